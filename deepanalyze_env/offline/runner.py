"""One runner for ``rollout``, ``eval`` and ``collect``: open the run folder, plan every episode,
skip the recorded ones, run the rest with a progress bar.

Every command that records episodes into a run folder opens it the same way (:func:`open_run`:
the manifest checked on ``--resume``, the env told where to write, each task's breakdown fields
for the report), plans the same jobs (:func:`plan_pending`: written before any episode runs, since
one whose job raises leaves no record and the plan still counts it) and runs what is pending.
``rollout`` and ``eval`` run their jobs here (:func:`run_planned`); ``collect`` runs them with
outside agents (``serve/collect.py``). Only what they do with the results differs (a table, or an
eval report), so that part stays in the commands.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.offline.eval_report import TASKS_FILE, task_meta, write_json
from deepanalyze_env.offline.policies import Policy
from deepanalyze_env.offline.report import progress_bar
from deepanalyze_env.offline.rollout import EpisodeJob, EpisodeOutcome, plan_jobs, run_jobs
from deepanalyze_env.offline.rundir import RunDir, RunSettings


class NothingToRun(ValueError):
    """No episode was planned: no scripted trajectory matches the tasks and labels."""


@dataclass
class RunOutcome:
    """What a run did: the planned jobs, the outcomes of the ones it ran, how many were recorded
    before it started, and whether Ctrl-C stopped it."""

    jobs: list[EpisodeJob]
    results: list[EpisodeOutcome] = field(default_factory=list)
    done_before: int = 0
    interrupted: bool = False

    @property
    def episode_ids(self) -> list[str]:
        return [job.episode_id for job in self.jobs]

    @property
    def failed(self) -> list[EpisodeOutcome]:
        """Episodes that did not finish for a reason other than Ctrl-C (not recorded)."""
        return [r for r in self.results if not r.finished and r.failure != "interrupted"]


def scripted_labels(policy: Any, labels: str) -> tuple[list[str], Callable[[str], list[str]]]:
    """``--labels a,b`` for a scripted policy: the labels, and per task the ones it has."""
    chosen = [x.strip() for x in labels.split(",") if x.strip()]

    def labels_for(task_id: str) -> list[str]:
        return [label for label in chosen if label in policy.labels_for(task_id)]

    return chosen, labels_for


def progress_info(results: Sequence[EpisodeOutcome]) -> str:
    """The progress bar's live field: mean reward over scored episodes and the status counts."""
    scored = [r.reward for r in results if r.status == "scored" and r.reward is not None]
    mean = f"{sum(scored) / len(scored):+.3f}" if scored else "–"
    counts = Counter(r.status for r in results)
    parts = [f"mean reward {mean}"] + [f"{k} {v}" for k, v in sorted(counts.items())]
    return " · ".join(parts)


def open_run(
    out: str | Path,
    settings: RunSettings,
    rows: Sequence[JsonObject],
    env_config: JsonObject,
    *,
    resume: bool,
    run_id: str | None = None,
) -> RunDir:
    """Start (or, with ``resume``, reopen) the run folder ``out``; point the env's records at it
    (``records_dir`` in ``env_config``) and write each task's method, family and difficulty
    (``tasks.json``, the report's breakdowns). Raises ``RunDirError`` when the folder cannot hold
    this run."""
    run = RunDir.open(out, settings, resume=resume, run_id=run_id)
    env_config["records_dir"] = str(run.records_dir)
    write_json(run.path / TASKS_FILE, task_meta(list(rows)))
    return run


def plan_pending(
    rows: Sequence[JsonObject],
    run: RunDir | None,
    run_id: str,
    samples: int,
    labels_for: Callable[[str], list[str]] | None = None,
) -> tuple[list[EpisodeJob], list[EpisodeJob]]:
    """Plan ``samples`` episodes per task (and label), write the plan into ``run``; every planned
    job and those ``run`` has not recorded yet. Raises :class:`NothingToRun` when nothing is
    planned and ``RunDirError`` when the folder's records do not belong to this plan."""
    jobs = plan_jobs(list(rows), run_id, samples, labels_for)
    if not jobs:
        raise NothingToRun("no episodes to run: no scripted trajectory matches these tasks and labels")
    if run is None:
        return jobs, jobs
    run.write_plan(jobs)  # before any episode: one that raises leaves no record, the plan counts it
    pending = set(run.pending([job.episode_id for job in jobs]))
    return jobs, [job for job in jobs if job.episode_id in pending]


def run_planned(
    rows: Sequence[JsonObject],
    env_config: JsonObject,
    policy: Policy,
    *,
    samples: int,
    labels_for: Callable[[str], list[str]] | None,
    run: RunDir | None,
    run_id: str,
    concurrency: int,
    label: str,
    console: Console,
    eta: bool = False,
) -> RunOutcome:
    """Run the episodes :func:`plan_pending` leaves to do, with a progress bar (Ctrl-C stops it
    and says so in the outcome)."""
    jobs, left = plan_pending(rows, run, run_id, samples, labels_for)
    outcome = RunOutcome(jobs, done_before=len(jobs) - len(left))
    stop = threading.Event()
    with progress_bar(label, total=len(jobs), console=console, completed=outcome.done_before, eta=eta) as (
        progress,
        bar,
    ):

        def on_result(result: EpisodeOutcome) -> None:
            outcome.results.append(result)
            progress.update(bar, advance=1 if result.finished else 0, info=progress_info(outcome.results))

        try:
            run_jobs(left, env_config, policy, concurrency=concurrency, on_result=on_result, stop=stop)
        except KeyboardInterrupt:
            outcome.interrupted = True
    return outcome
