"""An eval folder's ``report.json`` and ``eval --compare``'s result as types: what
``eval_report`` builds and writes, and what reads them back (``eval_report.read_report``:
``learn``'s stages and summary, the commands that print a report). Kept apart from the
statistics so the contract is read in one place."""

from __future__ import annotations

from typing import NotRequired, TypedDict


class EpisodeCounts(TypedDict):
    """Planned, finished and missing episodes (:func:`with_plan`); ``planned`` and ``missing`` are
    None for a folder without ``planned.json``, which also lacks the other optional keys."""

    planned: int | None
    finished: int
    missing: int | None
    tasks: list[str]
    missing_tasks: NotRequired[list[str]]
    unplanned: NotRequired[int]  # records whose episode the plan does not name


class PassAt(TypedDict):
    """pass@k of a group, and over how many tasks (those with at least k measured episodes)."""

    value: float | None
    tasks: int


class Summary(TypedDict):
    """Every metric of one group of episodes (:func:`summarize`; see :data:`DEFINITIONS`)."""

    episodes: int
    finished: int
    missing: int
    tasks: int
    reward_mean: float | None
    reward_ci95: tuple[float, float] | None
    reward_n: int
    format_gate_pass_rate: float | None
    format_gate_ci95: tuple[float, float] | None
    accuracy_mean: float | None
    accuracy_n: int
    pass_at: dict[str, PassAt]  # str(k) → pass@k
    components: dict[str, float | None]
    status_rates: dict[str, float]
    # reward_error_cause → share of the episodes (every cause); absent from reports written before it
    verifier_error_rates: NotRequired[dict[str, float]]
    termination_rates: dict[str, float]
    turns_mean: float | None
    turns_max: int | None
    completion_tokens_mean: float | None
    assistant_chars_mean: float | None


class EvalReport(TypedDict):
    """``report.json`` of an eval folder (:func:`build_report`, :func:`write_report`)."""

    episodes: EpisodeCounts
    overall: Summary
    samples_per_task: int
    pass_at_ks: list[int]
    accuracy_threshold: float
    accuracy_component: str | None  # the --accuracy-component override; None: each method's own
    breakdowns: dict[str, dict[str, Summary]]  # method/family/difficulty → group name → metrics
    definitions: list[str]
    folder: NotRequired[str]  # set by write_report


TaskMeans = TypedDict(
    "TaskMeans", {"reward": float | None, "pass@1": float | None, "format_gate": float | None}
)
"""One task's means that ``--compare`` pairs (:func:`per_task_means`): scored reward, pass@1 and
format-gate pass rate (the functional form: ``pass@1`` is not an identifier)."""


class MetricDiff(TypedDict):
    """One metric of a comparison: paired per-task differences B − A."""

    tasks: int
    mean_a: float | None
    mean_b: float | None
    mean_diff: float | None
    diff_ci95: tuple[float, float] | None
    b_better: int
    a_better: int
    ties: int


class Comparison(TypedDict):
    """``eval --compare``'s result (:func:`compare_runs`)."""

    metrics: dict[str, MetricDiff]  # one per TASK_METRICS
    per_task: dict[str, dict[str, TaskMeans]]  # task → "a" / "b" → its means
    only_in_a: list[str]
    only_in_b: list[str]
    definitions: list[str]
    a: NotRequired[str]  # the folders' labels, added by ``eval --compare``
    b: NotRequired[str]
