"""The pipeline's tasks: the bank slice it reads and a seeded, family-stratified sample of each
split, written once into the run folder so every stage reads the same files."""

from __future__ import annotations

import hashlib
import json
import random
from collections import defaultdict
from pathlib import Path

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.learn.settings import SPLITS, BankSlice, Pipeline


def bank_folder(bank: BankSlice) -> Path:
    """The whole bank's cache folder, or a sibling keyed by the selected families and tables."""
    from deepanalyze_env.offline.bank.build import DEFAULT_SEED, cache_folder

    base = cache_folder(DEFAULT_SEED if bank.seed is None else bank.seed)
    picks = {k: sorted(v) for k, v in (("families", bank.families), ("tables", bank.tables)) if v}
    if not picks:
        return base
    key = hashlib.sha256(json.dumps(picks, sort_keys=True).encode()).hexdigest()[:10]
    return base.with_name(f"{base.name}-{key}")


def needs_judge(task: JsonObject) -> bool:
    from deepanalyze_env.core.profiles import PROFILES

    return PROFILES["v1"].build_plan(task["reward_spec"]).needs_judge


def sample_tasks(tasks: list[JsonObject], n: int, seed: int) -> list[JsonObject]:
    """``n`` tasks, family-stratified: families take turns, each in a seeded shuffled order."""
    by_family: dict[str, list[JsonObject]] = defaultdict(list)
    for task in tasks:
        by_family[str(task.get("family", ""))].append(task)
    rng = random.Random(seed)
    queues = []
    for family in sorted(by_family):
        items = list(by_family[family])
        rng.shuffle(items)
        queues.append(items)
    picked: list[JsonObject] = []
    while len(picked) < n and any(queues):
        for queue in queues:
            if queue and len(picked) < n:
                picked.append(queue.pop())
    return picked


def select_tasks(pipe: Pipeline, bank: Path, out: Path) -> dict[str, Path]:
    """Write each split's sample into ``out/tasks/<split>.jsonl``; the files used by every stage."""
    with_judge = bool(pipe.env.get("judge"))
    files = {}
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        n = pipe.tasks.get(split, 0 if split == "test" else 10**9)
        if n <= 0:
            continue
        rows = [json.loads(x) for x in (bank / "tasks" / f"{split}.jsonl").read_text().splitlines() if x]
        usable = [t for t in rows if with_judge or not needs_judge(t)]
        chosen = sample_tasks(usable, n, pipe.seed + SPLITS.index(split))
        if not chosen:
            raise ConfigError(f"{pipe.source}: the bank's {split} split has no task for this pipeline")
        path = out / "tasks" / f"{split}.jsonl"
        path.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in chosen))
        files[split] = path
    return files
