"""Prompt sets side by side (``judge-eval --prompt-dir A --prompt-dir B …``): paired differences.

Every set is scored on the same fixture cases by the same judge, so the sets differ only in
their rubric files and each fixture item can be paired across sets: a candidate pair's ordering
outcome, a sample's parse failure, a candidate's standard deviation across repeats. A set's
difference from the first set (the baseline) is the mean of the paired differences, and its 95 %
interval comes from resampling fixture *cases* with replacement (a case's items share a
question and a judge, so they are not independent draws; cases are). An item one set could not
score is left out of that comparison (and counted); the per-set figures are each set's own
report.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from deepanalyze_env.offline.judge_eval.metrics import CandidateRow, CaseRow
from deepanalyze_env.offline.judge_eval.outputs import JudgeEvalReport
from deepanalyze_env.offline.report import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED, bootstrap_ci, fmt

PAIRED_METRICS = ("ordering_accuracy", "parse_failure_rate", "score_std_across_repeats")
ANSWERED = ("scored", "parse_error")  # a sample that got a reply, readable or not


@dataclass
class SetRun:
    """One prompt set's evaluation: its name, folder (None: the shipped prompts), report and case rows."""

    name: str
    prompt_dir: str | None
    report: JudgeEvalReport
    rows: list[CaseRow]


class SetFigures(TypedDict):
    """One prompt set's headline figures in ``compare.json``."""

    name: str
    prompt_dir: str | None
    prompt_hash: str
    ordering_accuracy: float | None
    parse_failure_rate: float | None
    score_std_across_repeats: float | None
    n_pairs: int | None
    n_replies: int | None
    n_parse_failures: int | None
    passed: bool | None


class Difference(TypedDict):
    """One metric's paired difference from the baseline, with its interval over cases."""

    diff: float | None
    ci95: list[float] | None
    n_cases: int
    n_items: int


class SetDifference(TypedDict):
    """A later set minus the baseline, per paired metric."""

    set: str
    minus: str
    metrics: dict[str, Difference]


class Bootstrap(TypedDict):
    """How the intervals were resampled."""

    unit: str
    resamples: int
    seed: int
    interval: str


class SetComparison(TypedDict):
    """``compare.json`` (before the judge header the command puts in front)."""

    baseline: str
    sets: list[SetFigures]
    differences: list[SetDifference]
    bootstrap: Bootstrap


class CompareHeader(TypedDict):
    """What every compared set shares: the judge and the fixtures."""

    model: str
    backend: str
    base_url: str | None
    temperature: float
    repeats: int
    n_cases: int
    fixtures: list[str]


def _samples(candidate: CandidateRow) -> dict[int, str]:
    return {s["repeat"]: s["status"] for s in candidate["samples"]}


def paired_items(base: Sequence[CaseRow], other: Sequence[CaseRow]) -> dict[str, list[list[float]]]:
    """Per metric, per case present in both: the paired differences ``other − base`` of its items."""
    by_id = {row["id"]: row for row in base}
    out: dict[str, list[list[float]]] = {m: [] for m in PAIRED_METRICS}
    for row in other:
        twin = by_id.get(row["id"])
        if twin is None:
            continue
        outcomes = {(p["better"], p["worse"]): p["outcome"] for p in twin["pairs"]}
        out["ordering_accuracy"].append(
            [
                p["outcome"] - outcomes[(p["better"], p["worse"])]
                for p in row["pairs"]
                if (p["better"], p["worse"]) in outcomes
            ]
        )
        failures, noise = [], []
        for cand, cand_base in zip(row["candidates"], twin["candidates"], strict=True):
            base_status = _samples(cand_base)
            for repeat, status in _samples(cand).items():
                if status in ANSWERED and base_status.get(repeat) in ANSWERED:
                    failures.append(
                        float(status == "parse_error") - float(base_status[repeat] == "parse_error")
                    )
            if cand["std"] is not None and cand_base["std"] is not None:
                noise.append(cand["std"] - cand_base["std"])
        out["parse_failure_rate"].append(failures)
        out["score_std_across_repeats"].append(noise)
    return out


def _clean(x: float) -> float:
    """Rounded past float noise (a sum of equal stds is not exactly 0), without a negative zero."""
    return round(x, 12) + 0.0


def _difference(groups: list[list[float]]) -> Difference:
    values = [v for g in groups for v in g]
    ci = bootstrap_ci(groups)
    return {
        "diff": _clean(sum(values) / len(values)) if values else None,
        "ci95": [_clean(ci[0]), _clean(ci[1])] if ci is not None else None,
        "n_cases": sum(1 for g in groups if g),
        "n_items": len(values),
    }


def compare_sets(runs: Sequence[SetRun]) -> SetComparison:
    """``compare.json``: every set's headline figures, every later set's paired differences from the first."""
    base = runs[0]
    return {
        "baseline": base.name,
        "sets": [
            {
                "name": run.name,
                "prompt_dir": run.prompt_dir,
                "prompt_hash": run.report["prompt_hash"],
                **{m: run.report.get(m) for m in PAIRED_METRICS},
                "n_pairs": run.report.get("n_pairs"),
                "n_replies": run.report.get("n_replies"),
                "n_parse_failures": run.report.get("n_parse_failures"),
                "passed": run.report.get("passed"),
            }
            for run in runs
        ],
        "differences": [
            {
                "set": run.name,
                "minus": base.name,
                "metrics": {m: _difference(g) for m, g in paired_items(base.rows, run.rows).items()},
            }
            for run in runs[1:]
        ],
        "bootstrap": {
            "unit": "fixture case",
            "resamples": BOOTSTRAP_SAMPLES,
            "seed": BOOTSTRAP_SEED,
            "interval": "95% percentile",
        },
    }


def render_compare_markdown(result: SetComparison, header: CompareHeader) -> str:
    lines = [
        "# Judge prompt sets compared",
        "",
        f"Judge `{header['model']}` ({header['backend']}), temperature {header['temperature']}, "
        f"{header['repeats']} repeat(s), {header['n_cases']} fixture cases, the same for every set.",
        "",
        "| set | prompts | ordering accuracy | parse failures | std across repeats | gates |",
        "|---|---|---|---|---|---|",
    ]
    for s in result["sets"]:
        where = f"`{s['prompt_dir']}`" if s["prompt_dir"] else "shipped"
        gates = "pass" if s["passed"] else "FAIL"
        lines.append(
            f"| {s['name']} | {where} | {fmt(s['ordering_accuracy'])} | {fmt(s['parse_failure_rate'])} "
            f"| {fmt(s['score_std_across_repeats'])} | {gates} |"
        )
    lines += [
        "",
        f"## Paired differences from {result['baseline']} (95 % bootstrap interval over fixture cases)",
        "",
        "| set | metric | difference | 95 % interval | cases | items |",
        "|---|---|---|---|---|---|",
    ]
    for d in result["differences"]:
        for metric, m in d["metrics"].items():
            ci = m["ci95"]
            interval = f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "–"
            diff = f"{m['diff']:+.3f}" if m["diff"] is not None else "–"
            lines.append(f"| {d['set']} | {metric} | {diff} | {interval} | {m['n_cases']} | {m['n_items']} |")
    lines += [
        "",
        "A positive ordering difference means the set ranks candidates better than the baseline; a "
        "negative parse-failure or std difference means fewer unreadable replies or less noise. An "
        "interval that excludes 0 is a difference these fixtures can see. The std needs --repeats 2 "
        "or more. Each set's full report is in its own folder.",
        "",
    ]
    return "\n".join(lines)


def write_compare(out: Path, result: SetComparison, header: CompareHeader) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps({**header, **result}, indent=2, ensure_ascii=False) + "\n")
    (out / "compare.md").write_text(render_compare_markdown(result, header), encoding="utf-8")
