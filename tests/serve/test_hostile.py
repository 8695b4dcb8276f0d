"""Hostile MCP clients over HTTP: oversized payloads, abandoned sessions, a hundred sessions at
once. Each gets a clear refusal, and when they are gone nothing is left: no kernel worker, no
scratch folder, no open episode — and the server still serves."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from deepanalyze_env.serve.mcp_server import PROMPT_URI
from tests.conftest import wait_gone
from tests.serve.conftest import INITIALIZE, records_in, wait_for


def workspaces_left() -> list[Path]:
    scratch = Path(os.environ["DEEPANALYZE_SCRATCH"])
    return [p for p in scratch.rglob("*") if p.is_dir() and p.name.count("-") >= 2]


async def session_call(url: str, name: str, arguments: dict, *, delete: bool = True):
    async with streamable_http_client(url, terminate_on_close=delete) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        return await s.call_tool(name, arguments)


def test_an_oversized_request_body_is_refused_unread(mcp_http):
    server, hub = mcp_http(max_request_bytes=50_000)
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"pad": "x" * 100_000}}
    reply = httpx.post(
        f"{server.url}/mcp?task_id=best-store",
        json=body,
        headers={"accept": "application/json, text/event-stream"},
    )
    assert reply.status_code == 413 and len(hub) == 0


def test_an_oversized_tool_argument_is_refused_and_nothing_runs(mcp_http, tmp_path):
    server, hub = mcp_http(max_payload_bytes=10_000)
    result = anyio.run(
        lambda: session_call(f"{server.url}/mcp?task_id=best-store", "run_python", {"code": "#" * 20_000})
    )
    assert result.is_error and "--max-payload-bytes" in result.content[0].text
    wait_for(lambda: len(hub) == 0, 10, "the session released")
    (record,) = records_in(tmp_path / "records")
    assert record["turns"] == 0 and record["reward_status"] == "unfinished"


def test_an_abandoned_session_is_reaped_after_the_idle_timeout(mcp_http, tmp_path):
    server, hub = mcp_http(idle_timeout_s=0.5)

    async def vanish():
        result = await session_call(
            f"{server.url}/mcp?task_id=best-store", "run_python", {"code": "print(1)"}, delete=False
        )
        (session,) = [s for s in hub._sessions.values()]
        return result, session.env.kernel.pid

    result, pid = anyio.run(vanish)
    assert not result.is_error
    wait_for(lambda: len(hub) == 0, 10, "the idle session reaped")
    assert wait_gone(pid) and not workspaces_left()
    (record,) = records_in(tmp_path / "records")
    assert record["reward_status"] == "unfinished" and "idle" in record["error"]


def test_a_request_without_a_session_is_told_to_use_the_handshake(mcp_http):
    server, _ = mcp_http()
    reply = httpx.post(
        f"{server.url}/mcp?task_id=best-store",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "run_python", "arguments": {"code": "print(1)"}},
        },
        headers={"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"},
    )
    assert reply.status_code in (400, 404) and len(reply.text) < 2000


def test_a_hundred_sessions_at_once_get_served_or_refused_and_leave_nothing_behind(mcp_http, tmp_path):
    server, hub = mcp_http(max_sessions=6)
    outcomes: list[str] = []
    pids: set[int] = set()

    opened = hub.open

    def open_and_note_worker(*args, **kwargs):
        session = opened(*args, **kwargs)
        pids.add(session.env.kernel.pid)
        return session

    hub.open = open_and_note_worker

    async def one(i: int):
        try:
            result = await session_call(
                f"{server.url}/mcp?task_id=best-store", "run_python", {"code": f"print({i})"}
            )
            outcomes.append("refused" if result.is_error else "mcp_http")
            if result.is_error:
                assert "--max-sessions" in result.content[0].text
        except Exception as exc:  # the session cap refuses the handshake, naming the flag
            outcomes.append("rejected" if "--max-sessions" in repr(exc) else f"other: {exc!r}")

    async def storm():
        async with anyio.create_task_group() as tg:
            for i in range(100):
                tg.start_soon(one, i)

    anyio.run(storm)
    assert len(outcomes) == 100 and not [o for o in outcomes if o.startswith("other")], outcomes
    assert outcomes.count("mcp_http") >= 1
    wait_for(lambda: len(hub) == 0, 30, "every session released")
    assert pids and all(wait_gone(pid) for pid in pids)
    assert not workspaces_left()
    records = records_in(tmp_path / "records")
    assert len(records) == outcomes.count("mcp_http")
    assert all(r["reward_status"] == "unfinished" for r in records)
    # and the server still plays a whole episode
    final = anyio.run(
        lambda: session_call(f"{server.url}/mcp?task_id=best-store", "submit_answer", {"answer": "B"})
    )
    assert final.structured_content["reward"] == 1.0


def test_a_client_piling_up_calls_is_refused_and_does_not_hold_up_another_client(mcp_http):
    server, _ = mcp_http()
    order: list[str] = []
    refused: list[bool] = []

    async def pile():
        async with (
            streamable_http_client(f"{server.url}/mcp?task_id=best-store") as (r, w),
            ClientSession(r, w) as s,
        ):
            await s.initialize()

            async def one():
                result = await s.call_tool(
                    "run_python", {"code": "import time\ntime.sleep(3)\nprint('slept')"}
                )
                refused.append(result.is_error and "one call at a time" in result.content[0].text)
                if not result.is_error:
                    order.append("pile")

            async with anyio.create_task_group() as tg:
                for _ in range(45):
                    tg.start_soon(one)

    async def other():
        await anyio.sleep(0.5)  # the pile is in
        result = await session_call(
            f"{server.url}/mcp?task_id=row-count", "run_python", {"code": "print('other')"}
        )
        assert result.content[0].text.strip() == "other"
        order.append("other")

    async def both():
        async with anyio.create_task_group() as tg:
            tg.start_soon(pile)
            tg.start_soon(other)

    anyio.run(both)
    assert order == ["other", "pile"]  # the other client's call ended while the pile's one cell ran
    assert refused.count(True) == 44 and refused.count(False) == 1


MCP_HEADERS = {"accept": "application/json, text/event-stream"}


def test_handshakes_for_an_unknown_task_are_refused_and_more_than_the_cap_lock_out_no_one(mcp_http, tmp_path):
    server, _ = mcp_http(max_sessions=1)
    for _ in range(2):  # more bogus handshakes than there are slots, none of them closed
        reply = httpx.post(f"{server.url}/mcp?task_id=nope", json=INITIALIZE, headers=MCP_HEADERS)
        assert reply.status_code == 400 and "mcp-session-id" not in reply.headers
        error = reply.json()["error"]
        assert reply.json()["id"] == 1 and error["message"].startswith("unknown task id 'nope'")
    no_task = httpx.post(f"{server.url}/mcp", json=INITIALIZE, headers=MCP_HEADERS)
    assert no_task.status_code == 400 and "/mcp?task_id=ID" in no_task.json()["error"]["message"]

    async def real_client():
        url = f"{server.url}/mcp?task_id=best-store"
        async with streamable_http_client(url) as (r, w), ClientSession(r, w) as s:
            await s.initialize()  # the one slot is free
            return [t.name for t in (await s.list_tools()).tools]

    assert anyio.run(real_client) == ["run_python", "submit_answer"]
    assert not records_in(tmp_path / "records")  # nothing was played, nothing recorded


def test_the_sdk_client_reads_why_its_handshake_was_refused(mcp_http):
    server, _ = mcp_http()
    with pytest.raises(Exception) as refused:  # the SDK's client raises it inside a task group
        anyio.run(lambda: session_call(f"{server.url}/mcp?task_id=nope", "run_python", {"code": "1"}))
    assert "MCPError" in repr(refused.value) and "unknown task id 'nope'" in repr(refused.value)


def test_pings_and_resource_reads_do_not_keep_a_session_past_the_idle_timeout(mcp_http, tmp_path):
    """Only a tool call is activity: a client that pings and reads but calls nothing loses its
    session (and the one slot) after --idle-timeout, and a waiting client gets in."""
    server, _ = mcp_http(max_sessions=1, idle_timeout_s=0.5)
    url = f"{server.url}/mcp?task_id=best-store"
    seen: dict = {}

    async def chatty(called: anyio.Event, newcomer_done: anyio.Event):
        try:
            async with streamable_http_client(url) as (r, w), ClientSession(r, w) as s:
                await s.initialize()
                await s.call_tool("run_python", {"code": "print(1)"})
                called.set()
                with anyio.move_on_after(60):
                    while not newcomer_done.is_set():
                        await s.send_ping()
                        await s.read_resource(PROMPT_URI)
                        await anyio.sleep(0.1)
                seen["chatty after"] = await s.call_tool("run_python", {"code": "print(2)"})
        except Exception as exc:  # its session was ended under it
            seen.setdefault("chatty after", exc)

    async def newcomer(called: anyio.Event, done: anyio.Event):
        await called.wait()
        refusals = 0
        with anyio.move_on_after(60):
            while "reward" not in seen:
                try:
                    result = await session_call(url, "submit_answer", {"answer": "B"})
                    seen["reward"] = result.structured_content["reward"]
                except Exception as exc:  # the one slot is taken: the handshake is refused
                    assert "--max-sessions" in repr(exc), exc
                    refusals += 1
                    await anyio.sleep(0.1)
        seen["refusals"] = refusals
        done.set()

    async def both():
        called, done = anyio.Event(), anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(chatty, called, done)
            tg.start_soon(newcomer, called, done)

    anyio.run(both)
    assert seen["reward"] == 1.0 and seen["refusals"] >= 1  # it waited for the chatty session's slot
    after = seen["chatty after"]
    assert isinstance(after, Exception) or (after.is_error and "ended" in after.content[0].text)
    chatty_record = [r for r in records_in(tmp_path / "records") if r["reward_status"] == "unfinished"]
    assert len(chatty_record) == 1 and "without a tool call" in chatty_record[0]["error"]
    assert chatty_record[0]["turns"] == 1
