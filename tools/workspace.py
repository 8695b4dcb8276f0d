"""Per-episode scratch copies of a task's data folder.

The agent's code runs inside a private copy, so nothing it does (deleting, rewriting,
writing outputs) reaches the shared source data or another episode. Folders are named after
the owning process (pid + start time) so that the next process sweeps those a crashed one left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

SCRATCH_ENV = "DEEPANALYZE_SCRATCH"
_swept: set[str] = set()
_sweep_lock = threading.Lock()


def scratch_root() -> Path:
    root = Path(os.environ.get(SCRATCH_ENV) or Path(tempfile.gettempdir()) / "deepanalyze-scratch")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _owner_alive(name: str) -> bool:
    parts = name.split("-")
    if len(parts) < 3 or not parts[0].isdigit():
        return True  # not ours: leave it alone
    return _start_time(int(parts[0])) == parts[1]


def sweep_stale(root: Path | None = None) -> int:
    """Remove scratch folders whose owning process is gone. Returns how many were removed."""
    root = root or scratch_root()
    removed = 0
    for entry in root.iterdir():
        if entry.is_dir() and not _owner_alive(entry.name):
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    if removed:
        log.info("swept %d stale scratch folder(s) from %s", removed, root)
    return removed


class UnsafeWorkspace(ValueError):
    """A task folder holds a symbolic link that leaves it (or loops): refused, never copied."""


def check_links(source: Path) -> None:
    """Refuse links that point outside ``source``, loop, dangle, or point at a folder that
    contains them: copying would pull host files into the episode (or never end)."""
    root = os.path.realpath(source)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            link = os.path.join(dirpath, name)
            if not os.path.islink(link):
                continue
            target = os.path.realpath(link)
            where = f"{link} -> {os.readlink(link)}"
            if target != root and not target.startswith(root + os.sep):
                raise UnsafeWorkspace(
                    f"task folder {root} holds a symbolic link that points outside it: {where}; "
                    "copy the file into the task folder instead"
                )
            if not os.path.exists(target):
                raise UnsafeWorkspace(
                    f"task folder {root} holds a dangling or looping symbolic link: {where}"
                )
            if os.path.isdir(target) and (link + os.sep).startswith(target + os.sep):
                raise UnsafeWorkspace(
                    f"task folder {root} holds a symbolic link to a folder above it: {where}"
                )


class Workspace:
    """A scratch folder for one episode; ``source`` (may be None) is copied into it."""

    def __init__(self, source: Path | None):
        root = scratch_root()
        with _sweep_lock:
            if str(root) not in _swept:
                _swept.add(str(root))
                sweep_stale(root)
        pid = os.getpid()
        self.path = root / f"{pid}-{_start_time(pid) or 0}-{uuid.uuid4().hex[:12]}"
        if source is not None:
            check_links(source)
        try:
            if source is not None:
                shutil.copytree(source, self.path, symlinks=False)
            else:
                self.path.mkdir()
        except BaseException:  # disk full mid-copy: leave no half-copied folder behind
            self.remove()
            raise

    def remove(self) -> None:
        handler = {"onexc": _force_remove} if sys.version_info >= (3, 12) else {"onerror": _force_remove}
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.path, **handler)


def _force_remove(func, path, _exc) -> None:
    """Cells may chmod their files read-only; make them writable and retry. A link is never
    followed (``chmod`` would change the file it points to, maybe outside the scratch folder)."""
    with contextlib.suppress(OSError):
        parent = os.path.dirname(path) or "."
        if not os.path.islink(parent):
            os.chmod(parent, 0o700)
        if not os.path.islink(path):
            os.chmod(path, 0o700)
        func(path)
