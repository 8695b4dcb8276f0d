"""Walking, copying and removing folder trees a policy may have shaped: iterative, link-safe.

A cell can build a workspace 1,200 folders deep, chmod folders to 000, plant links to host
files or make a folder the trainer cannot delete. Python 3.11's ``os.walk``, ``os.makedirs``
and ``shutil.rmtree`` recurse once per level (``RecursionError`` past ~1,000) and the env must
not let that escape ``init``/``close``; so everything here keeps its own stack, moves between
folders through descriptors (``O_NOFOLLOW``: a link is removed, never entered or chmodded
through) and reports what it could not remove instead of raising.

Standard library only, like the rest of ``tools``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from collections.abc import Iterator

log = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _chmod_dir_entry(name: str, dir_fd: int) -> bool:
    """Make folder ``name`` (in ``dir_fd``) readable and writable to its owner, without
    following a link: the entry is opened ``O_PATH | O_NOFOLLOW`` and checked to be a folder."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            return False
        os.chmod(f"/proc/self/fd/{fd}", 0o700)  # chmod of an O_PATH descriptor, as glibc does
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _open_dir(name: str, dir_fd: int | None) -> int:
    """Open folder ``name`` without following links; a folder its owner made unreadable
    (mode 000) is made 0700 first, never a link's target."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        parent = dir_fd
        opened = -1
        if parent is None:
            opened = parent = os.open(os.path.dirname(os.path.abspath(name)) or "/", _DIR_FLAGS)
            name = os.path.basename(os.path.abspath(name))
        try:
            if not _chmod_dir_entry(name, parent):
                raise
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        finally:
            if opened >= 0:
                os.close(opened)


def remove_tree(path: str | os.PathLike) -> bool:
    """Remove ``path`` and everything below it; True when nothing is left.

    Never raises and never follows a link (a link is unlinked, its target untouched). What
    cannot be removed (an immutable file, a mount point, a folder owned by someone else) is
    logged once and left in place, with everything else removed around it."""
    path = os.fspath(path)
    try:
        return _remove_tree(path)
    except Exception as exc:  # a bug here must not take init()/close() down
        log.error("could not remove %s: %s: %s", path, type(exc).__name__, exc)
        return False


def _remove_tree(path: str) -> bool:
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError as exc:
        log.error("cannot remove %s: %s", path, exc)
        return False
    if not stat.S_ISDIR(top.st_mode):
        try:
            os.unlink(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            log.error("cannot remove %s: %s", path, exc)
            return False
    try:
        fd = _open_dir(path, None)
    except OSError as exc:
        log.error("cannot open %s to remove it: %s", path, exc)
        return False
    # The folders entered below ``path``: their names and identities (device, inode), so that
    # going back up through ".." is checked to land where we came from.
    names: list[str] = []
    ids: list[tuple[int, int]] = [(top.st_dev, top.st_ino)]
    # Folders that could not be entered or removed, as (their parent's identity, their name): a
    # mount point's identity differs from the inode its parent lists, so names are the key.
    stuck: set[tuple[tuple[int, int], str]] = set()
    dirty: set[tuple[int, int]] = set()  # folders where a file could not be unlinked
    failures: list[str] = []
    try:
        while True:
            sub = _empty_files_find_subdir(fd, ids[-1], stuck, dirty, failures)
            if sub is not None:
                try:
                    child = _open_dir(sub, fd)
                except OSError as exc:
                    failures.append(f"{sub}: {exc.strerror}")
                    stuck.add((ids[-1], sub))
                    continue
                st = os.fstat(child)
                os.close(fd)
                fd = child
                names.append(sub)
                ids.append((st.st_dev, st.st_ino))
                continue
            if not names:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            pst = os.fstat(parent)
            if (pst.st_dev, pst.st_ino) != ids[-2]:
                os.close(parent)
                failures.append("a folder was moved during the removal")
                log.error("stopped removing %s: %s", path, failures[-1])
                return False
            os.close(fd)
            fd = parent
            name = names.pop()
            ids.pop()
            try:
                os.rmdir(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError as exc:
                stuck.add((ids[-1], name))
                failures.append(f"{name}: {exc.strerror}")
    finally:
        os.close(fd)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        failures.append(f"{os.path.basename(path)}: {exc.strerror}")
    if failures:
        shown = "; ".join(failures[:3]) + (f" (+{len(failures) - 3} more)" if len(failures) > 3 else "")
        log.error("left %s in place: could not remove everything in it (%s)", path, shown)
        return False
    return True


def _empty_files_find_subdir(
    fd: int, here: tuple[int, int], stuck: set, dirty: set, failures: list[str]
) -> str | None:
    """Unlink the non-folders in ``fd``; return the first sub-folder not known to be stuck."""
    try:
        scanner = os.scandir(fd)
    except OSError as exc:
        failures.append(f"cannot list a folder: {exc.strerror}")
        return None
    with scanner:
        for entry in scanner:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir:
                if (here, entry.name) not in stuck:
                    return entry.name
                continue
            if here in dirty:
                continue
            if not _unlink(entry.name, fd):
                dirty.add(here)
                failures.append(f"{entry.name}: not removable")
    return None


def _unlink(name: str, fd: int) -> bool:
    for attempt in range(2):
        try:
            os.unlink(name, dir_fd=fd)
            return True
        except FileNotFoundError:
            return True
        except PermissionError:
            if attempt:
                return False
            try:
                os.fchmod(fd, 0o700)  # the folder itself was made read-only by a cell
            except OSError:
                return False
        except OSError:
            return False
    return False


def walk(root: str | os.PathLike) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(root)`` top-down without recursion and without following links: (folder,
    sub-folder names, other names). Unreadable folders are skipped."""
    stack = [os.fspath(root)]
    while stack:
        here = stack.pop()
        dirs: list[str] = []
        others: list[str] = []
        try:
            with os.scandir(here) as scanner:
                for entry in scanner:
                    try:
                        (dirs if entry.is_dir(follow_symlinks=False) else others).append(entry.name)
                    except OSError:
                        others.append(entry.name)
        except OSError:
            continue
        yield here, dirs, others
        stack.extend(os.path.join(here, d) for d in reversed(dirs))


def copy_tree(source: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Copy a task folder (already checked by ``workspace.check_links``: every link stays
    inside it and does not loop) into the new folder ``dest``, without recursion. A link is
    copied as what it points to (as ``shutil.copytree(symlinks=False)`` does); FIFOs, sockets
    and devices are left out (reading a FIFO would block). Raises OSError (disk full...)."""
    stack = [(os.fspath(source), os.fspath(dest))]
    os.mkdir(os.fspath(dest))
    while stack:
        src_dir, dst_dir = stack.pop()
        with os.scandir(src_dir) as scanner:
            entries = list(scanner)
        for entry in entries:
            src = entry.path
            dst = os.path.join(dst_dir, entry.name)
            if entry.is_symlink():
                src = os.path.realpath(src)
            mode = os.stat(src).st_mode
            if stat.S_ISDIR(mode):
                os.mkdir(dst)
                stack.append((src, dst))
            elif stat.S_ISREG(mode):
                shutil.copy2(src, dst, follow_symlinks=False)
            else:
                log.warning("task folder entry %s is not a file or folder: not copied", entry.path)
        with contextlib.suppress(OSError):
            shutil.copystat(src_dir, dst_dir)
