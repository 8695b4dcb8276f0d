"""Deadlines and leftovers are enforced from outside the worker (issue 26).

A cell shares the worker's process, so it can walk up its stack to the worker loop, send the
reply frame itself (right sequence number, status ``ok``) and keep running; or patch the
worker's own leftover check. Whatever it writes, it must not outlive its turn or its deadline:
the env checks from its side that the worker is back waiting for a request after each reply
(``/proc/<pid>/syscall``) and counts the worker's threads and processes itself (``/proc``
task list and children, pids cgroup).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import skyrl_gym

from tests.conftest import code, qa_extras, wait_gone

PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]
ANSWER_B = "<Analyze>done</Analyze>\n<Answer>\nAnswer: B\n</Answer>"
TIMEOUT_S = 3.0
JOB_S = 2.0  # the job a forged reply tries to keep running; the test waits past its end

FORGE = (
    "import sys, json, struct, time, os\n"
    "f = sys._getframe()\n"
    "while f is not None and not ('conn' in f.f_locals and 'msg' in f.f_locals):\n"
    "    f = f.f_back\n"
    "conn, seq = f.f_locals['conn'], f.f_locals['msg']['seq']\n"
    "body = json.dumps({'seq': seq, 'status': 'ok', 'error_type': None}).encode()\n"
    "conn.sendall(struct.pack('>I', len(body)) + body)\n"
)
AFTER = {
    "spin": f"t = time.time()\nwhile time.time() - t < {JOB_S}:\n    pass\n",
    "sleep": f"time.sleep({JOB_S})\n",
    "spin_in_slices": f"t = time.time()\nwhile time.time() - t < {JOB_S}:\n"
    "    sum(range(10000))\n    time.sleep(0.001)\n",
}
DONE = "open('job-done', 'w').write('x')\n"


def make(root: Path, stateful: bool):
    config = {"workspace_root": str(root), "stateful_cells": stateful, "executor": {"timeout_s": TIMEOUT_S}}
    env = skyrl_gym.make("deepanalyze", env_config=config, extras=qa_extras(task_id="deadlines"))
    env.init(PROMPT)
    return env


@pytest.mark.parametrize("stateful", [False, True], ids=["fresh", "stateful"])
@pytest.mark.parametrize("after", sorted(AFTER))
def test_a_forged_ok_does_not_let_the_cell_run_on(workspace_root: Path, stateful: bool, after: str):
    env = make(workspace_root, stateful)
    try:
        worker = env.kernel.pid
        out = env.step(code(FORGE + AFTER[after] + DONE))
        meta = out["metadata"]
        assert meta["exec"]["status"] == "crashed", out["observations"][0]["content"]
        assert "kept running" in out["observations"][0]["content"]
        assert wait_gone(worker, 5.0)  # the worker that ran it was killed at once
        time.sleep(JOB_S + 0.5)
        assert not (env.workspace.path / "job-done").exists()  # the job never finished
        nxt = env.step(code("print('fresh')"))
        assert nxt["metadata"]["exec"]["status"] == "ok"
        assert env.step(ANSWER_B)["metadata"]["reward_status"] == "scored"
    finally:
        env.close()


@pytest.mark.parametrize("stateful", [False, True], ids=["fresh", "stateful"])
def test_a_cell_serving_the_loop_itself_still_meets_each_deadline(workspace_root: Path, stateful: bool):
    """The cell forges its reply and then waits for the next request itself (so the worker
    looks idle); it runs its long job when the next cell arrives — and that cell's deadline
    stops it: no 15 s job under a 10 s limit."""
    serve = (
        FORGE
        + "head = conn.recv(4)\n"
        + "conn.recv(struct.unpack('>I', head)[0])\n"  # the next request: never answered in time
        + f"t = time.time()\nwhile time.time() - t < {TIMEOUT_S + JOB_S}:\n    pass\n"
        + DONE
    )
    env = make(workspace_root, stateful)
    try:
        first = env.step(code(serve))
        assert first["metadata"]["exec"]["status"] == "ok"  # indistinguishable from a real ok
        start = time.monotonic()
        second = env.step(code("print('next')"))
        took = time.monotonic() - start
        assert second["metadata"]["exec"]["status"] == "timeout"
        assert took < TIMEOUT_S + 1.5
        time.sleep(JOB_S + 0.5)
        assert not (env.workspace.path / "job-done").exists()
        assert env.step(code("print(3)"))["metadata"]["exec"]["status"] == "ok"
    finally:
        env.close()


LEFTOVERS = {
    # a thread started with _thread: invisible to threading.active_count()
    "hidden_thread": "import _thread, time\n_thread.start_new_thread(lambda: time.sleep(300), ())\n",
    # the worker's own leftover check patched to say "none", then a thread and a process
    "patched_check_thread": "import sys, _thread, time\n"
    "sys.modules['__main__']._leftovers = lambda *a: False\n"
    "_thread.start_new_thread(lambda: time.sleep(300), ())\n",
    "patched_check_process": "import sys, subprocess\n"
    "sys.modules['__main__']._leftovers = lambda *a: False\n"
    "subprocess.Popen(['sleep', '300'], start_new_session=True)\n",
}


@pytest.mark.parametrize("kind", sorted(LEFTOVERS))
def test_leftovers_are_counted_from_outside(workspace_root: Path, kind: str):
    env = make(workspace_root, stateful=False)
    try:
        worker = env.kernel.pid
        out = env.step(code(LEFTOVERS[kind] + "print('left')"))
        assert out["metadata"]["exec"]["status"] == "ok"
        assert env.kernel.recycled == 1  # killed with its leftovers, whatever it said
        assert wait_gone(worker, 5.0)
        assert env.step(code("print(2)"))["metadata"]["exec"]["status"] == "ok"
        assert env.kernel.recycled == 1  # a clean cell is not recycled
    finally:
        env.close()
