"""Env-side handles to the kernel fork server and to one episode's worker.

A ``KernelServer`` is one preloaded ``kernel_server.py`` process per (interpreter, preload list)
per env-hosting process; a ``Kernel`` is one episode's live worker forked from it. The per-cell
time limit is a wall-clock watchdog here, in the env: on expiry the worker's whole process
group is killed and the next cell gets a freshly forked worker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tools import kernel_server as wire
from tools import sandbox as sandboxing
from tools.output import CappedOutput

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
# Environment variables the kernel server (and so every cell) does not inherit: the judge's API
# key and anything else that looks like a credential. (A cell running as the same uid can still
# read /proc/<pid>/environ of other processes of that uid; see the README's security model.)
_SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)


def kernel_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not _SECRET_ENV.search(k)}


SPAWN_TIMEOUT_S = 30.0
CGROUP_KILL_WAIT_S = 0.5


class KernelError(RuntimeError):
    """The kernel infrastructure failed for reasons outside the policy's control."""


class KernelLost(KernelError):
    """The worker died while idle (between cells): someone else killed it."""


@dataclass(frozen=True)
class CellResult:
    status: str  # "ok" | "error" | "timeout" | "crashed"
    output: str
    elapsed_ms: float
    truncated: bool
    error_type: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == "ok"


class KernelServer:
    """One fork server process; shared by every episode of this process with the same settings."""

    _instances: dict[tuple, KernelServer] = {}
    _lock = threading.Lock()

    def __init__(self, python: str, preload: tuple[str, ...]):
        self.python = python
        self.preload = preload
        self._dir = tempfile.mkdtemp(prefix="deepanalyze-kernel-")
        self.socket_path = os.path.join(self._dir, "server.sock")
        server_script = Path(__file__).with_name("kernel_server.py")
        cfg = json.dumps({"preload": list(preload)})
        try:
            self.proc = subprocess.Popen(
                [python, "-I", str(server_script), self.socket_path, cfg],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                close_fds=True,
                env=kernel_environment(),
            )
        except OSError as exc:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise KernelError(f"cannot start kernel interpreter {python!r}: {exc}") from exc
        ready = self._read_ready()
        self.versions: dict[str, str] = ready.get("versions", {})
        self.failed_preloads: dict[str, str] = ready.get("failed_preloads", {})
        for name, why in self.failed_preloads.items():
            log.warning("kernel preload %s failed under %s: %s", name, python, why)

    def _read_ready(self) -> dict:
        assert self.proc.stdout is not None
        ready_fd = self.proc.stdout.fileno()
        readable, _, _ = select.select([ready_fd], [], [], SERVER_START_TIMEOUT_S)
        line = self.proc.stdout.readline() if readable else b""
        if not line:
            self.shutdown()
            raise KernelError(
                f"kernel server under {self.python!r} did not start (exit code {self.proc.poll()}); "
                "check that the interpreter runs and has the kernel stack "
                "(pip install 'deepanalyze-env[kernel]')"
            )
        return json.loads(line)

    @classmethod
    def get(cls, python: str | None, preload: tuple[str, ...] | None) -> KernelServer:
        key = (python or sys.executable, tuple(DEFAULT_PRELOAD if preload is None else preload), os.getpid())
        with cls._lock:
            server = cls._instances.get(key)
            if server is None or not server.alive():
                if server is not None:
                    log.warning(
                        "kernel server %s died (exit %s); restarting", server.proc.pid, server.proc.poll()
                    )
                    server.shutdown()
                server = cls(key[0], key[1])
                cls._instances[key] = server
            return server

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(
        self,
        workspace: str,
        memory_mb: int | None,
        stateful: bool,
        cpu_backstop_s: int | None,
        sandbox: dict | None = None,
    ):
        """Fork a worker; returns (control socket, output read fd, hello) — hello has its pid
        and the sandbox protections in force."""
        out_r, out_w = os.pipe()
        ctrl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            ctrl.settimeout(SPAWN_TIMEOUT_S)
            ctrl.connect(self.socket_path)
            spec = {
                "op": "spawn",
                "workspace": workspace,
                "memory_mb": memory_mb,
                "stateful": stateful,
                "cpu_backstop_s": cpu_backstop_s,
                "sandbox": sandbox or {},
            }
            wire.send_msg(ctrl, spec, [out_w])
            os.close(out_w)
            out_w = -1
            hello = wire.recv_msg(ctrl)
        except (OSError, ValueError) as exc:
            ctrl.close()
            os.close(out_r)
            if out_w >= 0:
                os.close(out_w)
            raise KernelError(f"kernel server did not fork a worker: {exc}") from exc
        if not hello or "pid" not in hello:
            ctrl.close()
            os.close(out_r)
            raise KernelError("kernel worker exited before it was ready")
        ctrl.settimeout(None)
        os.set_blocking(out_r, False)
        return ctrl, out_r, hello

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            if self.proc.stdin:
                self.proc.stdin.close()  # EOF: the server kills its workers and exits
            self.proc.wait(timeout=5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    @classmethod
    def shutdown_all(cls) -> None:
        with cls._lock:
            for server in cls._instances.values():
                server.shutdown()
            cls._instances.clear()


class Kernel:
    """One episode's worker: run cells, enforce the wall-clock limit, restart after a kill."""

    def __init__(
        self,
        workspace: str | Path,
        *,
        timeout_s: float = 10.0,
        memory_mb: int | None = 2048,
        max_output_chars: int = 20000,
        stateful: bool = False,
        python: str | None = None,
        preload: tuple[str, ...] | None = None,
        cpu_backstop_s: int | None = 3600,
        timeout_message: str | None = None,
        crash_message: str | None = None,
        sandbox=None,
    ):
        self.workspace = str(workspace)
        self.timeout_s = float(timeout_s)
        self.memory_mb = memory_mb
        self.max_output_chars = int(max_output_chars)
        self.stateful = stateful
        self.cpu_backstop_s = cpu_backstop_s
        self.timeout_template = timeout_message  # "{timeout}" is replaced; None: the text below
        self.crash_template = crash_message
        self.sandbox_settings = sandboxing.settings(sandbox)
        self.sandbox: dict = {}  # protections in force in the current worker (from its hello)
        self.cgroup: str | None = None
        self.server = KernelServer.get(python, preload)
        self._ctrl: socket.socket | None = None
        self._out: int = -1
        self.pid: int | None = None
        self.restarts = 0
        self.recycled = 0
        self._start()

    @property
    def versions(self) -> dict[str, str]:
        return dict(self.server.versions)

    def _start(self) -> None:
        if not self.server.alive():
            self.server = KernelServer.get(self.server.python, self.server.preload)
        self._ctrl, self._out, hello = self.server.spawn(
            self.workspace, self.memory_mb, self.stateful, self.cpu_backstop_s, self.sandbox_settings
        )
        self.pid = int(hello["pid"])
        self.sandbox = dict(hello.get("sandbox") or {})
        self.cgroup = self.sandbox.get("cgroup")

    def _kill(self) -> None:
        """Kill the worker and every process it started, wherever they moved (new sessions)."""
        if self.pid is not None:
            if self.cgroup:
                # Whatever is left after this bounded wait can no longer fork and is killed for
                # good by the fork server when it reaps the worker.
                sandboxing.kill_cgroup(self.cgroup, timeout_s=CGROUP_KILL_WAIT_S)
            else:
                sandboxing.kill_tree(self.pid)
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(self.pid, signal.SIGKILL)
        if self._ctrl is not None:
            self._ctrl.close()
        if self._out >= 0:
            os.close(self._out)
        self._ctrl, self._out, self.pid, self.cgroup = None, -1, None, None

    def _died_while_idle(self) -> bool:
        assert self._ctrl is not None
        readable, _, _ = select.select([self._ctrl], [], [], 0)
        if not readable:
            return False
        try:
            return self._ctrl.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _drain_stale(self) -> None:
        """Drop output written between cells (background threads of an earlier cell)."""
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._out, 1 << 16):
                pass

    def run(self, code: str) -> CellResult:
        """Run one cell. Raises KernelLost/KernelError only for faults outside the policy."""
        if self._ctrl is None:
            self._start()  # after a timeout or crash (already reported in that cell's output)
        elif self._died_while_idle():
            self._kill()
            raise KernelLost("the kernel worker died between cells (killed from outside)")
        self._drain_stale()
        output = CappedOutput(self.max_output_chars)
        start = time.monotonic()
        deadline = start + self.timeout_s
        try:
            wire.send_msg(self._ctrl, {"op": "cell", "code": code})
        except OSError as exc:
            self._kill()
            raise KernelLost(f"the kernel worker could not receive the cell: {exc}") from exc
        watch = [self._ctrl, self._out]
        reply = None
        status = None
        while status is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                status = "timeout"
                break
            readable, _, _ = select.select(watch, [], [], remaining)
            if self._out in readable:
                try:
                    chunk = os.read(self._out, 1 << 16)
                except BlockingIOError:
                    chunk = None
                if chunk:
                    output.feed(chunk)
                elif chunk == b"":
                    watch.remove(self._out)  # every writer closed; keep waiting on the reply
            if self._ctrl in readable:
                try:
                    reply = wire.recv_msg(self._ctrl)
                except (OSError, ValueError):
                    reply = None
                status = "crashed" if reply is None else reply.get("status", "error")
        elapsed_ms = (time.monotonic() - start) * 1000.0
        self._drain_into(output)
        if status not in ("ok", "error"):
            self._kill()
            self.restarts += 1
        elif reply and reply.get("leftovers") and not self.stateful:
            # Threads or processes outlive the cell: recycle the worker so they cannot run on
            # into later cells (free without stateful cells: the next cell starts fresh anyway).
            self._kill()
            self.recycled += 1
        text = output.text()
        if status == "timeout":
            text = _join(text, self._timeout_message())
        elif status == "crashed":
            text = _join(text, self._crash_message())
        return CellResult(
            status=status,
            output=text,
            elapsed_ms=elapsed_ms,
            truncated=output.truncated,
            error_type=reply.get("error_type") if reply else None,
        )

    def _drain_into(self, output: CappedOutput) -> None:
        if self._out < 0:
            return
        while True:
            try:
                chunk = os.read(self._out, 1 << 16)
            except OSError:  # EAGAIN: nothing more buffered
                return
            if not chunk:
                return
            output.feed(chunk)

    def _timeout_message(self) -> str:
        if self.timeout_template is not None:
            return self.timeout_template.replace("{timeout}", str(float(self.timeout_s)))
        msg = (
            "[Error]:\nTimeoutError: the cell did not finish within "
            f"{self.timeout_s:g} seconds and was stopped."
        )
        if self.stateful:
            msg += " The kernel was restarted: variables from earlier cells are lost."
        return msg

    def _crash_message(self) -> str:
        if self.crash_template is not None:
            return self.crash_template
        msg = (
            "[Error]:\nKernelDied: the process running this cell died (a crash, os._exit, "
            "or the memory limit)."
        )
        if self.stateful:
            msg += " The kernel was restarted: variables from earlier cells are lost."
        return msg

    def close(self) -> None:
        self._kill()


def _join(head: str, tail: str) -> str:
    return tail if not head else head.rstrip("\n") + "\n" + tail
