"""The bank build: tables → workspaces → drafts → ground truth + gate → reference episodes → files.

Deterministic: every random choice comes from ``random.Random(f"{seed}:{table}:{family}")``
(so building a subset of families gives exactly those families' tasks of the full build), files
are written in sorted order, and records carry no times. Layout of ``--out``::

    manifest.json
    workspaces/<table>-<kind>/…         (workspace_root = the out folder, data = "workspaces")
    tasks/{train,dev,test}.jsonl          task files for rollout, prepare-data, training
    episodes/{train,dev,test}.jsonl       reference episodes (records) of the kept tasks
    trajectories.jsonl                    their assistant turns, for ``rollout --policy scripted``
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypedDict, Unpack

from deepanalyze_env.core.contracts import EpisodeRecord, JsonObject
from deepanalyze_env.generation.models import CACHE_ENV, cache_dir
from deepanalyze_env.offline.bank import BankError
from deepanalyze_env.offline.bank.families import FAMILIES, Draft, FamilyContext
from deepanalyze_env.offline.bank.families.base import Difficulty
from deepanalyze_env.offline.bank.quality import BankRewardSpec, judge, reward_spec, run_programs, summarise
from deepanalyze_env.offline.bank.sources import TABLES, describe
from deepanalyze_env.offline.bank.splits import MANIFEST, SPLITS, Manifest, file_hashes, manifest
from deepanalyze_env.offline.bank.workspaces import kinds_for, write_workspace

log = logging.getLogger(__name__)

DEFAULT_SEED = 13
# Drafts asked of each family per table, by split: the small dev/test table sets get more per
# table so that they reach their sizes.
PER_TABLE = {"train": 7, "dev": 4, "test": 4}
Progress = Callable[[str, int, int], None]  # (stage, done, total)


class TaskSource(TypedDict):
    """Where a task's table comes from (``tasks[].sources``)."""

    table: str
    package: str
    module: str
    extra: str | None


class BankTask(TypedDict):
    """One line of the bank's ``tasks/<split>.jsonl`` (a task file ``core.tasks`` reads)."""

    id: str
    method: str
    instruction: str
    input_seq: str
    data: str
    workspace_id: str
    reward_spec: BankRewardSpec
    family: str
    difficulty: Difficulty
    tables: list[str]
    sources: list[TaskSource]
    split: str


class BuildOptions(TypedDict, total=False):
    """What a build may be told besides its folder (:func:`build`, :func:`ensure`, :func:`check`)."""

    seed: int
    families: list[str] | None
    tables: list[str] | None
    per_table: dict[str, int] | None
    workers: int
    progress: Progress | None


@dataclass
class BuildResult:
    """What a bank build produced: the kept tasks, drop counts by reason, the reference-episode self-
    check and its failures, and the manifest written beside them."""

    out: Path
    tasks: list[BankTask]
    dropped: dict[str, int]
    self_check: dict[str, int]
    failures: list[str] = field(default_factory=list)
    manifest: Manifest | None = None


def _write_jsonl(path: Path, items: Iterable[object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for item in items:
            fh.write(json.dumps(item, ensure_ascii=False, sort_keys=True, allow_nan=False) + "\n")


def _task(draft: Draft, spec: BankRewardSpec, index: int, split: str) -> BankTask:
    src = TABLES[draft.table]
    return {
        "id": f"bank-{draft.family}-{draft.table}-{index:03d}",
        "method": spec["method"],
        "instruction": draft.instruction,
        "input_seq": draft.instruction,
        "data": "workspaces",
        "workspace_id": draft.workspace.id,
        "reward_spec": spec,
        "family": draft.family,
        "difficulty": draft.difficulty,
        "tables": [draft.table],
        "sources": [{"table": src.name, "package": src.package, "module": src.module, "extra": src.extra}],
        "split": split,
    }


def build(out: Path, **kwargs: Unpack[BuildOptions]) -> BuildResult:
    """Build the bank into ``out`` (created; must be empty or absent), atomically: the files are
    made in a sibling folder and renamed into place at the end, so an interrupted or failed build
    leaves nothing that blocks the next one (outputs do not depend on the folder's path)."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise BankError(f"--out {out} is not empty; give a new folder (or use --check to compare)")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        result = _build(staging, **kwargs)
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    result.out = out
    return result


def _drafts(
    ws_root: Path,
    table_names: list[str],
    families: list[str],
    seed: int,
    per_table: dict[str, int],
    tick: Progress,
) -> tuple[list[Draft], list[JsonObject]]:
    """Every family's drafts over every table (each family's RNG seeded by seed, table and family,
    so adding a family changes no other family's tasks), and each table's provenance."""
    drafts: list[Draft] = []
    sources = []
    for n, name in enumerate(table_names, 1):
        spec = TABLES[name]
        frame = spec.load()
        info = describe(spec, frame)
        sources.append(asdict(info))
        workspaces = {
            kind: write_workspace(ws_root, spec, frame, kind, seed, info.title, info.source)
            for kind in kinds_for(spec, len(frame))
        }
        for fam in families:
            family = FAMILIES[fam]
            if family.kinds and not any(k in workspaces for k in family.kinds):
                continue
            rng = random.Random(f"{seed}:{name}:{fam}")
            drafts.extend(family.make(FamilyContext(spec, frame, workspaces, rng, per_table[spec.split])))
        tick("tables", n, len(table_names))
    return drafts, sources


def _reference_episodes(
    kept: list[tuple[Draft, BankTask]], out: Path, workers: int, tick: Progress
) -> tuple[dict[str, EpisodeRecord], list[str]]:
    """Each kept task's reference episode played through the real env: the records of those
    that score full marks, and why the others did not (the self-check)."""
    from deepanalyze_env.offline.bank.episodes import EpisodeCheck, empty_judge_cache, play

    failures: list[str] = []
    records: dict[str, EpisodeRecord] = {}
    with tempfile.TemporaryDirectory(prefix="bank-judge-") as tmp:
        cache = empty_judge_cache(Path(tmp))
        done = 0

        def one(item: tuple[Draft, BankTask]) -> tuple[str, EpisodeCheck]:
            draft, task = item
            return task["id"], play(task, draft, out, cache)

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for task_id, check in pool.map(one, kept):
                done += 1
                tick("reference episodes", done, len(kept))
                if check.ok:
                    records[task_id] = check.record
                else:
                    failures.append(f"{task_id}: {'; '.join(check.problems)}")
    return records, failures


def _build(
    out: Path,
    *,
    seed: int = DEFAULT_SEED,
    families: list[str] | None = None,
    tables: list[str] | None = None,
    per_table: dict[str, int] | None = None,
    workers: int = 2,
    progress: Progress | None = None,
) -> BuildResult:
    names = families or sorted(FAMILIES)
    unknown = [f for f in names if f not in FAMILIES]
    if unknown:
        raise BankError(f"unknown families {', '.join(unknown)}; known: {', '.join(sorted(FAMILIES))}")
    table_names = tables or list(TABLES)
    if bad := [t for t in table_names if t not in TABLES]:
        raise BankError(f"unknown tables {', '.join(bad)}; known: {', '.join(sorted(TABLES))}")
    per_table = per_table or PER_TABLE
    tick = progress or (lambda stage, done, total: None)
    out.mkdir(parents=True, exist_ok=True)
    drafts, sources = _drafts(out / "workspaces", table_names, names, seed, per_table, tick)
    # ground truth from the kernel, then the gate
    reasons: Counter[str] = Counter()
    kept: list[tuple[Draft, BankTask]] = []
    seen: set[tuple[str, str, str]] = set()
    fresh: list[Draft] = []
    for d in drafts:
        key = (d.family, d.workspace.id, d.instruction)
        if key in seen:
            reasons["duplicate"] += 1
            continue
        seen.add(key)
        fresh.append(d)
    results = run_programs(fresh, out)
    tick("ground truth", len(fresh), len(fresh))
    per_group: Counter[tuple[str, str]] = Counter()
    tasks: list[BankTask] = []
    for d, (status, output) in zip(fresh, results, strict=True):
        truth, reason = judge(d, status, output)
        if reason is not None:
            reasons[reason] += 1
            log.debug("dropped %s/%s (%s): %s", d.family, d.table, reason, output[-300:])
            continue
        spec = reward_spec(d, truth)
        per_group[(d.family, d.table)] += 1
        task = _task(d, spec, per_group[(d.family, d.table)], TABLES[d.table].split)
        tasks.append(task)
        kept.append((d, task))
    records, failures = _reference_episodes(kept, out, workers, tick)
    if failures:
        reasons["self_check"] += len(failures)
    final = [t for t in tasks if t["id"] in records]
    for split in SPLITS:
        in_split = [t for t in final if t["split"] == split]
        _write_jsonl(out / "tasks" / f"{split}.jsonl", in_split)
        _write_jsonl(out / "episodes" / f"{split}.jsonl", [records[t["id"]] for t in in_split])
    # the reference turns in the scripted policy's format: `rollout --policy scripted` replays them
    _write_jsonl(
        out / "trajectories.jsonl",
        (
            {
                "task_id": t["id"],
                "label": "good",
                "kind": "reference",
                "turns": [m["content"] for m in records[t["id"]]["messages"] if m["role"] == "assistant"],
            }
            for t in final
        ),
    )
    dropped = summarise(reasons) | {"self_check": int(reasons.get("self_check", 0))}
    check_counts = {"played": len(kept), "passed": len(records), "failed": len(failures)}
    man = manifest(out, final, sources, seed, names, dropped, check_counts)
    (out / MANIFEST).write_text(
        json.dumps(man, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return BuildResult(out, final, dropped, check_counts, failures, man)


# What a build writes for a seed, as a number: raised by a change that alters the files (revision 2:
# references of three turns, inspect cells that print shape, dtypes and three rows). The cache
# folder names it, so a bank cached by an earlier revision is never reused as this one's: a cached
# bank is kept as long as its folder holds a manifest (``ensure``, ``learn``).
REVISION = 2


def cache_folder(seed: int = DEFAULT_SEED) -> Path:
    """Where the bank is built on first use: the project's cache folder (``DEEPANALYZE_CACHE``, else
    ``$XDG_CACHE_HOME/deepanalyze-env``, else ``~/.cache/deepanalyze-env``), one folder per seed
    and :data:`REVISION`."""
    name = f"bank-seed{seed}-r{REVISION}"
    if os.environ.get(CACHE_ENV):
        return cache_dir() / name
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "deepanalyze-env" / name


def ensure(out: Path | None = None, seed: int = DEFAULT_SEED, **kwargs: Unpack[BuildOptions]) -> Path:
    """The bank folder, built first if it holds no manifest (build on first use)."""
    out = out or cache_folder(seed)
    if not (out / MANIFEST).is_file():
        build(out, seed=seed, **kwargs)
    return out


def compare(built: Path, existing: Path) -> list[str]:
    """What differs between two builds, file by file (empty when byte-identical)."""
    if not existing.is_dir():
        raise BankError(f"--check: no bank at {existing}")
    a, b = file_hashes(built), file_hashes(existing)
    diffs = [f"only in the new build: {p}" for p in sorted(set(a) - set(b))]
    diffs += [f"only in {existing}: {p}" for p in sorted(set(b) - set(a))]
    diffs += [f"differs: {p}" for p in sorted(set(a) & set(b)) if a[p] != b[p]]
    ma, mb = (built / MANIFEST), (existing / MANIFEST)
    if ma.is_file() and mb.is_file() and ma.read_bytes() != mb.read_bytes() and not diffs:
        diffs.append(f"differs: {MANIFEST}")
    return diffs


def check(out: Path, **kwargs: Unpack[BuildOptions]) -> list[str]:
    """Rebuild into a temporary folder and compare with ``out``."""
    with tempfile.TemporaryDirectory(prefix="bank-check-") as tmp:
        fresh = Path(tmp) / "bank"
        build(fresh, **kwargs)
        return compare(fresh, out)
