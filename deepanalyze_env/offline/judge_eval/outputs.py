"""Writing a judge evaluation: ``report.json``, ``cases.jsonl``, ``report.md`` and ``scores.png``."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from deepanalyze_env.offline.judge_eval.fixtures import LABELS, BadLineInfo
from deepanalyze_env.offline.judge_eval.metrics import CaseRow, JudgeEvalMetrics, ThresholdGate
from deepanalyze_env.offline.report import fmt

log = logging.getLogger(__name__)


class JudgeEvalReport(JudgeEvalMetrics):
    """``report.json`` of a judge evaluation: the metrics, the judge, its prompts and the gates
    (assembled by ``deepanalyze-rl judge-eval``)."""

    prompt_hash: str
    model: str
    prompt_hashes: dict[str, str]
    prompt_dir: str | None
    backend: str
    base_url: str | None
    temperature: float
    max_tokens: int
    profile: str
    repeats: int
    fixtures: list[str]
    n_bad_lines: int
    bad_lines: list[BadLineInfo]
    thresholds: dict[str, ThresholdGate]
    passed: bool
    elapsed_s: float
    created_at: str


MAX_MD_ROWS = 40  # longer tables in report.md are cut; cases.jsonl has every row

# ---------------------------------------------------------------------------------- outputs


def write_outputs(out: Path, report: JudgeEvalReport, rows: Sequence[CaseRow]) -> None:
    """``report.json``, ``cases.jsonl``, ``report.md`` and ``scores.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(
        json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    with (out / "cases.jsonl").open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    (out / "report.md").write_text(render_markdown(report, rows), encoding="utf-8")
    plot_scores(rows, out / "scores.png")


def _more(total: int) -> list[str]:
    extra = total - MAX_MD_ROWS
    return [f"\n… and {extra} more in cases.jsonl", ""] if extra > 0 else [""]


def _per_judge_lines(report: JudgeEvalReport) -> list[str]:
    """The Per judge table and each multi-dimension judge's dimension means."""
    lines: list[str] = []
    lines += [
        "## Per judge",
        "",
        "| judge | cases | ordering | " + " | ".join(LABELS) + " |",
        "|---|---|---|",
    ]
    lines[-1] += "---|" * len(LABELS)
    for judge, stats in report["per_judge"].items():
        means = " | ".join(fmt(stats["per_label_mean"].get(label)) for label in LABELS)
        lines.append(f"| {judge} | {stats['n_cases']} | {fmt(stats['ordering_accuracy'])} | {means} |")
    lines.append("")
    for judge, stats in report["per_judge"].items():
        dims = stats.get("per_dimension_mean")
        if not dims:
            continue
        names = sorted({name for per in dims.values() for name in per})
        lines += [f"Dimensions of {judge}:", "", "| label | " + " | ".join(names) + " |"]
        lines.append("|---|" + "---|" * len(names))
        for label in LABELS:
            if label in dims:
                lines.append(f"| {label} | " + " | ".join(fmt(dims[label].get(n)) for n in names) + " |")
        lines.append("")
    return lines


def _problem_lines(rows: Sequence[CaseRow]) -> list[str]:
    """Pairs the judge ranked out of label order, and samples that got no score."""
    lines: list[str] = []
    misordered = [(row["id"], pair) for row in rows for pair in row["pairs"] if pair["outcome"] < 1.0]
    if misordered:
        lines += [
            "## Pairs not in label order",
            "",
            "| case | pair | scores | counted |",
            "|---|---|---|---|",
        ]
        for case_id, pair in misordered[:MAX_MD_ROWS]:
            scores = f"{fmt(pair['better_score'])} vs {fmt(pair['worse_score'])}"
            lines.append(f"| {case_id} | {pair['labels']} | {scores} | {pair['outcome']} |")
        lines += _more(len(misordered))
    failures = [
        (row["id"], cand, sample)
        for row in rows
        for cand in row["candidates"]
        for sample in cand["samples"]
        if sample["status"] != "scored"
    ]
    if failures:
        lines += ["## Samples without a score", "", "| case | candidate | repeat | status | error |"]
        lines.append("|---|---|---|---|---|")
        for case_id, cand, sample in failures[:MAX_MD_ROWS]:
            error = " ".join(str(sample["error"]).split())[:160].replace("|", "\\|")
            lines.append(
                f"| {case_id} | {cand['index']} ({cand['label']}) | {sample['repeat']} | {sample['status']} "
                f"| {error} |"
            )
        lines += _more(len(failures))
    return lines


HOW_TO_READ = [
    "## How to read this",
    "",
    "- **ordering_accuracy**: over every pair of candidates of one case with different labels, the "
    "share the judge ranked in the order reference > perturbed > wrong (ties count half). 0.5 is a "
    "judge that cannot tell them apart; below 0.5 it prefers the worse answer.",
    "- **per-label means** are scores in [0, 1] as the environment's reward sees them (the rubric "
    "score / 5; a multi-dimension judge's mean over dimensions). The gap between labels matters "
    "more than the level.",
    "- **parse_failure_rate**: share of replies with no readable verdict; in training each becomes "
    "a `verifier_error` episode that is left out of the gradient.",
    "- **score_std_across_repeats**: the judge's noise at this temperature (sample standard "
    "deviation over repeats, averaged over candidates); compare it with the per-label gaps.",
    "- Per-sample replies, errors and latencies are in `cases.jsonl`; `scores.png` shows the "
    "distribution per label and judge.",
    "",
]


def render_markdown(report: JudgeEvalReport, rows: Sequence[CaseRow]) -> str:
    """A human summary: headline numbers, gates, per judge, misordered pairs, failures, bad lines."""
    lines = [
        "# Judge evaluation",
        "",
        f"Judge: **{report['backend']}** model `{report['model']}`"
        + (f" at {report['base_url']}" if report.get("base_url") else "")
        + f", temperature {report['temperature']}, {report['repeats']} repeat(s) per candidate.",
        f"Prompt set hash `{report['prompt_hash'][:16]}`"
        + (f" from `{report['prompt_dir']}`" if report.get("prompt_dir") else " (shipped prompts)")
        + ".",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    for key in (
        "n_cases",
        "n_candidates",
        "n_calls",
        "ordering_accuracy",
        "n_pairs",
        "parse_failure_rate",
        "score_std_across_repeats",
        "latency_ms_p50",
        "n_call_errors",
        "n_other_errors",
        "n_bad_lines",
    ):
        lines.append(f"| {key} | {fmt(report.get(key))} |")
    for label, value in report["per_label_mean"].items():
        lines.append(f"| mean score, {label} | {fmt(value)} |")
    lines.append("")
    if report["thresholds"]:
        lines += ["## Gates", ""]
        for name, gate in report["thresholds"].items():
            verdict = "PASS" if gate["passed"] else "FAIL"
            lines.append(f"- **{verdict}** {name}: value {fmt(gate['value'])}, limit {gate['limit']}")
        lines.append("")
    lines += _per_judge_lines(report)
    lines += _problem_lines(rows)
    if report["bad_lines"]:
        lines += ["## Fixture lines skipped", ""]
        lines += [f"- {b['file']}:{b['line']}: {b['error']}" for b in report["bad_lines"]]
        lines.append("")
    lines += HOW_TO_READ
    return "\n".join(lines)


def plot_scores(rows: Sequence[CaseRow], path: Path) -> None:
    """One panel per judge: each candidate's score by label, with the label mean marked.

    Uses matplotlib's object API with the Agg canvas, so no global backend or pyplot state is
    touched in the caller's process.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    judges = list(dict.fromkeys(row["judge"] for row in rows)) or ["(no cases)"]
    fig = Figure(figsize=(4.2 * len(judges), 3.8))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(judges), squeeze=False)[0]
    colours = {"reference": "#2a9d8f", "perturbed": "#e9c46a", "wrong": "#e76f51"}
    for ax, judge in zip(axes, judges, strict=True):
        for x, label in enumerate(LABELS):
            values = [
                cand["score"]
                for row in rows
                if row["judge"] == judge
                for cand in row["candidates"]
                if cand["label"] == label and cand["score"] is not None
            ]
            if not values:
                continue
            # deterministic spread so equal scores stay visible side by side
            offsets = [((i % 7) - 3) * 0.05 for i in range(len(values))]
            ax.scatter([x + o for o in offsets], values, color=colours[label], alpha=0.8, s=28, zorder=3)
            mean = sum(values) / len(values)
            ax.hlines(mean, x - 0.3, x + 0.3, color="black", linewidth=2, zorder=4)
        ax.set_xticks(range(len(LABELS)), LABELS)
        ax.set_xlim(-0.6, len(LABELS) - 0.4)
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(judge)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("score (0–1); bar = label mean")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
