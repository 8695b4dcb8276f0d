"""The env behind OpenEnv's conventions, driven by OpenEnv's own ``EnvClient`` (WebSocket)."""

from __future__ import annotations

import pytest

from deepanalyze_env.serve.hub import TaskBook
from deepanalyze_env.serve.openenv_client import DeepAnalyzeEnvClient
from deepanalyze_env.serve.openenv_server import DeepAnalyzeAction, openenv_app
from tests.serve.conftest import CODE, cli, in_process, records_in, wait_for


@pytest.fixture
def served(make_hub, start_server, rows):
    def start(**limits):
        hub = make_hub(**limits)
        return start_server(openenv_app(hub, TaskBook(rows))), hub

    return start


def test_an_openenv_client_plays_an_episode_scored_as_in_process(served, rows, workspace_root, tmp_path):
    server, _ = served()
    calls = [("run_python", {"code": CODE}), ("submit_answer", {"answer": "B"})]
    expected = in_process(rows[0], workspace_root, calls)
    with DeepAnalyzeEnvClient(base_url=server.url).sync() as env:
        first = env.reset(task_id="best-store")
        assert (
            "highest total revenue" in first.observation.text
            and first.observation.files[0]["name"] == "sales.csv"
        )
        cell = env.step(DeepAnalyzeAction(tool=calls[0][0], arguments=calls[0][1]))
        assert (cell.done, cell.reward, cell.observation.text.strip(), cell.observation.code_pass) == (
            False,
            None,
            "B",
            1,
        )
        assert env.state().step_count == 1 and env.state().task_id == "best-store"
        end = env.step(DeepAnalyzeAction(tool=calls[1][0], arguments=calls[1][1]))
    assert end.done and end.reward == expected["reward"] == 1.0
    assert end.observation.reward_components == expected["reward_components"]
    assert end.observation.reward_status == "scored" and end.observation.termination == "answer"
    (record,) = records_in(tmp_path / "records")
    assert record["versions"]["policy_id"] == "served:openenv" and record["reward"] == 1.0


def test_a_disconnect_mid_episode_records_it_unfinished(served, tmp_path):
    server, hub = served()
    with DeepAnalyzeEnvClient(base_url=server.url).sync() as env:
        env.reset(task_id="row-count")
        env.step(DeepAnalyzeAction(tool="run_python", arguments={"code": "print(1)"}))
    wait_for(lambda: len(hub) == 0, 10, "the episode closed")
    (record,) = records_in(tmp_path / "records")
    assert record["reward_status"] == "unfinished" and "disconnected" in record["error"]


def test_a_second_reset_closes_the_running_episode_and_starts_another(served, tmp_path):
    server, _ = served()
    with DeepAnalyzeEnvClient(base_url=server.url).sync() as env:
        env.reset(task_id="row-count")
        env.step(DeepAnalyzeAction(tool="run_python", arguments={"code": "print(1)"}))
        env.reset(task_id="best-store")
        end = env.step(DeepAnalyzeAction(tool="submit_answer", arguments={"answer": "B"}))
    assert end.reward == 1.0
    statuses = sorted((r["task_id"], r["reward_status"]) for r in records_in(tmp_path / "records"))
    assert statuses == [("best-store", "scored"), ("row-count", "unfinished")]


def test_refusals_come_back_as_errors_and_keep_the_session(served):
    server, _ = served(max_payload_bytes=1000)
    with DeepAnalyzeEnvClient(base_url=server.url).sync() as env:
        with pytest.raises(RuntimeError, match="unknown task id 'nope'"):
            env.reset(task_id="nope")
        env.reset(task_id="best-store")
        with pytest.raises(RuntimeError, match="max-payload-bytes"):
            env.step(DeepAnalyzeAction(tool="run_python", arguments={"code": "#" * 5000}))
        bad = env.step(DeepAnalyzeAction(tool="delete_files", arguments={}))
        assert bad.observation.is_error and "unknown_tool" in bad.observation.text
        end = env.step(DeepAnalyzeAction(tool="submit_answer", arguments={"answer": "B"}))
    assert end.observation.format_ok is False and end.reward == -1.0  # the invalid call failed the gate


def test_a_refused_reset_starts_nothing_and_an_idle_connection_gives_its_slot_back(served, tmp_path):
    """A reset naming an unknown task is refused and holds no episode; the connection itself is
    closed after --idle-timeout without a successful reset or step (OpenEnv's reaper looks every
    5 s at the most), so a client that only holds a connection cannot lock out another."""
    import time

    server, hub = served(max_sessions=1, idle_timeout_s=0.5)
    with DeepAnalyzeEnvClient(base_url=server.url).sync() as holder:
        with pytest.raises(RuntimeError, match="unknown task id 'nope'"):
            holder.reset(task_id="nope")
        assert hub.running() == 0 and len(hub) == 0
        refusals, deadline, end = 0, time.monotonic() + 60, None
        while end is None:
            try:
                with DeepAnalyzeEnvClient(base_url=server.url).sync() as env:
                    env.reset(task_id="best-store")
                    end = env.step(DeepAnalyzeAction(tool="submit_answer", arguments={"answer": "B"}))
            except Exception as exc:  # the holder's connection has the one slot: OpenEnv answers
                # CAPACITY_REACHED and closes, which its client reports as the connection closing
                assert "ConnectionClosed" in type(exc).__name__ or "CAPACITY" in repr(exc), exc
                assert time.monotonic() < deadline, "the idle connection kept its slot"
                refusals += 1
                time.sleep(0.2)
        with pytest.raises(RuntimeError, match="this session was closed"):
            holder.reset(task_id="best-store")  # its session is gone, its connection refused
    assert end.reward == 1.0 and refusals >= 1
    (record,) = records_in(tmp_path / "records")
    assert record["reward_status"] == "scored"


def test_a_client_cannot_name_the_episode_id_of_a_record(served, tmp_path):
    server, _ = served()
    with DeepAnalyzeEnvClient(base_url=server.url).sync() as env:
        env.reset(task_id="best-store", episode_id="victim-episode")
        assert env.state().episode_id != "victim-episode"
        env.step(DeepAnalyzeAction(tool="submit_answer", arguments={"answer": "B"}))
    (record,) = records_in(tmp_path / "records")
    assert record["episode_id"] != "victim-episode" and len(record["episode_id"]) == 32


def test_a_port_in_use_is_a_one_line_error(task_file, workspace_root):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for transport in ("http", "openenv"):
            done = cli(
                "serve",
                "--transport",
                transport,
                "--port",
                str(port),
                "--tasks",
                str(task_file),
                "--workspace-root",
                str(workspace_root),
            )
            assert done.returncode == 2 and done.stdout.startswith(
                f"error: cannot listen on 127.0.0.1:{port}"
            )
            assert "Traceback" not in done.stdout + done.stderr
