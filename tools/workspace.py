"""Per-episode scratch copies of a task's data folder.

The agent's code runs inside a private copy, so nothing it does (deleting, rewriting,
writing outputs) reaches the shared source data or another episode. Folders are named after
the owning process (pid + start time) so that the next process sweeps those a crashed one left.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import uuid
from pathlib import Path

from tools.tree import copy_tree, remove_tree, walk

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
    """Remove scratch folders whose owning process is gone. Returns how many were removed.

    Never raises: a folder that cannot be removed (or listed) is logged and skipped, so one
    bad folder a crashed run left cannot fail every later episode on the machine. Links in
    the scratch root are not ours (we only make folders) and are left alone."""
    try:
        root = root or scratch_root()
        entries = list(os.scandir(root))
    except OSError as exc:
        log.error("cannot sweep the scratch root: %s", exc)
        return 0
    removed = 0
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or _owner_alive(entry.name):
                continue
        except OSError:
            continue
        if remove_tree(entry.path):
            removed += 1
        else:
            log.warning("stale scratch folder %s could not be removed: skipped", entry.path)
    if removed:
        log.info("swept %d stale scratch folder(s) from %s", removed, root)
    return removed


class UnsafeWorkspace(ValueError):
    """A task folder holds a symbolic link that leaves it (or loops): refused, never copied."""


def check_links(source: Path) -> None:
    """Refuse links that point outside ``source``, loop, dangle, or point at a folder that
    contains them: copying would pull host files into the episode (or never end)."""
    root = os.path.realpath(source)
    for dirpath, dirnames, filenames in walk(root):
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
                copy_tree(source, self.path)
            else:
                self.path.mkdir()
        except BaseException:  # disk full mid-copy: leave no half-copied folder behind
            self.remove()
            raise

    def remove(self) -> bool:
        """Remove the scratch folder; never raises. False (logged) when something was left:
        the next process's sweep tries again."""
        return remove_tree(self.path)
