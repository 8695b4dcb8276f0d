"""Episode records (docs/design.md §9): one JSON line per episode, appended atomically.

Each process writes its own ``episodes-<host>-<pid>.jsonl`` so Ray workers never share a file;
each record is written with a single ``write()`` on an ``O_APPEND`` descriptor, so readers see
whole lines or (after a crash mid-write) one torn last line, which they skip and ``--resume``
cuts off. A *run* folder (what ``rollout --out`` makes and ``stats``/``rescore`` read) holds
those per-process files, derived views (``episodes.jsonl``, ``kept.jsonl``) and re-scored
versions of some records (``rescored-<timestamp>.jsonl``), which :func:`load_run` lays over
the originals by ``episode_id`` — nothing is ever edited in place.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import tempfile
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from deepanalyze_env.core.contracts import RECORD_FIELDS, EpisodeRecord, EpisodeResult, JsonObject

if TYPE_CHECKING:
    from rewards.judge import JudgeClient

__all__ = ["RECORD_FIELDS", "RecordWriter", "build_record", "load_run", "own_turn_indices", "read_records"]

log = logging.getLogger(__name__)

TASK_FIELDS = ("reward_spec", "input_seq", "data", "workspace_id")
RECORDS_SUBDIR = "records"  # where ``rollout --out DIR`` points the env's records_dir
EPISODES_FILE = "episodes.jsonl"
RESCORED_GLOB = "rescored-*.jsonl"


def own_turn_indices(record: EpisodeRecord | JsonObject) -> list[int]:
    """Indices in ``messages`` of the policy's own turns: the last ``turns`` assistant messages.

    Each ``step`` appends exactly one assistant message, so assistant messages before those are
    part of the prompt: a recovery row's replayed ``prefix`` or few-shot examples. A record
    without ``turns`` counts every assistant message as the policy's.
    """
    assistant = [i for i, m in enumerate(record.get("messages") or []) if m.get("role") == "assistant"]
    turns = record.get("turns")
    if isinstance(turns, int) and not isinstance(turns, bool) and 0 <= turns <= len(assistant):
        return assistant[len(assistant) - turns :]
    return assistant


def package_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("deepanalyze-env")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def task_hash(extras: JsonObject) -> str:
    blob = json.dumps({k: extras.get(k) for k in TASK_FIELDS}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def episode_id(run_id: str, task_index: int, sample_index: int) -> str:
    """Deterministic id: a resumed run recomputes it and skips exactly the episodes that exist."""
    return f"{run_id}-t{task_index:05d}-s{sample_index:03d}"


def judge_versions(
    client: JudgeClient | None, function_names: Iterable[str]
) -> tuple[str | None, dict[str, str]]:
    """The judge model and the sha256 of every rubric prompt the plan uses (even if never called)."""
    if client is None:
        return None, {}
    from rewards.judge.prompts import prompt_hash
    from rewards.judges import rubrics_for

    settings = client.settings
    hashes = {}
    for rubric in rubrics_for(function_names):
        try:
            hashes[rubric] = prompt_hash(rubric, settings.prompt_dir)
        except Exception as exc:  # validated at construction; a record must still be written
            hashes[rubric] = f"unreadable: {exc}"
    return settings.model, hashes


def build_record(result: EpisodeResult) -> EpisodeRecord:
    """The record of a closed episode (``EpisodeRecord``; fields in ``RECORD_FIELDS`` order)."""
    meta = result.metadata
    extras = result.extras
    return {
        "episode_id": extras.get("episode_id") or uuid.uuid4().hex,
        "task_id": result.task_id,
        "task_hash": task_hash(extras),
        "reward_spec": extras.get("reward_spec") or {},
        "input_seq": extras.get("input_seq"),
        "data": extras.get("data"),
        "workspace_id": extras.get("workspace_id"),
        "messages": result.messages,
        "reward": result.reward,
        "reward_components": meta["reward_components"] if meta else {},
        "reward_status": meta["reward_status"] if meta else "unfinished",
        "reward_error_cause": meta.get("reward_error_cause") if meta else None,
        "format_ok": meta["format_ok"] if meta else None,
        "gate": meta["gate"] if meta else None,
        "termination": meta["termination"] if meta else None,
        "code_pass": list(result.code_pass),
        "turns": result.turns,
        "exec": list(result.exec),
        "judge": meta.get("judge") if meta else None,
        "usage": extras.get("usage"),
        "agent": extras.get("agent"),
        "versions": result.versions,
        "timings": dict(result.timings),
        "error": (meta.get("error") if meta else None) or result.unfinished,
    }


def encode_line(record: EpisodeRecord | JsonObject) -> bytes:
    return (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode("utf-8", "surrogatepass")


class RecordWriter:
    """Appends whole episode records to this process's ``episodes-<host>-<pid>.jsonl`` with one
    ``write()`` on an ``O_APPEND`` descriptor: one writer per folder and process, so concurrent envs
    never tear each other's lines."""

    _writers: dict[tuple[str, int], RecordWriter] = {}
    _lock = threading.Lock()

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"episodes-{socket.gethostname()}-{os.getpid()}.jsonl"
        self._write_lock = threading.Lock()

    @classmethod
    def for_dir(cls, directory: str | Path) -> RecordWriter:
        key = (str(Path(directory).resolve()), os.getpid())
        with cls._lock:
            if key not in cls._writers:
                cls._writers[key] = cls(Path(key[0]))
            return cls._writers[key]

    def append(self, record: EpisodeRecord | JsonObject) -> None:
        line = encode_line(record)
        with self._write_lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                written = os.write(fd, line)
                if written != len(line):
                    raise OSError(f"short write to {self.path}: {written} of {len(line)} bytes")
            finally:
                os.close(fd)


def read_records(path: str | Path) -> list[JsonObject]:
    """Read a records file, skipping (and logging) a torn last line."""
    records = []
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            records.append(json.loads(raw.decode("utf-8", "surrogatepass")))
        except (json.JSONDecodeError, UnicodeDecodeError):
            if i == len(lines) - 1:
                log.warning("%s: skipped a torn last line (%d bytes)", path, len(raw))
            else:
                raise ValueError(f"{path}: line {i + 1} is not valid JSON")
    return records


def torn_tail(path: str | Path) -> int:
    """Bytes after the last newline (a line a killed writer did not finish); 0 when clean."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        if size == 0:
            return 0
        block = 65536
        pos = size
        while pos > 0:
            start = max(0, pos - block)
            fh.seek(start)
            chunk = fh.read(pos - start)
            idx = chunk.rfind(b"\n")
            if idx >= 0:
                return size - (start + idx + 1)
            pos = start
        return size


def repair_torn_tail(path: str | Path) -> int:
    """Cut a torn last line off ``path`` so appends start on a clean line; returns bytes removed."""
    extra = torn_tail(path)
    if extra:
        size = os.path.getsize(path)
        os.truncate(path, size - extra)
        log.warning("%s: removed a torn last line (%d bytes) left by an interrupted writer", path, extra)
    return extra


def write_jsonl_atomic(path: str | Path, records: Iterable[EpisodeRecord | JsonObject]) -> int:
    """Write ``records`` to ``path`` via a temporary file and rename: readers never see half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    n = 0
    try:
        with os.fdopen(fd, "wb") as fh:
            for record in records:
                fh.write(encode_line(record))
                n += 1
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


# ---------------------------------------------------------------------------- run folders


@dataclass
class RunRecords:
    """The records of a run, de-duplicated by ``episode_id`` with re-scores laid on top."""

    records: list[JsonObject]  # as read back: raw JSON (older runs may lack newer fields)
    sources: list[Path] = field(default_factory=list)
    rescored: int = 0  # records replaced by a rescored-*.jsonl version
    duplicates: int = 0  # repeated ids dropped (the last copy wins)


def raw_record_files(run: Path) -> list[Path]:
    """The per-process files of a run folder (``records/`` first, as ``rollout`` lays it out)."""
    for folder in (run / RECORDS_SUBDIR, run):
        files = sorted(folder.glob("episodes-*.jsonl"))
        if files:
            return files
    return []


def _dedup(records: Iterable[JsonObject]) -> tuple[list[JsonObject], int]:
    by_id: dict[str, JsonObject] = {}
    duplicates = 0
    for record in records:
        key = str(record.get("episode_id"))
        if key in by_id:
            duplicates += 1
        by_id[key] = record
    return list(by_id.values()), duplicates


def load_run(path: str | Path, *, rescored: bool = True) -> RunRecords:
    """All episodes of a run folder (or one JSONL file), with ``rescored-*.jsonl`` laid over them.

    Sources, in order of preference: the per-process files (the source of truth while a run is
    in progress or was killed), else ``episodes.jsonl`` (a finished rollout or training run).
    Re-score files apply in name order (their names carry a sortable timestamp).
    """
    path = Path(path)
    if path.is_file():
        sources = [path]
    elif path.is_dir():
        sources = raw_record_files(path) or (
            [path / EPISODES_FILE] if (path / EPISODES_FILE).is_file() else []
        )
    else:
        raise FileNotFoundError(f"no such file or folder: {path}")
    loaded: list[JsonObject] = []
    for source in sources:
        loaded.extend(read_records(source))
    records, duplicates = _dedup(loaded)
    if duplicates:
        log.warning("%s: %d repeated episode ids; kept the last copy of each", path, duplicates)
    result = RunRecords(records, list(sources), duplicates=duplicates)
    if rescored and path.is_dir():
        index = {str(r.get("episode_id")): i for i, r in enumerate(records)}
        for overlay in sorted(path.glob(RESCORED_GLOB)):
            result.sources.append(overlay)
            for record in read_records(overlay):
                i = index.get(str(record.get("episode_id")))
                if i is None:
                    log.warning(
                        "%s: episode %s is not in the run; ignored", overlay, record.get("episode_id")
                    )
                    continue
                records[i] = record
                result.rescored += 1
    return result
