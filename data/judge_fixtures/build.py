"""Build the judge fixtures (``data/judge_fixtures/*.jsonl``) that ``deepanalyze-rl judge-eval`` reads.

Why this script exists
----------------------
A judge is only useful for RL if it ranks a sound analysis above a subtly broken one and both
above a wrong one. The fixtures give it exactly that test: for every shipped task, one
``reference`` trajectory (the shipped good one), one ``perturbed`` trajectory that breaks a
single key step (a wrong column, a wrong aggregation, a conclusion the output does not
support) and one ``wrong`` trajectory that reaches a wrong answer. The perturbations are
written here, by hand, as edits of the reference turns, so a reviewer can read each defect.

Every code cell is executed against a fresh copy of the task's workspace with the
environment's own executor, and the observation is rendered exactly as the environment
renders it, so judge-eval can split the text back into the analyst's turns and the
environment's output (``rewards.judge.transcript.messages_from_rendered``) and the judge sees
the trajectory marked by author as it would be during training — including outputs that
contradict an unsupported conclusion.

Each task yields one case for the judge its method uses in training (``qa`` →
``judge_analysis``, ``datatask`` → ``judge_accuracy``, ``openresearch`` → ``judge_opendomain``),
and the datatask and openresearch tasks one more case for ``judge_analysis``, whose judge sees
the whole trajectory rather than the final answer only.

Usage: ``python data/judge_fixtures/build.py [--out DIR] [--check]``. The outputs are committed;
rerun after editing a variant or the shipped trajectories. Cell outputs depend on the kernel
stack's versions (pinned by the ``kernel`` extra); ``--check`` reports whether the committed
files still match.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent
sys.path.insert(0, str(DATA.parent))  # run from a checkout without installing

from deepanalyze_env.core import protocol  # noqa: E402
from tools.kernel import Kernel  # noqa: E402
from tools.workspace import Workspace  # noqa: E402

log = logging.getLogger("judge_fixtures")

JUDGE_OF_METHOD = {"qa": "judge_analysis", "datatask": "judge_accuracy", "openresearch": "judge_opendomain"}
EXTRA_ANALYSIS_CASES = ("datatask", "openresearch")
OUTPUTS = {"qa": "qa.jsonl", "datatask": "datatask.jsonl", "openresearch": "openresearch.jsonl"}


@dataclass(frozen=True)
class Variant:
    label: str  # reference | perturbed | wrong
    kind: str  # what is broken, in a few words
    turns: tuple[str, ...]


def swap(turn: str, *edits: tuple[str, str]) -> str:
    """``turn`` with each ``old`` (which must occur exactly once) replaced by ``new``."""
    for old, new in edits:
        count = turn.count(old)
        if count != 1:
            raise ValueError(f"edit target occurs {count} times, expected once: {old[:60]!r}")
        turn = turn.replace(old, new)
    return turn


def swap_line(turn: str, prefix: str, new: str) -> str:
    """``turn`` with its one line starting with ``prefix`` replaced by ``new``."""
    lines = turn.split("\n")
    hits = [i for i, line in enumerate(lines) if line.startswith(prefix)]
    if len(hits) != 1:
        raise ValueError(f"{len(hits)} lines start with {prefix!r}, expected one")
    lines[hits[0]] = new
    return "\n".join(lines)


def code_turn(analyze: str, code: str, understand: str | None = None) -> str:
    head = f"<Understand>\n{understand}\n</Understand>\n" if understand else ""
    return f"{head}<Analyze>\n{analyze}\n</Analyze>\n<Code>\n```python\n{code.strip()}\n```\n</Code>"


def answer_turn(analyze: str, answer: str) -> str:
    return f"<Analyze>\n{analyze}\n</Analyze>\n<Answer>\n{answer.strip()}\n</Answer>"


# ------------------------------------------------------------------------------ the variants
# Each function receives the shipped reference turns of its task and returns the perturbed and
# wrong variants. Final answers state what the (perturbed) code printed, except where the defect
# is precisely an answer the output does not support.


def qa_retail(ref: list[str]) -> list[Variant]:
    mean_turn = swap(
        ref[1],
        ("sum revenue per store", "take the typical revenue per store"),
        ("['revenue'].sum()", "['revenue'].mean()"),
    )
    perturbed = (
        ref[0],
        mean_turn,
        answer_turn(
            "Harbor Point comes first with 135.42, ahead of Riverside Plaza with 116.96.",
            "I computed revenue as units × unit_price, restricted orders to March 2024 and compared "
            "the stores. Harbor Point had the highest March revenue (135.42).\n\nAnswer: Harbor Point",
        ),
    )
    wrong = (
        ref[0],
        answer_turn(
            "stores.csv gives each store's floor area, and Lakeshore Market is by far the largest "
            "at 1150 sqm. A bigger store sells more, so no further computation is needed.",
            "Lakeshore Market is the largest store (1150 sqm), so it had the highest total revenue in "
            "March 2024.\n\nAnswer: Lakeshore Market",
        ),
    )
    return [
        Variant("perturbed", "wrong aggregation: mean order value instead of total revenue", perturbed),
        Variant("wrong", "answer guessed from floor area, revenue never computed", wrong),
    ]


def qa_inventory(ref: list[str]) -> list[Variant]:
    per_row = code_turn(
        "I will compare each stock row's on_hand with the SKU's reorder_level and count the SKUs "
        "that have a row below it.",
        """
import pandas as pd
products = pd.read_excel('inventory.xlsx', sheet_name='products')
stock = pd.read_excel('inventory.xlsx', sheet_name='stock')
merged = stock.merge(products[['sku', 'product_name', 'reorder_level']], on='sku')
below = merged[merged['on_hand'] < merged['reorder_level']]
print(', '.join(sorted(below['sku'].unique())))
print('SKUs below reorder level:', below['sku'].nunique())
""",
        understand="'products' has 20 SKUs with unit_cost and reorder_level; 'stock' has one row per "
        "SKU and warehouse with on_hand.",
    )
    perturbed = (
        ref[0],
        per_row,
        answer_turn(
            "19 SKUs have stock below their reorder level.",
            "Comparing on_hand with reorder_level, 19 SKUs are below their reorder level.\n\nAnswer: 19",
        ),
    )
    median_turn = code_turn(
        "The reorder_level column says which products need reordering: a high reorder level means "
        "the product runs low. I will count products whose reorder_level is above the average.",
        """
import pandas as pd
products = pd.read_excel('inventory.xlsx', sheet_name='products')
high = products[products['reorder_level'] > products['reorder_level'].mean()]
print(high[['sku', 'reorder_level']].to_string(index=False))
print('count:', len(high))
""",
    )
    wrong = (
        ref[0],
        median_turn,
        answer_turn(
            "11 products have a high reorder level, so they are the ones below it.",
            "11 SKUs are below their reorder level.\n\nAnswer: 11",
        ),
    )
    return [
        Variant("perturbed", "wrong aggregation: per warehouse row instead of the SKU total", perturbed),
        Variant("wrong", "wrong column: reorder_level alone, on_hand never used", wrong),
    ]


def qa_clinic(ref: list[str]) -> list[Variant]:
    diastolic = swap(
        ref[1],
        ("average systolic_bp over those visits", "average the blood pressure over those visits"),
        ("SELECT v.systolic_bp, p.age", "SELECT v.diastolic_bp, p.age"),
        (
            "print('mean systolic:', round(older['systolic_bp'].mean(), 2))",
            "print('mean pressure:', round(older['diastolic_bp'].mean(), 2))",
        ),
    )
    perturbed = (
        ref[0],
        diastolic,
        answer_turn(
            "31 visits belong to patients older than 60; their mean blood pressure is 80.26 mmHg.",
            "Joining visits with patients and keeping patients with age > 60 gives 31 visits with a mean "
            "blood pressure of 80.26 mmHg.\n\nAnswer: 80.26",
        ),
    )
    all_visits = code_turn(
        "I will average systolic_bp in the visits table.",
        """
import sqlite3
import pandas as pd
con = sqlite3.connect('clinic.db')
visits = pd.read_sql_query('SELECT systolic_bp FROM visits', con)
con.close()
print('mean systolic:', round(visits['systolic_bp'].mean(), 2))
""",
        understand="'visits' holds systolic_bp for every visit.",
    )
    wrong = (
        ref[0],
        all_visits,
        answer_turn(
            "The mean systolic pressure is 123.96 mmHg.",
            "The mean systolic blood pressure of patients older than 60 is 123.96 mmHg.\n\nAnswer: 123.96",
        ),
    )
    return [
        Variant("perturbed", "wrong column: diastolic instead of systolic pressure", perturbed),
        Variant("wrong", "age filter never applied; mean over all visits", wrong),
    ]


def qa_sensors(ref: list[str]) -> list[Variant]:
    perturbed = (
        ref[0],
        ref[1],
        answer_turn(
            "S2 has 24 readings on 2024-05-02, 1 of them missing; the mean of the others is 23.58 °C.",
            "Sensor S2 recorded 23 valid temperature readings on 2024-05-02 (missing readings ignored: "
            "1); their mean is 23.58 °C.\n\nAnswer: 23.58",
        ),
    )
    all_sensors = code_turn(
        "I will select the readings of 2024-05-02 and take the mean of temperature_c.",
        """
import pandas as pd
df = pd.read_csv('readings.csv', parse_dates=['timestamp'])
sel = df[df['timestamp'].dt.strftime('%Y-%m-%d') == '2024-05-02']
print('rows:', len(sel))
print('mean temperature:', round(sel['temperature_c'].mean(), 2))
""",
        understand="There are hourly readings for three sensors.",
    )
    wrong = (
        ref[0],
        all_sensors,
        answer_turn(
            "The mean temperature on 2024-05-02 is 16.88 °C.",
            "The mean temperature recorded by S2 on 2024-05-02 is 16.88 °C.\n\nAnswer: 16.88",
        ),
    )
    return [
        Variant(
            "perturbed", "conclusion not supported by the output: 23.58 reported, 23.85 printed", perturbed
        ),
        Variant("wrong", "sensor filter missing: mean over all three sensors", wrong),
    ]


def datatask_sensors(ref: list[str]) -> list[Variant]:
    keep_missing = swap(
        ref[1],
        (
            "I will drop rows with a missing or out-of-range temperature",
            "I will drop rows with an out-of-range temperature",
        ),
        (
            "ok = df['temperature_c'].notna() & df['temperature_c'].between(-10, 60)",
            "ok = ~(df['temperature_c'] > 60)",
        ),
    )
    perturbed = (
        ref[0],
        keep_missing,
        ref[2],
        answer_turn(
            "The cleaned file checks out; I will summarise the results.",
            """
Cleaning summary for readings.csv (144 rows):
- Dropped 1 row: the out-of-range reading (85.0 °C from S1, a sensor glitch).
- Filled 5 missing humidity_pct values with the median humidity of the same sensor.
- Saved 143 rows with the original columns to readings_clean.csv; no values are missing.
- Mean temperature after cleaning: S1 21.82 °C, S2 23.46 °C, S3 4.22 °C.
""",
        ),
    )
    dropna = code_turn(
        "Rows with gaps are unreliable, so I will drop every row with a missing value and save the rest.",
        """
import pandas as pd
df = pd.read_csv('readings.csv')
clean = df.dropna()
clean.to_csv('readings_clean.csv', index=False)
print('rows dropped:', len(df) - len(clean))
print('rows saved:', len(clean))
for sensor, value in clean.groupby('sensor_id')['temperature_c'].mean().items():
    print(f"{sensor}: mean temperature {value:.2f}")
""",
        understand="Some temperature and humidity values are missing.",
    )
    wrong = (
        ref[0],
        dropna,
        answer_turn(
            "Done; I will report the numbers.",
            """
Cleaning summary for readings.csv:
- Dropped 12 rows with missing values; no humidity values needed filling.
- Saved 132 rows to readings_clean.csv.
- Mean temperature after cleaning: S1 23.21 °C, S2 23.01 °C, S3 4.23 °C.
""",
        ),
    )
    return [
        Variant(
            "perturbed", "missing temperatures kept; the check's output contradicts the summary", perturbed
        ),
        Variant("wrong", "dropna instead of the range filter and the per-sensor fill", wrong),
    ]


def datatask_retail(ref: list[str]) -> list[Variant]:
    perturbed = (
        *ref[:-1],
        swap(
            ref[-1],
            ("South has the largest quarterly total", "West has the largest quarterly total"),
            (
                "Highest revenue over the quarter: South with 6843.02.",
                "Highest revenue over the quarter: West with 6262.45.",
            ),
        ),
    )
    units = swap(
        ref[1],
        (
            "I will compute revenue, merge in the region",
            "I will take revenue from the units column, merge in the region",
        ),
        ("df['revenue'] = df['units'] * df['unit_price']", "df['revenue'] = df['units']"),
    )
    wrong = (
        ref[0],
        units,
        ref[2],
        answer_turn(
            "South has the largest quarterly total; I will report the table.",
            """
Revenue by region and month, saved as summary.csv:
- Midwest: 2024-01 43.00, 2024-02 53.00, 2024-03 91.00 (quarter 187.00)
- South: 2024-01 90.00, 2024-02 72.00, 2024-03 86.00 (quarter 248.00)
- West: 2024-01 48.00, 2024-02 59.00, 2024-03 48.00 (quarter 155.00)

Highest revenue over the quarter: South with 248.00.
""",
        ),
    )
    return [
        Variant(
            "perturbed", "conclusion not supported by the output: West named, South printed first", perturbed
        ),
        Variant("wrong", "wrong column: units summed as revenue, unit_price ignored", wrong),
    ]


def datatask_inventory(ref: list[str]) -> list[Variant]:
    per_row = code_turn(
        "Next, SKUs whose on_hand is below reorder_level.",
        """
import pandas as pd
products = pd.read_excel('inventory.xlsx', sheet_name='products')
stock = pd.read_excel('inventory.xlsx', sheet_name='stock')
merged = stock.merge(products[['sku', 'product_name', 'reorder_level']], on='sku')
below = merged[merged['on_hand'] < merged['reorder_level']]
print(', '.join(sorted(below['sku'].unique())))
print(below['sku'].nunique())
""",
    )
    perturbed = (
        ref[0],
        ref[1],
        per_row,
        answer_turn(
            "I have both results and will report them.",
            "- Stock value (on_hand × unit_cost) per warehouse, saved as warehouse_value.csv: East 7284.38, "
            "North 6534.15, South 4570.11 (total 18388.64).\n"
            "- 19 SKUs have on-hand stock below their reorder level: SKU-1001, SKU-1003 to SKU-1020.",
        ),
    )
    wrong_value = swap(
        ref[1],
        (
            "Stock value is on_hand × unit_cost per stock row, summed per warehouse.",
            "Stock value is the on_hand quantity summed per warehouse.",
        ),
        ("df['stock_value'] = df['on_hand'] * df['unit_cost']", "df['stock_value'] = df['on_hand']"),
    )
    wrong = (
        ref[0],
        wrong_value,
        answer_turn(
            "Every SKU is stocked somewhere, so none is below its reorder level; I will report.",
            "- Stock value per warehouse, saved as warehouse_value.csv: East 447.00, North 346.00, "
            "South 300.00 (total 1093.00).\n- No SKU is below its reorder level.",
        ),
    )
    return [
        Variant("perturbed", "wrong aggregation: SKU check per warehouse row, not per SKU total", perturbed),
        Variant(
            "wrong", "wrong column: units instead of value; reorder check skipped and answered 'none'", wrong
        ),
    ]


def openresearch_clinic(ref: list[str]) -> list[Variant]:
    report = swap_line(
        ref[-1],
        "- Age shows a strong positive association:",
        "- Age drives blood pressure: every year of age raises systolic pressure by 0.60 mmHg (r = 0.70).",
    )
    perturbed = (
        *ref[:-1],
        swap(
            report,
            (
                "- Smoking: smokers average 131.69 mmHg systolic versus 122.78 mmHg for non-smokers.",
                "- Smoking: smokers and non-smokers have about the same systolic pressure, so smoking "
                "plays no role.",
            ),
            (
                "\n\nCaveats: visits are repeated measures of the same patients and the groups are small, so "
                "these are descriptive associations, not causal effects. Age and diagnosis are confounded: "
                "hypertension and type 2 diabetes visits come from older patients (mean age 55.6 and 61.2 "
                "versus 52.5 over all visits).",
                "",
            ),
        ),
    )
    wrong = (
        ref[0],
        answer_turn(
            "The tables are small; I can write the report from this overview.",
            """
Blood pressure report

Blood pressure does not depend much on age in this clinic. Smokers and non-smokers look similar.
Asthma patients have the highest blood pressure, which suggests breathing problems raise it.
No figure was needed because the pattern is clear.
""",
        ),
    )
    return [
        Variant("perturbed", "smoking contradicts the output; causal claim; caveats dropped", perturbed),
        Variant("wrong", "report written without analysis; claims contradict the data; no figure", wrong),
    ]


def openresearch_retail(ref: list[str]) -> list[Variant]:
    units = swap(
        ref[1],
        (
            "by_cat = sales.groupby('category')['revenue'].agg(['sum', 'count'])",
            "by_cat = sales.groupby('category')['units'].agg(['sum', 'count'])",
        ),
        ("ax.set_ylabel('revenue')", "ax.set_ylabel('revenue (units)')"),
    )
    perturbed = (
        ref[0],
        units,
        ref[2],
        swap_line(
            ref[-1],
            "- Category mix dominates:",
            "- Category mix dominates: Grocery 296.00 (1.9%, 46 orders); Household 158.00 (1.0%, 39 orders); "
            "Apparel 68.00 (0.4%, 26 orders); Toys 35.00 (0.2%, 17 orders); Electronics 33.00 (0.2%, 22 "
            "orders). Grocery carries the largest share of revenue, Electronics the smallest.",
        ),
    )
    wrong = (
        ref[0],
        answer_turn(
            "I have seen the data and will write the report.",
            """
Revenue drivers

Toys drive most of the revenue and grew strongly every month. Maple Commons is the best store because
it is the newest. Store size and region do not matter. Revenue is evenly spread over the quarter.
""",
        ),
    )
    return [
        Variant("perturbed", "wrong column: category shares from units, reported as revenue", perturbed),
        Variant("wrong", "report without analysis; invented drivers; no chart", wrong),
    ]


VARIANTS = {
    "qa-retail-001": qa_retail,
    "qa-inventory-001": qa_inventory,
    "qa-clinic-001": qa_clinic,
    "qa-sensors-001": qa_sensors,
    "datatask-sensors-001": datatask_sensors,
    "datatask-retail-001": datatask_retail,
    "datatask-inventory-001": datatask_inventory,
    "openresearch-clinic-001": openresearch_clinic,
    "openresearch-retail-001": openresearch_retail,
}


# ------------------------------------------------------------------------------ assembly


def render_trajectory(turns: tuple[str, ...], workspace: Path, kernel_timeout_s: float = 60.0) -> str:
    """The episode text as the env builds it: each turn, then its code's observation."""
    copy = Workspace(workspace)
    kernel = Kernel(copy.path, timeout_s=kernel_timeout_s)
    try:
        parts = []
        for turn in turns:
            parts.append(turn)
            if protocol.has_answer(turn):
                break
            code = protocol.extract_code(turn)
            result = kernel.run(code) if code is not None else None
            if result is not None and result.status != "ok":
                log.warning("a cell ended with status %s in %s", result.status, workspace.name)
            parts.append(protocol.render_observation(result.output if result is not None else ""))
        return "".join(parts)
    finally:
        kernel.close()
        copy.remove()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def build(data: Path = DATA) -> dict[str, list[dict]]:
    """Fixture cases grouped by output file name, in task-file order."""
    tasks = [task for name in OUTPUTS.values() for task in read_jsonl(data / "tasks" / name)]
    good = {t["task_id"]: t for t in read_jsonl(data / "trajectories.jsonl") if t["label"] == "good"}
    missing = sorted(set(VARIANTS) ^ {t["id"] for t in tasks})
    if missing:
        raise SystemExit(f"tasks and variants disagree on: {', '.join(missing)}")
    out: dict[str, list[dict]] = {name: [] for name in OUTPUTS.values()}
    for task in tasks:
        reference = tuple(good[task["id"]]["turns"])
        variants = [Variant("reference", "shipped reference trajectory", reference)]
        variants += VARIANTS[task["id"]](list(reference))
        workspace = data / task["data"] / task["workspace_id"]
        candidates = [
            {"label": v.label, "kind": v.kind, "text": render_trajectory(v.turns, workspace)}
            for v in variants
        ]
        method = task["method"]
        judges = [JUDGE_OF_METHOD[method]]
        if method in EXTRA_ANALYSIS_CASES:
            judges.append("judge_analysis")
        for judge in judges:
            suffix = "" if judge == JUDGE_OF_METHOD[method] else "-analysis"
            out[OUTPUTS[method]].append(
                {
                    "id": f"{task['id']}{suffix}",
                    "method": method,
                    "judge": judge,
                    "task_id": task["id"],
                    "question": task.get("input_seq") or task["instruction"],
                    "ground_truth": task["reward_spec"].get("ground_truth", ""),
                    "candidates": candidates,
                }
            )
        log.info("built %s (%d candidates)", task["id"], len(candidates))
    return out


def dump(cases: list[dict]) -> str:
    return "".join(json.dumps(case, ensure_ascii=False) + "\n" for case in cases)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder for the JSONL files")
    parser.add_argument("--check", action="store_true", help="compare with the files in --out, write nothing")
    parser.add_argument("--show", metavar="TASK_ID", help="print the candidate texts of one task and stop")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    built = build()
    if args.show:
        for cases in built.values():
            for case in cases:
                if case["task_id"] == args.show and case["judge"] == JUDGE_OF_METHOD[case["method"]]:
                    for cand in case["candidates"]:
                        print(f"===== {cand['label']}: {cand['kind']}\n{cand['text']}\n")
        return 0
    stale = []
    for name, cases in built.items():
        path = args.out / name
        text = dump(cases)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
            continue
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        log.info("wrote %s (%d cases)", path, len(cases))
    if stale:
        log.error("out of date: %s (rerun python data/judge_fixtures/build.py)", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
