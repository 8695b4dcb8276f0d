"""The one way trainer-side code reads a file the policy wrote in its workspace.

Nothing a policy writes is trusted, and that includes what a file *is*: ``out.csv`` may be a
link to a correct file elsewhere on the host (pointing at an answer instead of writing one),
a link to ``/proc/kmsg`` or a FIFO (a read that never returns), a device, or 20 MiB of
newlines. So a read here:

- walks the relative name one component at a time from a descriptor of the workspace, every
  component opened with ``O_NOFOLLOW`` (a link anywhere on the way is refused, not followed;
  ``..`` is refused);
- opens the file ``O_NONBLOCK`` (opening a FIFO does not wait for a writer) and accepts only a
  regular file with one link (``fstat``: no FIFO, socket, device or hard link to a host file);
- refuses a file over ``max_bytes`` and reads at most ``max_bytes + 1`` bytes (a file that a
  leftover process keeps growing is refused too), so memory is bounded by the cap.

The result is the bytes or a one-line reason; the caller scores the component 0 with that
reason (the policy's failure), never an exception or a hang.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


@dataclass(frozen=True)
class PolicyFile:
    """What reading a policy-written file gave: ``data``, or ``refused`` (why not)."""

    name: str
    data: bytes | None = None
    refused: str | None = None

    @property
    def ok(self) -> bool:
        return self.data is not None


def _refuse(name: str, why: str) -> PolicyFile:
    return PolicyFile(name, None, f"{name} {why}")


def read_policy_file(
    workspace: str | os.PathLike, name: str, max_bytes: int = DEFAULT_MAX_BYTES
) -> PolicyFile:
    """Read ``name`` (relative to ``workspace``) as described in the module docstring."""
    parts = [p for p in Path(name).parts if p not in ("", ".")]
    if not parts or Path(name).is_absolute() or ".." in parts:
        return _refuse(name, "is not a path inside the workspace")
    try:
        fd = os.open(workspace, _DIR_FLAGS)
    except OSError as exc:
        return _refuse(name, f"cannot be read: the workspace is not readable ({exc.strerror})")
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                return _refuse(name, "was not written")
            except OSError as exc:
                return _refuse(name, f"is not readable: {part} is not a folder ({exc.strerror})")
            os.close(fd)
            fd = child
        return _read_regular(fd, parts[-1], name, max_bytes)
    finally:
        os.close(fd)


def _read_regular(dir_fd: int, leaf: str, name: str, max_bytes: int) -> PolicyFile:
    try:
        st = os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return _refuse(name, "was not written")
    except OSError as exc:
        return _refuse(name, f"cannot be read ({exc.strerror})")
    if stat.S_ISLNK(st.st_mode):
        return _refuse(name, "is a symbolic link, not a file the policy wrote (links are not followed)")
    if not stat.S_ISREG(st.st_mode):
        return _refuse(name, f"is not a regular file ({_kind(st.st_mode)})")
    try:
        fd = os.open(leaf, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:  # ELOOP: replaced by a link since the stat
        return _refuse(name, f"cannot be opened as a regular file ({exc.strerror})")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return _refuse(name, f"is not a regular file ({_kind(st.st_mode)})")
        if st.st_nlink != 1:
            return _refuse(name, f"is a hard link ({st.st_nlink} names), not a file the policy wrote")
        if st.st_size > max_bytes:
            return _refuse(name, f"is {st.st_size} bytes, over the {max_bytes}-byte cap for scored files")
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            return _refuse(name, f"grew past the {max_bytes}-byte cap for scored files while it was read")
        return PolicyFile(name, b"".join(chunks))
    except OSError as exc:
        return _refuse(name, f"cannot be read ({exc.strerror})")
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return kind
    return "not a file"
