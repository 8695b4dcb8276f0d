"""The synthetic data shipped under data/ is reproducible, well-formed and correct.

data/generate.py (with its modules in data/gen/) writes the workspaces, task files and reference
trajectories; these tests check that the committed files are exactly what it produces, that every
task points at a real workspace, that every good reference trajectory runs cell by cell in a fresh
interpreter and answers correctly, and that every bad one really has the defect its label claims.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
GENERATOR = DATA / "generate.py"
GENERATOR_PACKAGE = DATA / "gen"  # the modules generate.py imports
TASK_FILES = {"qa": "qa.jsonl", "datatask": "datatask.jsonl", "openresearch": "openresearch.jsonl"}
REQUIRED_TASK_KEYS = {"id", "method", "instruction", "data", "workspace_id", "reward_spec", "input_seq"}
CELL_TIMEOUT_S = 60


# ------------------------------------------------------------------------------------ helpers
def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _generated_files(root: Path) -> dict[str, Path]:
    """Relative path -> file, for everything the generator owns under a data folder."""
    files = {}
    for sub in ("workspaces", "tasks"):
        for path in sorted((root / sub).rglob("*")):
            if path.is_file():
                files[path.relative_to(root).as_posix()] = path
    files["trajectories.jsonl"] = root / "trajectories.jsonl"
    return files


TASKS = [t for name in TASK_FILES.values() for t in _read_jsonl(DATA / "tasks" / name)]
TASK_BY_ID = {t["id"]: t for t in TASKS}
TRAJECTORIES = _read_jsonl(DATA / "trajectories.jsonl")
GOOD = {t["task_id"]: t for t in TRAJECTORIES if t["label"] == "good"}
BAD = {t["task_id"]: t for t in TRAJECTORIES if t["label"] == "bad"}
QA_IDS = sorted(t["id"] for t in TASKS if t["method"] == "qa")

CODE_RE = re.compile(r"<Code>\n?(.*?)</Code>", re.S)
FENCE_RE = re.compile(r"^\s*```python\n(.*?)\n```\s*$", re.S)
ANSWER_RE = re.compile(r"<Answer>(.*?)</Answer>", re.S)


def _code_blocks(turn: str) -> list[str]:
    return CODE_RE.findall(turn)


def _cell_source(block: str) -> str:
    """Inner python of a <Code> block: the fenced body if fenced, else the raw text."""
    m = FENCE_RE.match(block)
    return m.group(1) if m else block


def _workspace(task: dict) -> Path:
    return DATA / task["data"] / task["workspace_id"]


def _final_answer(turns: list[str]) -> str | None:
    blocks = ANSWER_RE.findall("\n".join(turns))
    return blocks[-1] if blocks else None


def _answer_value(answer_block: str) -> str:
    lines = [line for line in answer_block.strip().splitlines() if line.strip()]
    assert lines[-1].startswith("Answer:"), f"last Answer line is {lines[-1]!r}"
    return lines[-1].split("Answer:", 1)[1].strip()


def _same_answer(value, truth) -> bool:
    if str(value).strip() == str(truth).strip():
        return True
    try:
        return math.isclose(float(value), float(truth), rel_tol=1e-6)
    except (TypeError, ValueError):
        return False


@functools.cache
def _run_cells(task_id: str, label: str) -> tuple[tuple[int, str, str], ...]:
    """Run each code cell of a trajectory in its own fresh interpreter, in one scratch copy of
    the task's workspace (files written by a cell stay visible to later cells, variables do not)."""
    traj = GOOD[task_id] if label == "good" else BAD[task_id]
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONHASHSEED="0")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "workspace"
        shutil.copytree(_workspace(TASK_BY_ID[task_id]), scratch)
        env["MPLCONFIGDIR"] = str(Path(tmp) / "mplconfig")
        for turn in traj["turns"]:
            for block in _code_blocks(turn):
                proc = subprocess.run(
                    [sys.executable, "-c", _cell_source(block)],
                    cwd=scratch,
                    capture_output=True,
                    text=True,
                    timeout=CELL_TIMEOUT_S,
                    env=env,
                )
                results.append((proc.returncode, proc.stdout, proc.stderr))
    return tuple(results)


# --------------------------------------------------------------------------- reproducibility
@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("regenerated")
    subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(out)], check=True, capture_output=True, timeout=120
    )
    return out


def test_regeneration_is_byte_identical(regenerated):
    committed = _generated_files(DATA)
    fresh = _generated_files(regenerated)
    assert sorted(fresh) == sorted(committed), "generator output and committed files differ in names"
    changed = [rel for rel in fresh if fresh[rel].read_bytes() != committed[rel].read_bytes()]
    assert not changed, f"regenerate with `python data/generate.py` and commit: {changed}"


def test_generator_imports_only_stdlib_and_openpyxl():
    """The entry point and every module of its ``gen`` package (imported beside it) stay free of
    numpy/pandas and anything else whose version could change the bytes."""
    sources = [GENERATOR, *sorted(GENERATOR_PACKAGE.glob("*.py"))]
    assert len(sources) > 2, "the generator's modules were not found"
    roots = set()
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                roots.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots.add(node.module.split(".")[0])
    third_party = {r for r in roots if r not in sys.stdlib_module_names} - {GENERATOR_PACKAGE.name}
    assert third_party <= {"openpyxl"}, third_party


def test_workspaces_are_small():
    files = [p for p in (DATA / "workspaces").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 200_000
    assert all(p.stat().st_size < 64_000 for p in files)


# ------------------------------------------------------------------------------- task files
def test_task_lines_have_required_keys_and_existing_workspaces():
    for method, name in TASK_FILES.items():
        tasks = _read_jsonl(DATA / "tasks" / name)
        assert tasks, name
        for task in tasks:
            assert set(task) >= REQUIRED_TASK_KEYS, (task.get("id"), REQUIRED_TASK_KEYS - set(task))
            assert task["method"] == method == task["reward_spec"]["method"]
            assert task["id"].startswith(f"{method}-{task['workspace_id']}-")
            assert isinstance(task["instruction"], str) and task["instruction"].strip()
            assert task["input_seq"] == task["instruction"]
            assert "ground_truth" in task["reward_spec"]
            ws = _workspace(task)
            assert ws.is_dir(), ws
            assert any(p.is_file() and p.stat().st_size > 0 for p in ws.iterdir()), ws


def test_task_ids_are_unique_and_cover_every_workspace():
    ids = [t["id"] for t in TASKS]
    assert len(ids) == len(set(ids))
    workspaces = {p.name for p in (DATA / "workspaces").iterdir() if p.is_dir()}
    assert {t["workspace_id"] for t in TASKS} == workspaces


def test_each_task_file_has_an_xlsx_or_sqlite_task():
    for name in TASK_FILES.values():
        suffixes = {p.suffix for t in _read_jsonl(DATA / "tasks" / name) for p in _workspace(t).iterdir()}
        assert suffixes & {".xlsx", ".db"}, name


def test_reward_specs_follow_their_method():
    for task in TASKS:
        spec = task["reward_spec"]
        if task["method"] == "qa":
            assert isinstance(spec["ground_truth"], (str, int, float)) and str(spec["ground_truth"]).strip()
            assert "function" not in spec
        elif task["method"] == "datatask":
            assert isinstance(spec["ground_truth"], str) and spec["ground_truth"].strip()
            assert spec["function"] == ["judge_accuracy"]
        else:
            assert spec["ground_truth"] == "" and spec["function"] == ["judge_opendomain"]


# ----------------------------------------------------------------------------- trajectories
def test_every_task_has_one_good_and_one_bad_trajectory():
    pairs = sorted((t["task_id"], t["label"]) for t in TRAJECTORIES)
    assert pairs == sorted((tid, label) for tid in TASK_BY_ID for label in ("good", "bad"))
    for traj in TRAJECTORIES:
        assert set(traj) == {"task_id", "label", "kind", "turns"}
        assert (traj["kind"] == "reference") == (traj["label"] == "good")
        assert all(isinstance(turn, str) and turn for turn in traj["turns"])


@pytest.mark.parametrize("task_id", sorted(GOOD))
def test_good_trajectory_follows_the_tag_protocol(task_id):
    turns = GOOD[task_id]["turns"]
    code_turns = [t for t in turns if "<Code>" in t]
    assert 2 <= len(code_turns) <= 4
    assert len(code_turns) == len(turns) - 1, "every turn but the last is one code action"
    for turn in turns:
        assert "<Analyze>" in turn and "</Analyze>" in turn
        assert turn.endswith("</Code>") or turn.endswith("</Answer>")
        assert turn.count("<Code>") + turn.count("<Answer>") == 1, "one action per turn"
    for turn in code_turns:
        (block,) = _code_blocks(turn)
        assert FENCE_RE.match(block), "code must be fenced with ```python"
    assert turns[-1].endswith("</Answer>") and "<Answer>" in turns[-1]


@pytest.mark.slow
@pytest.mark.parametrize("task_id", sorted(GOOD))
def test_good_trajectory_cells_run_without_error_in_fresh_processes(task_id):
    for i, (rc, _out, err) in enumerate(_run_cells(task_id, "good")):
        assert rc == 0, f"cell {i} of {task_id} failed:\n{err[-3000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("task_id", sorted(GOOD))
def test_good_answer_only_cites_numbers_the_code_printed(task_id):
    answer = _final_answer(GOOD[task_id]["turns"])
    printed = "\n".join(out for _rc, out, _err in _run_cells(task_id, "good"))
    missing = [n for n in re.findall(r"\d+\.\d+", answer) if n not in printed]
    assert not missing, f"{task_id}: answer cites numbers no cell printed: {missing}"


@pytest.mark.parametrize("task_id", QA_IDS)
def test_qa_good_answer_equals_ground_truth(task_id):
    value = _answer_value(_final_answer(GOOD[task_id]["turns"]))
    assert _same_answer(value, TASK_BY_ID[task_id]["reward_spec"]["ground_truth"])


# Independent recomputations of the QA ground truths, written by hand with pandas.
def _recompute_qa_retail(ws: Path):
    sales = pd.read_csv(ws / "sales.csv", parse_dates=["order_date"])
    stores = pd.read_csv(ws / "stores.csv")
    march = sales[sales["order_date"].dt.month.eq(3) & sales["order_date"].dt.year.eq(2024)]
    revenue = (march["units"] * march["unit_price"]).groupby(march["store_id"]).sum()
    return stores.set_index("store_id").loc[revenue.idxmax(), "store_name"]


def _recompute_qa_inventory(ws: Path):
    products = pd.read_excel(ws / "inventory.xlsx", sheet_name="products")
    stock = pd.read_excel(ws / "inventory.xlsx", sheet_name="stock")
    on_hand = stock.groupby("sku")["on_hand"].sum().reindex(products["sku"], fill_value=0)
    return int((on_hand.to_numpy() < products["reorder_level"].to_numpy()).sum())


def _recompute_qa_clinic(ws: Path):
    con = sqlite3.connect(ws / "clinic.db")
    try:
        visits = pd.read_sql_query("SELECT patient_id, systolic_bp FROM visits", con)
        patients = pd.read_sql_query("SELECT patient_id, age FROM patients", con)
    finally:
        con.close()
    df = visits.merge(patients, on="patient_id")
    return round(float(df.loc[df["age"] > 60, "systolic_bp"].mean()), 2)


def _recompute_qa_sensors(ws: Path):
    df = pd.read_csv(ws / "readings.csv", parse_dates=["timestamp"])
    day = df[(df["sensor_id"] == "S2") & (df["timestamp"].dt.date == pd.Timestamp("2024-05-02").date())]
    return round(float(day["temperature_c"].dropna().mean()), 2)


RECOMPUTE = {
    "qa-retail-001": _recompute_qa_retail,
    "qa-inventory-001": _recompute_qa_inventory,
    "qa-clinic-001": _recompute_qa_clinic,
    "qa-sensors-001": _recompute_qa_sensors,
}


def test_every_qa_task_has_an_independent_recomputation():
    assert sorted(RECOMPUTE) == QA_IDS


@pytest.mark.parametrize("task_id", QA_IDS)
def test_qa_ground_truth_matches_pandas_recomputation(task_id):
    task = TASK_BY_ID[task_id]
    expected = RECOMPUTE[task_id](_workspace(task))
    assert _same_answer(expected, task["reward_spec"]["ground_truth"]), (expected, task["reward_spec"])


# ------------------------------------------------------------------------ bad trajectories
@pytest.mark.slow
@pytest.mark.parametrize("task_id", sorted(BAD))
def test_bad_trajectory_has_the_defect_its_kind_names(task_id):
    traj, task = BAD[task_id], TASK_BY_ID[task_id]
    turns, kind = traj["turns"], traj["kind"]
    answer = _final_answer(turns)
    blocks = [b for t in turns for b in _code_blocks(t)]
    if kind == "missing_analyze_tags":
        assert not any("<Analyze>" in t or "</Analyze>" in t for t in turns)
        assert answer is not None
    elif kind == "unfenced_code":
        assert task["method"] in ("datatask", "openresearch")
        assert any(not FENCE_RE.match(b) for b in blocks)
        assert answer is not None
    elif kind == "no_answer":
        assert answer is None and len(turns) == 3
        assert all(t.endswith("</Code>") for t in turns)
    elif kind.startswith("exception_then_"):
        assert any(rc != 0 for rc, _out, _err in _run_cells(task_id, "bad"))
        assert answer is not None
    else:  # a wrong final answer from a wrong column / aggregation / missing-value handling
        assert kind in {"wrong_aggregation", "wrong_column", "missing_values_as_zero"}, kind
        assert answer is not None
        assert all(rc == 0 for rc, _out, _err in _run_cells(task_id, "bad"))
    if task["method"] == "qa" and answer is not None and kind != "missing_analyze_tags":
        assert not _same_answer(_answer_value(answer), task["reward_spec"]["ground_truth"])
    if kind == "wrong_column":
        good_answer = _final_answer(GOOD[task_id]["turns"])
        assert set(re.findall(r"\d+\.\d+", answer)).isdisjoint(re.findall(r"\d+\.\d+", good_answer))


def test_bad_trajectory_kinds_vary():
    assert len({t["kind"] for t in BAD.values()}) >= 5
