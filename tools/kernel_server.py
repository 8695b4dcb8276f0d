"""Kernel fork server: imports the data-science stack once, then forks one worker per episode.

Runs as a standalone script under ``executor.python`` (which may be another virtualenv), so it
imports nothing from this project: standard library only.

Why a fork server: a fresh interpreter per cell costs ~400 ms and ``spawn`` per cell ~300 ms;
forking a worker from a parent that already imported pandas/sklearn costs ~15 ms once per
episode, after which each cell is a pipe round-trip to a live process.

Protocol. The server talks only to the process that started it, over an inherited
``SOCK_SEQPACKET`` socket pair (no socket path a cell could connect to):
- the env sends ``{"op": "spawn", "workspace", "tmp", "memory_mb", "stateful", "cpu_backstop_s"}``
  with two descriptors attached (SCM_RIGHTS): its end of a fresh per-episode socket pair and the
  write end of the episode's output pipe. The server bounds the episode from outside the worker
  (the memory limit of the worker's memory cgroup; with ``tmp``, the folder of the episode's
  size-limited storage, detached copies of its workspace and tmp folders for the worker to
  attach, ``_episode_storage``), then hands it all to a worker forked in advance,
  which sends ``{"hello": true, "pid": ..., "sandbox": {...}}`` with a pidfd of itself on the
  episode's socket and then answers ``{"op": "cell", "seq": n, "code": ...}`` with
  ``{"seq": n, "status": "ok"|"error"|"crashed", "error_type", "leftovers"?}`` after the cell's
  output went into the pipe. By default the worker runs each cell in a child forked in advance
  and never runs policy code itself (``_serve_cell_processes``: it first acknowledges the cell
  with ``{"seq": n, "started": true}``, where the cell's deadline starts; the reply is its own
  observation, sent once every process of the cell has ended); with ``stateful`` it runs cells
  in its own process (``_serve_in_process``; never ``crashed``: a death is seen by the env).
  The sandbox settings are the server's own, fixed at its start; a request cannot change them.
- the server reports each reaped worker as ``{"exit": pid, "status": waitstatus, "memory": {...}}``
  on the pair, ``memory`` being the final counters of its memory cgroup (``sandbox.memory_events``).
- the server exits (killing its workers) when the pair or its stdin reaches EOF, i.e. when the
  process that started it is gone, whichever thread started it.
Every message on a stream socket is a 4-byte big-endian length + JSON.

Why one module over 650 lines: it runs as a standalone script under ``executor.python``, where
nothing of this project can be imported but the sandbox file it loads by path; the wire format,
the worker's cell loop and the server loop share one set of constants and helpers that both
sides of a fork must agree on.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import gc
import importlib
import io
import json
import linecache
import os
import re
import resource
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import types

_HEADER = struct.Struct(">I")
SPARES = 2
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_DUMPABLE = 4
KERNEL_DISTRIBUTIONS = (
    "pandas",
    "numpy",
    "scipy",
    "matplotlib",
    "seaborn",
    "scikit-learn",
    "statsmodels",
    "networkx",
    "openpyxl",
)
CELL_FILENAME = "<string>"  # the name DeepAnalyze's executor showed in tracebacks


def _prctl(option: int, value: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the protection is simply absent
        pass


def send_msg(sock: socket.socket, obj: dict, fds: list[int] | None = None) -> None:
    payload = json.dumps(obj).encode("utf-8")
    data = _HEADER.pack(len(payload)) + payload
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # a cell request (code) may be large; replies are tiny


def recv_msg(sock: socket.socket, with_fds: bool = False, max_bytes: int = MAX_MESSAGE_BYTES):
    """Returns the decoded message (and received fds when asked), or None on EOF.

    Raises ValueError for a length over ``max_bytes`` or a body that is not JSON."""
    fds: list[int] = []
    if with_fds:
        head, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, 4)
        if not head:
            return (None, fds)
        if len(head) < _HEADER.size:
            rest = _recv_exact(sock, _HEADER.size - len(head))
            if rest is None:
                return (None, fds)
            head += rest
    else:
        head = _recv_exact(sock, _HEADER.size)
        if head is None:
            return None
    (length,) = _HEADER.unpack(head)
    if length > max_bytes:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"message of {length} bytes exceeds the {max_bytes}-byte cap")
    body = _recv_exact(sock, length)
    msg = None if body is None else json.loads(body.decode("utf-8"))
    return (msg, fds) if with_fds else msg


# ----------------------------------------------------------------------------- worker side


def _format_exception(exc: BaseException, source: str) -> str:
    """Render an exception in the shape DeepAnalyze models were trained on.

    ``Traceback`` header, the frames that belong to the cell (``File "<string>", line N`` plus
    the stripped source line), then ``Type: message``. Frames inside libraries are left out:
    the model can only act on its own lines.
    """
    if isinstance(exc, SyntaxError) and exc.filename == CELL_FILENAME:
        return "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
    lines = source.splitlines()
    out = ["Traceback (most recent call last):"]
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename != CELL_FILENAME:
            continue
        out.append(f'  File "{CELL_FILENAME}", line {frame.lineno}, in {frame.name}')
        if frame.lineno and 0 < frame.lineno <= len(lines):
            out.append(f"    {lines[frame.lineno - 1].strip()}")
    out.append("".join(traceback.format_exception_only(type(exc), exc)).rstrip())
    return "\n".join(out)


def _reset_cell_state(workspace: str) -> None:
    os.chdir(workspace)
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        try:
            plt.close("all")
        except Exception:
            pass


def _run_cell(code: str, namespace: dict) -> tuple[str, str | None]:
    linecache.cache[CELL_FILENAME] = (len(code), None, code.splitlines(True), CELL_FILENAME)
    try:
        compiled = compile(code, CELL_FILENAME, "exec")
        exec(compiled, namespace)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are the cell's failures too
        text = _format_exception(exc, code)
        try:
            sys.stdout.flush()
        except Exception:
            pass
        sys.stderr.write("[Error]:\n" + text + "\n")
        return "error", type(exc).__name__
    return "ok", None


def _load_sandbox():
    """``tools/sandbox.py``: a package import under the env, by file path under ``python -I``."""
    if __package__:
        from tools import sandbox

        return sandbox
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox.py")
    spec = importlib.util.spec_from_file_location("_deepanalyze_sandbox", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _leftovers(cgroup: str | None, sandbox, pid_ns: bool) -> bool:
    """True when the cell left threads or processes running after it returned."""
    if threading.active_count() > 1:
        return True
    if pid_ns:
        # The worker is its namespace's init: orphans of the cell end up as its children.
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        try:
            return any(e.isdigit() and e != "1" for e in os.listdir("/proc"))
        except OSError:
            return True
    if cgroup:
        return len(sandbox.cgroup_pids(cgroup)) > 1
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return bool(fh.read().split())
    except OSError:
        return False


_TIMERS = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)
_SIGNALS = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


def _signal_baseline() -> dict:
    found = {}
    for sig in _SIGNALS:
        try:
            found[sig] = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
    return found


def _restore_signals(baseline: dict) -> None:
    """Undo what a cell did to signal delivery: timers (``signal.alarm``), handlers, the mask.

    A timer or handler left by one cell would otherwise fire between cells and end the worker
    while it waits for the next one."""
    signal.alarm(0)
    for timer in _TIMERS:
        signal.setitimer(timer, 0)
    for sig, handler in baseline.items():
        if signal.getsignal(sig) is not handler:
            try:
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            except (OSError, ValueError, TypeError):
                continue
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _worker_main(
    conn: socket.socket,
    out_fd: int,
    spec: dict,
    sandbox,
    own_cgroups: dict[str, str],
    namespaces: dict,
    prepared: dict | None = None,
    storage: list[int] | None = None,
) -> None:
    if out_fd <= 2 or conn.fileno() <= 2:
        raise RuntimeError("worker fds collide with stdio")  # _fork_spare keeps 0-2 occupied
    os.setsid()  # own process group and session
    # Not tied to the fork server's life: a worker serves its episode even if the server dies
    # (whoever killed it); the env kills workers by pidfd.
    _prctl(_PR_SET_PDEATHSIG, 0)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    # One ordered stream: both Python streams write straight through to the shared pipe.
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )
    memory_mb = spec.get("memory_mb")
    if memory_mb:
        # Address space beyond what the preloaded stack already maps.
        with open("/proc/self/statm") as fh:
            baseline = int(fh.read().split()[0]) * resource.getpagesize()
        limit = baseline + int(memory_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    cpu_backstop = spec.get("cpu_backstop_s")
    if cpu_backstop:
        resource.setrlimit(resource.RLIMIT_CPU, (int(cpu_backstop), int(cpu_backstop) + 5))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    active = sandbox.apply(spec, own_cgroups, namespaces, prepared, storage)
    # No process of the episode's uid may read or write this one's memory or descriptors
    # (/proc/<pid>/mem, /proc/<pid>/fd): a worker as root without capabilities stays dumpable
    # otherwise. Cells' processes inherit it.
    _prctl(_PR_SET_DUMPABLE, 0)
    workspace = spec["workspace"]
    os.chdir(workspace)
    stateful = bool(spec.get("stateful"))
    if not stateful:
        # Orphans of a cell come back here, not to the fork server, so the worker ends them.
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a child cannot end the worker with it
    me = os.getpid()
    pidfd = os.pidfd_open(me) if hasattr(os, "pidfd_open") else -1
    send_msg(conn, {"hello": True, "pid": me, "sandbox": active}, [pidfd] if pidfd >= 0 else None)
    if pidfd >= 0:
        os.close(pidfd)
    if stateful:
        _serve_in_process(conn, workspace, active, sandbox)
    else:
        _serve_cell_processes(conn, workspace, bool(active.get("pid_ns")))
    os._exit(0)


def _serve_in_process(conn: socket.socket, workspace: str, active: dict, sandbox) -> None:
    """``stateful_cells``: every cell runs in this process, in one namespace that persists. The
    cells share the process that replies, so a cell can change how its own later cells are
    judged (docs/design.md section 12); the env checks from outside what it can."""
    persistent: dict = {"__name__": "__main__", "__builtins__": builtins}
    me = os.getpid()
    handlers = _signal_baseline()
    while True:
        msg = recv_msg(conn)
        if msg is None or msg.get("op") != "cell":
            return
        _reset_cell_state(workspace)
        status, error_type = _run_cell(msg["code"], persistent)
        if os.getpid() != me:  # a process the cell forked returned here: it must not answer
            os._exit(0)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        _restore_signals(handlers)
        reply = {"seq": msg.get("seq"), "status": status, "error_type": (error_type or "")[:200] or None}
        if _leftovers(active["cgroup"], sandbox, active.get("pid_ns", False)):
            reply["leftovers"] = True
        send_msg(conn, reply)


# ----------------------------------------------------------------------------- one process per cell
#
# Default (stateless) cells. The worker ("parent") never runs policy code: it forks one child
# per cell from its own clean state, hands it the code, relays the child's output into the
# episode's pipe, and decides the status from what it observes. The child closes every other
# descriptor before it reads its code (the control socket above all), so nothing a cell does
# can reach the reply; a cell's processes (threads, children, orphans) are killed, and its own
# output pipe closed, before the parent replies, so nothing of a cell outlives it.

STATUS_MAX_BYTES = 128
# The child's report of its own cell: "ok" or "error <exception class name>", one line.
_STATUS_LINE = re.compile(rb"(ok|error [A-Za-z_][A-Za-z0-9_]{0,99})\n")
_ERROR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
_CODE_MARK = b"C"  # the code pipe's first byte: an empty cell is still a cell
RELAY_DRAIN_S = 0.25  # after the cell's end: how long to read what its pipe still holds


class _CellChild:
    """A child forked in advance ("spare"), waiting on ``code_w``'s pipe for its cell."""

    def __init__(self, pid: int, code_w: int, out_r: int, status_r: int):
        self.pid = pid
        self.code_w = code_w
        self.out_r = out_r
        self.status_r = status_r
        os.set_blocking(status_r, False)  # a grandchild may hold its write end past the child
        self.pidfd = os.pidfd_open(pid)

    def close(self) -> None:
        for fd in (self.code_w, self.out_r, self.status_r, self.pidfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.code_w = self.out_r = self.status_r = self.pidfd = -1


def _fork_cell_child(workspace: str) -> _CellChild:
    code_r, code_w = os.pipe()
    out_r, out_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:  # EAGAIN: the cgroup's pids are all in use
        for fd in (code_r, code_w, out_r, out_w, status_r, status_w):
            os.close(fd)
        raise
    if pid == 0:
        try:
            _cell_child(code_r, out_w, status_w, workspace)
        finally:
            os._exit(70)
    for fd in (code_r, out_w, status_w):
        os.close(fd)
    return _CellChild(pid, code_w, out_r, status_r)


def _cell_child(code_r: int, out_w: int, status_w: int, workspace: str) -> None:
    """The cell's own process: only stdin (/dev/null), stdout and stderr (its own output
    pipe), the code pipe and the status pipe stay open; then it waits for its code."""
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    keep = sorted({0, 1, 2, code_r, status_w})
    for low, high in zip(keep, [*keep[1:], 1 << 16], strict=True):
        os.closerange(low + 1, high)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as fh:
        fh.write("1000")  # under memory pressure the cell goes first, never its worker
    os.chdir(workspace)
    chunks = []
    while chunk := os.read(code_r, 1 << 16):
        chunks.append(chunk)
    os.close(code_r)
    data = b"".join(chunks)
    if not data.startswith(_CODE_MARK):
        os._exit(0)  # the worker is going away: no cell to run
    code = data[len(_CODE_MARK) :].decode("utf-8", errors="surrogateescape")
    status, error_type = _run_cell(code, _fresh_main())
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    name = error_type if error_type and _ERROR_NAME.fullmatch(error_type) else "Exception"
    line = b"ok\n" if status == "ok" else f"error {name}\n".encode()
    with contextlib.suppress(OSError):
        os.write(status_w, line)
    os._exit(0)


def _fresh_main() -> dict:
    """The cell's ``__main__``: a new module with no ``__file__`` (not this script, which the
    cell's view hides), so ``multiprocessing``'s spawn and forkserver children do not try to
    re-run the server, and a function the cell defines pickles by reference as it would in a
    notebook; ``sys.argv`` holds no server settings."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.argv = [""]
    return main.__dict__


def _relay(src: int, dst: int) -> bool:
    """Copy what ``src`` holds now to ``dst``; False at EOF."""
    try:
        chunk = os.read(src, 1 << 16)
    except BlockingIOError:
        return True
    if not chunk:
        return False
    view = memoryview(chunk)
    while view:
        try:
            view = view[os.write(dst, view) :]
        except OSError:  # the env closed its end: nobody reads this episode any more
            os._exit(0)
    return True


def _await_cell(child: _CellChild) -> tuple[str, str | None]:
    """Relay the child's output until it reported its cell or died: (status, error type)."""
    poller = select.poll()
    watched = {child.out_r, child.status_r, child.pidfd}
    for fd in watched:
        poller.register(fd, select.POLLIN)
    record = b""
    while True:
        ready = {fd for fd, _ in poller.poll()}
        if child.out_r in ready and not _relay(child.out_r, 1):
            poller.unregister(child.out_r)
            watched.discard(child.out_r)
        if child.status_r in ready or child.pidfd in ready:
            try:
                data = os.read(child.status_r, STATUS_MAX_BYTES + 1)
            except BlockingIOError:
                data = None
            if data == b"" and child.status_r in watched:
                poller.unregister(child.status_r)
                watched.discard(child.status_r)
            record += data or b""
            if b"\n" in record or len(record) > STATUS_MAX_BYTES:
                return _parse_status(record)
        if child.pidfd in ready:
            return "crashed", None  # it died without reporting its cell


def _parse_status(record: bytes) -> tuple[str, str | None]:
    """The first line of the status pipe, strictly: anything else is a crashed cell."""
    match = _STATUS_LINE.match(record)
    if match is None:
        return "crashed", None
    words = match.group(1).decode().split(" ")
    return (words[0], words[1] if len(words) > 1 else None)


def _cell_processes(pid_ns: bool) -> list[int]:
    """Every process of the current cell: the worker's children (the worker is the child
    subreaper, so orphans are its children too); in a PID namespace, every process but init."""
    if pid_ns:
        return [int(e) for e in os.listdir("/proc") if e.isdigit() and e != "1"]
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


def _kill_cell_processes(pid_ns: bool) -> None:
    if pid_ns:
        with contextlib.suppress(OSError):
            os.kill(-1, signal.SIGKILL)  # from the namespace's init: every other process in it
        return
    for pid in _cell_processes(False):  # our unreaped children: their pids cannot be reused
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _reap_cell(pid_ns: bool) -> int:
    """Kill and reap until the worker has no child left (a process orphaned meanwhile becomes
    the worker's child and is killed on the next round); returns how many were reaped."""
    count = 0
    while True:
        _kill_cell_processes(pid_ns)
        reaped = False
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return count
            if pid == 0:
                break
            count += 1
            reaped = True
        if not reaped:
            time.sleep(0.0005)


def _drain(src: int, dst: int) -> None:
    os.set_blocking(src, False)
    deadline = time.monotonic() + RELAY_DRAIN_S
    with contextlib.suppress(OSError):
        while time.monotonic() < deadline and _relay(src, dst):
            if not select.select([src], [], [], 0)[0]:
                return


def _run_in_child(child: _CellChild, code: str, pid_ns: bool) -> tuple[dict, set[int]]:
    """One cell in ``child``: the reply (without ``seq``) and the cell's processes still to
    reap (in a PID namespace: all killed, none able to run or fork any more)."""
    data = _CODE_MARK + code.encode("utf-8", errors="surrogateescape")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(child.code_w, view) :]
    except OSError:
        pass  # the child is gone: it is reported crashed below
    os.close(child.code_w)
    child.code_w = -1
    status, error_type = _await_cell(child)
    doomed: set[int] = set()
    if pid_ns:
        # From the namespace's init, one kill(-1) leaves no process of the cell that can run
        # another instruction or fork (a fork racing it fails): listed after it, the set is
        # complete. They are reaped after the reply, while their memory is torn down.
        _kill_cell_processes(True)
        doomed = set(_cell_processes(True))
        leftovers = len(doomed - {child.pid})
    else:
        leftovers = max(0, _reap_cell(False) - 1)  # every one of them is gone before the reply
    # What the pipe holds now is the cell's; a write still in flight in a dying process lands
    # in a pipe that is closed below, never in a later cell's output.
    _drain(child.out_r, 1)
    child.close()
    reply: dict = {"status": status, "error_type": error_type}
    if leftovers:
        reply["leftovers"] = leftovers
    return reply, doomed


def _reap_doomed(doomed: set[int], spare: _CellChild) -> bool:
    """Reap the killed processes of the last cell (their exit tears down their memory, ~6 ms
    for a cell's process, while the next child is already forked); False if the spare itself
    died meanwhile (killed from outside the episode)."""
    alive = True
    doomed.discard(spare.pid)
    while doomed:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return alive
            if pid == 0:
                break
            doomed.discard(pid)
            alive = alive and pid != spare.pid
        # One reaped by its own (dying) parent, which ignored SIGCHLD, never comes here.
        doomed = {p for p in doomed if os.path.exists(f"/proc/{p}")}
        if doomed:
            time.sleep(0.0005)
    return alive


def _serve_cell_processes(conn: socket.socket, workspace: str, pid_ns: bool) -> None:
    spare = _fork_cell_child(workspace)
    while True:
        msg = recv_msg(conn)
        if msg is None or msg.get("op") != "cell":
            return
        # The last cell's processes are reaped and the next child forked: the cell starts now.
        send_msg(conn, {"seq": msg.get("seq"), "started": True})
        reply, doomed = _run_in_child(spare, msg["code"], pid_ns)
        reply["seq"] = msg.get("seq")
        send_msg(conn, reply)
        # Nothing of the cell can run on (killed, or reaped without a namespace): the next
        # child is forked from this clean process at once, then the dead are reaped. A cell
        # that used every pid the cgroup allows leaves none until its processes are reaped:
        # then the fork waits for that, so the next cell does not pay for this one.
        try:
            spare = _fork_cell_child(workspace)
        except OSError:
            _reap_cell(pid_ns)
            spare = _fork_cell_child(workspace)
            continue
        if not _reap_doomed(doomed, spare):
            spare.close()
            spare = _fork_cell_child(workspace)


# ----------------------------------------------------------------------------- server side


def _preload(modules: list[str]) -> dict[str, str]:
    failed: dict[str, str] = {}
    try:
        import matplotlib

        matplotlib.use("Agg")
    except Exception as exc:
        failed["matplotlib"] = repr(exc)
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"
    return failed


def _warm_up() -> None:
    """Run the commonest first steps of an analysis once, in the server, with our own data: the
    lazy imports and caches they fill (pandas' formatters and groupby paths, matplotlib's
    renderer) are then in every worker and every cell's process from the fork, instead of being
    redone by each cell's fresh process (a read_csv + groupby + print cell: ~25 -> ~13 ms in a
    fresh fork, measured here). Best effort: a stack without pandas or matplotlib skips it."""
    sink = io.StringIO()
    with contextlib.suppress(Exception):
        pandas = sys.modules.get("pandas")
        if pandas is not None:
            df = pandas.read_csv(
                io.StringIO("k,n,x,when\na,1,2.5,2024-01-02\nb,3,4.5,2024-02-03\na,5,6.5,2024-03-04\n")
            )
            df["y"] = df["n"] * df["x"]
            df["when"] = pandas.to_datetime(df["when"])
            sink.write(str(df.groupby("k")["y"].agg(["count", "sum", "mean"]).round(2)))
            sink.write(str(df.describe()) + repr(df.head()) + str(df.dtypes) + str(df["k"].value_counts()))
            sink.write(df.sort_values("y").to_string() + str(df.pivot_table(index="k", values="y")))
            df.info(buf=sink)
    with contextlib.suppress(Exception):
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:
            fig, ax = pyplot.subplots()
            ax.plot([1, 2, 3], [2, 1, 3])
            ax.set_title("warm-up")
            fig.savefig(io.BytesIO(), format="png")
            pyplot.close("all")


def _versions() -> dict[str, str]:
    from importlib import metadata

    found = {"python": sys.version.split()[0]}
    for dist in KERNEL_DISTRIBUTIONS:
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return found


def _kill_orphans(live_workers) -> None:
    """Kill processes reparented to this server (it is their subreaper) whose worker is gone.

    Only orphans of workers without a PID namespace land here, and only once their worker is
    dead (inside a namespace the worker is the reaper; a stateless worker is its cells' child
    subreaper); they are this server's children, so their pids cannot be reused until it reaps."""
    me = os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid in live_workers:
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


class _Spare:
    """A worker forked in advance: ``pid`` is the process that will run cells (the init of its
    PID namespace, or the forked process itself where there is none)."""

    def __init__(self, forked: int, handoff: socket.socket, cgroups: dict[str, str]):
        self.forked = forked
        self.handoff = handoff
        self.cgroups = cgroups  # {controller: folder} the spare joins
        self._pid: int | None = None

    def pid(self, timeout_s: float = 10.0) -> int | None:
        if self._pid is None:
            self.handoff.settimeout(timeout_s)
            try:
                raw = _recv_exact(self.handoff, 4)
            except OSError:
                raw = None
            self.handoff.settimeout(None)
            self._pid = struct.unpack(">I", raw)[0] if raw else -1
        return self._pid if self._pid > 0 else None


def _close_inherited(keep: socket.socket, stdin_fd: int, drop: list) -> None:
    """In a fresh spare: 0 and 1 become /dev/null, every descriptor but ``keep`` and stderr is
    closed (the server's channel to the env, other workers' hand-off sockets, pipes)."""
    for obj in drop:
        if obj is not None:
            obj.detach()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, stdin_fd)
    os.dup2(devnull, 1)
    os.close(devnull)
    fd = keep.fileno()
    os.closerange(3, fd)
    os.closerange(fd + 1, 1 << 16)


def _fork_spare(stdin_fd: int, sandbox, server_cgroups: dict[str, str], cfg: dict, drop: list) -> _Spare:
    """Fork a worker in advance; it waits for its episode (spec, control socket, output fd).

    Forking a parent that maps the whole preloaded stack costs 10-30 ms (page tables), so the
    server keeps spares ready and an episode start only hands one the connection. As root the
    server enters the new namespaces around the fork (``unshare_for_next_child``), so the child
    is the namespace's init; otherwise the spare enters them and forks once more.
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # As root the server unshares the namespaces itself, so this fork's child is already the
    # namespace's init (one fork of the preloaded interpreter per worker, not two).
    direct = sandbox.unshare_for_next_child(cfg)
    try:
        pid = os.fork()
    except BaseException:
        if direct is not None:
            sandbox.restore_namespaces(direct[1])
        raise
    if pid != 0 and direct is not None:
        sandbox.restore_namespaces(direct[1])
    if pid == 0:
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            # The host's pid (its /proc is still the host's): it names the worker's cgroup.
            host_pid = int(os.readlink("/proc/self")) if direct is not None else os.getpid()
            # Join a cgroup of its own now, while idle: moving a process between cgroups waits
            # for an RCU grace period (~10 ms), which would otherwise delay the episode start.
            # pids.max is set now: the worker's /sys is read-only once its mounts are prepared.
            # Its memory limit is written by the server at hand-off, when the episode is known.
            limit = cfg.get("max_processes") if cfg.get("cgroup") else None
            own_cgroups = sandbox.join_new_cgroups(server_cgroups, host_pid, limit)
            _close_inherited(theirs, stdin_fd, [ours, *drop])
            if direct is not None:  # its copies of the server's namespace fds went above
                namespaces = direct[0]
                theirs.sendall(struct.pack(">I", host_pid))
            else:
                namespaces = sandbox.enter_namespaces(cfg)
                if namespaces["pid_ns"]:
                    child = os.fork()
                    if child:
                        theirs.sendall(struct.pack(">I", child))
                        os._exit(0)
                else:
                    theirs.sendall(struct.pack(">I", os.getpid()))
            prepared = sandbox.prepare(cfg, namespaces)  # while idle: off the episode's start
            spec, fds = recv_msg(theirs, with_fds=True)
            theirs.close()
            if spec is None or len(fds) not in (2, 3, 4):
                os._exit(0)
            _worker_main(
                socket.socket(fileno=fds[0]),
                fds[1],
                spec,
                sandbox,
                own_cgroups,
                namespaces,
                prepared,
                fds[2:] or None,
            )
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(70)
    theirs.close()
    return _Spare(pid, ours, {c: os.path.join(d, f"w{pid}") for c, d in server_cgroups.items()})


def _hand_off(
    chan: socket.socket,
    spare: _Spare,
    workers: dict[int, dict[str, str]],
    stdin_fd: int,
    sandbox,
    server_cgroups: dict[str, str],
    cfg: dict,
) -> _Spare | bool | None:
    """Serve one message from the env; returns the spare still unused, None once it was handed
    out, or False when the env is gone."""
    try:
        data, fds, _flags, _addr = socket.recv_fds(chan, 1 << 16, 2)
    except OSError:
        return spare
    if not data:
        return False
    try:
        spec = json.loads(data.decode("utf-8"))
    except ValueError:
        spec = None
    if not isinstance(spec, dict) or spec.get("op") != "spawn" or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        return spare
    spec["sandbox"] = cfg  # the server's own settings, whatever the request says
    if isinstance(spec.get("workspace"), str):
        spec["workspace"] = os.path.realpath(spec["workspace"])  # as the host sees it
    worker = spare.pid()
    if worker is None or not _alive(worker):  # the spare was killed from outside: fork a fresh one
        spare.handoff.close()
        spare = _fork_spare(stdin_fd, sandbox, server_cgroups, cfg, [chan])
        worker = spare.pid()
    if worker is not None:
        workers[worker] = spare.cgroups
    storage = _episode_storage(sandbox, spec, spare, cfg)
    try:
        send_msg(spare.handoff, spec, fds + storage)
    except OSError:
        pass  # the env sees its socket close without a hello and reports it
    spare.handoff.close()
    for fd in fds + storage:
        os.close(fd)
    return None


def _episode_storage(sandbox, spec: dict, spare: _Spare, cfg: dict) -> list[int]:
    """The episode's bounds, set from here (outside the worker, before its first cell): the
    memory limit of the spare's memory cgroup (``spec["memory_limit"]``, bytes), the identity
    of its workspace folder, and detached copies of the workspace folder and — when the trainer
    mounted bounded storage for the episode (``spec["tmp"]``) — of its tmp folder, for the
    worker to attach in its own mount namespace, which was made before the episode's storage
    existed. Returns those descriptors (none, one or two)."""
    memory = spare.cgroups.get("memory") if cfg.get("cgroup") else None
    spec["memory_cgroup"] = None
    spec["memory_limit"] = None
    if memory and os.path.isdir(memory):
        spec["memory_cgroup"] = memory
        spec["memory_limit"] = sandbox.limit_memory(memory, spec.get("memory_mb"))
    workspace, tmp = spec.get("workspace"), spec.get("tmp")
    spec["workspace_ident"] = None
    if isinstance(workspace, str):
        try:
            st = os.stat(workspace)
            spec["workspace_ident"] = [st.st_dev, st.st_ino]
        except OSError:
            pass
    if not isinstance(workspace, str):
        return []
    paths = [workspace] + ([os.path.realpath(tmp)] if isinstance(tmp, str) else [])
    clones = [sandbox.clone_mount(path) for path in paths]
    if None in clones:  # the worker binds the workspace by its path instead (and checks it)
        for fd in clones:
            if fd is not None:
                os.close(fd)
        return []
    return clones


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not (yet) ours: the spare's first process has not exited
        return os.path.exists(f"/proc/{pid}")
    return done == 0


def _reap(workers: dict[int, dict[str, str]], doomed: set[str], chan: socket.socket, sandbox) -> bool:
    """Reap exited children; for each worker, report its exit with the final counters of its
    memory cgroup (read here, before the folder is removed: the env decides from them whether an
    OOM killer ended it, see ``tools.kernel``), then doom its cgroups."""
    reaped = False
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        if pid in workers:
            cgroups = workers.pop(pid)
            memory = sandbox.memory_events(cgroups.get("memory"), True)
            report = {"exit": pid, "status": status, "memory": memory}
            doomed.update(cgroups.values())  # whatever the worker left in its cgroups goes too
            try:
                chan.send(json.dumps(report).encode(), socket.MSG_DONTWAIT)
            except OSError:
                pass
        reaped = True


def _probe(sandbox, cfg: dict) -> dict | None:
    """Set a worker up in a throwaway child exactly as an episode would (namespaces, mounts,
    privileges, filter) and check that it can write its workspace; the server degrades its
    settings where this fails (an LSM, seccomp or a kernel that refuses some step). Returns what
    was in force there (``sandbox.apply``'s record), or None. A PID namespace asked for and not
    entered is a failure: the next, weaker try says so instead."""
    import shutil
    import tempfile

    probe = tempfile.mkdtemp(prefix="deepanalyze-fsprobe-")
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                namespaces = sandbox.enter_namespaces(cfg)
                if cfg.get("pid_namespace") and not namespaces["pid_ns"]:
                    os._exit(1)
                if namespaces["pid_ns"]:
                    child = os.fork()
                    if child:
                        _, status = os.waitpid(child, 0)
                        os._exit(os.waitstatus_to_exitcode(status))
                active = sandbox.apply({"workspace": probe, "sandbox": cfg}, None, namespaces)
                if sandbox.stack_readable():
                    with open(os.path.join(probe, "ok"), "w") as fh:
                        keys = ("pid_ns", "fs", "uid", "seccomp", "network")
                        json.dump({k: active.get(k) for k in keys}, fh)
                    code = 0
            except BaseException:
                traceback.print_exc()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            return None
        with open(os.path.join(probe, "ok")) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _unsafe(found: dict) -> list[str]:
    """What leaves episodes open to each other or the host, from what a probe found in force."""
    why = []
    if not found.get("pid_ns"):
        why.append("no PID namespace (a cell reaches other episodes' files through /proc/<pid>/root)")
    if found.get("uid") == 0 and found.get("fs") != "readonly":
        why.append("cells run as root on a writable filesystem (the project, the venv, /etc)")
    return why


def _workable_settings(sandbox, cfg: dict) -> tuple[dict, dict, str | None]:
    """The strongest settings that work here, what the probe found in force with them, and why
    the kernel must not start with them (None: it may). Tries cells as ``sandbox.uid`` (as
    root) where that uid can read the interpreter, else root without capabilities; then without
    a PID namespace; then without the read-only filesystem. A choice that leaves episodes open
    to each other or the host (``_unsafe``) is taken only with ``sandbox.allow_unsafe``."""
    tries = (
        {},
        {"uid": 0},
        {"pid_namespace": False},
        {"pid_namespace": False, "uid": 0},
        {"pid_namespace": False, "readonly_fs": False, "uid": 0},
    )
    chosen, found = dict(cfg, pid_namespace=False, readonly_fs=False), {}
    for over in tries:
        trial = dict(cfg, **over)
        result = _probe(sandbox, trial)
        if result is not None:
            chosen, found = trial, result
            break
    why = _unsafe(found) if found else ["no sandbox setting could be set up here"]
    if not why or cfg.get("allow_unsafe"):
        return chosen, found, None
    keys = ("pid_namespace", "readonly_fs", "uid")
    weaker = ", ".join(f"{k}: {chosen[k]}" for k in keys if chosen[k] != cfg[k])
    return (
        chosen,
        found,
        (
            f"the executor sandbox is unsafe here: {'; '.join(why)}"
            + (f" (what worked here: {weaker})" if weaker else "")
            + "; set executor.sandbox.allow_unsafe: true to run anyway, or run where PID namespaces"
            " and a read-only filesystem can be made (root, or unprivileged user namespaces)"
        ),
    )


def _poll_readable(fds: list, timeout_s: float) -> set[int]:
    """Readable descriptors (EOF counts); ``poll``, since the channel keeps the number it had
    in the env process, which may be past the 1,024 that ``select`` accepts."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(int(timeout_s * 1000))}


def serve(chan_fd: int, config: dict) -> None:
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    chan = socket.socket(fileno=chan_fd)
    sandbox = _load_sandbox()
    sandbox.sweep_cgroups(keep_server_pid=os.getpid())
    server_cgroups = sandbox.server_cgroups(os.getpid())
    sandbox.SECCOMP_PROGRAM = sandbox.build_seccomp_program()  # once; workers only load it
    sandbox.CLONE_MOUNT_WORKS = sandbox.clone_mount_works()  # once; spares detach foreign mounts
    cfg, found, refused = _workable_settings(sandbox, sandbox.settings(config.get("sandbox")))
    if refused:
        sys.stdout.write(json.dumps({"ready": False, "error": refused}) + "\n")
        sys.stdout.flush()
        return
    failed = _preload(list(config.get("preload", [])))
    _warm_up()
    ready = {
        "ready": True,
        "pid": os.getpid(),
        "versions": _versions(),
        "failed_preloads": failed,
        "cgroup": server_cgroups.get("pids"),
        "memory_cgroup": server_cgroups.get("memory"),
        "sandbox": cfg,
        "probe": found,  # what a worker set up with ``cfg`` had in force
    }
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    gc.collect()
    gc.freeze()  # keep preloaded objects out of future collections: fewer copy-on-write pages
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)  # reap (and report) a worker as soon as it exits
    workers: dict[int, dict[str, str]] = {}
    doomed: set[str] = set()  # cgroups of exited workers still to empty and remove
    stdin_fd = sys.stdin.fileno()
    drop = [chan]
    # Spares ready to hand out: two, so that episodes starting in quick succession do not wait
    # for a spare's two forks and mount setup.
    spares: list[_Spare] = [_fork_spare(stdin_fd, sandbox, server_cgroups, cfg, drop)]
    while True:
        try:
            wait_s = 0 if len(spares) < SPARES else 0.5
            readable = _poll_readable([chan, stdin_fd, wake_r], wait_s)
        except InterruptedError:
            continue
        if stdin_fd in readable and not os.read(stdin_fd, 4096):
            break  # our owner is gone
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError, OSError):
                os.read(wake_r, 4096)
        if chan.fileno() in readable:
            if not spares:
                spares.append(_fork_spare(stdin_fd, sandbox, server_cgroups, cfg, drop))
            result = _hand_off(chan, spares[0], workers, stdin_fd, sandbox, server_cgroups, cfg)
            if result is False:
                break
            if result is None:
                spares.pop(0)
        # Housekeeping after the hand-off, off the critical path of episode start.
        if _reap(workers, doomed, chan, sandbox):
            live = set(workers)
            for spare in spares:  # their cell-running process is reparented here before hand-off
                live.update((spare.forked, spare.pid()))
            _kill_orphans(live)
        for path in list(doomed):
            if sandbox.kill_cgroup(path, timeout_s=0):
                doomed.discard(path)
        if len(spares) < SPARES:
            spares.append(_fork_spare(stdin_fd, sandbox, server_cgroups, cfg, drop))
    for spare in spares:
        workers[spare.forked] = {}
        if spare.pid(timeout_s=1.0):
            workers[spare.pid()] = spare.cgroups
    for pid in list(workers):
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)  # our children, not yet reaped: the pids are theirs
            except OSError:
                pass
    _kill_orphans(set())
    for server_cgroup in set(server_cgroups.values()):
        for name in os.listdir(server_cgroup) if os.path.isdir(server_cgroup) else []:
            child = os.path.join(server_cgroup, name)
            if os.path.isdir(child):
                sandbox.kill_cgroup(child, timeout_s=2.0)
        try:
            os.rmdir(server_cgroup)
        except OSError:
            pass


if __name__ == "__main__":
    serve(int(sys.argv[1]), json.loads(sys.argv[2]))
