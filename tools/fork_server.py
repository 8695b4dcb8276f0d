"""Env-side handle to the kernel fork server: one preloaded ``kernel_server.py`` process per
(interpreter, preload list, sandbox settings) per env-hosting process, started with an
allowlisted environment and reachable only over a socket pair it inherits. ``tools.kernel``
asks it for one worker per episode."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tools import kernel_server as wire
from tools import sandbox as sandboxing

log = logging.getLogger(__name__)

DEFAULT_PRELOAD = (
    "numpy",
    "pandas",
    "matplotlib.pyplot",
    "seaborn",
    "scipy.stats",
    "sklearn",
    "sklearn.linear_model",
    "sklearn.ensemble",
    "sklearn.model_selection",
    "sklearn.preprocessing",
    "sklearn.metrics",
    "statsmodels.api",
    "networkx",
    "openpyxl",
    "sqlite3",
)
SERVER_START_TIMEOUT_S = 180.0
# What the kernel server (and so every cell) inherits from the trainer's environment: an
# allowlist, so a credential under any name (the judge's API key, MYSQL_PWD, DATABASE_URL...)
# stays out of reach of policy code.
KERNEL_ENV_ALLOWLIST = frozenset(
    {
        "PATH",
        "HOME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "USER",
        "LOGNAME",
        "LD_LIBRARY_PATH",
        "MPLBACKEND",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "NUMEXPR_MAX_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        "PYTHONHASHSEED",
        "SOURCE_DATE_EPOCH",
    }
)


# Thread pools default to one thread per worker unless the trainer's environment says otherwise:
# many episodes share the cores anyway, and an idle pool thread is a thread the leftover check
# (counted from outside, docs/design.md section 12) cannot tell from one a cell left running.
KERNEL_THREAD_DEFAULTS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# Set for every interpreter a cell starts (``python -c``/``-m``, joblib's loky workers,
# ``multiprocessing``'s spawn): the workspace is their directory and the policy writes it, so
# neither the directory nor the script's folder may lead ``sys.path`` (a planted ``argparse.py``
# would run in a later honest cell's workers), nor may a user site or bytecode written there.
# ``PYTHONPATH``/``PYTHONSTARTUP`` never reach cells: they are outside the allowlist.
KERNEL_PYTHON_FLAGS = {"PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def kernel_environment(python: str | None = None) -> dict[str, str]:
    """What the kernel server and its cells inherit. With the kernel's interpreter given by
    path, its folder leads ``PATH``, so ``python3``/``pip`` that a cell runs are that venv's
    (the stack's), not whatever the host's PATH finds first."""
    env = {k: v for k, v in os.environ.items() if k in KERNEL_ENV_ALLOWLIST or k.startswith("LC_")}
    for key, value in KERNEL_THREAD_DEFAULTS.items():
        env.setdefault(key, value)
    env.update(KERNEL_PYTHON_FLAGS)
    if python and os.sep in python:
        folder = os.path.dirname(os.path.abspath(python))  # not resolved: a venv's bin stays
        env["PATH"] = os.pathsep.join(p for p in (folder, env.get("PATH")) if p)
    return env


# The settings that isolate cells (a different value than the default is weaker).
PROTECTIVE_SETTINGS = ("pid_namespace", "readonly_fs", "seccomp", "cgroup", "network", "uid", "allow_unsafe")


def weaker_than_default(asked: dict, effective: dict, probe: dict) -> list[str]:
    """Each protective setting in force that differs from ``sandbox.DEFAULTS``, saying whether
    it was asked for or chosen by the server because the default could not be set up here; and
    what the start-up probe's worker lacked though its setting was on (``probe``: the syscall
    filter, the empty network namespace)."""
    out = []
    seccomp, network = probe.get("seccomp"), probe.get("network")
    if effective.get("seccomp") and isinstance(seccomp, str) and seccomp != "on":
        out.append(f"seccomp {seccomp}")
    if not effective.get("network") and isinstance(network, str) and network.startswith("open"):
        out.append(f"network {network}")
    for key in PROTECTIVE_SETTINGS:
        default, value = sandboxing.DEFAULTS.get(key), effective.get(key, asked.get(key))
        if value != default:
            asked_for = asked.get(key)
            how = "as configured" if asked_for == value else f"asked {asked_for}, could not be set up here"
            out.append(f"{key}={value} ({how})")
    return out


SPAWN_TIMEOUT_S = 30.0
MAX_HELLO_BYTES = 64 * 1024


class KernelError(RuntimeError):
    """The kernel infrastructure failed for reasons outside the policy's control."""


def wait_readable(fds: list, timeout_s: float) -> set[int]:
    """The descriptors (ints or sockets) readable within ``timeout_s`` — EOF and errors count.
    ``poll``, not ``select``: a trainer with a thousand episodes holds descriptors past 1,024,
    which ``select`` refuses."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN | select.POLLPRI)
    return {fd for fd, _ in poller.poll(max(0, int(timeout_s * 1000 + 0.999)))}


class KernelServer:
    """One fork server process; shared by every episode of this process with the same settings.

    The server is reachable only through a socket pair it inherits (``pass_fds``): nothing a
    cell can see in the filesystem or in ``/proc`` lets it ask for a worker.
    """

    _instances: dict[tuple, KernelServer] = {}
    _lock = threading.Lock()

    def __init__(self, python: str, preload: tuple[str, ...], sandbox: dict | None = None):
        self.python = python
        self.preload = preload
        self.sandbox = sandboxing.settings(sandbox)
        self._chan_lock = threading.Lock()
        self._exits: dict[int, dict] = {}  # the server's exit reports, by worker pid
        self._chan, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server_script = Path(__file__).with_name("kernel_server.py")
        cfg = json.dumps({"preload": list(preload), "sandbox": self.sandbox})
        try:
            self.proc = subprocess.Popen(
                [python, "-I", str(server_script), str(theirs.fileno()), cfg],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                close_fds=True,
                pass_fds=(theirs.fileno(),),
                env=kernel_environment(python),
            )
        except OSError as exc:
            self._chan.close()
            raise KernelError(f"cannot start kernel interpreter {python!r}: {exc}") from exc
        finally:
            theirs.close()
        ready = self._read_ready()
        self.versions: dict[str, str] = ready.get("versions", {})
        self.failed_preloads: dict[str, str] = ready.get("failed_preloads", {})
        self.effective_sandbox: dict = ready.get("sandbox", {})
        self.memory_cgroup: str | None = ready.get("memory_cgroup")  # the server's own folder
        for name, why in self.failed_preloads.items():
            log.warning("kernel preload %s failed under %s: %s", name, python, why)
        weaker = weaker_than_default(self.sandbox, self.effective_sandbox, ready.get("probe") or {})
        if weaker:  # once per server: every episode it serves runs with these settings
            log.warning("kernel sandbox weaker than the default: %s", "; ".join(weaker))

    def _read_ready(self) -> dict:
        assert self.proc.stdout is not None
        ready_fd = self.proc.stdout.fileno()
        readable = wait_readable([ready_fd], SERVER_START_TIMEOUT_S)
        line = self.proc.stdout.readline() if readable else b""
        if not line:
            self.shutdown()
            raise KernelError(
                f"kernel server under {self.python!r} did not start (exit code {self.proc.poll()}); "
                "check that the interpreter runs and has the kernel stack "
                "(pip install 'deepanalyze-env[kernel]')"
            )
        ready = json.loads(line)
        if ready.get("ready") is not True:
            self.shutdown()
            raise KernelError(f"kernel server refused to start: {ready.get('error')}")
        return ready

    @classmethod
    def get(cls, python: str | None, preload: tuple[str, ...] | None, sandbox=None) -> KernelServer:
        settings = sandboxing.settings(sandbox)
        key = (
            python or sys.executable,
            tuple(DEFAULT_PRELOAD if preload is None else preload),
            json.dumps(settings, sort_keys=True),
            os.getpid(),
        )
        with cls._lock:
            server = cls._instances.get(key)
            if server is None or not server.alive():
                if server is not None:
                    log.warning(
                        "kernel server %s died (exit %s); restarting", server.proc.pid, server.proc.poll()
                    )
                    server.shutdown()
                server = cls(key[0], key[1], settings)
                cls._instances[key] = server
            return server

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _drain_reports(self) -> None:
        """Read the server's exit reports (non-blocking); caller holds ``_chan_lock``."""
        while True:
            try:
                data = self._chan.recv(4096, socket.MSG_DONTWAIT)
            except (BlockingIOError, OSError):
                return
            if not data:
                return
            with contextlib.suppress(ValueError, KeyError, TypeError):
                report = json.loads(data)
                self._exits[int(report["exit"])] = {
                    "status": int(report["status"]),
                    "memory": report.get("memory") if isinstance(report.get("memory"), dict) else None,
                }
                if len(self._exits) > 4096:  # reports nobody asked for: keep the newest
                    for old in list(self._exits)[:2048]:
                        del self._exits[old]

    def exit_report(self, pid: int, wait_s: float) -> dict | None:
        """The server's report of worker ``pid``'s end (``{"status", "memory"}``), waiting up to
        ``wait_s`` for it: the server reaps and reports a worker within milliseconds of its
        death. None when no report came (or the server is gone)."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._chan_lock:
                self._drain_reports()
                report = self._exits.get(pid)
            remaining = deadline - time.monotonic()
            if report is not None or remaining <= 0 or not self.alive():
                return report
            wait_readable([self._chan], min(remaining, 0.05))

    def spawn(
        self,
        workspace: str,
        memory_mb: int | None,
        stateful: bool,
        cpu_backstop_s: int | None,
        tmp: str | None = None,
    ):
        """Fork a worker; returns (control socket, output read fd, hello, pidfd) — hello has the
        sandbox protections in force; the pidfd is how the worker is killed, never its pid.
        ``tmp``: the tmp folder of the episode's bounded storage (``tools.workspace``), if any."""
        out_r, out_w = os.pipe()
        ctrl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        spec = {
            "op": "spawn",
            "workspace": workspace,
            "tmp": tmp,
            "memory_mb": memory_mb,
            "stateful": stateful,
            "cpu_backstop_s": cpu_backstop_s,
        }
        fds: list[int] = []
        try:
            with self._chan_lock:
                self._drain_reports()
                socket.send_fds(self._chan, [json.dumps(spec).encode()], [theirs.fileno(), out_w])
            theirs.close()
            os.close(out_w)
            out_w = -1
            ctrl.settimeout(SPAWN_TIMEOUT_S)
            hello, fds = wire.recv_msg(ctrl, with_fds=True, max_bytes=MAX_HELLO_BYTES)
        except (OSError, ValueError) as exc:
            theirs.close()
            ctrl.close()
            os.close(out_r)
            if out_w >= 0:
                os.close(out_w)
            for fd in fds:
                os.close(fd)
            raise KernelError(f"kernel server did not fork a worker: {exc}") from exc
        if not hello or not hello.get("hello") or len(fds) != 1:
            ctrl.close()
            os.close(out_r)
            for fd in fds:
                os.close(fd)
            raise KernelError("kernel worker exited before it was ready")
        ctrl.setblocking(False)
        os.set_blocking(out_r, False)
        return ctrl, out_r, hello, fds[0]

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            if self.proc.stdin:
                self.proc.stdin.close()  # EOF: the server kills its workers and exits
            self.proc.wait(timeout=5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            self._chan.close()

    @classmethod
    def shutdown_all(cls) -> None:
        with cls._lock:
            for server in cls._instances.values():
                server.shutdown()
            cls._instances.clear()
