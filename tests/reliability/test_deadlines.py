"""Deadlines and leftovers (issues 26 and 52).

With ``stateful_cells`` a cell shares the worker's process, so it can walk up its stack to the
worker loop, send the reply frame itself (right sequence number, status ``ok``) and keep
running. Whatever it writes, it must not outlive its turn or its deadline: the env checks from
its side that the worker is back waiting for a request after each reply (``/proc/<pid>/syscall``).

In the default mode each cell runs in a process of its own that holds no control socket: the
same forgery finds nothing to write to, and the cell's threads and processes end with it
(the worker kills them before it replies), whatever the cell patched in its own process.
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


@pytest.mark.parametrize("after", sorted(AFTER))
def test_a_forged_ok_does_not_let_a_stateful_cell_run_on(workspace_root: Path, after: str):
    env = make(workspace_root, stateful=True)
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


def test_a_stateless_cell_cannot_reach_the_reply_channel(workspace_root: Path):
    """The frame walk finds the worker loop's socket object (a copy, in the cell's own process),
    but its descriptor was closed before the cell ran: the forgery fails as the cell's error and
    the job after it never runs."""
    env = make(workspace_root, stateful=False)
    try:
        out = env.step(code(FORGE + AFTER["sleep"] + DONE))
        assert out["metadata"]["exec"]["status"] == "error", out["observations"][0]["content"]
        assert not (env.workspace.path / "job-done").exists()
        nxt = env.step(code("1/0"))
        assert nxt["metadata"]["exec"]["status"] == "error"
        assert "ZeroDivisionError" in nxt["observations"][0]["content"]
        assert env.step(ANSWER_B)["metadata"]["reward_status"] == "scored"
    finally:
        env.close()


def test_a_stateful_cell_serving_the_loop_itself_still_meets_each_deadline(workspace_root: Path):
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
    env = make(workspace_root, stateful=True)
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
    # the worker's code patched (in the cell's own process) to say "none", then a thread
    "patched_check_thread": "import sys, _thread, time\n"
    "sys.modules['__main__']._cell_processes = lambda *a: []\n"
    "sys.modules['__main__']._reap_cell = lambda *a: 0\n"
    "_thread.start_new_thread(lambda: time.sleep(300), ())\n",
    # ... then a process in a session of its own, which writes a file when it is not killed
    "patched_check_process": "import sys, subprocess\n"
    "sys.modules['__main__']._cell_processes = lambda *a: []\n"
    "sys.modules['__main__']._reap_cell = lambda *a: 0\n"
    "subprocess.Popen(['sh', '-c', 'sleep 1; echo late > late.txt'], start_new_session=True)\n",
}


@pytest.mark.parametrize("kind", sorted(LEFTOVERS))
def test_leftovers_end_with_their_cell(workspace_root: Path, kind: str):
    env = make(workspace_root, stateful=False)
    try:
        worker = env.kernel.pid
        out = env.step(code(LEFTOVERS[kind] + "print('left')"))
        assert out["metadata"]["exec"]["status"] == "ok"
        after = env.step(
            code("import os, threading\nprint(threading.active_count(), len(os.listdir('/proc/self/task')))")
        )
        assert after["observations"][0]["content"] == "\n<Execute>\n1 1\n\n</Execute>\n"
        assert env.kernel.pid == worker and env.kernel.restarts == 0  # the worker itself stays
        if kind == "patched_check_process":
            assert env.kernel.leftover_cells == 1  # counted by the worker, whatever the cell patched
            time.sleep(1.5)  # past the moment the process would have written its file
            assert not (env.workspace.path / "late.txt").exists()
    finally:
        env.close()


def test_a_cells_deadline_starts_when_its_worker_takes_it(workspace_root: Path):
    """Time the worker spends before it takes a cell (ending the last cell's processes: a cell
    that left hundreds of them costs seconds) is charged to nobody, never to the next cell: its
    deadline starts at the worker's acknowledgement. Here the worker is held (stopped from the
    trainer's side) for longer than the whole deadline before the next cell; that cell still
    gets its full time and prints."""
    import os
    import signal
    import threading

    env = make(workspace_root, stateful=False)
    try:
        assert env.step(code("print('first')"))["metadata"]["exec"]["status"] == "ok"
        worker = env.kernel.pid
        os.kill(worker, signal.SIGSTOP)
        threading.Timer(TIMEOUT_S + 1.0, os.kill, (worker, signal.SIGCONT)).start()
        out = env.step(code("print('second')"))
        assert out["metadata"]["exec"]["status"] == "ok", out["observations"][0]["content"]
        assert "second" in out["observations"][0]["content"]
    finally:
        env.close()


def test_a_worker_that_never_takes_the_cell_still_times_out(
    workspace_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """The wait for the acknowledgement is bounded too: a worker that never takes the cell ends
    the turn as a timeout (the env's clock), not a hang."""
    import os
    import signal

    import tools.kernel

    monkeypatch.setattr(tools.kernel, "START_LIMIT_S", TIMEOUT_S + 1.0)
    env = make(workspace_root, stateful=False)
    try:
        assert env.step(code("print('first')"))["metadata"]["exec"]["status"] == "ok"
        os.kill(env.kernel.pid, signal.SIGSTOP)
        out = env.step(code("print('second')"))  # returns after START_LIMIT_S
        assert out["metadata"]["exec"]["status"] == "timeout", out["observations"][0]["content"]
    finally:
        env.close()
