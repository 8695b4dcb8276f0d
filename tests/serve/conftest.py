"""Shared pieces of the serving tests: a judge-free task over a small table, the same actions
played in-process (the oracle a served episode must match), and a look at what is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from deepanalyze_env.core.env import DeepAnalyzeEnv
from deepanalyze_env.core.records import read_records
from deepanalyze_env.core.tasks import env_extras, load_task_files
from deepanalyze_env.core.tool_calls import ParsedTurn, check_call
from tests.test_view import browser  # noqa: F401  (the Chromium fixture, for the agent page test)

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}
"""An MCP handshake as a raw JSON-RPC request (for tests that speak the protocol by hand)."""
CODE = "import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum().idxmax())"
TASKS = [
    {
        "id": "best-store",
        "method": "verified",
        "instruction": "Which store has the highest total revenue? Answer with the store letter.",
        "data": "data",
        "workspace_id": "ws",
        "reward_spec": {"method": "verified", "ground_truth": "B", "function": ["answer_match"]},
    },
    {
        "id": "row-count",
        "method": "verified",
        "instruction": "How many rows does sales.csv have?",
        "data": "data",
        "workspace_id": "ws",
        "reward_spec": {"method": "verified", "ground_truth": "3", "function": ["answer_match"]},
    },
]


@pytest.fixture
def task_file(workspace_root: Path) -> Path:
    path = workspace_root / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return path


@pytest.fixture
def rows(task_file: Path, workspace_root: Path) -> list[dict[str, Any]]:
    return load_task_files([task_file], str(workspace_root))


def in_process(row: dict[str, Any], workspace_root: Path, calls: list[tuple[str, dict[str, Any]]]) -> dict:
    """The oracle: the same calls played on a DeepAnalyzeEnv in this process, as the tools format
    plays them (system prompt ``protocol``), returning the final step's reward and metadata."""
    env = DeepAnalyzeEnv(
        {"workspace_root": str(workspace_root), "action_format": "tools", "system_prompt": "protocol"},
        extras=env_extras(row),
    )
    env.init(row["prompt"])
    out: Any = None
    try:
        for name, arguments in calls:
            checked = check_call(name, arguments)
            turn = (
                ParsedTurn("", checked) if not isinstance(checked, tuple) else ParsedTurn("", None, *checked)
            )
            out = env.act(turn)
            if out["done"]:
                break
    finally:
        env.close(record=False)
    assert out is not None and out["done"], "the oracle's calls must end the episode"
    return {"reward": out["reward"], **out["metadata"]}


def records_in(folder: Path) -> list[dict[str, Any]]:
    return [r for f in sorted(folder.glob("episodes-*.jsonl")) for r in read_records(f)]


def cell_started(scratch: Path) -> bool:
    """A test cell wrote ``started`` in its workspace (``<scratch>/<episode>/workspace/``)."""
    return any(scratch.glob("*/workspace/started"))


def wait_for(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def kernel_children() -> list[psutil.Process]:
    """This process's descendants that are kernel workers or fork servers (what an episode starts)."""
    found = []
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "kernel" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def scratch_entries() -> list[str]:
    scratch = Path(os.environ["DEEPANALYZE_SCRATCH"])
    return sorted(p.name for p in scratch.iterdir()) if scratch.is_dir() else []


@pytest.fixture
def make_hub(workspace_root: Path, tmp_path: Path):
    """``make_hub(**limits)``: a hub over the test workspace recording into ``tmp_path/records``;
    every hub made is closed at the end."""
    from deepanalyze_env.serve.hub import SessionHub
    from deepanalyze_env.serve.session import ServeLimits

    made = []

    def make(**limits) -> SessionHub:
        hub = SessionHub(
            {"workspace_root": str(workspace_root), "records_dir": str(tmp_path / "records")},
            ServeLimits(**limits),
        )
        made.append(hub)
        return hub

    yield make
    for hub in made:
        hub.close_all()


@pytest.fixture
def start_server(make_hub):
    """``start_server(app)``: the app under uvicorn on an ephemeral loopback port, stopped at the end
    (before the hubs close)."""
    from deepanalyze_env.serve.http import BackgroundServer

    started = []

    def start(app):
        server = BackgroundServer(app).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def mcp_http(make_hub, start_server, rows):
    """``mcp_http(**limits)``: (server, hub) of an MCP streamable-HTTP server whose sessions play
    the task their URL names."""
    from deepanalyze_env.serve.hub import TaskBook
    from deepanalyze_env.serve.mcp_server import EpisodeServer, http_app, task_from_query

    def start(**limits):
        hub = make_hub(**limits)
        server = start_server(http_app(EpisodeServer(hub, task_from_query(TaskBook(rows))), host="127.0.0.1"))
        return server, hub

    return start


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``deepanalyze-rl ARGS…`` as a user runs it (this interpreter's console script)."""
    program = Path(sys.executable).parent / "deepanalyze-rl"
    return subprocess.run([str(program), *args], capture_output=True, text=True, timeout=timeout)
