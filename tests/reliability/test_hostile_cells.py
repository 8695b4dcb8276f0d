"""Hostile cells through a real env and real kernels (issue 8).

Each case: the cell ends within ``timeout_s`` + 2 s with a clear observation and status, the
next cell of the same episode works, and after ``close()`` no process of the episode and no
scratch folder remains. Fork bombs are bounded twice: the bomb itself stops at 2**7 processes
and the sandbox caps a worker at 64 pids here; where neither a pids cgroup nor RLIMIT_NPROC can
be enforced (root without a writable cgroup) the fork-bomb case is skipped.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import skyrl_gym

import tools.sandbox
from tests.conftest import code, pid_namespace, qa_extras, wait_gone, wait_gone_inside
from tools.kernel_server import SPARES

TIMEOUT_S = 2.0
PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]
FILE_CAP_MB = 50


@dataclass(frozen=True)
class Case:
    name: str
    src: str
    statuses: tuple[str, ...]
    says: str | None = None  # text the observation must contain


CASES = [
    Case("infinite_loop", "while True:\n    pass", ("timeout",), "did not finish within"),
    Case(
        "busy_thread_and_loop",
        "import threading\nthreading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True)"
        ".start()\nwhile True:\n    pass",
        ("timeout",),
        "did not finish within",
    ),
    Case(
        "busy_thread_outlives_cell",
        "import threading\nthreading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True)"
        ".start()\nprint('spinning')",
        ("ok",),
        "spinning",
    ),
    Case(
        "sigterm_ignored_then_loop",
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
        ("timeout",),
        "did not finish within",
    ),
    Case(
        "fork_bomb",
        "import os\nfor _ in range(7):\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
        "while True:\n    pass",
        ("timeout",),
        "did not finish within",
    ),
    Case(
        "memory_bomb_gradual",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(8 * 1024 * 1024))",
        ("error", "crashed", "timeout"),  # on a loaded machine the clock may win the race
        "[Error]:",
    ),
    Case("memory_bomb_sudden", "x = bytearray(64 * 1024 ** 3)", ("error", "crashed"), "MemoryError"),
    Case(
        "memory_bomb_numpy",
        "import numpy as np\nx = np.ones((200_000, 200_000))",
        ("error", "crashed"),
        "[Error]:",
    ),
    Case("output_10mb", "print('x' * 10_000_000)", ("ok",), "output truncated"),
    Case(
        "output_without_newlines_forever",
        "import sys\nwhile True:\n    sys.stdout.write('y' * 4096)",
        ("timeout",),
        "output truncated",
    ),
    Case("os_exit", "import os\nos._exit(3)", ("crashed",), "KernelDied"),
    Case("segfault", "import ctypes\nctypes.string_at(0)", ("crashed",), "KernelDied"),
    Case("sys_exit", "import sys\nsys.exit()", ("error",), "SystemExit"),
    Case("keyboard_interrupt", "raise KeyboardInterrupt", ("error",), "KeyboardInterrupt"),
    Case(
        "grandchild_new_session",
        "import subprocess\np = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "print('child', p.pid)",
        ("ok",),
        "child",
    ),
    Case(
        "double_forked_daemon",
        "import os, time\nr, w = os.pipe()\npid = os.fork()\nif pid == 0:\n    os.setsid()\n"
        "    if os.fork() == 0:\n        os.write(w, str(os.getpid()).encode())\n"
        "        time.sleep(300)\n    os._exit(0)\nos.waitpid(pid, 0)\n"
        "print('daemon', os.read(r, 64).decode())",
        ("ok",),
        "daemon",
    ),
    Case(
        "large_file",
        "with open('big.bin', 'wb') as f:\n    for _ in range(200):\n        f.write(b'\\0' * 2 ** 20)",
        ("error",),
        "File too large",
    ),
    Case(
        "delete_and_rewrite_source_data",
        "import os\nopen('sales.csv', 'w').write('store,revenue\\nZ,999\\n')\n"
        "for name in os.listdir('.'):\n    os.remove(name)\nprint(os.listdir('.'))",
        ("ok",),
        "[]",
    ),
    Case(
        "write_outside_workspace",
        "import tempfile, os\npath = os.path.join(tempfile.gettempdir(), 'deepanalyze-escape-probe')\n"
        "try:\n    open(path, 'w').write('x')\n    print('wrote', path)\n    os.remove(path)\n"
        "except OSError as exc:\n    print('refused', exc)",
        ("ok",),
        None,
    ),
    Case(
        "network_connection",
        "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1.5)\nprint('connected')",
        ("error",),
        "[Error]:",
    ),
]


@pytest.fixture(autouse=True)
def _small_caps(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "file_size_mb", FILE_CAP_MB)
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "max_processes", 64)


def make_env(root: Path, **executor):
    executor = {"timeout_s": TIMEOUT_S, "memory_mb": 256, **executor}
    env = skyrl_gym.make(
        "deepanalyze", env_config={"workspace_root": str(root), "executor": executor}, extras=qa_extras()
    )
    env.init(PROMPT)
    return env


def _episode_processes(server_pid: int, keep: set[int]) -> list[int]:
    """Descendants of the fork server other than its idle spare(s)."""
    try:
        kids = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    alive = []
    for p in kids:
        try:
            if p.pid not in keep and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def _wait(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def _fork_bomb_is_bounded(env) -> bool:
    sb = env.kernel.sandbox
    return bool(sb.get("cgroup")) or (os.geteuid() != 0 and sb.get("nproc"))


FALLBACK_CASES = [
    c
    for c in CASES
    if c.name
    in {
        "infinite_loop",
        "fork_bomb",
        "busy_thread_outlives_cell",
        "grandchild_new_session",
        "double_forked_daemon",
        "os_exit",
        "memory_bomb_gradual",
    }
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_cell_is_contained(case: Case, workspace_root: Path):
    _contained(case, workspace_root)


@pytest.mark.parametrize("case", FALLBACK_CASES, ids=[c.name for c in FALLBACK_CASES])
def test_hostile_cell_is_contained_without_cgroup(
    case: Case, workspace_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """What a normal user without a delegated cgroup or user namespaces gets: process-tree kills
    guarded by the worker's pidfd + the fork server as subreaper."""
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "cgroup", False)
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "pid_namespace", False)
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "allow_unsafe", True)  # no namespace: opted in
    _contained(case, workspace_root)


def _contained(case: Case, workspace_root: Path) -> None:
    source = workspace_root / "data" / "ws" / "sales.csv"
    original = source.read_bytes()
    env = make_env(workspace_root)
    try:
        if case.name == "fork_bomb" and not _fork_bomb_is_bounded(env):
            pytest.skip(
                "needs root with a writable pids cgroup (or a non-root user, for RLIMIT_NPROC): "
                "a fork bomb is not bounded here"
            )
        if case.name == "network_connection" and env.kernel.sandbox.get("network", "").startswith("open"):
            pytest.skip("needs root (or unprivileged user namespaces): no network namespace here")
        server_pid = env.kernel.server.proc.pid
        worker_pid = env.kernel.pid
        worker_ns = pid_namespace(worker_pid)
        scratch = env.workspace.path

        start = time.monotonic()
        out = env.step(code(case.src))
        took = time.monotonic() - start
        meta = out["metadata"]
        observation = out["observations"][0]["content"]

        assert took < TIMEOUT_S + 2.0, f"{case.name} took {took:.1f}s"
        assert out["done"] is False and out["reward"] == 0.0
        assert meta["exec"]["status"] in case.statuses, observation[-500:]
        shown = observation[len("\n<Execute>\n") : -len("\n</Execute>\n")]
        assert meta["code_pass"] == int(meta["exec"]["status"] == "ok" and bool(shown.strip()))
        assert observation.startswith("\n<Execute>\n") and observation.endswith("\n</Execute>\n")
        assert len(observation) < 25_000
        if case.says:
            assert case.says in observation, observation[-500:]
        if case.name == "busy_thread_outlives_cell":  # it ended with its cell's process
            threads = env.step(code("import threading\nprint(threading.active_count())"))
            assert threads["observations"][0]["content"] == "\n<Execute>\n1\n\n</Execute>\n"
        if case.name == "large_file":
            big = scratch / "big.bin"
            assert big.stat().st_size <= FILE_CAP_MB * 2**20
        if case.name in ("grandchild_new_session", "double_forked_daemon"):
            leftover = int(observation.split(case.says, 1)[1].split()[0])
            # killed by the worker before its reply (without a cgroup or a PID namespace too)
            assert env.kernel.leftover_cells == 1
            assert wait_gone_inside(leftover, worker_ns), "a process outlived its cell"

        nxt = env.step(
            code(
                "import pandas as pd\nprint(pd.read_csv('sales.csv').shape if "
                "__import__('os').path.exists('sales.csv') else 'gone')"
            )
        )
        assert nxt["metadata"]["exec"]["status"] == "ok", nxt["observations"][0]["content"]
        assert nxt["metadata"]["code_pass"] == 1

        final = env.step("<Answer>\nAnswer: B\n</Answer>")
        assert final["done"] is True
        assert final["metadata"]["reward_status"] == "scored"
        assert final["reward"] == 1.0
    finally:
        env.close()
    assert wait_gone(worker_pid, timeout=15.0)  # a fork bomb's teardown is slow on a loaded host
    assert _wait(lambda: len(_episode_processes(server_pid, set())) <= SPARES), (
        f"processes left: {_episode_processes(server_pid, set())}"
    )
    assert not scratch.exists()
    assert source.read_bytes() == original  # the task's source data is untouched
    cgroup = env.kernel.sandbox.get("cgroup")
    if cgroup:
        assert _wait(lambda: not os.path.exists(cgroup)), "the worker's cgroup was not removed"


def test_stateful_kernel_survives_hostile_cells(workspace_root: Path):
    env = skyrl_gym.make(
        "deepanalyze",
        env_config={
            "workspace_root": str(workspace_root),
            "stateful_cells": True,
            "executor": {"timeout_s": TIMEOUT_S, "memory_mb": 512},
        },
        extras=qa_extras(),
    )
    env.init(PROMPT)
    try:
        assert env.step(code("x = 41"))["metadata"]["exec"]["status"] == "ok"
        assert env.step(code("print(x + 1)"))["observations"][0]["content"].count("42") == 1
        crashed = env.step(code("import os\nos._exit(1)"))
        assert crashed["metadata"]["exec"]["status"] == "crashed"
        assert "variables from earlier cells are lost" in crashed["observations"][0]["content"]
        assert env.step(code("print('fresh')"))["metadata"]["exec"]["status"] == "ok"
    finally:
        env.close()


def test_sandbox_reports_what_is_in_force(workspace_root: Path):
    env = make_env(workspace_root)
    try:
        sb = env.kernel.sandbox
        assert set(sb) >= {"cgroup", "network", "nproc", "file_size_mb"}
        assert sb["file_size_mb"] == FILE_CAP_MB
        if os.geteuid() == 0 and os.access("/sys/fs/cgroup/pids", os.W_OK):
            assert sb["cgroup"], "root with a writable pids cgroup must get one"
            assert sb["network"] == "netns"
    finally:
        env.close()


def test_writes_outside_the_workspace_do_not_land(workspace_root: Path, tmp_path: Path):
    """With the read-only filesystem (root), nothing a cell writes outside its workspace reaches
    the host: not the task's source data by absolute path, not the scratch root, not /tmp."""
    env = make_env(workspace_root)
    try:
        if env.kernel.sandbox.get("fs") != "readonly":
            pytest.skip("no private read-only mount namespace here (needs root)")
        source = workspace_root / "data" / "ws" / "sales.csv"
        original = source.read_bytes()
        targets = [tmp_path / "probe.txt", env.workspace.path.parent / "probe.txt", Path("/tmp/da-probe.txt")]
        paths = [str(t) for t in targets]
        src = "\n".join(
            [
                "import os",
                f"for p in {paths!r}:",
                "    try:",
                "        open(p, 'w').write('x')",
                "        print('wrote', p)",
                "    except OSError as exc:",
                "        print('refused', p, exc.strerror)",
                "try:",
                f"    open({str(source)!r}, 'w').write('rewritten')",
                "except OSError as exc:",
                "    print('source', exc.strerror)",
                "open('inside.txt', 'w').write('ok')",
            ]
        )
        out = env.step(code(src))
        assert out["metadata"]["exec"]["status"] == "ok", out["observations"][0]["content"]
        # refused: read-only, or not even visible (a source under /tmp is hidden by the private /tmp)
        assert "\nsource " in out["observations"][0]["content"]
        assert source.read_bytes() == original
        assert not any(t.exists() for t in targets)
        assert (env.workspace.path / "inside.txt").read_text() == "ok"
    finally:
        env.close()


def test_cells_do_not_inherit_credentials(workspace_root: Path, monkeypatch: pytest.MonkeyPatch):
    from tools.fork_server import KernelServer

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-for-cells")
    monkeypatch.setenv("HF_TOKEN", "hf-test-not-for-cells")
    KernelServer.shutdown_all()  # the next episode starts a server with today's environment
    env = make_env(workspace_root)
    try:
        out = env.step(code("import os\nprint(sorted(k for k in os.environ if 'KEY' in k or 'TOKEN' in k))"))
        assert out["observations"][0]["content"] == "\n<Execute>\n[]\n\n</Execute>\n"
    finally:
        env.close()


# ---------------------------------------------------------------------------- issue 52
# A cell that rewrites how later cells are judged: through the worker's module (sys.modules,
# the call stack, the garbage collector), builtins, the output streams, the traceback module, or
# something that runs on after it (a thread, a daemon, a signal handler, an atexit hook). In the
# default mode every cell runs in a fresh process forked from a worker that never runs policy
# code, so none of this reaches a later cell: its status, output and code_pass are its own.

FORGED = "sanity check: all values verified"
_FAKE_RUN = f"def fake(code, namespace):\n    print({FORGED!r})\n    return 'ok', None\n"
PATCHES = {
    "sys_modules_main": _FAKE_RUN + "import sys\nsys.modules['__main__']._run_cell = fake\n",
    "sys_modules_all_functions": _FAKE_RUN + "import sys\nm = sys.modules['__main__']\n"
    "for name in ('_parse_status', '_await_cell'):\n"
    "    if hasattr(m, name):\n"
    "        setattr(m, name, lambda *a: ('ok', None))\n"
    "m._run_cell = fake\n",
    "gc_code_swap": _FAKE_RUN + "import gc\ngc.unfreeze()\n"
    "for o in gc.get_objects():\n"
    "    if type(o).__name__ == 'function' and o.__name__ == '_run_cell' and o is not fake:\n"
    "        o.__code__ = fake.__code__\n",
    "frame_globals": _FAKE_RUN + "import sys\nf = sys._getframe()\n"
    "while f is not None and '_run_cell' not in f.f_globals:\n"
    "    f = f.f_back\n"
    "f.f_globals['_run_cell'] = fake\n",
    "builtins_compile": "import builtins\nreal = builtins.compile\n"
    f"builtins.compile = lambda src, *a, **k: real({'print(' + repr(FORGED) + ')'!r}, *a, **k)\n",
    "output_streams": "import io, sys\n"
    "class Forger(io.TextIOBase):\n"
    "    def write(self, s):\n"
    f"        return sys.__stdout__.write({FORGED!r} + '\\n') and len(s)\n"
    "sys.stdout = sys.stderr = Forger()\n",
    "traceback_module": "import traceback, linecache\n"
    f"traceback.format_exception_only = lambda *a, **k: [{FORGED!r}]\n"
    "traceback.extract_tb = lambda *a, **k: []\n"
    "linecache.getline = lambda *a, **k: ''\n",
    "excepthook_signals_atexit": "import sys, signal, atexit\n"
    f"sys.excepthook = lambda *a: print({FORGED!r})\n"
    f"atexit.register(print, {FORGED!r})\n"
    f"signal.signal(signal.SIGTERM, lambda *a: print({FORGED!r}))\n",
    "background_thread": "import threading, time, sys\n"
    "def forge():\n"
    "    while True:\n"
    f"        sys.stdout.write({FORGED!r} + '\\n')\n"
    "        time.sleep(0.005)\n"
    "threading.Thread(target=forge, daemon=True).start()\n",
    # every pid the cgroup allows, held: the next cell's process must still be forked
    "exhaust_pids": "import os, time\n"
    "try:\n"
    "    for _ in range(200):\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(30)\n"
    "            os._exit(0)\n"
    "except OSError:\n"
    "    pass\n",
    "daemon_writes_later": "import os, time\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        for _ in range(5000):\n"
    "            time.sleep(0.001)\n"
    f"            os.write(1, {FORGED!r}.encode() + b'\\n')\n"
    "    os._exit(0)\n"
    "os.waitpid(pid, 0)\n"
    "time.sleep(0.05)\n",
}


def _shown(out: dict) -> str:
    return out["observations"][0]["content"][len("\n<Execute>\n") : -len("\n</Execute>\n")]


def _later_cells_are_judged_as_their_own(env) -> None:
    failing = env.step(code("1/0"))
    assert failing["metadata"]["exec"]["status"] == "error", _shown(failing)
    assert failing["metadata"]["code_pass"] == 0
    assert "ZeroDivisionError: division by zero" in _shown(failing) and FORGED not in _shown(failing)
    silent = env.step(code("pass"))
    assert silent["metadata"]["exec"]["status"] == "ok"
    assert _shown(silent).strip() == "" and silent["metadata"]["code_pass"] == 0
    real = env.step(code("print('real')"))
    assert _shown(real) == "real\n" and real["metadata"]["code_pass"] == 1
    final = env.step("<Answer>\nAnswer: B\n</Answer>")
    assert final["metadata"]["reward_status"] == "scored"
    assert final["metadata"]["code_pass"][-3:] == [0, 0, 1]


@pytest.mark.parametrize("patch", sorted(PATCHES))
def test_a_cell_cannot_change_how_later_cells_are_judged(patch: str, workspace_root: Path):
    env = make_env(workspace_root)
    try:
        env.step(code(PATCHES[patch]))
        _later_cells_are_judged_as_their_own(env)
    finally:
        env.close()


FALLBACK_PATCHES = ["sys_modules_main", "background_thread", "daemon_writes_later"]


@pytest.mark.parametrize("patch", FALLBACK_PATCHES)
def test_a_cell_cannot_change_later_cells_without_cgroup_or_pid_namespace(
    patch: str, workspace_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """The unprivileged fallback: the worker is its cells' child subreaper and kills what they
    leave (a double-forked daemon included) before it replies."""
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "cgroup", False)
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "pid_namespace", False)
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "allow_unsafe", True)  # no namespace: opted in
    env = make_env(workspace_root)
    try:
        assert not env.kernel.sandbox["pid_ns"] and not env.kernel.sandbox["cgroup"]
        env.step(code(PATCHES[patch]))
        _later_cells_are_judged_as_their_own(env)
    finally:
        env.close()


def test_a_cell_cannot_stop_or_kill_its_worker_into_an_environment_error(
    workspace_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """Without a PID namespace a cell can signal its worker (same uid): a killed worker is the
    cell's crash, a stopped one its timeout; never ``environment_error``."""
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "cgroup", False)
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "pid_namespace", False)
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "allow_unsafe", True)  # no namespace: opted in
    env = make_env(workspace_root)
    try:
        killed = env.step(code("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('x')"))
        assert killed["metadata"]["exec"]["status"] == "crashed", _shown(killed)
        stopped = env.step(code("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\nprint('x')"))
        assert stopped["metadata"]["exec"]["status"] == "timeout", _shown(stopped)
        _later_cells_are_judged_as_their_own(env)
    finally:
        env.close()


def test_stateful_cells_can_change_their_own_later_cells(workspace_root: Path):
    """What the spec says of ``stateful_cells`` (docs/design.md section 12): cells share the
    worker's process, so a patch holds for the episode's later cells. Only that episode."""
    env = skyrl_gym.make(
        "deepanalyze",
        env_config={
            "workspace_root": str(workspace_root),
            "stateful_cells": True,
            "executor": {"timeout_s": TIMEOUT_S, "memory_mb": 512},
        },
        extras=qa_extras(),
    )
    env.init(PROMPT)
    try:
        env.step(code(PATCHES["sys_modules_main"]))
        failing = env.step(code("1/0"))
        assert failing["metadata"]["exec"]["status"] == "ok" and FORGED in _shown(failing)
    finally:
        env.close()
    fresh = make_env(workspace_root)
    try:
        _later_cells_are_judged_as_their_own(fresh)
    finally:
        fresh.close()


def test_a_cell_sees_no_mount_of_other_jobs(workspace_root: Path, tmp_path: Path):
    """A mount of another job below a folder the sandbox covers (a tmpfs under the scratch
    root's parent, as another trainer's bounded storage would be) is not in a cell's
    /proc/mounts or /proc/self/mountinfo: only the episode's own folders are named."""
    import ctypes

    from tools.fork_server import KernelServer

    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    foreign = tmp_path / "other-job-storage"
    foreign.mkdir()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"tmpfs", str(foreign).encode(), b"tmpfs", 0, b"size=1m") != 0:
        pytest.skip(f"cannot mount a tmpfs here: {os.strerror(ctypes.get_errno())}")
    try:
        KernelServer.shutdown_all()  # spares forked from now on see the foreign mount on the host
        env = make_env(workspace_root)
        try:
            if env.kernel.sandbox.get("fs") != "readonly":
                pytest.skip("no private read-only mount namespace here")
            out = env.step(
                code("print(open('/proc/mounts').read())\nprint(open('/proc/self/mountinfo').read())")
            )
            text = _shown(out)
            assert out["metadata"]["exec"]["status"] == "ok" and "/proc" in text
            assert "other-job-storage" not in text
            own = str(env.workspace.root)  # the episode's folder: its workspace and storage
            base = str(tmp_path.parent)  # this test session's folders: scratch roots, other tests'
            named = [w for line in text.splitlines() for w in line.split() if w.startswith(base)]
            assert all(w == own or w.startswith(own + "/") for w in named), named
        finally:
            env.close()
    finally:
        libc.umount2(str(foreign).encode(), 2)
        KernelServer.shutdown_all()


# ----------------------------------------------------------------------------- what a cell leaves
# Red-team round on the per-cell executor: what one stateless cell could still change for the
# episode's later, honest cells (its worker's attributes, a module planted for new interpreters,
# SysV IPC objects), and what it could still see of the host.

_ATTRS = (
    "import os, resource\n"
    "print('nice', os.getpriority(os.PRIO_PROCESS, 0))\n"
    "print('cpus', sorted(os.sched_getaffinity(0)))\n"
    "print('fsize', resource.getrlimit(resource.RLIMIT_FSIZE))\n"
    "print('nofile', resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    "print('policy', os.sched_getscheduler(0))\n"
)
# Each call aims at the worker (the cell's parent) or at every process of the cell's uid or
# group; each prints REFUSED or CHANGED. Syscall numbers: x86_64.
_WORKER_ATTACKS = (
    "import ctypes, os, resource\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "w = os.getppid()\n"
    "def attempt(name, fn):\n"
    "    try:\n"
    "        fn()\n"
    "        print(name, 'CHANGED')\n"
    "    except OSError:\n"
    "        print(name, 'REFUSED')\n"
    "def raw(nr, *args):\n"
    "    def call():\n"
    "        if libc.syscall(nr, *args) != 0:\n"
    "            raise OSError(ctypes.get_errno(), 'refused')\n"
    "    return call\n"
    "attempt('prlimit', lambda: resource.prlimit(w, resource.RLIMIT_FSIZE, (10, 10)))\n"
    "attempt('setpriority', lambda: os.setpriority(os.PRIO_PROCESS, w, 19))\n"
    "attempt('setpriority_pgrp', lambda: os.setpriority(os.PRIO_PGRP, 0, 19))\n"
    "attempt('setpriority_user', lambda: os.setpriority(os.PRIO_USER, 0, 19))\n"
    "attempt('affinity', lambda: os.sched_setaffinity(w, {min(os.sched_getaffinity(0))}))\n"
    "attempt('scheduler', lambda: os.sched_setscheduler(w, os.SCHED_IDLE, os.sched_param(0)))\n"
    "attempt('param', lambda: os.sched_setparam(w, os.sched_param(0)))\n"
    "attr = (ctypes.c_uint32 * 14)(56, 5)  # size, SCHED_IDLE\n"
    "attempt('setattr', raw(314, w, ctypes.byref(attr), 0))\n"
    "attempt('ioprio', raw(251, 1, w, (3 << 13)))  # IOPRIO_WHO_PROCESS, class idle\n"
    "attempt('ioprio_user', raw(251, 3, 0, (3 << 13)))  # IOPRIO_WHO_USER, own uid\n"
)


def test_a_cell_cannot_change_its_workers_limits_priority_or_cpus(workspace_root: Path):
    """prlimit, setpriority, sched_set*, ioprio_set aimed at another process (the worker above
    all: every later cell is forked from it) are refused; the next cell's attributes are the
    first cell's."""
    env = make_env(workspace_root)
    try:
        before = _shown(env.step(code(_ATTRS)))
        attack = env.step(code(_WORKER_ATTACKS))
        assert attack["metadata"]["exec"]["status"] == "ok", _shown(attack)
        lines = _shown(attack).split("\n")
        assert "CHANGED" not in _shown(attack) and len([x for x in lines if "REFUSED" in x]) == 10, lines
        assert _shown(env.step(code(_ATTRS))) == before
        _later_cells_are_judged_as_their_own(env)
    finally:
        env.close()


def test_a_cell_may_still_set_its_own_limits_priority_and_cpus(workspace_root: Path):
    """The same calls aimed at the calling process itself (pid 0) keep working: honest code
    (``os.nice``, ``resource.setrlimit``, pinning itself) is not broken by the filter."""
    env = make_env(workspace_root)
    try:
        out = env.step(
            code(
                "import os, resource\n"
                "os.nice(1)\n"
                "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
                "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
                "resource.prlimit(0, resource.RLIMIT_CORE, (0, 0))\n"
                "cpu = min(os.sched_getaffinity(0))\n"
                "os.sched_setaffinity(0, {cpu})\n"
                "os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))\n"
                "print(os.getpriority(os.PRIO_PROCESS, 0) >= 1, os.sched_getaffinity(0) == {cpu},\n"
                "      resource.getrlimit(resource.RLIMIT_NOFILE)[0],\n"
                "      os.sched_getscheduler(0) == os.SCHED_BATCH)\n"
            )
        )
        assert _shown(out) == "True True 64 True\n", _shown(out)
    finally:
        env.close()


PLANT = (
    "open('argparse.py', 'w').write(\"print('PLANTED CODE RAN')\\nraise SystemExit(0)\\n\")\nprint('planted')"
)


@pytest.mark.parametrize(
    "later",
    [
        "import subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-c', 'import argparse; print(\"clean\")'],\n"
        "                   capture_output=True, text=True)\n"
        "print(r.stdout + r.stderr)",
        "import subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-m', 'json.tool', '--help'], capture_output=True, text=True)\n"
        "print('PLANTED CODE RAN' if 'PLANTED' in r.stdout + r.stderr else 'clean')",
        "from joblib import Parallel, delayed\nimport math\n"
        "print('clean', Parallel(n_jobs=2)(delayed(math.sqrt)(x) for x in (4, 9, 16)))",
    ],
    ids=["python_c", "python_m", "joblib_loky"],
)
def test_a_planted_module_does_not_run_in_a_later_cells_new_interpreter(later: str, workspace_root: Path):
    """An interpreter a later cell starts (``python -c``, ``-m``, joblib's loky workers, all
    from the workspace as their directory) imports the standard library, not a same-named file
    an earlier cell wrote into the workspace."""
    env = make_env(workspace_root, timeout_s=30.0)
    try:
        assert _shown(env.step(code(PLANT))) == "planted\n"
        out = env.step(code(later))
        assert "clean" in _shown(out) and "PLANTED" not in _shown(out), _shown(out)
    finally:
        env.close()


def test_sysv_ipc_is_refused_and_posix_locks_work(workspace_root: Path):
    """SysV shared memory, semaphores and message queues outlive the process that made them
    (charged to the episode, or the host's without an IPC namespace): cells cannot make them.
    ``multiprocessing``'s locks (POSIX semaphores) still work."""
    env = make_env(workspace_root)
    try:
        out = env.step(
            code(
                "import ctypes, multiprocessing\n"
                "libc = ctypes.CDLL(None, use_errno=True)\n"
                "print(libc.shmget(0, 1 << 20, 0o1600), libc.semget(0, 1, 0o1600), libc.msgget(0, 0o1600))\n"
                "lock = multiprocessing.Lock()\n"
                "with lock:\n"
                "    print('locked')\n"
            )
        )
        assert _shown(out) == "-1 -1 -1\nlocked\n", _shown(out)
    finally:
        env.close()


def test_posix_message_queues_and_legacy_aio_are_refused(workspace_root: Path):
    """A POSIX message queue outlives its cell (a per-uid quota every episode shares) and a
    legacy AIO context draws on one host-wide quota: cells cannot make either (x86_64 numbers:
    mq_open 240, io_setup 206; both return -1)."""
    env = make_env(workspace_root)
    try:
        out = env.step(
            code(
                "import ctypes\n"
                "libc = ctypes.CDLL(None, use_errno=True)\n"
                "ctx = ctypes.c_ulong(0)\n"
                "mq = libc.syscall(240, b'/q', 0o100 | 2, 0o600, None)\n"
                "print(mq, libc.syscall(206, 16, ctypes.byref(ctx)))\n"
            )
        )
        assert _shown(out) == "-1 -1\n", _shown(out)
    finally:
        env.close()


def test_a_cell_has_a_main_module_of_its_own(workspace_root: Path):
    """The cell's ``__main__`` is a fresh module without a file, not the kernel server: a
    function it defines pickles by reference (as in a notebook), a ``spawn`` pool starts
    (its children would otherwise re-run the hidden server script, die and be restarted
    forever), and ``sys.argv`` shows no server settings."""
    env = make_env(workspace_root)
    try:
        out = env.step(
            code(
                "import multiprocessing as mp, pickle, sys\n"
                "def f(x):\n"
                "    return x\n"
                "main = sys.modules['__main__']\n"
                "print(pickle.loads(pickle.dumps(f)) is f, sys.argv, hasattr(main, '__file__'))\n"
                "with mp.get_context('spawn').Pool(1) as pool:\n"
                "    print(pool.map(abs, [-1, -2]))\n"
            )
        )
        assert _shown(out) == "True [''] False\n[1, 2]\n", _shown(out)
    finally:
        env.close()


def test_python_on_a_cells_path_is_the_kernels_interpreter(workspace_root: Path):
    """``python3`` that a cell runs by name is the kernel's own interpreter (its venv's folder
    leads PATH), not the host's first one, which may lack the stack."""
    env = make_env(workspace_root)
    try:
        out = env.step(
            code(
                "import os, shutil, sys\n"
                "print(os.path.dirname(shutil.which('python3')) == os.path.dirname(sys.executable))\n"
            )
        )
        assert _shown(out) == "True\n", _shown(out)
    finally:
        env.close()


def test_top_level_files_of_the_host_are_not_in_view(workspace_root: Path):
    """Files at ``/`` (``/container_info.json``, ``/.dockerenv``...) are covered like folders."""
    names = sorted(e.name for e in os.scandir("/") if e.is_file(follow_symlinks=False))
    if not names:
        pytest.skip("no regular file at / on this host")
    env = make_env(workspace_root)
    try:
        if env.kernel.sandbox.get("fs") != "readonly":
            pytest.skip("no private read-only mount namespace here")
        out = env.step(
            code(
                "import os\n"
                f"for name in {names!r}:\n"
                "    try:\n"
                "        data = open('/' + name, 'rb').read()\n"
                "    except OSError:\n"
                "        data = b''\n"
                "    print(name, len(data))\n"
            )
        )
        assert _shown(out) == "".join(f"{n} 0\n" for n in names), _shown(out)
    finally:
        env.close()


def test_episodes_start_with_a_writable_filesystem_and_a_pid_namespace(workspace_root: Path):
    """``readonly_fs`` off (allowed unsafe, since cells may have to run as root here) with the
    default PID namespace and the episode's bounded storage: each of five episodes in turn
    starts and its first cell reads the task's file (the worker's mount namespace, made before
    the episode's storage was mounted, gets the workspace attached)."""
    for _ in range(5):
        env = make_env(workspace_root, sandbox={"readonly_fs": False, "allow_unsafe": True})
        try:
            assert env.kernel is not None
            out = env.step(code("print(open('sales.csv').read().splitlines()[1])"))
            assert _shown(out) == "A,10\n", _shown(out)
        finally:
            env.close()
