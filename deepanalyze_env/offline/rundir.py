"""A ``rollout`` run folder: its manifest, resuming without duplicates or gaps, derived views.

Layout of ``--out DIR``::

    run.json                      what the run is (id, tasks, samples, policy) — checked on --resume
    records/episodes-<host>-<pid>.jsonl   written by the env, one line per finished episode
    episodes.jsonl                every episode, in task/sample order (rebuilt at the end of a run)
    kept.jsonl                    the episodes ``--keep`` selects, same order (for SFT)
    planned.json                  every planned episode (id, task) and each task's reward spec:
                                  what reports count a missing episode against
    rescored-<timestamp>.jsonl    written later by ``rescore``; never replaces the above

The per-process files are the source of truth (a killed run has nothing else); the ordered
views are rebuilt from them atomically, so they are never half written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal, TypedDict

from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.core.records import (
    EPISODES_FILE,
    RECORDS_SUBDIR,
    package_version,
    raw_record_files,
    repair_torn_tail,
    task_hash,
)
from deepanalyze_env.core.tasks import env_extras

if TYPE_CHECKING:
    from deepanalyze_env.offline.rollout import EpisodeJob

log = logging.getLogger(__name__)

MANIFEST = "run.json"
KEPT_FILE = "kept.jsonl"
PLAN_FILE = "planned.json"
# Settings a resumed run must share with the run it finishes (else ids would mean other episodes).
PINNED = ("task_fingerprint", "samples", "labels", "policy")


class RunDirError(ValueError):
    """The folder cannot hold (or resume) this run; the message says what to do."""


def task_fingerprint(rows: Sequence[JsonObject]) -> str:
    items = [[str(r.get("task_id")), task_hash(env_extras(r)), r.get("prompt")] for r in rows]
    return hashlib.sha256(json.dumps(items, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunSettings:
    """What a run is, as ``run.json`` records it: the tasks, how many samples of each, the policy
    and its settings. A resumed run must share the :data:`PINNED` ones with the run it finishes."""

    kind: Literal["rollout", "eval", "collect"]
    tasks: list[str]  # the task files, as given
    task_fingerprint: str  # of the loaded rows (:func:`task_fingerprint`): same ids, same tasks
    samples: int
    labels: list[str] | None  # a scripted policy's trajectory labels
    policy: str  # the policy id
    policy_settings: JsonObject
    keep: str | None = None  # the record filter behind ``kept.jsonl``


@dataclass
class RunDir:
    """A rollout/eval run folder and its ``run.json`` manifest: the one place that knows its layout,
    what is recorded and what is still pending."""

    path: Path
    manifest: JsonObject  # run.json as read: RunSettings' fields plus run_id, created, package, resumed

    @property
    def run_id(self) -> str:
        return str(self.manifest["run_id"])

    @property
    def records_dir(self) -> Path:
        return self.path / RECORDS_SUBDIR

    @classmethod
    def open(
        cls, path: str | Path, run_settings: RunSettings, *, resume: bool, run_id: str | None = None
    ) -> RunDir:
        """Start a new run in ``path`` or (``resume``) reopen the one there, checking it matches."""
        path = Path(path)
        settings = asdict(run_settings)
        manifest_path = path / MANIFEST
        if manifest_path.is_file():
            manifest = json.loads(manifest_path.read_text())
            if not resume:
                raise RunDirError(
                    f"{path} already holds run {manifest.get('run_id')}; pass --resume to finish it "
                    "or choose another --out"
                )
            for key in PINNED:
                if manifest.get(key) != settings.get(key):
                    raise RunDirError(
                        f"--resume: this command's {key} differs from the run in {path} "
                        f"({settings.get(key)!r} vs {manifest.get(key)!r}); resume with the same "
                        "tasks, samples, labels and policy, or choose another --out"
                    )
            if settings.get("keep") is not None:
                manifest["keep"] = settings["keep"]
            manifest["resumed"] = [*manifest.get("resumed", []), _now()]
            run = cls(path, manifest)
            run.save()
            return run
        if resume:
            raise RunDirError(f"--resume: {path} holds no run to resume ({MANIFEST} is missing)")
        if raw_record_files(path) or (path / EPISODES_FILE).exists():
            raise RunDirError(f"{path} already holds episode records; choose another --out")
        path.mkdir(parents=True, exist_ok=True)
        manifest = {
            "run_id": run_id or f"r{time.strftime('%Y%m%d')}-{secrets.token_hex(3)}",
            "created": _now(),
            "package": package_version(),
            **settings,
        }
        run = cls(path, manifest)
        run.save()
        return run

    def save(self) -> None:
        tmp = self.path / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(self.manifest, indent=2, ensure_ascii=False, default=str) + "\n")
        tmp.replace(self.path / MANIFEST)

    def write_plan(self, jobs: Sequence[EpisodeJob]) -> None:
        """Record every planned episode (``EpisodeJob``-like: ``episode_id``, ``task_id``, ``row``)
        before any runs: an episode that raises leaves no record, and without the plan a report
        could only count the survivors."""
        specs: dict[str, JsonObject | None] = {}
        for job in jobs:
            spec = job.row.get("reward_spec")
            if isinstance(spec, str):
                try:
                    spec = json.loads(spec)
                except ValueError:
                    spec = None
            specs.setdefault(job.task_id, spec if isinstance(spec, dict) else None)
        plan: Plan = {
            "episodes": [{"episode_id": job.episode_id, "task_id": job.task_id} for job in jobs],
            "reward_specs": specs,
        }
        tmp = self.path / f".{PLAN_FILE}.tmp"
        tmp.write_text(json.dumps(plan, ensure_ascii=False, default=str) + "\n")
        tmp.replace(self.path / PLAN_FILE)

    def repair(self) -> int:
        """Cut torn last lines off the per-process files (a writer killed mid-line); bytes removed."""
        return sum(repair_torn_tail(p) for p in raw_record_files(self.path) if p.parent == self.records_dir)

    def existing_ids(self) -> set[str]:
        return set(self._index())

    def pending(self, episode_ids: Sequence[str]) -> list[str]:
        """What a (resumed) run still has to do: repair torn tails, then the ids not yet recorded,
        in the given order. A killed run resumes with no duplicate and no gap."""
        self.repair()
        done = self.existing_ids()
        return [eid for eid in episode_ids if eid not in done]

    def missing(self, episode_ids: Sequence[str]) -> int:
        """How many of ``episode_ids`` have no record (episodes that failed or were interrupted)."""
        return len(set(episode_ids) - self.existing_ids())

    def _index(self, keep: Callable[[JsonObject], bool] | None = None) -> dict[str, _Line]:
        """Where each episode's line is (last copy wins), without holding the records in memory:
        a long teacher run has more record bytes than a machine has RAM."""
        index: dict[str, _Line] = {}
        for source in sorted(self.records_dir.glob("episodes-*.jsonl")):
            with open(source, "rb") as fh:
                offset = 0
                for raw in fh:
                    if raw.endswith(b"\n") and raw.strip():  # a torn tail is not an episode
                        try:
                            record = json.loads(raw)
                        except ValueError:
                            raise RunDirError(f"{source}: the line at byte {offset} is not valid JSON")
                        kept = keep(record) if keep is not None else False
                        index[str(record.get("episode_id"))] = _Line(source, offset, len(raw), kept)
                    offset += len(raw)
        return index

    def consolidate(
        self, order: Sequence[str], keep: Callable[[JsonObject], bool] | None = None
    ) -> tuple[int, int | None]:
        """Rebuild ``episodes.jsonl`` (and ``kept.jsonl``) in job order; returns their sizes.

        Lines are copied byte for byte. An id written twice (only possible if two processes ran
        one --out at once) keeps its last copy, so the views never hold a duplicate.
        """
        index = self._index(keep)
        position = {eid: i for i, eid in enumerate(order)}
        ids = sorted(index, key=lambda eid: position.get(eid, len(position)))
        n = _copy_lines(self.path / EPISODES_FILE, [index[i] for i in ids])
        kept = None
        if keep is not None:
            kept = _copy_lines(self.path / KEPT_FILE, [index[i] for i in ids if index[i].kept])
        return n, kept


@dataclass(frozen=True)
class _Line:
    path: Path
    offset: int
    length: int
    kept: bool


def _copy_lines(target: Path, lines: Sequence[_Line]) -> int:
    """Write ``lines`` (copied from their files) to ``target`` atomically (temp file + rename)."""
    tmp = target.with_name(f".{target.name}.tmp")
    handles: dict[Path, IO[bytes]] = {}
    try:
        with open(tmp, "wb") as out:
            for line in lines:
                fh = handles.get(line.path) or handles.setdefault(line.path, open(line.path, "rb"))  # noqa: SIM115
                fh.seek(line.offset)
                out.write(fh.read(line.length))
        os.replace(tmp, target)
    finally:
        for fh in handles.values():
            fh.close()
        tmp.unlink(missing_ok=True)
    return len(lines)


class PlannedEpisode(TypedDict):
    """One planned episode: its id and its task."""

    episode_id: str
    task_id: str


class Plan(TypedDict):
    """``planned.json``: every planned episode, and each task's reward spec (None: unreadable),
    what a report counts a missing episode against (``eval_report.with_plan``)."""

    episodes: list[PlannedEpisode]
    reward_specs: dict[str, JsonObject | None]


def read_plan(path: str | Path) -> Plan | None:
    """A run folder's ``planned.json``, or None (a folder made before plans were written)."""
    file = Path(path) / PLAN_FILE
    if not file.is_file():
        return None
    plan: Plan = json.loads(file.read_text())
    return plan


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
