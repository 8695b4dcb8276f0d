"""Episode records (DESIGN contract 6): one JSON line per episode, appended atomically.

Each process writes its own ``episodes-<host>-<pid>.jsonl`` so Ray workers never share a file;
each record is written with a single ``write()`` on an ``O_APPEND`` descriptor, so readers see
whole lines or (after a crash mid-write) one torn last line, which they skip.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deepanalyze_env.env import DeepAnalyzeEnv

log = logging.getLogger(__name__)

TASK_FIELDS = ("reward_spec", "input_seq", "data", "workspace_id")


def package_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("deepanalyze-env")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def task_hash(extras: dict[str, Any]) -> str:
    blob = json.dumps({k: extras.get(k) for k in TASK_FIELDS}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_record(env: DeepAnalyzeEnv) -> dict[str, Any]:
    meta = env.final_metadata or {}
    extras = env.extras
    return {
        "episode_id": extras.get("episode_id") or uuid.uuid4().hex,
        "task_id": env.task_id,
        "task_hash": task_hash(extras),
        **{k: extras.get(k) for k in TASK_FIELDS},
        "messages": env.messages,
        "reward": env.final_reward,
        "reward_components": meta.get("reward_components", {}),
        "reward_status": meta.get("reward_status", "unfinished"),
        "format_ok": meta.get("format_ok"),
        "gate": meta.get("gate"),
        "termination": meta.get("termination"),
        "code_pass": list(env.code_pass),
        "turns": env.turns,
        "exec": list(env.exec_log),
        "judge": meta.get("judge"),
        "usage": extras.get("usage"),
        "versions": {
            "package": package_version(),
            "profile": env.config.profile,
            "reward_plan": env.plan.fingerprint(),
            "policy_id": env.config.policy_id,
            "kernel": env.kernel_versions,
        },
        "timings": dict(env.timings),
        "error": meta.get("error"),
    }


class RecordWriter:
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

    def append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode("utf-8", "surrogatepass")
        with self._write_lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                written = os.write(fd, line)
                if written != len(line):
                    raise OSError(f"short write to {self.path}: {written} of {len(line)} bytes")
            finally:
                os.close(fd)


def read_records(path: str | Path) -> list[dict[str, Any]]:
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
