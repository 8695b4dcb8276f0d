"""Kernel fork server: imports the data-science stack once, then forks one worker per episode.

Runs as a standalone script under ``executor.python`` (which may be another virtualenv), so it
imports nothing from this project: standard library only.

Why a fork server: a fresh interpreter per cell costs ~400 ms and ``spawn`` per cell ~300 ms;
forking a worker from a parent that already imported pandas/sklearn costs ~15 ms once per
episode, after which each cell is a pipe round-trip to a live process.

Protocol (AF_UNIX stream socket, every message = 4-byte big-endian length + JSON):
- the env connects and sends ``{"op": "spawn", ...}`` with the write end of its output pipe
  attached (SCM_RIGHTS); the server hands both to a worker it forked in advance, which keeps the
  connection as its control channel, replies ``{"pid": ...}`` and then answers
  ``{"op": "cell", "code": ...}`` requests with ``{"status": "ok"|"error", ...}`` after the
  cell's output went into the pipe.
- the server exits (killing its workers) when its stdin reaches EOF, i.e. when the process that
  started it is gone, whichever thread started it.
"""

from __future__ import annotations

import builtins
import ctypes
import gc
import importlib
import io
import json
import linecache
import os
import resource
import select
import signal
import socket
import struct
import sys
import threading
import traceback

_HEADER = struct.Struct(">I")
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
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


def recv_msg(sock: socket.socket, with_fds: bool = False):
    """Returns the decoded message (and received fds when asked), or None on EOF."""
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


def _leftovers(cgroup: str | None, sandbox) -> bool:
    """True when the cell left threads or processes running after it returned."""
    if threading.active_count() > 1:
        return True
    if cgroup:
        return len(sandbox.cgroup_pids(cgroup)) > 1
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return bool(fh.read().split())
    except OSError:
        return False


def _worker_main(conn: socket.socket, out_fd: int, spec: dict, sandbox, own_cgroup: str | None) -> None:
    if out_fd <= 2 or conn.fileno() <= 2:
        raise RuntimeError("worker fds collide with stdio")  # _fork_spare keeps 0-2 occupied
    os.setsid()  # own process group: the env kills the whole tree with one killpg
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
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
    active = sandbox.apply(spec, own_cgroup)
    workspace = spec["workspace"]
    os.chdir(workspace)
    stateful = bool(spec.get("stateful"))
    persistent: dict = {"__name__": "__main__", "__builtins__": builtins}
    me = os.getpid()
    send_msg(conn, {"pid": me, "sandbox": active})
    while True:
        msg = recv_msg(conn)
        if msg is None or msg.get("op") != "cell":
            os._exit(0)
        _reset_cell_state(workspace)
        namespace = persistent if stateful else {"__name__": "__main__", "__builtins__": builtins}
        status, error_type = _run_cell(msg["code"], namespace)
        if os.getpid() != me:  # a process the cell forked returned here: it must not answer
            os._exit(0)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        reply = {"status": status, "error_type": error_type}
        if _leftovers(active["cgroup"], sandbox):
            reply["leftovers"] = True
        send_msg(conn, reply)


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


def _versions() -> dict[str, str]:
    from importlib import metadata

    found = {"python": sys.version.split()[0]}
    for dist in KERNEL_DISTRIBUTIONS:
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return found


def _kill_orphans(live_workers: set[int]) -> None:
    """Kill processes reparented to this server (it is their subreaper) whose worker is gone."""
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


def _reap(workers: set[int], sandbox, server_cgroup: str | None, doomed: set[str]) -> bool:
    reaped = False
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        if pid in workers and server_cgroup:  # whatever the worker left in its cgroup goes too
            doomed.add(os.path.join(server_cgroup, f"w{pid}"))
        workers.discard(pid)
        reaped = True


def _fork_spare(
    listener: socket.socket, stdin_fd: int, sandbox=None, server_cgroup: str | None = None
) -> tuple[int, socket.socket]:
    """Fork a worker in advance; it waits for its episode (spec, control socket, output fd).

    Forking a parent that maps the whole preloaded stack costs 10-30 ms (page tables), so the
    server keeps one spare ready and an episode start only hands it the connection.
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            # Join a cgroup of its own now, while idle: moving a process between cgroups waits
            # for an RCU grace period (~10 ms), which would otherwise delay the episode start.
            own_cgroup = sandbox.join_new_cgroup(server_cgroup, os.getpid(), None) if server_cgroup else None
            listener.close()
            # Keep fd 0 occupied (by /dev/null) so received fds never land on 0-2.
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, stdin_fd)
            os.close(devnull)
            ours.close()
            spec, fds = recv_msg(theirs, with_fds=True)
            theirs.close()
            if spec is None or len(fds) != 2:
                os._exit(0)
            _worker_main(socket.socket(fileno=fds[0]), fds[1], spec, sandbox, own_cgroup)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(70)
    theirs.close()
    return pid, ours


def _hand_off(
    listener: socket.socket,
    spare: tuple[int, socket.socket],
    workers: set[int],
    stdin_fd: int,
    sandbox=None,
    server_cgroup: str | None = None,
) -> tuple[int, socket.socket] | None:
    """Give one spawn request to the spare worker; returns the spare still unused, or None."""
    conn, _ = listener.accept()
    try:
        spec, fds = recv_msg(conn, with_fds=True)
    except (OSError, ValueError):
        conn.close()
        return spare
    if spec is None or spec.get("op") != "spawn" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        conn.close()
        return spare
    spare_pid, handoff = spare
    if not _alive_child(spare_pid):  # the spare was killed from outside: fork a fresh one
        workers.discard(spare_pid)
        handoff.close()
        spare_pid, handoff = _fork_spare(listener, stdin_fd, sandbox, server_cgroup)
        workers.add(spare_pid)
    try:
        send_msg(handoff, spec, [conn.fileno(), fds[0]])
    except OSError:
        pass  # the env sees its connection close without a hello and reports it
    handoff.close()
    conn.close()
    os.close(fds[0])
    return None


def _alive_child(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == 0


def serve(sock_path: str, config: dict) -> None:
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    sandbox = _load_sandbox()
    sandbox.sweep_cgroups(keep_server_pid=os.getpid())
    server_cgroup = sandbox.server_cgroup(os.getpid())
    sandbox.READONLY_FS_WORKS = sandbox.probe_readonly_fs()  # inherited by every forked worker
    failed = _preload(list(config.get("preload", [])))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(128)
    ready = {
        "ready": True,
        "pid": os.getpid(),
        "versions": _versions(),
        "failed_preloads": failed,
        "cgroup": server_cgroup,
    }
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    gc.collect()
    gc.freeze()  # keep preloaded objects out of future collections: fewer copy-on-write pages
    workers: set[int] = set()
    doomed: set[str] = set()  # cgroups of exited workers still to empty and remove
    stdin_fd = sys.stdin.fileno()
    spare = _fork_spare(listener, stdin_fd, sandbox, server_cgroup)
    workers.add(spare[0])
    while True:
        readable, _, _ = select.select([listener, stdin_fd], [], [], 0.5)
        if stdin_fd in readable and not os.read(stdin_fd, 4096):
            break  # our owner is gone
        if listener in readable:
            spare = _hand_off(listener, spare, workers, stdin_fd, sandbox, server_cgroup)
        # Housekeeping after the hand-off, off the critical path of episode start.
        if _reap(workers, sandbox, server_cgroup, doomed):
            _kill_orphans(workers)
        for path in list(doomed):
            if sandbox.kill_cgroup(path, timeout_s=0):
                doomed.discard(path)
        if spare is None:
            spare = _fork_spare(listener, stdin_fd, sandbox, server_cgroup)
            workers.add(spare[0])
    for pid in list(workers):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    _kill_orphans(set())
    if server_cgroup:
        for name in os.listdir(server_cgroup) if os.path.isdir(server_cgroup) else []:
            child = os.path.join(server_cgroup, name)
            if os.path.isdir(child):
                sandbox.kill_cgroup(child, timeout_s=2.0)
        try:
            os.rmdir(server_cgroup)
        except OSError:
            pass


if __name__ == "__main__":
    serve(sys.argv[1], json.loads(sys.argv[2]))
