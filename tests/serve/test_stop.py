"""Ctrl-C and SIGTERM end ``serve`` (every transport) and ``collect`` at once, at any moment:
during start-up (imports, the HTTP server's start, the kernel's) and while a cell runs. The real
command runs as a user runs it, with a real client (or agent) playing a cell that would run for
two minutes (the cell timeout is raised past it); what is left afterwards is checked: the
records the spec names, no kernel process, no scratch folder."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_gone
from tests.serve.conftest import INITIALIZE, cell_started, records_in, wait_for

BIN = Path(sys.executable).parent / "deepanalyze-rl"
PROMPT_EXIT_S = 10.0
"""From the signal to the exit. The stop itself takes a fraction of a second; the rest is slack
for a busy machine. Before the fix: 10-12 s (http, openenv: uvicorn draining a cell, then the
interpreter's teardown), the cell's whole run (collect, openenv), never (stdio)."""
CELL = "open('started', 'w').close()\nimport time\ntime.sleep(120)"
MESSAGES = [
    INITIALIZE,
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "run_python", "arguments": {"code": CELL}},
    },
]
MCP_CLIENT = f"""
import json, os, sys, httpx
url = sys.argv[1] if len(sys.argv) > 1 else os.environ["DEEPANALYZE_MCP_URL"]
headers = {{"accept": "application/json, text/event-stream"}}
with httpx.Client(timeout=600) as client:
    for message in json.loads({json.dumps(MESSAGES)!r}):
        reply = client.post(url, headers=headers, json=message)
        headers.setdefault("mcp-session-id", reply.headers.get("mcp-session-id"))
"""
"""The same three messages over HTTP, as an agent of ``collect`` or a client of ``serve``."""


class Command:
    """``deepanalyze-rl serve --transport KIND …`` or ``collect …`` with a client playing one long
    cell: over HTTP once the server says where it listens, over stdio at once (stdin is kept
    open, as a client that has not left keeps it), under collect as its agent."""

    def __init__(self, kind: str, task_file: Path, workspace_root: Path, tmp_path: Path):
        self.kind, self.tmp = kind, tmp_path
        self.records = tmp_path / ("run" if kind == "collect" else "rec")
        client = tmp_path / "mcp_client.py"
        client.write_text(MCP_CLIENT)
        config = tmp_path / "env.yaml"
        config.write_text("executor:\n  timeout_s: 300\n")
        argv = [str(BIN)]
        if kind == "collect":
            argv += ["collect", "--agent", f"{sys.executable} {client}", "--out", str(self.records)]
        else:
            argv += ["serve", "--transport", kind, "--records", str(self.records)]
            argv += ["--task-id", "best-store"] if kind == "stdio" else ["--port", "0"]
        argv += ["--tasks", str(task_file), "--workspace-root", str(workspace_root), "--config", str(config)]
        self.helpers: list[subprocess.Popen] = []
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        threading.Thread(target=self._read_stderr, daemon=True).start()
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        if kind == "stdio":
            self.proc.stdin.write("".join(json.dumps(m) + "\n" for m in MESSAGES))
            self.proc.stdin.flush()

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            if line.startswith("serving "):
                self._connect(line.split(" at ", 1)[1].split(" ", 1)[0])

    def _connect(self, url: str) -> None:
        if self.kind == "http":
            client = self.tmp / "mcp_client.py"
            self.helpers.append(subprocess.Popen([sys.executable, str(client), f"{url}?task_id=best-store"]))
        elif self.kind == "openenv":
            threading.Thread(target=_openenv_cell, args=(url,), daemon=True).start()

    def wait_for_the_cell(self) -> None:
        scratch = Path(os.environ["DEEPANALYZE_SCRATCH"])
        wait_for(
            lambda: cell_started(scratch) or self.proc.poll() is not None,
            180,
            "the cell to start",
        )
        assert self.proc.poll() is None, "".join(self.lines[-20:])

    def stop(self, signum: int) -> tuple[int | None, float, list[int]]:
        """Send ``signum``; the exit code, the seconds it took, and the processes it had started."""
        try:
            started = [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.Error:
            started = []
        sent = time.monotonic()
        self.proc.send_signal(signum)
        try:
            code: int | None = self.proc.wait(timeout=PROMPT_EXIT_S + 60)
        except subprocess.TimeoutExpired:
            code = None
        return code, time.monotonic() - sent, started

    def close(self) -> None:
        for proc in [self.proc, *self.helpers]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _openenv_cell(url: str) -> None:
    from deepanalyze_env.serve.openenv_client import DeepAnalyzeEnvClient
    from deepanalyze_env.serve.openenv_server import DeepAnalyzeAction

    try:
        with DeepAnalyzeEnvClient(base_url=url).sync() as env:
            env.reset(task_id="best-store")
            env.step(DeepAnalyzeAction(tool="run_python", arguments={"code": CELL}))
    except Exception:  # the server stops under it
        pass


@pytest.fixture
def command(task_file, workspace_root, tmp_path):
    made: list[Command] = []

    def start(kind: str) -> Command:
        made.append(Command(kind, task_file, workspace_root, tmp_path))
        return made[-1]

    yield start
    for cmd in made:
        cmd.close()


def nothing_left(started: list[int]) -> None:
    """The command's kernel processes (and agents) are gone, and so is every scratch folder."""
    left = [pid for pid in started if not wait_gone(pid, timeout=15)]
    assert not left, [" ".join(psutil.Process(pid).cmdline())[:100] for pid in left]
    scratch = Path(os.environ["DEEPANALYZE_SCRATCH"])
    assert not scratch.is_dir() or not list(scratch.iterdir())


def records_of(cmd: Command) -> list[dict]:
    return records_in(cmd.records / "records" if cmd.kind == "collect" else cmd.records)


EXIT_CODE = {"http": 0, "openenv": 0, "stdio": 0, "collect": 130}


@pytest.mark.parametrize("kind", ["http", "openenv", "stdio", "collect"])
def test_ctrl_c_while_a_cell_runs_ends_the_command_at_once_with_the_documented_records(command, kind):
    cmd = command(kind)
    cmd.wait_for_the_cell()
    code, seconds, started = cmd.stop(signal.SIGINT)
    assert code == EXIT_CODE[kind] and seconds < PROMPT_EXIT_S, (code, seconds, "".join(cmd.lines[-20:]))
    nothing_left(started)
    records = records_of(cmd)
    if kind == "collect":  # the agent is killed and its episode left for --resume
        assert records == []
    else:  # the episode as it stood, its running cell's turn counted
        (record,) = records
        assert record["reward_status"] == "unfinished" and record["error"] == "the server was stopped"
        assert record["turns"] == 1 and record["task_id"] == "best-store"
    if kind == "openenv":  # and the command said where its clients connect
        assert (
            cmd.lines[0].startswith("serving openenv at http://127.0.0.1:")
            and "(OpenEnv base URL" in cmd.lines[0]
        )


START_UP = [
    ("http", signal.SIGINT),
    ("openenv", signal.SIGTERM),
    ("stdio", signal.SIGINT),
    ("collect", signal.SIGTERM),
]


@pytest.mark.parametrize(("kind", "signum"), START_UP, ids=[f"{k}-{s.name}" for k, s in START_UP])
def test_a_signal_at_a_random_moment_of_start_up_ends_the_command_and_leaves_nothing(command, kind, signum):
    """At a random moment of the first 2.5 s: the imports, the checks, the HTTP server's start,
    on a fast machine the client's handshake and the kernel's start (that one is pinned down in
    test_session's stop while the kernel starts). A signal that lands before the command's own
    handling (the imports) ends it the interpreter's way: at once as well."""
    delay = random.uniform(0.0, 2.5)
    cmd = command(kind)
    time.sleep(delay)
    code, seconds, started = cmd.stop(signum)
    expected = {EXIT_CODE[kind], -signum} | ({130} if signum == signal.SIGINT else set())
    assert code in expected and seconds < PROMPT_EXIT_S, (delay, code, seconds, "".join(cmd.lines[-20:]))
    nothing_left(started)
    records = records_of(cmd)  # serve: the episode as it stood, if its cell had started; collect: none
    assert len(records) <= (0 if kind == "collect" else 1), delay
    assert all(r["reward_status"] == "unfinished" and r["error"] == "the server was stopped" for r in records)


def test_sigterm_is_a_ctrl_c_inside_and_the_old_handler_comes_back():
    """What makes SIGTERM stop ``serve`` and ``collect`` as Ctrl-C does (collect's agents killed,
    serve's episodes recorded): a ``KeyboardInterrupt`` in the main thread."""
    from deepanalyze_env.serve.stopping import sigterm_as_interrupt

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here at once
    assert signal.getsignal(signal.SIGTERM) is before
