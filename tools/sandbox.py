"""Containment for one episode's worker: process caps, file-size cap, no network, tree kills.

Standard library only: ``kernel_server.py`` runs under ``executor.python`` (maybe another
virtualenv) and imports this file by path; the env imports it as ``tools.sandbox``.

What each protection needs (and what holds where) is summarised in ``describe()`` and in the
README's "Security model":
- process tree tracking + cap: a per-worker *pids cgroup* (v1 ``/sys/fs/cgroup/pids`` or a v2
  hierarchy with the pids controller) when the cgroup filesystem is writable (root, or a
  delegated subtree); it holds processes in new sessions and double-forked daemons, and its
  ``pids.max`` caps fork bombs even for root. Otherwise ``RLIMIT_NPROC`` (not enforced for
  root) and a /proc ancestry walk at kill time, backed by the fork server being a child
  subreaper that kills orphans when a worker exits.
- network: a new, empty network namespace (root: ``unshare(CLONE_NEWNET)``; others: inside a
  new user namespace where the kernel allows unprivileged ones).
- file size: ``RLIMIT_FSIZE`` with ``SIGXFSZ`` ignored, so a too-large write fails with
  ``OSError: [Errno 27] File too large`` instead of killing the worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import time

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CGROUP_PREFIX = "deepanalyze-"

# Defaults for ``executor.sandbox``; a config section, when present, overrides them per key.
DEFAULTS = {
    "max_processes": 512,  # processes + threads per worker (pids cgroup / RLIMIT_NPROC headroom)
    "file_size_mb": 1024,  # largest single file a cell may write
    "network": False,  # False: the worker gets an empty network namespace where permitted
    "cgroup": True,  # False: no per-worker pids cgroup even where one could be made
    # True: a private mount namespace where every filesystem is read-only except the episode's
    # workspace and fresh private /tmp and /dev/shm (root only; others keep file permissions)
    "readonly_fs": True,
    "tmp_mb": 256,  # size of the private /tmp (and /dev/shm) tmpfs
}


def settings(section=None) -> dict:
    """Merge a config section (mapping or object with attributes) over ``DEFAULTS``."""
    merged = dict(DEFAULTS)
    if section is None:
        return merged
    for key in DEFAULTS:
        value = section.get(key) if isinstance(section, dict) else getattr(section, key, None)
        if value is not None:
            merged[key] = value
    return merged


# ----------------------------------------------------------------------------- cgroups


def _pids_hierarchy() -> str | None:
    """Directory of this process's own pids cgroup, if the pids controller is mounted."""
    try:
        with open("/proc/self/cgroup") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    v1 = "/sys/fs/cgroup/pids"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(",") and os.path.isdir(v1):
            return os.path.join(v1, path.lstrip("/"))
    for line in lines:
        if line.startswith("0::"):
            base = os.path.join("/sys/fs/cgroup", line[3:].lstrip("/"))
            try:
                with open(os.path.join(base, "cgroup.controllers")) as fh:
                    if "pids" in fh.read().split():
                        return base
            except OSError:
                return None
    return None


def server_cgroup(server_pid: int) -> str | None:
    """Create (or find) the fork server's cgroup folder; None where cgroups are not writable."""
    base = _pids_hierarchy()
    if base is None:
        return None
    path = os.path.join(base, f"{CGROUP_PREFIX}{server_pid}")
    try:
        os.makedirs(path, exist_ok=True)
        if os.path.exists(os.path.join(base, "cgroup.subtree_control")):  # v2: delegate pids
            with contextlib.suppress(OSError), open(os.path.join(path, "cgroup.subtree_control"), "w") as fh:
                fh.write("+pids")
        return path
    except OSError:
        return None


def join_new_cgroup(server_dir: str, pid: int, max_processes: int | None) -> str | None:
    """Move ``pid`` (the calling worker) into a fresh cgroup of its own; returns its path."""
    path = os.path.join(server_dir, f"w{pid}")
    try:
        os.mkdir(path)
        if max_processes:
            with contextlib.suppress(OSError), open(os.path.join(path, "pids.max"), "w") as fh:
                fh.write(str(int(max_processes)))
        with open(os.path.join(path, "cgroup.procs"), "w") as fh:
            fh.write(str(pid))
        return path
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(path)
        return None


def cgroup_pids(path: str) -> list[int]:
    try:
        with open(os.path.join(path, "cgroup.procs")) as fh:
            return [int(x) for x in fh.read().split()]
    except (OSError, ValueError):
        return []


def kill_cgroup(path: str, timeout_s: float = 1.0) -> bool:
    """SIGKILL every process in the cgroup until it is empty, then remove it.

    Returns True once the folder is gone. A fork bomb's processes may sit in ``fork()`` copying
    a large address space before they can die, so this gives up after ``timeout_s`` (they can
    no longer multiply: ``pids.max`` is 0) and a later call finishes the job.
    """
    deadline = time.monotonic() + timeout_s
    kill_file = os.path.join(path, "cgroup.kill")  # v2, Linux >= 5.14: atomic
    # No new process may start in it from now on: a fork bomb cannot outrun the kills.
    with contextlib.suppress(OSError), open(os.path.join(path, "pids.max"), "w") as fh:
        fh.write("0")
    while True:
        if not os.path.isdir(path):
            return True
        pids = cgroup_pids(path)
        if not pids:
            try:
                os.rmdir(path)
                return True
            except FileNotFoundError:
                return True
            except OSError:  # EBUSY while the last tasks are being released
                pass
        if os.path.exists(kill_file):
            with contextlib.suppress(OSError), open(kill_file, "w") as fh:
                fh.write("1")
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def sweep_cgroups(keep_server_pid: int | None = None) -> int:
    """Kill and remove cgroups left by fork servers that no longer exist."""
    base = _pids_hierarchy()
    if base is None:
        return 0
    removed = 0
    try:
        entries = os.listdir(base)
    except OSError:
        return 0
    for entry in entries:
        if not entry.startswith(CGROUP_PREFIX):
            continue
        try:
            owner = int(entry[len(CGROUP_PREFIX) :])
        except ValueError:
            continue
        if owner == keep_server_pid or os.path.exists(f"/proc/{owner}"):
            continue
        server_dir = os.path.join(base, entry)
        for child in _subdirs(server_dir):
            kill_cgroup(child, timeout_s=0.5)
        with contextlib.suppress(OSError):
            os.rmdir(server_dir)
            removed += 1
    return removed


def _subdirs(path: str) -> list[str]:
    try:
        return [os.path.join(path, e) for e in os.listdir(path) if os.path.isdir(os.path.join(path, e))]
    except OSError:
        return []


# ----------------------------------------------------------------------------- process trees


def _ppid_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return children
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    tree = _ppid_map()
    found: list[int] = []
    stack = list(tree.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(tree.get(child, []))
    return found


def kill_tree(pid: int, timeout_s: float = 1.0) -> None:
    """Stop ``pid``, SIGKILL its descendants until none is left, then kill it and its group.

    Catches children in new sessions (``setsid``) while they are still below the worker; a
    double-forked daemon is reparented to the fork server (a child subreaper), which kills it
    when it reaps the worker.
    """
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        kids = descendants(pid)
        if not kids:
            break
        for kid in kids:
            with contextlib.suppress(OSError):
                os.kill(kid, signal.SIGKILL)
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(OSError):
            kill(pid, signal.SIGKILL)


# ----------------------------------------------------------------------------- worker setup


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _isolate_network() -> str | None:
    """Enter an empty network namespace; returns how, or None if not permitted."""
    libc = _libc()
    if libc is None or not hasattr(libc, "unshare"):
        return None
    if libc.unshare(CLONE_NEWNET) == 0:
        return "netns"
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return None
    try:  # map our own ids so file ownership and access stay exactly as before
        with contextlib.suppress(OSError):
            _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    except OSError:
        pass
    return "userns+netns"


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
CLONE_NEWNS = 0x00020000
_SKIP_READONLY = ("/proc", "/sys")


def _mount(libc, source, target, fstype, flags, data=None) -> None:
    enc = lambda v: None if v is None else v.encode()  # noqa: E731
    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            raw = line.split()[4]
            points.append(raw.encode().decode("unicode_escape"))  # \040 etc.
    return points


def _kept_flags(path: str) -> int:
    try:
        f = os.statvfs(path).f_flag
    except OSError:
        return 0
    return (
        (MS_NOSUID if f & os.ST_NOSUID else 0)
        | (MS_NODEV if f & os.ST_NODEV else 0)
        | (MS_NOEXEC if f & os.ST_NOEXEC else 0)
    )


def _paths_under(root: str) -> list[str]:
    """Outermost interpreter/import folders (prefixes, sys.path) that lie under ``root``."""
    import sys

    found = set()
    for entry in (sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path):
        if entry and os.path.isdir(entry):
            real = os.path.realpath(entry)
            if real.startswith(root.rstrip("/") + "/"):
                found.add(real)
    return [p for p in sorted(found) if not any(p.startswith(q + "/") for q in found if q != p)]


def _readonly_filesystem(workspace: str, tmp_mb: int) -> str | None:
    """Root only: make every mount read-only in a private mount namespace except the workspace,
    and give the worker its own empty /tmp and /dev/shm. Returns a description, or None."""
    if os.geteuid() != 0:
        return None
    libc = _libc()
    if libc is None or not hasattr(libc, "mount"):
        return None
    workspace = os.path.realpath(workspace)
    if libc.unshare(CLONE_NEWNS) != 0:
        return None
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    # Opened inside the new namespace, so the fd names this namespace's copy of the mount.
    ws_fd = os.open(workspace, os.O_PATH | os.O_DIRECTORY)
    try:
        for point in sorted(set(_mount_points()), key=len):
            if any(point == p or point.startswith(p + "/") for p in _SKIP_READONLY):
                continue
            with contextlib.suppress(OSError):
                _mount(libc, None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | _kept_flags(point))
        for private in ("/tmp", "/dev/shm"):
            if os.path.isdir(private):
                # The interpreter, its venv and sys.path may live under /tmp (a CI checkout):
                # keep them visible, read-only, on top of the fresh tmpfs.
                kept = _paths_under(private)
                fds = [os.open(path, os.O_PATH | os.O_DIRECTORY) for path in kept]
                try:
                    size = f"size={int(tmp_mb)}m,mode=1777"
                    _mount(libc, "tmpfs", private, "tmpfs", MS_NOSUID | MS_NODEV, size)
                    for path, fd in zip(kept, fds, strict=True):
                        os.makedirs(path, exist_ok=True)
                        _mount(libc, f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
                        with contextlib.suppress(OSError):
                            _mount(
                                libc, None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | _kept_flags(path)
                            )
                finally:
                    for fd in fds:
                        os.close(fd)
        # The workspace (maybe under the /tmp just covered) comes back, writable, by its fd.
        os.makedirs(workspace, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{ws_fd}", workspace, None, MS_BIND)
        _mount(libc, None, workspace, None, MS_BIND | MS_REMOUNT | _kept_flags(workspace))
        return "readonly"
    finally:
        os.close(ws_fd)


READONLY_FS_WORKS: bool | None = None  # set by the fork server's start-up probe


def probe_readonly_fs() -> bool:
    """Try the read-only filesystem in a throwaway child; the server calls this once at start,
    so a host that allows the namespace but not the mounts (an LSM, seccomp) degrades to "open"
    instead of failing every episode."""
    import shutil
    import tempfile

    if os.geteuid() != 0:
        return False
    probe = tempfile.mkdtemp(prefix="deepanalyze-fsprobe-")
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                if _readonly_filesystem(probe, 1):
                    with open(os.path.join(probe, "ok"), "w") as fh:
                        fh.write("ok")
                    code = 0
            except BaseException:
                pass
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status) == 0 and os.path.exists(os.path.join(probe, "ok"))
    except OSError:
        return False
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _user_process_count(uid: int) -> int:
    count = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    for entry in entries:
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    with open(f"/proc/{entry}/status") as fh:
                        for line in fh:
                            if line.startswith("Threads:"):
                                count += int(line.split()[1])
                                break
            except (OSError, ValueError):
                continue
    return count


def apply(spec: dict, own_cgroup: str | None) -> dict:
    """Apply the sandbox inside a freshly forked worker (after setsid, before its first cell).

    ``own_cgroup``: the cgroup the worker already joined (None: none could be made). With
    ``sandbox.cgroup`` off the worker stays in it but nothing relies on it (the fallback path).
    Returns what is in force, reported to the env and recorded with the episode.
    """
    cfg = settings(spec.get("sandbox"))
    active: dict = {"cgroup": None, "network": "open", "nproc": None, "file_size_mb": None, "fs": "open"}
    max_processes = cfg.get("max_processes")
    if own_cgroup and cfg.get("cgroup"):  # joined by the spare worker before its hand-off
        active["cgroup"] = own_cgroup
        if max_processes:
            with contextlib.suppress(OSError), open(os.path.join(own_cgroup, "pids.max"), "w") as fh:
                fh.write(str(int(max_processes)))
    if max_processes and os.geteuid() != 0:
        # RLIMIT_NPROC counts every process of the real uid: leave room for the ones it has.
        limit = _user_process_count(os.getuid()) + int(max_processes)
        with contextlib.suppress(ValueError, OSError):
            hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
            if hard != resource.RLIM_INFINITY:
                limit = min(limit, hard)
            resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
            active["nproc"] = limit
    file_size_mb = cfg.get("file_size_mb")
    if file_size_mb:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a killed worker
        size = int(file_size_mb) * 1024 * 1024
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
            active["file_size_mb"] = int(file_size_mb)
    if cfg.get("readonly_fs") and spec.get("workspace") and READONLY_FS_WORKS is not False:
        try:
            active["fs"] = _readonly_filesystem(spec["workspace"], cfg.get("tmp_mb") or 512) or "open"
        except OSError as exc:
            # Half-applied is unsafe to run in (the workspace may be hidden): give up loudly.
            raise RuntimeError(f"read-only filesystem setup failed: {exc}") from exc
    if not cfg.get("network"):
        active["network"] = _isolate_network() or "open (no namespace permitted)"
    return active
