"""An eval folder's ``report.json`` as types: what ``eval_report`` writes (``write_report``) and
what reads it back (``eval_report.read_report``: ``learn``'s stages and summary, the commands that
print a report). Kept apart from the statistics so the contract is read in one place."""

from __future__ import annotations

from typing import NotRequired, TypedDict


class EpisodeCounts(TypedDict):
    """How many episodes a report's figures are over (:func:`with_plan`); ``planned`` and
    ``missing`` are None for a folder without ``planned.json``."""

    planned: int | None
    finished: int
    missing: int | None
    tasks: list[str]  # the planned tasks (the recorded ones without a plan)
    missing_tasks: NotRequired[list[str]]
    unplanned: NotRequired[int]


class PassAt(TypedDict):
    """pass@k over the tasks measured at least k times (None when none was)."""

    value: float | None
    tasks: int  # tasks with at least k measured episodes


class Summary(TypedDict):
    """:func:`summarize`'s figures of one set of episodes, as ``report.json`` holds them (an
    interval is a ``[low, high]`` pair, or None without data)."""

    episodes: int
    finished: int
    missing: int
    tasks: int
    reward_mean: float | None
    reward_ci95: list[float] | None
    reward_n: int
    format_gate_pass_rate: float | None
    format_gate_ci95: list[float] | None
    accuracy_mean: float | None
    accuracy_n: int
    pass_at: dict[str, PassAt]  # k (as a string) -> pass@k
    components: dict[str, float | None]
    status_rates: dict[str, float]
    termination_rates: dict[str, float]
    turns_mean: float | None
    turns_max: int | None
    completion_tokens_mean: float | None
    assistant_chars_mean: float | None


class PairedDiff(TypedDict):
    """One metric of :func:`compare_runs`: per-task means of A and B over the paired tasks, B − A."""

    tasks: int
    mean_a: float | None
    mean_b: float | None
    mean_diff: float | None
    diff_ci95: list[float] | tuple[float, float] | None
    b_better: int
    a_better: int
    ties: int


class EvalReport(TypedDict):
    """An eval folder's ``report.json`` (:func:`build_report`, written by :func:`write_report`)."""

    episodes: EpisodeCounts
    overall: Summary
    samples_per_task: int
    pass_at_ks: list[int]
    accuracy_threshold: float
    accuracy_component: str | None
    breakdowns: dict[str, dict[str, Summary]]  # method/family/difficulty -> group -> figures
    definitions: list[str]
    folder: str
