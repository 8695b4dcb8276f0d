"""A served episode (``serve.session`` / ``serve.hub``): the env's own scoring, the limits, and
episodes closed for a client that left — with real kernels and workspaces."""

from __future__ import annotations

import pytest

from deepanalyze_env.serve.hub import TaskBook
from deepanalyze_env.serve.session import ServeError
from tests.conftest import wait_gone
from tests.serve.conftest import CODE, in_process, records_in, scratch_entries, wait_for


@pytest.fixture
def hub(make_hub):
    return make_hub


def test_a_served_episode_scores_exactly_as_the_same_calls_in_process(hub, rows, workspace_root, tmp_path):
    calls = [("run_python", {"code": CODE}), ("submit_answer", {"answer": "B"})]
    expected = in_process(rows[0], workspace_root, calls)
    session = hub().open("k", rows[0])
    first = session.call(*calls[0])
    assert (first.done, first.text.strip(), first.data["status"], first.data["code_pass"]) == (
        False,
        "B",
        "ok",
        1,
    )
    final = session.call(*calls[1])
    assert final.done and final.data["reward"] == expected["reward"] == 1.0
    assert final.data["reward_components"] == expected["reward_components"]
    (record,) = records_in(tmp_path / "records")
    assert record["reward"] == 1.0 and record["reward_status"] == "scored" and record["code_pass"] == [1]
    assert record["versions"]["policy_id"] == "served"
    assert record["episode_id"] == session.episode_id


def test_the_prompt_holds_the_tools_system_prompt_and_the_task_with_its_files(hub, rows):
    session = hub().open("k", rows[0])
    text = session.prompt_text()
    assert "submit_answer" in text and "highest total revenue" in text and "sales.csv" in text
    assert session.files() == [{"name": "sales.csv", "size": "0.0KB"}]


def test_an_invalid_call_is_played_as_the_policys_failure_and_fails_the_tools_gate(hub, rows, tmp_path):
    session = hub().open("k", rows[0])
    bad = session.call("run_python", {"source": "print(1)"})
    assert bad.is_error and not bad.done and "bad_arguments" in bad.text
    final = session.call("submit_answer", {"answer": "B"})
    assert final.data["format_ok"] is False and final.data["gate"] == "tools"
    (record,) = records_in(tmp_path / "records")
    assert record["gate"] == "tools" and record["turns"] == 2


def test_an_oversized_argument_is_refused_before_anything_runs(hub, rows):
    session = hub(max_payload_bytes=1000).open("k", rows[0])
    with pytest.raises(ServeError, match="max-payload-bytes"):
        session.call("run_python", {"code": "print(1)\n" + "#" * 2000})
    assert session.env.turns == 0 and session.env.exec_log == []


def test_the_call_past_the_limit_closes_the_episode_as_unfinished(hub, rows, tmp_path):
    session = hub(max_calls=2).open("k", rows[0])
    pid, scratch = session.env.kernel.pid, session.env.workspace.path
    session.call("run_python", {"code": "print(1)"})
    session.call("run_python", {"code": "print(2)"})
    with pytest.raises(ServeError, match="--max-calls"):
        session.call("run_python", {"code": "print(3)"})
    with pytest.raises(ServeError, match="has ended"):
        session.call("submit_answer", {"answer": "B"})
    assert wait_gone(pid) and not scratch.exists()
    (record,) = records_in(tmp_path / "records")
    assert record["reward_status"] == "unfinished" and record["reward"] is None
    assert "call limit" in record["error"] and record["turns"] == 2


def test_a_released_running_episode_is_recorded_unfinished_with_the_reason(hub, rows, tmp_path):
    h = hub()
    session = h.open("k", rows[0])
    session.call("run_python", {"code": "print(1)"})
    pid = session.env.kernel.pid
    h.release("k", "the client went away")
    assert wait_gone(pid) and len(h) == 0
    (record,) = records_in(tmp_path / "records")
    assert (record["reward_status"], record["termination"], record["error"]) == (
        "unfinished",
        None,
        "the client went away",
    )


def test_the_session_cap_refuses_one_more_and_ended_episodes_do_not_count(hub, rows):
    h = hub(max_sessions=2)
    first = h.open("a", rows[0])
    h.open("b", rows[1])
    with pytest.raises(ServeError, match="--max-sessions"):
        h.open("c", rows[0])
    first.call("submit_answer", {"answer": "B"})
    assert h.running() == 1
    h.open("c", rows[0])  # the ended episode's slot is free again


def test_the_reaper_closes_an_idle_episode_but_not_one_whose_cell_is_running(hub, rows, tmp_path):
    h = hub(idle_timeout_s=0.4)
    idle = h.open("idle", rows[0])
    busy = h.open("busy", rows[1])
    pid = idle.env.kernel.pid
    out = busy.call("run_python", {"code": "import time\ntime.sleep(1.2)\nprint('slept')"})
    assert out.text.strip() == "slept"  # 1.2 s of cell time is not idleness
    wait_for(lambda: h.get("idle") is None, 5, "the idle episode to be reaped")
    assert wait_gone(pid)
    assert idle.ended is not None and "idle" in idle.ended
    assert busy.ended is None  # its idle clock started when the call returned


def test_an_unknown_task_id_names_some_known_ones(rows):
    with pytest.raises(ServeError, match="best-store"):
        TaskBook(rows).get("nope")


def test_a_call_while_another_of_the_episode_runs_is_refused_at_once(hub, rows):
    import threading
    import time as clock

    session = hub().open("k", rows[0])
    first = threading.Thread(
        target=session.call, args=("run_python", {"code": "import time\ntime.sleep(1.5)"})
    )
    first.start()
    wait_for(lambda: session.busy, 5, "the first call to run")
    start = clock.monotonic()
    with pytest.raises(ServeError, match="one call at a time"):
        session.call("run_python", {"code": "print(2)"})
    refused_after = clock.monotonic() - start
    first.join()
    assert refused_after < 0.5 and session.calls == 1  # not queued behind the running cell, not counted


def test_a_session_released_while_its_kernel_starts_is_closed_when_the_start_returns(
    hub, rows, tmp_path, monkeypatch
):
    import threading

    from deepanalyze_env.serve.session import EpisodeSession

    started, released = threading.Event(), threading.Event()
    original = EpisodeSession.start

    def slow_start(self):  # the release lands while the kernel starts
        started.set()
        released.wait(5)
        original(self)

    monkeypatch.setattr(EpisodeSession, "start", slow_start)
    h = hub()
    errors = []
    opener = threading.Thread(target=lambda: errors.append(_open_or_error(h, "k", rows[0])))
    opener.start()
    started.wait(5)
    h.release("k", "the client ended the session")  # while start() runs
    released.set()
    opener.join()
    assert len(errors) == 1 and "while its episode was starting" in errors[0]
    assert len(h) == 0 and h.running() == 0
    (record,) = records_in(tmp_path / "records")
    assert record["reward_status"] == "unfinished" and record["error"] == "the client ended the session"


def test_a_stop_while_the_kernel_starts_removes_the_scratch_at_once_and_records_nothing(
    hub, rows, tmp_path, monkeypatch
):
    """The stopping server may not live to see the start return: the scratch folder goes now; when
    the start does return (here the worker finds its folder gone and fails to start; one that
    started is ended), still nothing is recorded: nothing was played."""
    import threading

    import deepanalyze_env.core.env as env_module

    starting, stopped, workers = threading.Event(), threading.Event(), []
    original = env_module.start_kernel

    def slow_start_kernel(config, profile, workspace):  # the stop lands while the kernel starts
        starting.set()
        stopped.wait(10)
        kernel = original(config, profile, workspace)
        workers.append(kernel.pid)
        return kernel

    monkeypatch.setattr(env_module, "start_kernel", slow_start_kernel)
    h = hub()
    errors = []
    opener = threading.Thread(target=lambda: errors.append(_open_or_error(h, "k", rows[0])))
    opener.start()
    assert starting.wait(10)
    assert scratch_entries()  # the episode's folder is there, its kernel starting
    h.close_all("the server was stopped", wait=False)
    assert scratch_entries() == []  # at once
    stopped.set()
    opener.join()
    assert len(errors) == 1 and "while its episode was starting" in errors[0]
    assert all(wait_gone(pid) for pid in workers) and h.running() == 0 and len(h) == 0
    assert records_in(tmp_path / "records") == []


def _open_or_error(h, key, row) -> str:
    try:
        h.open(key, row)
    except ServeError as exc:
        return str(exc)
    return "opened"


def test_a_released_key_never_gets_another_episode(hub, rows):
    h = hub()
    h.open("k", rows[0]).call("submit_answer", {"answer": "B"})
    h.release("k", "the client ended the session")
    with pytest.raises(ServeError, match="episode has ended"):
        h.open("k", rows[0])


def test_stopping_with_a_cell_running_records_it_and_removes_its_scratch_at_once(hub, rows, tmp_path):
    import threading
    import time as clock

    h = hub()
    session = h.open("k", rows[0])
    scratch = session.env.workspace.path
    cell = threading.Thread(target=_call_quietly, args=(session, "import time\ntime.sleep(3)"))
    cell.start()
    wait_for(lambda: session.busy, 5, "the cell to run")
    start = clock.monotonic()
    h.close_all("the server was stopped", wait=False)
    took = clock.monotonic() - start
    assert took < 1.0 and not scratch.exists()
    (record,) = records_in(tmp_path / "records")
    assert record["reward_status"] == "unfinished" and record["error"] == "the server was stopped"
    cell.join()
    assert len(records_in(tmp_path / "records")) == 1  # the cell's end writes no second record


def _call_quietly(session, code: str) -> None:
    try:
        session.call("run_python", {"code": code})
    except ServeError:
        pass
