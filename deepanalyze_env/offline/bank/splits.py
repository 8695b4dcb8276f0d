"""Splits by table and the manifest.

A table belongs to exactly one split (``sources.TABLES``), and every task inherits the split of
its table, so train, dev and test share no table: dev/test measure generalisation to tables the
policy never saw. The manifest records the counts per family × split × method, the sources with
their licence text, the seed, the versions that produced the build, the tasks dropped per
reason, and the sha256 of every file (what ``bank build --check`` compares).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from deepanalyze_env.core.contracts import JsonObject

if TYPE_CHECKING:
    from deepanalyze_env.offline.bank.build import BankTask

SPLITS = ("train", "dev", "test")
VERSION_PACKAGES = ("deepanalyze-env", "pandas", "numpy", "scipy", "statsmodels", "scikit-learn", "openpyxl")
MANIFEST = "manifest.json"


class Counts(TypedDict):
    """Tasks per split, and per family × split × method."""

    per_split: dict[str, int]
    family_split_method: dict[str, dict[str, dict[str, int]]]


class Manifest(TypedDict):
    """The bank's ``manifest.json`` (:func:`manifest`)."""

    seed: int
    families: list[str]
    versions: dict[str, str]  # package → version that produced the build
    counts: Counts
    tables_per_split: dict[str, list[str]]
    dropped: dict[str, int]  # reason → drafts dropped
    self_check: dict[str, int]  # reference episodes played, passed, failed
    sources: list[JsonObject]  # each table's provenance (``sources.describe``)
    files: dict[str, str]  # path → sha256


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in VERSION_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def disjoint_by_table(tasks: list[BankTask]) -> dict[str, set[str]]:
    """Tables per split; raises when a table appears in two splits."""
    tables: dict[str, set[str]] = {s: set() for s in SPLITS}
    for task in tasks:
        tables[task["split"]].update(task["tables"])
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1 :]:
            shared = tables[a] & tables[b]
            if shared:
                raise ValueError(f"splits {a} and {b} share tables {sorted(shared)}")
    return tables


def counts(tasks: list[BankTask]) -> Counts:
    by = Counter((t["family"], t["split"], t["method"]) for t in tasks)
    table: dict[str, dict[str, dict[str, int]]] = {}
    for (family, split, method), n in sorted(by.items()):
        table.setdefault(family, {}).setdefault(split, {})[method] = n
    per_split = Counter(t["split"] for t in tasks)
    return {"per_split": {s: per_split.get(s, 0) for s in SPLITS}, "family_split_method": table}


def file_hashes(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and rel != MANIFEST:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def manifest(
    root: Path,
    tasks: list[BankTask],
    sources: list[JsonObject],
    seed: int,
    families: list[str],
    dropped: dict[str, int],
    self_check: dict[str, int],
) -> Manifest:
    tables = disjoint_by_table(tasks)
    return {
        "seed": seed,
        "families": families,
        "versions": versions(),
        "counts": counts(tasks),
        "tables_per_split": {s: sorted(v) for s, v in tables.items()},
        "dropped": dropped,
        "self_check": self_check,
        "sources": sources,
        "files": file_hashes(root),
    }
