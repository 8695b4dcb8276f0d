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
        if case.name == "busy_thread_outlives_cell":
            assert env.kernel.recycled == 1  # the spinning thread does not run on into later cells
        if case.name == "large_file":
            big = scratch / "big.bin"
            assert big.stat().st_size <= FILE_CAP_MB * 2**20
        if case.name in ("grandchild_new_session", "double_forked_daemon"):
            leftover = int(observation.split(case.says, 1)[1].split()[0])
            # the worker is recycled after a cell that leaves processes behind (pids cgroup),
            # or at the latest when the episode closes
            if env.kernel.sandbox.get("cgroup"):
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
