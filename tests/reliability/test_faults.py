"""Faults outside the policy (issue 8): each is ``environment_error`` with a clear ``error``,
the episode's record is still written, and nothing is left behind. And the converse: what the
policy does to its own worker is never an ``environment_error``.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

import pytest
import skyrl_gym

import tools.sandbox
import tools.workspace
from deepanalyze_env.core.records import read_records
from tests.conftest import code, qa_extras, wait_gone

PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]
ANSWER_B = "<Analyze>done</Analyze>\n<Answer>\nAnswer: B\n</Answer>"


def make(root: Path, records: Path | None = None):
    config = {"workspace_root": str(root), "executor": {"timeout_s": 2}}
    if records is not None:
        config["records_dir"] = str(records)
    env = skyrl_gym.make("deepanalyze", env_config=config, extras=qa_extras(task_id="fault"))
    env.init(PROMPT)
    return env


def only_record(records: Path) -> dict:
    [path] = list(records.glob("episodes-*.jsonl"))
    [record] = read_records(path)
    return record


def test_idle_worker_sigkilled_before_any_cell(workspace_root: Path, tmp_path: Path):
    env = make(workspace_root, tmp_path / "rec")
    pid = env.kernel.pid
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(pid)
    out = env.step(code("print(2)"))
    env.close()
    meta = out["metadata"]
    assert out["done"] is True and isinstance(out["reward"], float)
    assert meta["reward_status"] == "environment_error"
    assert "before any cell of the episode ran" in meta["error"]
    record = only_record(tmp_path / "rec")
    assert record["reward_status"] == "environment_error" and record["error"] == meta["error"]
    assert not env.workspace.path.exists()


def test_disk_full_while_copying_the_workspace(
    workspace_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _scratch: Path
):
    real_copy = tools.workspace.copy_tree

    def copy_then_enospc(src, dst):
        real_copy(src, dst)  # a partial copy exists when the disk fills
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    monkeypatch.setattr(tools.workspace, "copy_tree", copy_then_enospc)
    env = make(workspace_root, tmp_path / "rec")
    assert env.kernel is None
    out = env.step(code("print(1)"))
    env.close()
    meta = out["metadata"]
    assert out["done"] is True and meta["reward_status"] == "environment_error"
    assert "No space left on device" in meta["error"] and "episode start failed" in meta["error"]
    assert only_record(tmp_path / "rec")["reward_status"] == "environment_error"
    assert list(_scratch.iterdir()) == []  # the half-copied folder was removed


def test_fork_server_killed_mid_episode_costs_the_episode_nothing(workspace_root: Path, tmp_path: Path):
    """Workers are not tied to the fork server's life: whoever killed it (a cell without a PID
    namespace can), the running episode goes on and the next episode restarts the server."""
    env = make(workspace_root, tmp_path / "rec")
    assert env.step(code("print(1)"))["metadata"]["exec"]["status"] == "ok"
    server = env.kernel.server.proc
    server.kill()
    server.wait()
    out = env.step(code("print(2)"))
    assert out["metadata"]["exec"]["status"] == "ok" and "2" in out["observations"][0]["content"]
    worker = env.kernel.pid
    assert env.step(ANSWER_B)["metadata"]["reward_status"] == "scored"
    env.close()
    assert wait_gone(worker)
    assert only_record(tmp_path / "rec")["reward_status"] == "scored"
    fresh = make(workspace_root)  # the next episode restarts the server
    try:
        assert fresh.step(code("print(3)"))["metadata"]["exec"]["status"] == "ok"
    finally:
        fresh.close()


@pytest.mark.parametrize(
    "src",
    [
        # a child that kills the worker once the cell is over
        "import subprocess, os\nsubprocess.Popen(['sh', '-c', f'sleep 0.3; kill -9 {os.getpid()}'])",
        # a thread that does it
        "import threading, os\nthreading.Timer(0.3, os._exit, args=(0,)).start()",
        # a child in a new session that kills it
        "import subprocess, os\nsubprocess.Popen(['sh', '-c', f'sleep 0.3; kill -9 {os.getpid()}'], "
        "start_new_session=True)",
    ],
    ids=["child", "thread", "new_session_child"],
)
@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "no_cgroup"])
def test_policy_cannot_turn_its_worker_death_into_environment_error(
    workspace_root: Path, src: str, cgroup: bool, monkeypatch: pytest.MonkeyPatch
):
    """A cell's leftovers are killed with the cell, so they cannot kill the worker later.

    Without a cgroup a direct child (in any session) is still seen; a double-forked daemon is
    not (see the README's security model).
    """
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "cgroup", cgroup)
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "pid_namespace", cgroup)  # no_cgroup: no namespace
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "allow_unsafe", True)  # no namespace: opted in
    env = make(workspace_root)
    try:
        first = env.step(code(src))
        assert first["metadata"]["exec"]["status"] == "ok"
        time.sleep(0.8)
        second = env.step(code("print('still here')"))
        assert second["done"] is False, second["metadata"]
        assert second["metadata"]["exec"]["status"] == "ok"
        final = env.step(ANSWER_B)
        assert final["metadata"]["reward_status"] == "scored"
    finally:
        env.close()
