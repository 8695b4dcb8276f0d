"""SQLite cache of judge replies, shared by every process that scores with the same file.

The key covers what determines a reply — model, rendered prompt, sampling parameters and
sample index — and deliberately not the backend, so a run scored through an endpoint can be
re-scored offline by the ``replay`` backend. WAL mode lets readers proceed while one process
writes, and ``busy_timeout`` makes concurrent writers queue instead of failing; the first reply
stored for a key is kept (``INSERT OR IGNORE``), so replays are stable.

WAL keeps its index in shared memory, which processes on different hosts do not share: on a
network filesystem (NFS, Lustre, CIFS, …), where a cluster's shared ``cache_path`` usually
lives, it is unsafe. ``journal="auto"`` (the default) uses WAL on local disks and SQLite's
rollback journal (``DELETE``), which needs only the filesystem's POSIX locks, where
``/proc/mounts`` says the file lives on a network filesystem; ``"wal"`` and ``"delete"`` force one.

Writes are batched: ``put`` only records the reply in a per-process pending table (visible to
every ``get`` in the process at once) and a writer thread commits pending replies in one
transaction per batch. At judge concurrency a thread hop and a commit per reply cost the event
loop more than the rest of the cached path; a batch costs one of each. Pending replies are
flushed by ``flush``/``close`` and at interpreter exit; a process killed outright loses at
most the replies of the last few milliseconds, which a later run simply asks for again.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path

from deepanalyze_env.core.config import CACHE_JOURNALS

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 30_000
_SCHEMA = """
CREATE TABLE IF NOT EXISTS judge_replies (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    sample INTEGER NOT NULL,
    reply TEXT NOT NULL,
    created REAL NOT NULL
)
"""
_INSERT = "INSERT OR IGNORE INTO judge_replies (key, model, sample, reply, created) VALUES (?, ?, ?, ?, ?)"


def cache_key(model: str, prompt: str, temperature: float, max_tokens: int, sample: int) -> str:
    """sha256 over a self-delimiting header (the ``repr`` of a tuple) then the prompt."""
    header = repr((str(model), float(temperature), int(max_tokens), int(sample)))
    digest = hashlib.sha256(header.encode("utf-8"))
    digest.update(b"\x00")
    digest.update(prompt.encode("utf-8"))
    return digest.hexdigest()


NETWORK_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "glusterfs", "fuse.glusterfs",
     "ceph", "fuse.ceph", "cephfs", "9p", "afs", "fuse.sshfs", "ocfs2", "gfs2", "panfs", "fuse.juicefs",
     "fuse.gcsfuse", "fuse.s3fs", "fuse.mountpoint-s3", "wekafs", "fuse.weka", "virtiofs"}
)  # fmt: skip


def filesystem_type(path: Path, mounts: str | None = None) -> str | None:
    """Type of the filesystem holding ``path``: the longest mount point that contains it in
    ``/proc/mounts`` (or ``mounts``, that file's text); None where it cannot be read."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    target = str(path)
    best, kind = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def resolve_journal(path: Path, journal: str = "auto", mounts: str | None = None) -> str:
    """``wal`` or ``delete`` for this file (see the module docstring)."""
    if journal not in CACHE_JOURNALS:
        raise ValueError(f"judge cache journal must be one of {', '.join(CACHE_JOURNALS)}, got {journal!r}")
    if journal != "auto":
        return journal
    kind = filesystem_type(path.resolve().parent, mounts)
    if kind in NETWORK_FILESYSTEMS:
        log.info("judge cache %s is on %s (a network filesystem): rollback journal, not WAL", path, kind)
        return "delete"
    return "wal"


def _connect(path: Path, journal: str = "wal") -> sqlite3.Connection:
    conn = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False, isolation_level=None
    )
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    conn.execute(f"PRAGMA journal_mode={journal.upper()}")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(_SCHEMA)
    return conn


class _Store:
    """One per process and file: the reader connection, the pending replies, the writer thread."""

    def __init__(self, path: Path, journal: str = "wal"):
        self.path = path
        self.journal = journal
        self.read_lock = threading.Lock()
        self.reader = _connect(path, journal)
        self.cond = threading.Condition(threading.Lock())  # a plain lock: cheaper than the RLock default
        self.pending: dict[str, tuple[str, int, str, float]] = {}
        self.writing = False
        self.writer: threading.Thread | None = None
        self.error: str | None = None

    def get(self, key: str) -> str | None:
        with self.cond:
            row = self.pending.get(key)
        if row is not None:
            return row[2]
        with self.read_lock:
            found = self.reader.execute("SELECT reply FROM judge_replies WHERE key = ?", (key,)).fetchone()
        return None if found is None else found[0]

    def put(self, key: str, model: str, sample: int, reply: str) -> None:
        with self.cond:
            self.pending.setdefault(key, (model, int(sample), reply, time.time()))
            if self.writer is None:
                self.writer = threading.Thread(
                    target=self._write_loop, name="judge-cache-writer", daemon=True
                )
                self.writer.start()
            self.cond.notify_all()

    def _write_loop(self) -> None:
        conn = _connect(self.path, self.journal)
        while True:
            with self.cond:
                while not self.pending:
                    self.cond.wait()
                batch = list(self.pending.items())
                self.writing = True
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(_INSERT, [(key, *row) for key, row in batch])
                conn.execute("COMMIT")
                failure = None
            except sqlite3.Error as exc:
                failure = f"{type(exc).__name__}: {exc}"
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            with self.cond:
                if failure is None:
                    for key, row in batch:
                        if self.pending.get(key) is row:
                            del self.pending[key]
                elif failure != self.error:
                    log.warning("judge cache %s: write failed, will retry: %s", self.path, failure)
                self.error = failure
                self.writing = False
                self.cond.notify_all()
            if failure is not None:
                time.sleep(0.5)

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every pending reply is committed; False if that did not happen in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while self.pending or self.writing:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self.cond.wait(remaining)
        return True

    def count(self) -> int:
        self.flush()
        with self.read_lock:
            return self.reader.execute("SELECT COUNT(*) FROM judge_replies").fetchone()[0]


_stores: dict[tuple[int, str], _Store] = {}
_stores_lock = threading.Lock()


def _store_for(path: Path, journal: str = "auto") -> _Store:
    key = (os.getpid(), str(path.resolve()))
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            store = _stores[key] = _Store(path, resolve_journal(path, journal))
        return store


def _reset_after_fork() -> None:
    """A child must not inherit a lock another parent thread held at ``fork`` time."""
    global _stores_lock
    _stores_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


@atexit.register
def _flush_all() -> None:
    for (pid, path), store in list(_stores.items()):
        if pid == os.getpid() and not store.flush(timeout=30.0):
            log.error("judge cache %s: %d replies could not be written at exit", path, len(store.pending))


class JudgeCache:
    """A handle on the cache file; handles on one file in one process share a :class:`_Store`."""

    def __init__(self, path: str | os.PathLike, journal: str = "auto"):
        self.path = Path(path).expanduser()
        self.journal = journal
        self._store: _Store | None = None
        self._pid: int | None = None

    def _get_store(self) -> _Store:
        if self._store is None or self._pid != os.getpid():  # a forked child opens its own
            self._store, self._pid = _store_for(self.path, self.journal), os.getpid()
        return self._store

    def get(self, key: str) -> str | None:
        return self._get_store().get(key)

    def put(self, key: str, model: str, sample: int, reply: str) -> None:
        self._get_store().put(key, model, sample, reply)

    def flush(self, timeout: float | None = 30.0) -> bool:
        return self._get_store().flush(timeout)

    def __len__(self) -> int:
        return self._get_store().count()

    def close(self) -> None:
        """Flush pending replies. The shared connections stay open for other handles."""
        if self._store is not None:
            self._store.flush()
