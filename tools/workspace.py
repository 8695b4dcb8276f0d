"""Per-episode scratch copies of a task's data folder, in storage of a bounded size.

The agent's code runs inside a private copy, so nothing it does (deleting, rewriting,
writing outputs) reaches the shared source data or another episode. Folders are named after
the owning process (pid + start time) so that the next process sweeps those a crashed one left.

An episode's folder ``<scratch>/<pid>-<start>-<id>/`` holds ``workspace/`` (the copy, the cells'
working folder, what rewards read) and, where the disk bound holds, ``tmp/`` (the cells' /tmp
and /dev/shm). With ``disk_mb`` set and the right to mount (root), the episode's folder is a
tmpfs of the copy's size + ``disk_mb`` (and a matching number of inodes), mounted here in the
trainer's mount namespace: everything the episode's cells can write lands in it, and a write
past it fails with ``ENOSPC`` ("No space left on device"), the cell's own error. The fork
server hands the worker detached copies of ``workspace/`` and ``tmp/`` (``sandbox.clone_mount``).
tmpfs pages are memory: see docs/design.md section 12 for how they count.
"""

from __future__ import annotations

import ctypes
import logging
import os
import tempfile
import threading
import uuid
from pathlib import Path

from tools.tree import copy_tree, remove_tree, walk

log = logging.getLogger(__name__)

SCRATCH_ENV = "DEEPANALYZE_SCRATCH"
DEFAULT_DISK_MB = 512  # executor.disk_mb's default (the reasons: docs/design.md section 5)
INODES_PER_MB = 64  # files + folders an episode may add per MiB of disk_mb (kernel memory each)
_swept: set[str] = set()
_sweep_lock = threading.Lock()
_storage: dict[str, str] = {}  # bounded workspaces of this process: workspace path -> tmp folder
_storage_lock = threading.Lock()
_warned = False
MS_NOSUID, MS_NODEV, MS_REMOUNT, MNT_DETACH = 2, 4, 32, 2


def episode_tmp(workspace: str | os.PathLike) -> str | None:
    """The tmp folder of the bounded storage holding ``workspace`` (a ``Workspace.path`` of
    this process), or None where the workspace is not bounded. Looked up in this process's own
    table, never in anything a cell can write."""
    with _storage_lock:
        return _storage.get(os.fspath(workspace))


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _mount_tmpfs(target: str, options: str, remount: bool = False) -> None:
    libc = _libc()
    if libc is None or not hasattr(libc, "mount"):
        raise OSError("no mount(2) here")
    flags = MS_NOSUID | MS_NODEV | (MS_REMOUNT if remount else 0)
    if libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", flags, options.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _unmount(target: str) -> None:
    libc = _libc()
    if libc is not None and libc.umount2(os.fsencode(target), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err != 22:  # EINVAL: not a mount point (any more)
            log.warning("could not unmount %s: %s", target, os.strerror(err))


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
        if os.path.ismount(entry.path):
            _unmount(entry.path)  # then the removal (rmdir) detaches its copies elsewhere too
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
    """A scratch folder for one episode; ``source`` (may be None) is copied into ``path``.

    ``disk_mb``: what the episode may write beyond the copy (None: no bound). ``bounded`` says
    whether it holds: False where no tmpfs could be mounted (not root, no ``CAP_SYS_ADMIN``),
    logged once per process; then only ``sandbox.file_size_mb`` (per file) and ``sandbox.tmp_mb``
    (the worker's private /tmp) bound what cells write."""

    def __init__(self, source: Path | None, disk_mb: int | None = DEFAULT_DISK_MB):
        root = scratch_root()
        with _sweep_lock:
            if str(root) not in _swept:
                _swept.add(str(root))
                sweep_stale(root)
        pid = os.getpid()
        self.root = root / f"{pid}-{_start_time(pid) or 0}-{uuid.uuid4().hex[:12]}"
        self.path = self.root / "workspace"
        self.tmp: Path | None = None
        self.disk_mb = disk_mb
        self.bounded = False
        self._removed = False
        if source is not None:
            check_links(source)
        try:
            self.root.mkdir()
            if disk_mb is not None:
                self.bounded = self._mount(disk_mb)
            if source is not None:
                copy_tree(source, self.path)
            else:
                self.path.mkdir()
            if self.bounded:
                self._seal(disk_mb)
        except BaseException:  # disk full mid-copy: leave no half-copied folder behind
            self.remove()
            raise
        if self.bounded:
            with _storage_lock:
                _storage[str(self.path)] = str(self.tmp)

    def _mount(self, disk_mb: int) -> bool:
        """Mount the episode's tmpfs (default size, half the RAM, while the trusted copy goes
        in: tmpfs cannot be limited later if it starts unlimited); False where refused."""
        global _warned
        try:
            _mount_tmpfs(str(self.root), "mode=755")
        except OSError as exc:
            if not _warned:
                _warned = True
                log.warning(
                    "executor.disk_mb is not enforced here: no tmpfs could be mounted for an "
                    "episode's workspace (%s; needs root). What cells write is bounded only per "
                    "file (sandbox.file_size_mb) and in /tmp (sandbox.tmp_mb)",
                    exc.strerror or exc,
                )
            return False
        self.tmp = self.root / "tmp"
        self.tmp.mkdir()
        self.tmp.chmod(0o1777)
        return True

    def _seal(self, disk_mb: int) -> None:
        """Shrink the tmpfs to what the copy uses + ``disk_mb`` (and the inodes it uses +
        ``INODES_PER_MB`` per MiB): from here on a write past the bound fails ENOSPC."""
        st = os.statvfs(self.root)
        used_kb = (st.f_blocks - st.f_bfree) * st.f_frsize // 1024
        used_inodes = st.f_files - st.f_ffree
        size_kb = used_kb + int(disk_mb) * 1024
        inodes = used_inodes + max(256, int(disk_mb) * INODES_PER_MB)
        _mount_tmpfs(str(self.root), f"size={size_kb}k,nr_inodes={inodes},mode=755", remount=True)

    def remove(self) -> bool:
        """Remove the scratch folder; never raises. False (logged) when something was left:
        the next process's sweep tries again. A bounded one is unmounted at once (its memory
        is freed when the last worker holding it is gone) and its mount point removed, which
        also detaches the copies spare workers' mount namespaces made of it."""
        with _storage_lock:
            _storage.pop(str(self.path), None)
        if self.bounded and not self._removed:
            _unmount(str(self.root))
        self._removed = True
        return remove_tree(self.root)
