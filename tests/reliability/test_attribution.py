"""Who is to blame, decided from outside the worker (issue 26).

A cell can forge every piece of evidence the worker itself produces: its exit status, the
signal that killed it, even that signal's siginfo (``rt_sigqueueinfo`` on itself claiming a
kernel origin). So after a cell of the episode ran, each death below must be a ``crashed``
turn of the policy, with the episode going on and scored; only faults the test causes from
outside — the fork server killed, the scratch folder removed — are ``environment_error``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import skyrl_gym

import tools.sandbox
from tests.conftest import code, qa_extras, wait_gone
from tools.tree import remove_tree
from tools.workspace import scratch_root

PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]
ANSWER_B = "<Analyze>done</Analyze>\n<Answer>\nAnswer: B\n</Answer>"
AFTER_TURN_S = 0.4  # the hidden thread acts this long after its cell returned

_LATER = f"import _thread, time, os, ctypes, resource\ndef later():\n    time.sleep({AFTER_TURN_S})\n"
# siginfo_t is 128 bytes: si_signo, si_errno, si_code (ints), then the union. SI_KERNEL (0x80)
# is a lie the kernel accepts when a thread signals itself (rt_tgsigqueueinfo to its own tid;
# a fatal signal to one thread kills the process); it even kills the init of a PID namespace,
# which ignores a plain self-sent SIGKILL, and its exit status reads "SIGKILL from outside".
_FORGED = (
    "    import threading\n"
    "    info = (ctypes.c_int * 32)()\n"
    "    info[0], info[2] = {sig}, 0x80\n"
    "    libc = ctypes.CDLL(None, use_errno=True)\n"
    "    tid = threading.get_native_id()\n"
    "    libc.syscall(297, os.getpid(), tid, {sig}, ctypes.byref(info))\n"  # rt_tgsigqueueinfo, x86_64
)
# Each starts a thread with _thread (invisible to threading.active_count()) that kills its own
# worker after the turn returned.
ATTACKS = {
    "sigqueueinfo_sigkill_si_kernel": _LATER + _FORGED.format(sig=9),
    "sigqueueinfo_sigsegv_si_kernel": _LATER + _FORGED.format(sig=11),
    "rlimit_cpu_hard": _LATER
    + "    resource.setrlimit(resource.RLIMIT_CPU, (1, 1))\n    while True:\n        pass\n",
    "rlimit_cpu_soft_then_hard": _LATER
    + "    resource.setrlimit(resource.RLIMIT_CPU, (1, 2))\n    while True:\n        pass\n",
    "os_exit": _LATER + "    os._exit(0)\n",
    "abort": _LATER + "    os.abort()\n",
}


def make(root: Path, stateful: bool = False):
    config = {"workspace_root": str(root), "stateful_cells": stateful, "executor": {"timeout_s": 10}}
    env = skyrl_gym.make("deepanalyze", env_config=config, extras=qa_extras(task_id="attribution"))
    env.init(PROMPT)
    return env


def _wait_dead(env, timeout: float = 15.0) -> None:
    pid = env.kernel.pid
    assert wait_gone(pid, timeout), "the attack did not kill its worker"


# A PID namespace's init dies of a forced SIGKILL only (a forged SIGSEGV is ignored there).
CASES = [(name, True) for name in sorted(ATTACKS) if name != "sigqueueinfo_sigsegv_si_kernel"] + [
    (name, False) for name in sorted(ATTACKS) if name.startswith("sigqueueinfo")
]


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="rt_tgsigqueueinfo is syscall 297 on x86_64")
@pytest.mark.parametrize(
    ("attack", "pid_ns"), CASES, ids=[f"{a}-{'pidns' if p else 'nopidns'}" for a, p in CASES]
)
def test_a_worker_killed_by_its_own_cell_is_the_policys_crash(
    workspace_root: Path, attack: str, pid_ns: bool, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "pid_namespace", pid_ns)
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "allow_unsafe", True)  # no namespace: opted in
    # Stateful: the hidden thread stays (without stateful cells the env counts it as a leftover
    # and recycles the worker at the end of the cell, before the thread acts: test_deadlines).
    env = make(workspace_root, stateful=True)
    try:
        first = env.step(code(ATTACKS[attack] + "_thread.start_new_thread(later, ())\nprint('armed')"))
        assert first["metadata"]["exec"]["status"] == "ok"
        assert wait_gone(env.kernel.pid, 15.0), "the attack did not kill its worker"
        second = env.step(code("print(2)"))
        assert second["done"] is False, second["metadata"]
        assert second["metadata"]["exec"]["status"] == "crashed"
        assert "KernelDied" in second["observations"][0]["content"]
        third = env.step(code("print(3)"))  # a fresh worker
        assert third["metadata"]["exec"]["status"] == "ok"
        final = env.step(ANSWER_B)
        assert final["metadata"]["reward_status"] == "scored"
        assert final["metadata"]["code_pass"] == [1, 0, 1]
    finally:
        env.close()


def test_a_worker_killed_by_someone_else_after_a_cell_is_the_policys_crash(workspace_root: Path):
    """An operator's SIGKILL looks exactly like a cell's forged one: counted as the policy's."""
    env = make(workspace_root)
    try:
        assert env.step(code("print(1)"))["metadata"]["exec"]["status"] == "ok"
        os.kill(env.kernel.pid, signal.SIGKILL)
        _wait_dead(env)
        out = env.step(code("print(2)"))
        assert out["done"] is False and out["metadata"]["exec"]["status"] == "crashed"
    finally:
        env.close()


def test_a_replacement_that_cannot_start_because_of_the_cell_is_the_policys_crash(workspace_root: Path):
    """The cell makes its workspace unenterable (mode 000; cells hold no CAP_DAC_OVERRIDE):
    its next cell's worker dies, and no replacement can start in that workspace."""
    env = make(workspace_root)
    try:
        first = env.step(code("import os\nos.chmod('.', 0)\nprint('locked')"))
        assert first["metadata"]["exec"]["status"] == "ok"
        for _ in range(2):
            out = env.step(code("print(2)"))
            assert out["done"] is False, out["metadata"]
            assert out["metadata"]["exec"]["status"] == "crashed"
        final = env.step(ANSWER_B)
        assert final["metadata"]["reward_status"] == "scored"
        workspace = env.workspace.path
    finally:
        env.close()
    assert not workspace.exists()


def test_fork_server_killed_with_the_worker_is_an_environment_error(workspace_root: Path):
    env = make(workspace_root)
    try:
        assert env.step(code("print(1)"))["metadata"]["exec"]["status"] == "ok"
        if not env.kernel.sandbox.get("pid_ns"):
            pytest.skip("without a PID namespace a cell can kill the fork server itself")
        server = env.kernel.server.proc
        server.kill()
        server.wait()
        os.kill(env.kernel.pid, signal.SIGKILL)
        _wait_dead(env)
        out = env.step(code("print(2)"))
        meta = out["metadata"]
        assert out["done"] is True and meta["reward_status"] == "environment_error"
        assert "fork server died" in meta["error"]
    finally:
        env.close()


@pytest.mark.parametrize("when", ["idle", "worker_dead", "scratch_root"])
def test_workspace_removed_from_outside_is_an_environment_error(workspace_root: Path, when: str):
    env = make(workspace_root)
    try:
        assert env.step(code("print(1)"))["metadata"]["exec"]["status"] == "ok"
        if env.kernel.sandbox.get("fs") != "readonly":
            pytest.skip("without the read-only filesystem a cell can remove its own workspace")
        if when == "worker_dead":
            os.kill(env.kernel.pid, signal.SIGKILL)
            _wait_dead(env)
        # An operator's rm -rf of the scratch root leaves a bounded workspace's mount point (busy)
        # and removes everything in it.
        remove_tree(scratch_root() if when == "scratch_root" else env.workspace.path)
        assert not env.workspace.path.exists()
        out = env.step(code("print(2)"))
        meta = out["metadata"]
        assert out["done"] is True and meta["reward_status"] == "environment_error"
        assert "removed from outside the episode" in meta["error"]
    finally:
        env.close()


def test_a_cell_cannot_remove_its_own_workspace_folder(workspace_root: Path):
    """The converse of the test above: what makes "removed" evidence is that cells cannot."""
    env = make(workspace_root)
    try:
        out = env.step(
            code(
                "import os, shutil\nhere = os.getcwd()\nos.chdir('/')\n"
                "for name in os.listdir(here):\n    os.remove(os.path.join(here, name))\n"
                "try:\n    os.rmdir(here)\n    print('HIT')\n"
                "except OSError as e:\n    print('refused', e.errno)"
            )
        )
        if env.kernel.sandbox.get("fs") != "readonly":
            pytest.skip("only the read-only filesystem keeps the workspace folder")
        assert "refused" in out["observations"][0]["content"]
        assert env.workspace.path.is_dir()
        time.sleep(0.1)
        assert env.step(code("print(3)"))["metadata"]["exec"]["status"] == "ok"
    finally:
        env.close()
