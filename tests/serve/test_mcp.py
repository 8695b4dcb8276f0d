"""The env as an MCP server, driven by the official SDK's client: over stdio (the command line
``deepanalyze-rl serve --transport stdio …`` as a subprocess) and over streamable HTTP."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from deepanalyze_env.serve.mcp_server import PROMPT_URI, STATE_URI
from tests.serve.conftest import CODE, cell_started, cli, in_process, records_in, wait_for

BIN = Path(sys.executable).parent / "deepanalyze-rl"


def stdio_params(task_file: Path, workspace_root: Path, records: Path, task_id: str = "best-store"):
    return StdioServerParameters(
        command=str(BIN),
        args=[
            "serve",
            "--transport",
            "stdio",
            "--tasks",
            str(task_file),
            "--task-id",
            task_id,
            "--workspace-root",
            str(workspace_root),
            "--records",
            str(records),
        ],
        env={  # the server runs this checkout's code, as the test does
            k: os.environ[k] for k in ("DEEPANALYZE_SCRATCH", "PATH", "PYTHONPATH") if k in os.environ
        },
    )


def test_over_stdio_a_client_plays_one_episode_and_reads_the_env_reward(
    task_file, rows, workspace_root, tmp_path
):
    calls = [("run_python", {"code": CODE}), ("submit_answer", {"answer": "B"})]
    expected = in_process(rows[0], workspace_root, calls)
    seen = {}

    async def client():
        params = stdio_params(task_file, workspace_root, tmp_path / "rec")
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            seen["tools"] = sorted(t.name for t in (await s.list_tools()).tools)
            seen["prompt"] = (await s.read_resource(PROMPT_URI)).contents[0].text
            seen["cell"] = await s.call_tool(*calls[0])
            seen["end"] = await s.call_tool(*calls[1])
            seen["after"] = await s.call_tool("run_python", {"code": "print(1)"})

    anyio.run(client)
    assert seen["tools"] == ["run_python", "submit_answer"]
    assert "highest total revenue" in seen["prompt"] and "sales.csv" in seen["prompt"]
    assert seen["cell"].content[0].text.strip() == "B" and not seen["cell"].is_error
    end = seen["end"].structured_content
    assert end["reward"] == expected["reward"] == 1.0
    assert end["reward_components"] == expected["reward_components"] and end["reward_status"] == "scored"
    assert seen["after"].is_error and "has ended" in seen["after"].content[0].text
    (record,) = records_in(tmp_path / "rec")
    assert record["reward"] == 1.0 and record["versions"]["policy_id"] == "served:mcp"


def test_a_stdio_client_that_leaves_mid_episode_is_recorded_unfinished_and_leaves_nothing(
    task_file, workspace_root, tmp_path
):
    async def client():
        params = stdio_params(task_file, workspace_root, tmp_path / "rec")
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            await s.call_tool("run_python", {"code": "print(40 + 2)"})

    anyio.run(client)
    wait_for(lambda: records_in(tmp_path / "rec"), 15, "the unfinished record")
    (record,) = records_in(tmp_path / "rec")
    assert record["reward_status"] == "unfinished" and "closed the stdio connection" in record["error"]
    assert record["turns"] == 1
    scratch = Path(os.environ["DEEPANALYZE_SCRATCH"])
    wait_for(
        lambda: not [p for p in scratch.rglob("*") if p.is_dir() and "-" in p.name], 10, "scratch cleared"
    )


def test_stdio_without_a_task_id_is_a_one_line_usage_error(task_file, workspace_root):

    done = cli(
        "serve", "--transport", "stdio", "--tasks", str(task_file), "--workspace-root", str(workspace_root)
    )
    assert (
        done.returncode == 2
        and "give --task-id" in done.stdout
        and "Traceback" not in done.stdout + done.stderr
    )


async def play(url: str, calls, *, leave_early: bool = False) -> list:
    out = []
    async with streamable_http_client(url) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        for name, arguments in calls:
            out.append(await s.call_tool(name, arguments))
        if leave_early:
            return out
    return out


def test_over_http_two_sessions_play_their_own_tasks_side_by_side(mcp_http, rows, workspace_root, tmp_path):
    server, hub = mcp_http()
    results = {}

    async def both():
        async def one(task, calls):
            results[task] = await play(f"{server.url}/mcp?task_id={task}", calls)

        async with anyio.create_task_group() as tg:
            tg.start_soon(
                one, "best-store", [("run_python", {"code": CODE}), ("submit_answer", {"answer": "B"})]
            )
            tg.start_soon(
                one,
                "row-count",
                [("run_python", {"code": "x = 3\nprint(x)"}), ("submit_answer", {"answer": "4"})],
            )

    anyio.run(both)
    assert results["best-store"][-1].structured_content["reward"] == 1.0
    assert (
        results["row-count"][-1].structured_content["reward"]
        == in_process(
            rows[1],
            workspace_root,
            [("run_python", {"code": "x = 3\nprint(x)"}), ("submit_answer", {"answer": "4"})],
        )["reward"]
    )
    assert results["row-count"][-1].structured_content["reward_components"] == {"answer_match": 0.0}
    wait_for(lambda: len(hub) == 0, 10, "both sessions released")
    assert sorted(r["task_id"] for r in records_in(tmp_path / "records")) == ["best-store", "row-count"]


def test_an_http_client_that_ends_its_session_early_has_its_episode_recorded_unfinished(mcp_http, tmp_path):
    server, hub = mcp_http()
    anyio.run(lambda: play(f"{server.url}/mcp?task_id=best-store", [("run_python", {"code": "print(1)"})]))
    wait_for(lambda: len(hub) == 0 and records_in(tmp_path / "records"), 10, "the episode closed")
    (record,) = records_in(tmp_path / "records")
    assert record["reward_status"] == "unfinished" and "ended the session" in record["error"]


def test_a_handshake_without_a_task_is_refused_naming_the_url_form(mcp_http):
    server, hub = mcp_http()
    with pytest.raises(Exception) as refused:  # the SDK's client raises it inside a task group
        anyio.run(lambda: play(f"{server.url}/mcp", [("run_python", {"code": "print(1)"})]))
    assert "MCPError" in repr(refused.value) and "?task_id=ID" in repr(refused.value)
    assert hub.running() == 0


def test_the_state_resource_reports_the_episode(mcp_http):
    server, _ = mcp_http()

    async def client():
        async with (
            streamable_http_client(f"{server.url}/mcp?task_id=row-count") as (r, w),
            ClientSession(r, w) as s,
        ):
            await s.initialize()
            await s.call_tool("run_python", {"code": "print(1)"})
            return json.loads((await s.read_resource(STATE_URI)).contents[0].text)

    state = anyio.run(client)
    assert (
        state["task_id"] == "row-count" and state["turns"] == 1 and state["calls"] == 1 and not state["done"]
    )


def test_a_stdio_client_that_stops_the_server_mid_cell_leaves_a_record_and_no_scratch(
    task_file, workspace_root, tmp_path
):
    """The SDK's client closes stdin, waits two seconds, then SIGTERMs the server's process group
    (and SIGKILLs two seconds later): a 30-second cell cannot finish, so the server records the
    episode as it stands and removes its scratch at once."""
    scratch = Path(os.environ["DEEPANALYZE_SCRATCH"])

    async def client():
        params = stdio_params(task_file, workspace_root, tmp_path / "rec")
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            async with anyio.create_task_group() as tg:
                code = "open('started', 'w').close()\nimport time\ntime.sleep(30)"
                tg.start_soon(s.call_tool, "run_python", {"code": code})
                with anyio.fail_after(120):
                    while not cell_started(scratch):  # the cell runs: the client leaves
                        await anyio.sleep(0.05)
                tg.cancel_scope.cancel()

    anyio.run(client)
    wait_for(lambda: records_in(tmp_path / "rec"), 15, "the unfinished record")
    (record,) = records_in(tmp_path / "rec")
    assert (
        record["reward_status"] == "unfinished"
        and record["error"] == "the client closed the stdio connection"
    )
    assert not [p for p in scratch.rglob("*") if p.is_dir() and p.name.count("-") >= 2]
