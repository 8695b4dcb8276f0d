"""Env-side handle to one episode's kernel worker, and every verdict about its cells.

A ``Kernel`` is one episode's live worker, forked by the fork server (``tools.fork_server``).
The per-cell time limit is a wall-clock watchdog here, in the env: on expiry the worker and
every process of the episode are killed and the next cell gets a freshly forked worker.

Who decides a cell's status (docs/design.md section 12). Default (stateless) cells: the worker
never runs policy code; each cell runs in a child it forks, and the worker replies ``ok``,
``error`` or ``crashed`` from what it observed of that child, after every process of the cell
was ended. The env trusts that reply, and decides ``timeout`` and a dead worker itself, from
the clock and the sockets. ``stateful_cells``: cells run inside the worker, so its reply is
policy-writable; the env then also checks from ``/proc`` that the worker went back to waiting
(``_worker_idle``) and treats a malformed reply as tampering.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools import kernel_server as wire
from tools import sandbox as sandboxing
from tools.fork_server import KernelError, KernelServer, wait_readable
from tools.output import CappedOutput
from tools.workspace import episode_tmp

log = logging.getLogger(__name__)

CGROUP_KILL_WAIT_S = 0.5
# How long to wait for the fork server's report of a dead worker (its memory cgroup's final
# counters); the server reaps within milliseconds, so this bounds only a stuck server.
EXIT_REPORT_WAIT_S = 3.0
_warned_no_memory_cgroup = False
MAX_REPLY_BYTES = 64 * 1024  # a cell's reply is a status line; anything bigger is forged
DRAIN_LIMIT_S = 0.25  # bound on reading output a cell's leftovers keep writing
# Stateful cells: after a reply the worker must be back waiting for a request
# (Kernel._worker_idle) before it spends this much CPU, sleeps this long elsewhere, or this
# much time passes.
IDLE_CPU_S = 0.05
IDLE_SLEEP_S = 0.05
IDLE_WALL_S = 5.0
# Per architecture: the syscalls the worker loop waits in (read, recvfrom, recvmsg), and futex
# (a thread waiting for the GIL, not a sign of anything).
_ARCH_SYSCALLS = {"x86_64": ({"0", "45", "47"}, "202"), "aarch64": ({"63", "207", "212"}, "98")}
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# The most a stateless worker may take to acknowledge a cell (it ends the last cell's processes
# first: a cell that left hundreds costs seconds) before the turn is a timeout: a stuck worker
# still ends the turn. Not part of the cell's own deadline.
START_LIMIT_S = 15.0


class KernelLost(KernelError):
    """The worker died while idle (between cells), and the env can show the cause was outside."""


class ProtocolViolation(Exception):
    """A reply on the control socket that the worker's code would never send: forged by a cell."""


@dataclass(frozen=True)
class CellResult:
    """How one cell ended (status, capped output, time), as the env's watchdog and pipe reader saw it."""

    status: str  # "ok" | "error" | "timeout" | "crashed"
    output: str
    elapsed_ms: float
    truncated: bool
    error_type: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == "ok"


def _pidfd_pid(pidfd: int) -> int | None:
    """The pid (in our namespace) a pidfd names, from its fdinfo; None once it has exited."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as fh:
            for line in fh:
                if line.startswith("Pid:"):
                    pid = int(line.split()[1])
                    return pid if pid > 0 else None
    except (OSError, ValueError):
        return None
    return None


def _exited(pidfd: int, wait_s: float = 0.0) -> bool:
    return bool(wait_readable([pidfd], wait_s))


class Kernel:
    """One episode's worker: run cells, enforce the wall-clock limit, restart after a kill.

    Attribution is decided here, from the trainer side only (docs/design.md section 12). Once a
    cell of the episode has run, any death of its worker, any failure to start its replacement
    and any odd exit is the policy's (the turn is ``crashed``, or ``timeout``): exit statuses,
    signals and siginfo are not evidence, since a cell can forge all of them (``rt_tgsigqueueinfo``
    on itself with a kernel ``si_code``, ``RLIMIT_CPU``...). ``KernelLost``
    (``environment_error``) needs evidence the worker cannot write: no cell of the episode ran
    yet; an OOM killer ended it while idle although the episode never reached its own memory
    limit (``_oom_outside_episode``); the fork server, which cells cannot reach from their PID
    namespace, is dead; or the episode's workspace folder is gone from the trainer's view while
    cells could not remove it (read-only filesystem: it is a mount point to them). The env's own
    kills (timeout, recycle, close) are never deaths to attribute.

    Memory (``memory_mb``) is bounded from outside, by the worker's memory cgroup (all the
    episode's processes together, files its cells write in the episode's tmpfs included), where
    one can be made; ``RLIMIT_AS`` per process stays as the early, recoverable ``MemoryError``.
    Whether an OOM killer ended one of the episode's processes is read from that cgroup's own
    counters (``sandbox.memory_events``), never from the host-wide ``oom_kill`` of
    ``/proc/vmstat``, which moves for every cgroup's OOM kills, a hostile neighbour's included.
    """

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
        self.memory_cgroup: str | None = None
        self._memory_seen: dict | None = None  # its counters after the last cell (or the start)
        self._memory_counters: sandboxing.MemoryCounters | None = None
        self.server = KernelServer.get(python, preload, self.sandbox_settings)
        self._ctrl: socket.socket | None = None
        self._out: int = -1
        self._pidfd: int = -1
        self.pid: int | None = None
        self.restarts = 0
        self.leftover_cells = 0  # stateless cells whose processes outlived them (the worker ended them)
        self.violations = 0
        self._seq = 0
        self._proc_fds: tuple[int, int, int] | None = None  # (pid, its /proc stat and syscall)
        self._oom_kills = 0
        self._start()

    @property
    def versions(self) -> dict[str, str]:
        return dict(self.server.versions)

    def _start(self) -> None:
        if not self.server.alive():
            self.server = KernelServer.get(self.server.python, self.server.preload, self.sandbox_settings)
        self._ctrl, self._out, hello, self._pidfd = self.server.spawn(
            self.workspace, self.memory_mb, self.stateful, self.cpu_backstop_s, episode_tmp(self.workspace)
        )
        self.pid = _pidfd_pid(self._pidfd) or int(hello.get("pid") or 0) or None
        self.sandbox = dict(hello.get("sandbox") or {})
        self.cgroup = self.sandbox.get("cgroup")
        self.memory_cgroup = self.sandbox.get("memory_cgroup")
        self._memory_counters = sandboxing.MemoryCounters.open(self.memory_cgroup)
        self._memory_seen = self._memory_counters.read() if self._memory_counters else None
        if self._memory_seen is None:
            self.memory_cgroup = None
            _warn_no_memory_cgroup(self.memory_mb)
        self._oom_kills = _oom_kills()  # without a memory cgroup: any OOM kill since makes a death ambiguous

    def _kill(self) -> None:
        """Kill the worker and every process it started, by handle, never by a bare pid that
        may have been reused: with a PID namespace, SIGKILL to its init (by pidfd) makes the
        kernel kill the whole namespace; otherwise the cgroup, or the tree found under the
        stopped worker while its pidfd shows it has not exited."""
        pidfd = self._pidfd
        if pidfd >= 0:
            if self.sandbox.get("pid_ns"):
                if self.cgroup:  # no new process from now on: a fork bomb stops growing
                    sandboxing.freeze_forks(self.cgroup)
                with contextlib.suppress(ProcessLookupError, OSError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                # No wait: once the init has SIGKILL pending nothing in the namespace runs user
                # code again, and its teardown (mount and network namespaces) takes tens of ms.
            else:
                if self.cgroup:
                    # Whatever is left after this bounded wait can no longer fork and is killed
                    # for good by the fork server when it reaps the worker.
                    sandboxing.kill_cgroup(self.cgroup, timeout_s=CGROUP_KILL_WAIT_S)
                elif self.pid is not None:
                    sandboxing.kill_tree_by_pidfd(pidfd, self.pid)
                with contextlib.suppress(ProcessLookupError, OSError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.close(pidfd)
        if self._ctrl is not None:
            self._ctrl.close()
        if self._out >= 0:
            os.close(self._out)
        self._close_proc_fds()
        if self._memory_counters is not None:
            self._memory_counters.close()
            self._memory_counters = None
        self._ctrl, self._out, self._pidfd, self.pid, self.cgroup = None, -1, -1, None, None

    def _died_while_idle(self) -> bool:
        assert self._ctrl is not None
        if self._pidfd >= 0 and _exited(self._pidfd):
            return True
        if not wait_readable([self._ctrl], 0):
            return False
        try:
            return self._ctrl.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def _outside_cause(self, idle: bool) -> str | None:
        """Trainer-side evidence that a worker's death (or its replacement's failure to start)
        came from outside the episode; None when it is the policy's. See the class docstring."""
        if self._seq == 0:
            return "before any cell of the episode ran"
        gone = self._workspace_removed()
        if gone:
            return gone
        if self.sandbox.get("pid_ns") and not self.server.alive():
            return f"the fork server died (exit status {self.server.proc.poll()})"
        if idle and self._oom_outside_episode():
            return "the host's OOM killer ended it while it was idle"
        return None

    def _memory_now(self) -> dict | None:
        """The worker's memory cgroup counters; once it is gone with its worker, the fork
        server's report of the worker's end (read before it removed the cgroup)."""
        found = self._memory_counters.read() if self._memory_counters is not None else None
        if found is None and self.pid is not None:
            report = self.server.exit_report(self.pid, EXIT_REPORT_WAIT_S)
            found = report.get("memory") if report else None
        return found

    def _oom_outside_episode(self) -> bool:
        """An OOM killer ended a process of the episode since its last cell while the episode's
        own limit was never reached: the host (or a limit above the episode) ran out of memory.
        Without a memory cgroup: the host-wide counter moved since the worker started."""
        if self.memory_cgroup is None:
            return _oom_kills() != self._oom_kills
        before, after = self._memory_seen, self._memory_now()
        if before is None or after is None:
            return False
        return after["oom_kill"] > before["oom_kill"] and after["limit_hits"] == before["limit_hits"]

    def _memory_limit_stopped(self) -> bool:
        """During this cell an OOM killer ended one of the episode's processes because the
        episode reached its own memory limit (both of its cgroup's counters moved)."""
        before = self._memory_seen
        if before is None:
            return False
        after = self._memory_now()
        if after is None:
            return False
        self._memory_seen = after
        return after["oom_kill"] > before["oom_kill"] and after["limit_hits"] > before["limit_hits"]

    def _workspace_removed(self) -> str | None:
        if self.sandbox.get("fs") == "readonly" and not os.path.isdir(self.workspace):
            return f"the episode's workspace {self.workspace} was removed from outside the episode"
        return None

    def _replace_worker(self) -> CellResult | None:
        """Start the next worker after a timeout, crash or recycle; None when it said hello.
        A failure is the policy's (a crashed turn) unless ``_outside_cause`` finds evidence."""
        try:
            self._start()
            return None
        except KernelError as exc:
            cause = self._outside_cause(idle=False)
            if cause is not None:
                raise KernelLost(f"the kernel worker could not be restarted ({cause or exc})") from exc
            log.info("replacement worker failed to start after a cell ran: %s", exc)
            self.restarts += 1
            return CellResult("crashed", self._restart_failed_message(), 0.0, False, "KernelDied")

    def _drain_stale(self) -> None:
        """Drop output written between cells (stateful cells: background threads of an earlier
        cell; a stateless cell's processes and its output pipe end with it)."""
        deadline = time.monotonic() + DRAIN_LIMIT_S
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._out, 1 << 16) and time.monotonic() < deadline:
                pass

    def run(self, code: str) -> CellResult:
        """Run one cell. Raises KernelLost/KernelError only for faults outside the policy."""
        gone = self._workspace_removed()
        if gone:
            self._kill()
            raise KernelLost(gone)
        if self._ctrl is None:
            # After a timeout, crash or recycle (already reported in that cell's output).
            failed = self._replace_worker()
            if failed is not None:
                return failed
        elif self._died_while_idle():
            cause = self._outside_cause(idle=True)
            self._kill()
            if cause is not None:
                raise KernelLost(f"the kernel worker died between cells ({cause})")
            self.restarts += 1
            return CellResult("crashed", self._idle_death_message(), 0.0, False, "KernelDied")
        self._drain_stale()
        output = CappedOutput(self.max_output_chars)
        start = time.monotonic()
        # Stateless: the cell's deadline starts when the worker (which runs no policy code)
        # acknowledges it took the cell, so the time it spent ending the last cell's processes
        # is charged to nobody; until then the bound is START_LIMIT_S.
        deadline = start + (self.timeout_s if self.stateful else max(START_LIMIT_S, self.timeout_s))
        self._seq += 1
        try:
            self._ctrl.setblocking(True)
            wire.send_msg(self._ctrl, {"op": "cell", "seq": self._seq, "code": code})
            self._ctrl.setblocking(False)
        except OSError:
            # The worker is gone or stopped reading: whatever an earlier cell did, its doing.
            self._kill()
            self.restarts += 1
            return CellResult("crashed", self._idle_death_message(), 0.0, False, "KernelDied")
        status, reply, violation, start = self._await_reply(output, deadline, start)
        elapsed_ms = (time.monotonic() - start) * 1000.0
        self._drain_into(output)
        if violation is not None:
            self.violations += 1
        if status == "crashed" and violation is None:
            cause = self._outside_cause(idle=False)
            if cause is not None:
                self._kill()
                raise KernelLost(f"the kernel worker died during the cell ({cause})")
        if self.stateful and reply is not None and violation is None and not self._worker_idle():
            # The reply came, yet the worker is not back waiting for a request: a cell wrote
            # the reply itself and kept running. It does not outlive its turn.
            violation, status = "a reply while the cell kept running", "crashed"
            self.violations += 1
        memory_hit = (
            status in ("ok", "error", "crashed") and violation is None and self._memory_limit_stopped()
        )
        error_type = reply.get("error_type") if reply else None
        if memory_hit:  # a process of the cell was stopped by its memory limit: its failure
            status, error_type = ("crashed" if status == "crashed" else "error"), "MemoryError"
        # A stateless worker that replied "crashed" lost only the cell's own process: it stays.
        replied_crashed = violation is None and reply is not None and reply.get("status") == "crashed"
        restarted = status not in ("ok", "error") and not (status == "crashed" and replied_crashed)
        if restarted:
            self._kill()
            self.restarts += 1
        if reply is not None and reply.get("leftovers"):
            self.leftover_cells += 1  # stateless: already ended by the worker, before its reply
        text = output.text()
        if status == "timeout":
            text = _join(text, self._timeout_message())
        elif violation is not None:
            text = _join(text, self._violation_message(violation))
        elif memory_hit:
            text = _join(text, self._memory_message(crashed=status == "crashed", restarted=restarted))
        elif status == "crashed":
            text = _join(text, self._crash_message())
        return CellResult(
            status=status,
            output=text,
            elapsed_ms=elapsed_ms,
            truncated=output.truncated,
            error_type=error_type if isinstance(error_type, str) else None,
        )

    def _await_reply(
        self, output: CappedOutput, deadline: float, start: float
    ) -> tuple[str, dict[str, Any] | None, str | None, float]:
        """Collect the cell's output until its reply, its deadline or the worker's end:
        (status, reply, protocol violation, when the cell started). ``timeout`` and a worker's
        death (``crashed``) are decided here, from the clock and the socket; a stateless
        worker's reply may say ``crashed`` for its cell's own process. A stateless worker first
        acknowledges the cell (``{"seq", "started": true}``): the cell's own deadline starts
        then."""
        watch = [self._ctrl, self._out]
        reply = None
        status = None
        violation = None
        pending = bytearray()
        acked = self.stateful
        while status is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                status = "timeout"
                break
            fds = [w if isinstance(w, int) else w.fileno() for w in watch]
            readable = wait_readable(fds, remaining)
            if self._out in readable:
                try:
                    chunk = os.read(self._out, 1 << 16)
                except BlockingIOError:
                    chunk = None
                if chunk:
                    output.feed(chunk)
                elif chunk == b"":
                    watch.remove(self._out)  # every writer closed; keep waiting on the reply
            if self._ctrl.fileno() in readable:
                try:
                    data = self._ctrl.recv(MAX_REPLY_BYTES + 8)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    status = "crashed"
                    break
                pending += data
                try:
                    if not acked and self._take_ack(pending):
                        acked, start = True, time.monotonic()
                        deadline = start + self.timeout_s
                    reply = self._parse_reply(pending) if acked else None
                except ProtocolViolation as exc:
                    violation, status = str(exc), "crashed"
                    break
                if reply is not None:
                    status = reply["status"]
        return status, reply, violation, start

    def _take_ack(self, pending: bytearray) -> bool:
        """Remove the worker's acknowledgement of the current cell from ``pending``; False while
        incomplete. Any other first frame is a violation."""
        frame = _frame(pending, "an acknowledgement")
        if frame is None:
            return False
        ack, size = frame
        if ack != {"seq": self._seq, "started": True}:
            raise ProtocolViolation("a first frame that is not the acknowledgement of this cell")
        del pending[:size]
        return True

    def _close_proc_fds(self) -> None:
        if self._proc_fds is not None:
            for fd in self._proc_fds[1:]:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._proc_fds = None

    def _worker_idle(self) -> bool:
        """Stateful cells only (a stateless worker never runs policy code): after a reply the
        worker's main thread must go back to waiting for the next request
        (``/proc/<pid>/syscall``: read/recvfrom/recvmsg). It is judged by what it does, not by
        the clock, so a loaded host cannot fail an honest worker: it is not idle once it spent
        ``IDLE_CPU_S`` of CPU time since the reply (a cell computing on), or slept
        ``IDLE_SLEEP_S`` in any other syscall but a futex (a cell sleeping on), or is still not
        waiting after ``IDLE_WALL_S``."""
        arch = _ARCH_SYSCALLS.get(os.uname().machine)
        pid = self.pid
        if pid is None or arch is None:
            return True
        waits, futex = arch
        start = time.monotonic()
        first_cpu: float | None = None
        asleep_since: float | None = None
        if self._proc_fds is None or self._proc_fds[0] != pid:
            self._close_proc_fds()
            try:
                self._proc_fds = (
                    pid,
                    os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC),
                    os.open(f"/proc/{pid}/syscall", os.O_RDONLY | os.O_CLOEXEC),
                )
            except OSError:
                return True  # gone (the next cell finds out) or not readable to this uid
        _, stat_fd, syscall_fd = self._proc_fds
        while True:
            try:  # pread at 0 regenerates a /proc file: no open per poll
                fields = os.pread(stat_fd, 1024, 0).rsplit(b")", 1)[1].decode().split()
                nr = os.pread(syscall_fd, 24, 0).split(b" ", 1)[0].strip().decode()
            except (OSError, IndexError):
                return True  # gone: the next cell finds out
            if nr in waits:
                return True
            now = time.monotonic()
            cpu = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
            first_cpu = cpu if first_cpu is None else first_cpu
            if cpu - first_cpu > IDLE_CPU_S or now - start > IDLE_WALL_S:
                return False
            if fields[0] == "S" and nr not in ("running", "-1", futex):
                asleep_since = now if asleep_since is None else asleep_since
                if now - asleep_since > IDLE_SLEEP_S:
                    return False
            else:
                asleep_since = None
            if now - start >= 0.001:  # below: it is between its send and its recv, poll on
                time.sleep(0.0001 if now - start < 0.01 else 0.002)

    def _parse_reply(self, pending: bytearray) -> dict | None:
        """One reply frame from ``pending``, None while incomplete. Anything but exactly one
        well-formed frame for the current request is a violation: bytes a cell wrote itself."""
        frame = _frame(pending, "a reply frame")
        if frame is None:
            return None
        reply, size = frame
        if len(pending) > size:
            raise ProtocolViolation("bytes after the reply frame")
        if not isinstance(reply, dict) or reply.get("seq") != self._seq:
            raise ProtocolViolation("a reply frame for another request")
        # "crashed": a stateless worker saw its cell's process die without reporting the cell.
        if reply.get("status") not in (("ok", "error") if self.stateful else ("ok", "error", "crashed")):
            raise ProtocolViolation("a reply frame with an unknown status")
        return reply

    def _drain_into(self, output: CappedOutput) -> None:
        if self._out < 0:
            return
        deadline = time.monotonic() + DRAIN_LIMIT_S
        while time.monotonic() < deadline:
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

    def _memory_message(self, crashed: bool, restarted: bool) -> str:
        if crashed and self.crash_template is not None:
            return self.crash_template
        what = "the process running it was stopped" if crashed else "one of its processes was stopped"
        msg = (
            "[Error]:\nMemoryError: the cell exceeded the memory limit of "
            f"{self.memory_mb} MB (all its processes together, files it wrote included); {what}."
        )
        if restarted:
            msg += " The kernel was restarted."
            if self.stateful:
                msg += " Variables from earlier cells are lost."
        return msg

    def _idle_death_message(self) -> str:
        if self.crash_template is not None:
            return self.crash_template
        return (
            "[Error]:\nKernelDied: the kernel died after the previous cell (a timer, signal, thread "
            "or process that cell left behind); this cell did not run. The kernel was restarted."
        )

    def _restart_failed_message(self) -> str:
        if self.crash_template is not None:
            return self.crash_template
        return (
            "[Error]:\nKernelDied: the kernel could not be restarted after the previous cell (what "
            "that cell left in the workspace stops a new kernel from starting); this cell did not run."
        )

    def _violation_message(self, why: str) -> str:
        return (
            f"[Error]:\nKernelDied: the kernel's reply channel was tampered with ({why}); the "
            "kernel was restarted."
        )

    def close(self) -> None:
        self._kill()


def _frame(pending: bytearray, what: str) -> tuple[object, int] | None:
    """The first length-prefixed JSON frame of ``pending`` (the wire format of
    ``tools.kernel_server.send_msg``) and its size in bytes, None while incomplete. A frame over
    :data:`MAX_REPLY_BYTES` or not JSON is a violation: bytes a cell wrote itself."""
    if len(pending) < 4:
        return None
    length = int.from_bytes(pending[:4], "big")
    if length > MAX_REPLY_BYTES:
        raise ProtocolViolation(f"{what} announced {length} bytes (cap {MAX_REPLY_BYTES})")
    if len(pending) < 4 + length:
        return None
    try:
        return json.loads(bytes(pending[4 : 4 + length]).decode("utf-8")), 4 + length
    except ValueError as exc:
        raise ProtocolViolation(f"{what} that is not JSON") from exc


def _warn_no_memory_cgroup(memory_mb: int | None) -> None:
    global _warned_no_memory_cgroup
    if memory_mb and not _warned_no_memory_cgroup:
        _warned_no_memory_cgroup = True
        log.warning(
            "executor.memory_mb bounds each process's address space only (RLIMIT_AS): no memory "
            "cgroup could be made for the kernel workers here (needs a writable cgroup v1 memory "
            "hierarchy or a v2 one with the memory controller delegated), so an episode's "
            "processes together can use more"
        )


def _oom_kills() -> int:
    """The host's OOM-kill counter (every cgroup's kills too); used only where workers have no
    memory cgroup of their own."""
    try:
        with open("/proc/vmstat", "rb") as fh:
            for line in fh:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return 0
    return 0


def _join(head: str, tail: str) -> str:
    return tail if not head else head.rstrip("\n") + "\n" + tail
