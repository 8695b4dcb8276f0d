"""The correct episodes of a sampled run: what rejection-sampling fine-tuning trains on.

An episode is correct when it was scored, passed the format gate, and its accuracy — as the eval
report counts it (:func:`~deepanalyze_env.offline.eval_report.episode_accuracy` over the method's
accuracy component, :func:`~rewards.plan.spec_accuracy_component`) — is at or above the
threshold, the same rule as the report's pass@k. The gate and the status are checked here as
well, not left to the component: the report counts a ``verifier_error`` episode's accuracy when
the component was computed, and takes a computed component at its value whatever the gate said,
while SFT data must be an episode whose whole answer was accepted and whose reward is known.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from deepanalyze_env.core.records import write_jsonl_atomic
from deepanalyze_env.offline.eval_report import ReportRecord, episode_accuracy, load_eval, task_key
from rewards.plan import spec_accuracy_component


def is_correct(record: ReportRecord, threshold: float = 1.0) -> bool:
    """Scored, through the format gate, and accuracy at or above ``threshold`` (a method without
    an accuracy component has no correct episode)."""
    if record.get("reward_status") != "scored" or record.get("format_ok") is not True:
        return False
    accuracy = episode_accuracy(record, spec_accuracy_component(record.get("reward_spec")))
    return accuracy is not None and accuracy >= threshold


class CorrectCounts(TypedDict):
    """What a selection found: episodes read (missing planned ones included), kept, and tasks."""

    episodes: int
    kept: int
    tasks: int  # tasks sampled
    tasks_correct: int  # tasks with at least one kept episode


@dataclass(frozen=True)
class CorrectSelection:
    """The correct episodes of a run and the counts that describe them."""

    kept: list[ReportRecord]
    counts: CorrectCounts


def select_correct(records: Sequence[ReportRecord], threshold: float = 1.0) -> CorrectSelection:
    """The correct episodes of ``records`` (in their order) and the counts."""
    kept = [r for r in records if is_correct(r, threshold)]
    counts: CorrectCounts = {
        "episodes": len(records),
        "kept": len(kept),
        "tasks": len({task_key(r) for r in records}),
        "tasks_correct": len({task_key(r) for r in kept}),
    }
    return CorrectSelection(kept, counts)


def write_correct(folder: Path, out_file: Path, threshold: float = 1.0) -> CorrectCounts:
    """Select the correct episodes of the eval folder ``folder`` (its planned episodes, read as
    every report reads them) into the records file ``out_file``; returns the counts."""
    records, _ = load_eval(folder)
    selection = select_correct(records, threshold)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(out_file, selection.kept)
    return selection.counts
