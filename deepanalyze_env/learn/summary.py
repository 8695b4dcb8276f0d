"""``learn.json``: what each stage contributes to the summary, read through the typed readers of
the modules that write the stages' results (an eval's ``report.json``, GRPO's ``metrics.jsonl``),
and the paired comparisons of consecutive dev evals."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from deepanalyze_env.core.memory import PeakFigures

if TYPE_CHECKING:  # the readers are imported when used: every CLI start imports this package
    from deepanalyze_env.offline.eval_schema import MetricDiff
    from deepanalyze_env.trainers.trl.train import StepTeach, StepTime


class Headline(TypedDict):
    """A stage's dev (or test) figures, over its planned episodes (a missing one counts as a failed
    gate; ``planned``/``finished``/``missing`` say how many there were)."""

    reward_mean: float | None
    reward_ci95: list[float] | None
    format_gate_pass_rate: float | None
    accuracy: float | None  # pass@1, when the tasks' methods have an accuracy component
    episodes: int
    planned: int | None
    finished: int
    missing: int | None
    missing_tasks: list[str]
    task_ids: list[str]
    status_rates: dict[str, float]
    pass_at: dict[str, float | None]  # k -> pass@k


class SampledHeadline(Headline):
    """The sampled dev eval: its figures, the temperature it sampled at and its k."""

    temperature: float
    k: int


class Coverage(TypedDict):
    """Whether every dev stage is over the same tasks, else which tasks each one lacks."""

    same_tasks: bool
    tasks: int
    lacking: dict[str, list[str]]


# A pair of consecutive dev stages: the paired differences per metric, and the unpaired tasks.
StageComparison = TypedDict(
    "StageComparison",
    {
        "reward": "MetricDiff",
        "pass@1": "MetricDiff",
        "format_gate": "MetricDiff",
        "only_in_a": list[str],
        "only_in_b": list[str],
    },
)


class GrpoStep(TypedDict):
    """The figures of one GRPO step the summary keeps (its ``metrics.jsonl`` line has more)."""

    step: int
    reward_mean: float | None
    components: dict[str, float]
    status_counts: dict[str, int]
    rollout_seconds: float | None
    time: StepTime | None
    teach: StepTeach | None
    memory: dict[str, PeakFigures] | None


class RftRound(TypedDict):
    """One round of rejection-sampling fine-tuning: its sample (``rft/roundN/sample``, read
    through the eval report) and what was kept from it (``offline/correct.py``'s counts)."""

    round: int
    model: str  # the model the round ends with (the one it started from when nothing was kept)
    sample: Headline  # the sample's figures at the round's temperature (accuracy: pass@1 of k)
    episodes: int  # sampled episodes (planned; a missing one counts as not correct)
    kept: int  # correct episodes: the round's SFT data
    tasks: int
    tasks_correct: int  # tasks with at least one correct episode
    trained: bool  # False: nothing was kept, no SFT ran, and the rounds stopped
    seconds: dict[str, float]  # sample / sft -> seconds (each its own process)
    memory: dict[str, PeakFigures]  # sample / sft -> its process tree's peak


class LearnSummary(TypedDict):
    """``learn.json``: what ``learn.md``, ``learn.png`` and the console table show."""

    pipeline: str
    coverage: Coverage
    model: str  # the last stage's model
    bank: str
    task_files: dict[str, str]  # split -> file
    tasks: dict[str, int]  # split -> tasks
    dev: dict[str, Headline]  # stage -> figures, in run order
    sampled: SampledHeadline | None
    test: Headline | None
    comparisons: dict[str, StageComparison]  # "a->b" -> paired comparison
    grpo_steps: list[GrpoStep]
    rft: list[RftRound]  # rejection-sampling rounds, in order (none without an rft stage)
    seconds: dict[str, float]  # stage -> seconds, and the total
    # each stage's peak memory (its whole process tree: kernel workers included); PSS counts a page
    # shared by several processes once
    memory: dict[str, PeakFigures]


def headline(eval_dir: Path) -> Headline:
    """An eval stage's figures, from its report."""
    from deepanalyze_env.offline.eval_report import read_report

    report = read_report(eval_dir)
    overall, counts = report["overall"], report["episodes"]
    pass_at = overall.get("pass_at", {})
    return {
        "reward_mean": overall["reward_mean"],
        "reward_ci95": overall["reward_ci95"],
        "format_gate_pass_rate": overall["format_gate_pass_rate"],
        "accuracy": pass_at["1"]["value"] if "1" in pass_at else None,
        "episodes": overall["episodes"],
        "planned": counts.get("planned"),
        "finished": counts.get("finished", overall["episodes"]),
        "missing": counts.get("missing"),
        "missing_tasks": counts.get("missing_tasks", []),
        "task_ids": counts.get("tasks", []),
        "status_rates": overall["status_rates"],
        "pass_at": {k: v["value"] for k, v in pass_at.items()},
    }


def coverage(dev: dict[str, Headline]) -> Coverage:
    """Whether every stage's figures are over the same tasks (the before/after table is only a
    comparison if they are); otherwise which tasks each stage lacks or adds."""
    sets = {stage: set(m.get("task_ids") or []) for stage, m in dev.items()}
    union: set[str] = set().union(*sets.values()) if sets else set()
    lacking = {stage: sorted(union - s) for stage, s in sets.items() if union - s}
    return {"same_tasks": not lacking, "tasks": len(union), "lacking": lacking}


def grpo_steps(metrics: Path) -> list[GrpoStep]:
    """GRPO's per-step figures from its ``metrics.jsonl`` (none when it wrote no file; a figure
    that a line from an older version lacks is None)."""
    from deepanalyze_env.trainers.trl.train import read_step_lines

    return [
        {
            "step": s["step"],
            "reward_mean": s.get("reward_mean"),
            "components": s.get("components", {}),
            "status_counts": s.get("status_counts", {}),
            "rollout_seconds": s.get("rollout_seconds"),
            "time": s.get("time"),
            "teach": s.get("teach"),
            "memory": s.get("memory"),
        }
        for s in read_step_lines(metrics)
    ]


def compare_stages(out: Path, order: list[str]) -> dict[str, StageComparison]:
    """Paired per-task comparisons of each stage with the one before it (dev), over planned
    episodes (missing ones as failures), naming the tasks that had no partner."""
    from deepanalyze_env.offline.eval_report import compare_runs, load_eval

    result: dict[str, StageComparison] = {}
    for a, b in itertools.pairwise(order):
        runs = [load_eval(out / f"eval-{name}")[0] for name in (a, b)]
        compared = compare_runs(*runs)
        metrics = compared["metrics"]
        result[f"{a}->{b}"] = {
            "reward": metrics["reward"],
            "pass@1": metrics["pass@1"],
            "format_gate": metrics["format_gate"],
            "only_in_a": compared["only_in_a"],
            "only_in_b": compared["only_in_b"],
        }
    return result
