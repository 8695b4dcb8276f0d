"""Export run records as a Hub-ready dataset folder (``deepanalyze-rl export``).

The folder is what ``datasets.load_dataset(DIR)`` loads directly and what ``hf upload`` pushes:
``data/<split>-NNNNN-of-NNNNN.parquet`` shards and a ``README.md`` dataset card
(:mod:`.export_card`) whose YAML header is Hub metadata (licence, task categories, tags,
``configs`` with ``data_files``, the features) and whose body says how the data was made —
versions, judge, kernel, policies, filter, counts and the ``stats`` figures — because a
trajectory dataset without its provenance cannot be compared with anything.

Columns: the record's scalar fields as they are; ``messages`` as a list of ``{role, content}``
(what TRL's ``SFTTrainer`` reads); ``reward_components`` as a struct with one field per
component (null where an episode lacks it); the free-form nested fields (``reward_spec``,
``exec``, ``judge``, ``usage``, ``versions``, ``timings``) as JSON text, since their shapes
differ between methods and runs and Parquet needs one schema.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NotRequired, TypedDict

from deepanalyze_env.core.contracts import EpisodeRecord, JsonValue
from deepanalyze_env.core.filters import DERIVED, RecordFilter
from deepanalyze_env.core.records import load_run
from deepanalyze_env.offline.export_card import SourceInfo, card_body, card_metadata
from deepanalyze_env.offline.rundir import MANIFEST

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

JSON_COLUMNS = ("reward_spec", "exec", "judge", "usage", "agent", "versions", "timings")
SHARD_ROWS = 5000
SPLIT_NAME = re.compile(r"^\w+(\.\w+)*$")  # what the Hub accepts as a split name
# Fields --split-by can name besides the record's own (see filters.DERIVED for method).
SPLIT_FIELDS: dict[str, Callable[[EpisodeRecord], JsonValue]] = {
    **DERIVED,
    "policy_id": lambda r: (r.get("versions") or {}).get("policy_id"),
    "profile": lambda r: (r.get("versions") or {}).get("profile"),
}


class ExportError(ValueError):
    """The export cannot be made as asked; the message says why."""


@dataclass
class ExportReport:
    """What an export wrote (episodes in, rows per split, shards, duplicates dropped), for the command's
    summary and its tests."""

    out: Path
    episodes_in: int
    split_counts: dict[str, int]
    shards: list[Path]
    duplicates: list[str] = field(default_factory=list)
    dropped_by_splits: int = 0


class Message(TypedDict):
    """A message of the ``messages`` column: what TRL's SFTTrainer reads."""

    role: str
    content: str


class ExportRow(TypedDict):
    """One row of the exported dataset (:func:`to_row`; its columns: :func:`arrow_schema`,
    :data:`COLUMN_DOCS`). The record's nested fields (:data:`JSON_COLUMNS`) follow as JSON text."""

    episode_id: str
    run: str
    task_id: str | None
    task_hash: str | None
    method: str | None
    policy_id: str | None
    input_seq: str | None
    data: str | None
    workspace_id: str | None
    messages: list[Message]
    reward: float | None
    reward_status: str | None
    reward_error_cause: str | None
    format_ok: bool | None
    gate: str | None
    termination: str | None
    code_pass: list[int]
    turns: int | None
    error: str | None
    reward_components: NotRequired[dict[str, float | None]]
    reward_spec: str | None  # the JSON_COLUMNS: the record's nested fields as JSON text
    exec: str | None
    judge: str | None
    usage: str | None
    agent: str | None
    versions: str | None
    timings: str | None


SplitRule = tuple[Literal["fraction"], dict[str, float]] | tuple[Literal["filter"], dict[str, RecordFilter]]
"""``--splits`` read (:func:`parse_splits`): fractions by task, or filter expressions per split."""


# ---------------------------------------------------------------------------- splits


def split_field_value(record: EpisodeRecord, name: str) -> JsonValue:
    if name in SPLIT_FIELDS:
        return SPLIT_FIELDS[name](record)
    return record.get(name)


def split_name(value: JsonValue) -> str:
    name = re.sub(r"\W+", "_", str(value)).strip("_")
    return name or "none"


def parse_splits(specs: Sequence[str]) -> SplitRule:
    """``NAME=FRACTION …`` (by task, so a task's samples never straddle splits) or ``NAME=EXPR …``
    (first matching expression wins). Returns ("fraction" | "filter", {name: value})."""
    parsed: dict[str, str] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        name = name.strip()
        if not sep or not value.strip():
            raise ExportError(f"--splits {spec!r}: expected NAME=FRACTION or NAME=EXPR")
        if not SPLIT_NAME.match(name):
            raise ExportError(f"--splits: {name!r} is not a valid split name (letters, digits, _ and .)")
        if name in parsed:
            raise ExportError(f"--splits: split {name!r} is given twice")
        parsed[name] = value.strip()
    fractions: dict[str, float] = {}
    for name, value in parsed.items():
        try:
            fractions[name] = float(value)
        except ValueError:
            break
    if len(fractions) == len(parsed):
        if any(not (0 < f <= 1) for f in fractions.values()):
            raise ExportError("--splits: fractions must be in (0, 1]")
        if not math.isclose(sum(fractions.values()), 1.0, abs_tol=1e-6):
            raise ExportError(f"--splits: fractions sum to {sum(fractions.values()):g}, not 1")
        return "fraction", fractions
    if fractions:
        raise ExportError("--splits: use fractions for every split or expressions for every split, not both")
    return "filter", {name: RecordFilter(expr) for name, expr in parsed.items()}


def _task_position(task_id: str) -> float:
    """A task's fixed place in [0, 1): the same task id lands in the same split in every export."""
    digest = hashlib.sha256(task_id.encode("utf-8", "replace")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_splits(
    records: Sequence[EpisodeRecord], split_by: str | None, splits: Sequence[str] | None
) -> tuple[dict[str, list[EpisodeRecord]], int]:
    """Records per split name (in record order) and how many no split took."""
    out: dict[str, list[EpisodeRecord]] = defaultdict(list)
    dropped = 0
    if split_by:
        known = {*SPLIT_FIELDS, *(k for r in records for k in r)}
        if split_by not in known:
            raise ExportError(f"--split-by {split_by!r}: not a record field (or method, policy_id, profile)")
        names: dict[str, str] = {}
        for record in records:
            value = split_field_value(record, split_by)
            if isinstance(value, dict | list):
                raise ExportError(
                    f"--split-by {split_by!r}: the field holds {type(value).__name__}s, not values"
                )
            name = split_name(value)
            if names.setdefault(name, str(value)) != str(value):
                raise ExportError(
                    f"--split-by {split_by!r}: values {names[name]!r} and {value!r} "
                    f"both become split {name!r}"
                )
            out[name].append(record)
    elif splits:
        rule = parse_splits(splits)
        if rule[0] == "fraction":
            bounds = []
            acc = 0.0
            for name, frac in rule[1].items():
                acc += frac
                bounds.append((acc, name))
            for record in records:
                pos = _task_position(str(record.get("task_id")))
                name = next((n for b, n in bounds if pos < b), bounds[-1][1])
                out[name].append(record)
        else:
            for record in records:
                name = next((n for n, flt in rule[1].items() if flt(record)), None)
                if name is None:
                    dropped += 1
                else:
                    out[name].append(record)
    else:
        out["train"] = list(records)
    return dict(out), dropped


# ---------------------------------------------------------------------------- rows


def to_row(record: EpisodeRecord, components: Sequence[str], run: str) -> ExportRow:
    versions = record.get("versions") or {}
    comps = record.get("reward_components") or {}
    reward = record.get("reward")
    row: ExportRow = {
        "episode_id": str(record.get("episode_id")),
        "run": run,
        "task_id": _str_or_none(record.get("task_id")),
        "task_hash": _str_or_none(record.get("task_hash")),
        "method": _str_or_none(DERIVED["method"](record)),
        "policy_id": _str_or_none(versions.get("policy_id")),
        "input_seq": _str_or_none(record.get("input_seq")),
        "data": _str_or_none(record.get("data")),
        "workspace_id": _str_or_none(record.get("workspace_id")),
        "messages": [
            Message(role=str(m.get("role")), content=str(m.get("content") or ""))
            for m in record.get("messages") or []
        ],
        # an unscored episode's reward is a placeholder (0.0), never a reward a dataset should average
        "reward": float(reward)
        if isinstance(reward, int | float) and record.get("reward_status") == "scored"
        else None,
        "reward_status": _str_or_none(record.get("reward_status")),
        "reward_error_cause": _str_or_none(record.get("reward_error_cause")),
        "format_ok": record.get("format_ok") if isinstance(record.get("format_ok"), bool) else None,
        "gate": _str_or_none(record.get("gate")),
        "termination": _str_or_none(record.get("termination")),
        "code_pass": [int(p) for p in record.get("code_pass") or []],
        "turns": int(record["turns"]) if isinstance(record.get("turns"), int) else None,
        "error": _str_or_none(record.get("error")),
    }
    if components:
        row["reward_components"] = {c: float(comps[c]) if c in comps else None for c in components}
    for name in JSON_COLUMNS:
        value = record.get(name)
        row[name] = (
            None if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
        )
    return row


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def arrow_schema(components: Sequence[str]) -> pa.Schema:
    import pyarrow as pa

    fields = [
        ("episode_id", pa.string()),
        ("run", pa.string()),
        ("task_id", pa.string()),
        ("task_hash", pa.string()),
        ("method", pa.string()),
        ("policy_id", pa.string()),
        ("input_seq", pa.string()),
        ("data", pa.string()),
        ("workspace_id", pa.string()),
        ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("reward", pa.float64()),
        ("reward_status", pa.string()),
        ("reward_error_cause", pa.string()),
        ("format_ok", pa.bool_()),
        ("gate", pa.string()),
        ("termination", pa.string()),
        ("code_pass", pa.list_(pa.int64())),
        ("turns", pa.int64()),
        ("error", pa.string()),
    ]
    if components:
        fields.append(("reward_components", pa.struct([(c, pa.float64()) for c in components])))
    fields += [(name, pa.string()) for name in JSON_COLUMNS]
    return pa.schema(fields)


# ---------------------------------------------------------------------------- export


def _source_info(path: Path, episodes: int) -> SourceInfo:
    info = SourceInfo(path=str(path), episodes=episodes)
    manifest = path / MANIFEST if path.is_dir() else None
    if manifest is not None and manifest.is_file():
        data = json.loads(manifest.read_text())
        for key in ("run_id", "created", "policy", "samples"):
            if data.get(key) is not None:
                info[key] = data[key]
        tasks = ", ".join(Path(t).name for t in data.get("tasks") or [])
        if tasks:
            info["tasks"] = tasks
    return info


def _read_sources(
    sources: Sequence[str | Path], rescored: bool
) -> tuple[list[EpisodeRecord], dict[str, str], list[SourceInfo], list[str], int]:
    """Records of every run in order, the run each episode id came from (first copy wins), each
    source's summary, the duplicate ids and the number of episodes read."""
    records: list[EpisodeRecord] = []
    run_of: dict[str, str] = {}
    source_info = []
    duplicates: list[str] = []
    episodes_in = 0
    for source in sources:
        path = Path(source)
        run = load_run(path, rescored=rescored)
        source_info.append(_source_info(path, len(run.records)))
        for record in run.records:
            episodes_in += 1
            eid = str(record.get("episode_id"))
            if eid in run_of:
                duplicates.append(eid)
                continue
            run_of[eid] = str(path)
            records.append(record)
    return records, run_of, source_info, duplicates, episodes_in


def _write_shards(
    folder: Path,
    name: str,
    rows: Sequence[EpisodeRecord],
    components: list[str],
    run_of: dict[str, str],
    schema: pa.Schema,
    shard_rows: int,
) -> list[tuple[Path, int]]:
    """One split's Parquet shards under ``folder/data``: (path relative to the dataset, bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    written = []
    n_shards = max(1, math.ceil(len(rows) / shard_rows))
    for i in range(n_shards):
        chunk = rows[i * shard_rows : (i + 1) * shard_rows]
        table = pa.Table.from_pylist(
            [to_row(r, components, run_of[str(r.get("episode_id"))]) for r in chunk], schema=schema
        )
        rel = Path("data") / f"{name}-{i:05d}-of-{n_shards:05d}.parquet"
        pq.write_table(table, folder / rel)
        written.append((rel, table.nbytes))
    return written


def export_runs(
    sources: Sequence[str | Path],
    out: str | Path,
    *,
    keep: str | None = None,
    split_by: str | None = None,
    splits: Sequence[str] | None = None,
    license_id: str = "unknown",
    pretty_name: str | None = None,
    shard_rows: int = SHARD_ROWS,
    rescored: bool = True,
) -> ExportReport:
    """Write the dataset folder ``out`` from the runs in ``sources`` (merged; first copy of an id wins)."""
    from datasets import Features
    from huggingface_hub import DatasetCard, DatasetCardData

    if split_by and splits:
        raise ExportError("--split-by and --splits exclude each other")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"--out {out} exists and is not an empty folder; choose another")
    flt = RecordFilter(keep) if keep else None
    if splits:
        parse_splits(splits)  # a bad --splits fails before any reading
    records, run_of, source_info, duplicates, episodes_in = _read_sources(sources, rescored)
    if not records:
        raise ExportError(f"{', '.join(map(str, sources))}: no episode records")
    if duplicates:
        log.warning("%d duplicate episode ids across the runs; kept the first copy of each", len(duplicates))
    if flt is not None:
        records = [r for r in records if flt(r)]
        if not records:
            raise ExportError(
                f"--keep {keep!r} keeps none of the {len(run_of)} episodes; nothing to export "
                "(check the expression with `deepanalyze-rl stats` or `view`)"
            )
    by_split, dropped = assign_splits(records, split_by, splits)
    if not by_split:
        raise ExportError("--splits: no episode matches any split expression; nothing to export")

    components = sorted({c for r in records for c in (r.get("reward_components") or {})})
    schema = arrow_schema(components)
    features = Features.from_arrow_schema(schema)
    split_counts = {name: len(rows) for name, rows in by_split.items()}
    title = pretty_name or "DeepAnalyze agent trajectories"

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    shards: list[Path] = []
    split_bytes: dict[str, int] = defaultdict(int)
    try:
        (tmp / "data").mkdir()
        for name, rows in by_split.items():
            for rel, nbytes in _write_shards(tmp, name, rows, components, run_of, schema, shard_rows):
                shards.append(out / rel)
                split_bytes[name] += nbytes  # what datasets reports as a split's num_bytes
        metadata = card_metadata(split_counts, split_bytes, features, license_id, title)
        card_data = DatasetCardData(**metadata)  # the card classes the Hub uses check the header shape
        body = card_body(
            title=title,
            records=[r for rows in by_split.values() for r in rows],
            split_counts=split_counts,
            sources=source_info,
            keep=keep,
            split_rule=_split_rule(split_by, splits),
            episodes_in=episodes_in,
            duplicates=duplicates,
            dropped_by_splits=dropped,
        )
        card = DatasetCard(f"---\n{card_data.to_yaml()}\n---\n\n{body}")
        card.save(tmp / "README.md")
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportReport(out, episodes_in, split_counts, shards, duplicates, dropped)


def _split_rule(split_by: str | None, splits: Sequence[str] | None) -> str:
    if split_by:
        return f"one split per value of `{split_by}`"
    if splits:
        rule = (
            "by task (every sample of a task in one split), fractions"
            if parse_splits(splits)[0] == "fraction"
            else "first match of"
        )
        return f"{rule} " + ", ".join(f"`{s.replace('`', chr(39))}`" for s in splits)
    return "one split, `train`"
