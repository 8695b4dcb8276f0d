"""Paired tests of two models' accuracy on the same tasks: the exact McNemar test beside the paired
bootstrap that ``eval --compare`` already computes (``eval_report.compare_runs``).

Why both: the bootstrap interval over tasks says how large the difference is, but with a handful
of discordant tasks its lower bound sits on a single task and moves with the resampling seed.
McNemar asks only the discordant pairs (tasks one model gets right and the other wrong) whether
the split between them could be a fair coin's, exactly (binomial, no normal approximation), so a
7 wins / 1 loss result reads as p ≈ 0.07 rather than as a lower bound "above 0". It needs each
task's outcome to be right or wrong, i.e. one greedy episode per task; with several samples per
task the per-task pass@1 is a fraction and only the bootstrap applies (``mcnemar_p`` is None).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

from deepanalyze_env.offline.eval_report import ReportRecord, per_task_means
from deepanalyze_env.offline.eval_schema import Comparison
from deepanalyze_env.offline.report import bootstrap_ci, mean

METRIC = "pass@1"  # the per-task accuracy that compare_runs pairs


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for ``b`` and ``c`` discordant pairs: twice the smaller
    binomial tail of Bin(b + c, 1/2), capped at 1 (no discordant pair: 1)."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got {b} and {c}")
    n = b + c
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2**n)


class AccuracyTest(TypedDict):
    """Model B against model A on the same tasks (B − A): the paired bootstrap's figures, the
    discordant counts and McNemar's p (None when an outcome is not 0 or 1, or no task paired)."""

    tasks: int
    accuracy_a: float | None
    accuracy_b: float | None
    mean_diff: float | None
    ci95: tuple[float, float] | None
    b_better: int  # tasks B gets right and A wrong (per-task pass@1 higher, with several samples)
    a_better: int
    ties: int
    binary: bool  # every paired task's outcome is 0 or 1 (one episode per task)
    mcnemar_p: float | None
    unpaired: int  # tasks only one side has: a target read from this test is not met while > 0


def accuracy_test(comparison: Comparison) -> AccuracyTest:
    """The accuracy part of a ``compare_runs`` result with McNemar's exact p added."""
    diff = comparison["metrics"][METRIC]
    values = [
        v
        for sides in comparison["per_task"].values()
        if sides["a"][METRIC] is not None and sides["b"][METRIC] is not None
        for v in (sides["a"][METRIC], sides["b"][METRIC])
    ]
    binary = bool(values) and all(v in (0.0, 1.0) for v in values)
    return {
        "tasks": diff["tasks"],
        "accuracy_a": diff["mean_a"],
        "accuracy_b": diff["mean_b"],
        "mean_diff": diff["mean_diff"],
        "ci95": diff["diff_ci95"],
        "b_better": diff["b_better"],
        "a_better": diff["a_better"],
        "ties": diff["ties"],
        "binary": binary,
        "mcnemar_p": mcnemar_exact(diff["b_better"], diff["a_better"]) if binary else None,
        "unpaired": len(comparison["only_in_a"]) + len(comparison["only_in_b"]),
    }


def above_zero(test: AccuracyTest) -> bool:
    """B above A: every task paired and the paired 95 % interval's lower bound above 0."""
    ci = test["ci95"]
    return test["unpaired"] == 0 and ci is not None and ci[0] > 0


class Accuracy(TypedDict):
    """One model's accuracy (pass@1) over tasks, with the 95 % bootstrap interval over tasks."""

    tasks: int
    accuracy: float | None
    ci95: tuple[float, float] | None


def accuracy_interval(records: Sequence[ReportRecord]) -> Accuracy:
    """The mean of the per-task pass@1 of an eval's records (missing episodes as placeholders,
    ``eval_report.load_eval``) and its percentile bootstrap over tasks: the interval a claim
    "accuracy above 0" is read from (the eval report gives one for reward and gate only)."""
    values = [v for m in per_task_means(records).values() if (v := m["pass@1"]) is not None]
    return {"tasks": len(values), "accuracy": mean(values), "ci95": bootstrap_ci([[v] for v in values])}
