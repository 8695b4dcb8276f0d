"""``collect``: outside agent processes play the tasks through the MCP server, their model calls
through the recording proxy in front of a scripted OpenAI-compatible model on 127.0.0.1; the env
scores, and every episode is an ordinary record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from deepanalyze_env.offline.rundir import RunSettings
from deepanalyze_env.offline.runner import open_run
from deepanalyze_env.serve.collect import AgentSpec, collect
from deepanalyze_env.serve.http import BackgroundServer
from deepanalyze_env.serve.proxy import RecordingProxy, Upstream
from deepanalyze_env.serve.session import ServeLimits
from tests.serve.conftest import CODE, INITIALIZE, cli, in_process, wait_for
from tests.serve.fake_openai import FakeToolModel
from tests.test_view import Watched, open_episode

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent / "deepanalyze-rl"
OPENAI_AGENT = f"{sys.executable} {REPO / 'examples' / 'openai_agent.py'}"
SCRIPTS = {
    "highest total revenue": [("run_python", {"code": CODE}), ("submit_answer", {"answer": "B"})],
    "How many rows": [
        ("run_python", {"code": "import pandas as pd\nprint(len(pd.read_csv('sales.csv')))"}),
        ("submit_answer", {"answer": "3"}),
    ],
}


def run_collect(
    spec,
    rows,
    workspace_root,
    out: Path,
    *,
    resume: bool = False,
    samples: int = 1,
    concurrency: int = 1,
    limits: ServeLimits | None = None,
):
    settings = RunSettings("collect", [], "t", samples, None, spec.policy_id, {})
    env_config = {"workspace_root": str(workspace_root)}
    run = open_run(out, settings, rows, env_config, resume=resume)
    return collect(
        spec,
        rows,
        env_config,
        run,
        samples=samples,
        concurrency=concurrency,
        limits=limits,
    )


def episodes(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


def test_agent_episodes_score_exactly_as_the_same_calls_in_process_and_keep_the_model_calls(
    rows, workspace_root, tmp_path
):
    with FakeToolModel(SCRIPTS) as model:
        spec = AgentSpec(OPENAI_AGENT, 60, Upstream(model.url, "sk-user-key", "served-model"))
        outcome = run_collect(spec, rows, workspace_root, tmp_path / "run", concurrency=2)
    assert not outcome.failed
    by_task = {r["task_id"]: r for r in episodes(tmp_path / "run")}
    for row in rows:
        script = next(s for key, s in SCRIPTS.items() if key in row["prompt"][0]["content"])
        expected = in_process(row, workspace_root, script)
        record = by_task[row["task_id"]]
        assert (record["reward"], record["reward_components"], record["code_pass"]) == (
            expected["reward"],
            expected["reward_components"],
            expected["code_pass"],
        )
        assert record["versions"]["policy_id"] == "black-box:openai_agent"
        agent = record["agent"]
        assert agent["kind"] == "black-box" and agent["exit_code"] == 0 and len(agent["model_calls"]) == 2
        call = agent["model_calls"][0]
        assert call["request"]["model"] == "served-model" and call["request"]["tools"]
        assert call["response"]["choices"][0]["token_ids"][:2] == [151657, 42]
        assert call["response"]["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.25
    # the upstream saw the user's key; the agents only ever had their episode token
    assert {h["authorization"] for h in model.headers} == {"Bearer sk-user-key"}
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["overall"]["reward_mean"] == 1.0


def test_an_agent_that_exits_before_submitting_is_one_unfinished_episode(rows, workspace_root, tmp_path):
    agent = tmp_path / "quitter.py"
    agent.write_text(
        "import os, sys, anyio\n"
        "from mcp import ClientSession\n"
        "from mcp.client.streamable_http import streamable_http_client\n"
        "async def main():\n"
        "    url = os.environ['DEEPANALYZE_MCP_URL']\n"
        "    async with streamable_http_client(url) as (r, w), ClientSession(r, w) as s:\n"
        "        await s.initialize()\n"
        "        await s.call_tool('run_python', {'code': 'print(1)'})\n"
        "anyio.run(main)\n"
        "sys.exit(3)\n"
    )
    outcome = run_collect(
        AgentSpec(f"{sys.executable} {agent}", 60), rows[:1], workspace_root, tmp_path / "run"
    )
    assert not outcome.failed
    (record,) = episodes(tmp_path / "run")
    assert record["reward_status"] == "unfinished" and "exited with code 3" in record["error"]
    assert record["agent"]["exit_code"] == 3 and record["turns"] == 1


def test_an_agent_that_only_shakes_hands_gives_its_session_slot_back_when_it_exits(
    rows, workspace_root, tmp_path
):
    """One slot (--max-sessions 1, --concurrency 1), two episodes: the second agent's handshake
    is accepted although the first agent left its session open without a call."""
    agent = tmp_path / "greeter.py"
    agent.write_text(
        "import json, os, httpx\n"
        f"message = json.loads({json.dumps(json.dumps(INITIALIZE))})\n"
        "headers = {'accept': 'application/json, text/event-stream'}\n"
        "reply = httpx.post(os.environ['DEEPANALYZE_MCP_URL'], headers=headers, json=message)\n"
        f"with open({str(tmp_path / 'handshakes')!r}, 'a') as f:\n"
        "    f.write(str(reply.status_code) + '\\n')\n"
    )
    outcome = run_collect(
        AgentSpec(f"{sys.executable} {agent}", 60),
        rows[:1],
        workspace_root,
        tmp_path / "run",
        samples=2,
        limits=ServeLimits(max_sessions=1),
    )
    assert [o.failure for o in outcome.failed] == ["agent_error", "agent_error"]  # never opened them
    assert (tmp_path / "handshakes").read_text().split() == ["200", "200"]


def test_an_agent_that_never_opens_its_episode_is_not_recorded_and_resume_runs_it_again(
    rows, workspace_root, tmp_path
):
    flaky = tmp_path / "flaky.py"
    marker = tmp_path / "tried"
    flaky.write_text(
        "import os, pathlib, runpy, sys\n"
        f"marker = pathlib.Path({str(marker)!r})\n"
        "if not marker.exists():\n"
        "    marker.write_text('1'); print('model endpoint refused', file=sys.stderr); sys.exit(1)\n"
        f"sys.argv = [{str(REPO / 'examples' / 'replay_agent.py')!r}]\n"
        f"runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    spec = AgentSpec(f"{sys.executable} {flaky}", 60)
    row = dict(rows[0], task_id="qa-retail-001")  # a task the shipped reference trajectories cover
    row = {
        **row,
        "reward_spec": {"method": "verified", "ground_truth": "Harbor Point", "function": ["answer_match"]},
        "data": "workspaces",
        "workspace_id": "retail",
    }
    first = run_collect(spec, [row], REPO / "data", tmp_path / "run")
    assert [o.failure for o in first.failed] == ["agent_error"]
    assert (
        "never opened its episode" in first.failed[0].error
        and "model endpoint refused" in first.failed[0].error
    )
    assert not (tmp_path / "run" / "episodes.jsonl").read_text().strip()
    second = run_collect(spec, [row], REPO / "data", tmp_path / "run", resume=True)
    assert not second.failed and second.done_before == 0
    (record,) = episodes(tmp_path / "run")
    assert record["reward"] == 1.0 and record["agent"]["exit_code"] == 0


def test_an_agent_past_its_time_limit_is_killed_with_its_children(rows, workspace_root, tmp_path):
    agent = tmp_path / "sleeper.py"
    pidfile = tmp_path / "child.pid"
    agent.write_text(
        "import subprocess, sys, time, pathlib\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"pathlib.Path({str(pidfile)!r}).write_text(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    outcome = run_collect(
        AgentSpec(f"{sys.executable} {agent}", 2.0), rows[:1], workspace_root, tmp_path / "run"
    )
    assert [o.failure for o in outcome.failed] == ["agent_error"] and "exit code None" in outcome.failed[
        0
    ].error
    child = int(pidfile.read_text())
    wait_for(
        lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE,
        10,
        "the agent's child killed",
    )


def test_the_proxy_forwards_a_stream_as_it_comes_and_records_what_it_adds_up_to(tmp_path):
    with FakeToolModel({"task": [("run_python", {"code": "print(1)"})]}) as model:
        proxy = RecordingProxy(Upstream(model.url, "sk-user"))
        from starlette.applications import Starlette

        with BackgroundServer(Starlette(routes=proxy.routes())) as server:
            proxy.open("tok")
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "task"}]}
            with httpx.stream("POST", f"{server.url}/proxy/tok/v1/chat/completions", json=body) as reply:
                lines = [line for line in reply.iter_lines() if line.startswith("data:")]
            unknown = httpx.post(f"{server.url}/proxy/other/v1/chat/completions", json=body)
            huge = httpx.post(f"{server.url}/proxy/tok/v1/chat/completions", content=b"x" * 9_000_000)
            trace = proxy.close("tok")
    assert len(lines) == 4 and lines[-1] == "data: [DONE]"  # two deltas, the end, [DONE]: relayed whole
    (call,) = trace.calls
    message = call["response"]["choices"][0]["message"]
    assert message["tool_calls"][0]["function"] == {
        "name": "run_python",
        "arguments": json.dumps({"code": "print(1)"}),
    }
    assert len(call["response"]["choices"][0]["logprobs"]["content"]) == 2
    assert (unknown.status_code, huge.status_code) == (404, 413)


@pytest.fixture
def cli_run(task_file, workspace_root, tmp_path) -> Path:
    """``deepanalyze-rl collect`` as a user types it: the OpenAI agent, the scripted model."""
    with FakeToolModel(SCRIPTS) as model:
        done = subprocess.run(
            [
                str(BIN),
                "collect",
                "--agent",
                OPENAI_AGENT,
                "--tasks",
                str(task_file),
                "--workspace-root",
                str(workspace_root),
                "--upstream-base-url",
                model.url,
                "--upstream-model",
                "m",
                "--out",
                str(tmp_path / "a"),
                "--keep",
                "reward >= 1",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp_path / "a"


def test_collect_on_the_command_line_writes_a_run_folder_that_eval_compare_reads(cli_run):
    assert (cli_run / "kept.jsonl").read_text().count("\n") == 2
    assert "reward" in (cli_run / "report.md").read_text()
    compared = subprocess.run(
        [str(BIN), "eval", "--compare", str(cli_run), str(cli_run)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert compared.returncode == 0, compared.stdout + compared.stderr


def test_view_shows_an_agent_episode_with_its_model_calls(cli_run, browser):
    assert subprocess.run([str(BIN), "view", str(cli_run)], capture_output=True, timeout=120).returncode == 0
    record = episodes(cli_run)[0]
    w = Watched(browser, cli_run / "episodes.html")
    try:
        open_episode(w, record["episode_id"])
        agent = w.page.text_content("#episode-view .agent")
        assert "openai_agent.py" in agent and "run_python(" in agent and "submit_answer(" in agent
        assert w.errors == []
    finally:
        w.context.close()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--samples", "0"], "--samples"),
        (["--agent-timeout", "0"], "--agent-timeout"),
        (["--agent", "no-such-agent-xyz"], "command not found: no-such-agent-xyz"),
        (["--max-calls", "0"], "--max-calls"),
    ],
)
def test_bad_collect_flags_are_one_line_errors_before_anything_runs(
    flags, says, task_file, workspace_root, tmp_path
):
    done = cli(
        "collect",
        "--agent",
        "true",
        "--tasks",
        str(task_file),
        "--workspace-root",
        str(workspace_root),
        "--out",
        str(tmp_path / "x"),
        *flags,
    )
    assert done.returncode == 2 and done.stdout.startswith("error:") and says in done.stdout
    assert len(done.stdout.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


def test_tasks_that_need_a_judge_are_refused_up_front_naming_the_flags(tmp_path):
    done = cli(
        "collect",
        "--agent",
        "true",
        "--tasks",
        str(REPO / "data" / "tasks" / "qa.jsonl"),
        "--workspace-root",
        str(REPO / "data"),
        "--out",
        str(tmp_path / "x"),
    )
    assert done.returncode == 2 and "4 of 4 tasks cannot be served" in done.stdout
    assert "--judge-base-url URL --judge-model NAME" in done.stdout


def test_the_agent_gets_its_episode_token_never_the_users_key(rows, workspace_root, tmp_path, monkeypatch):
    monkeypatch.setenv("MY_UPSTREAM_KEY", "sk-secret")
    seen = tmp_path / "seen.json"
    agent = tmp_path / "snoop.py"
    agent.write_text(
        "import json, os, sys\n"
        "keys = ('MY_UPSTREAM_KEY', 'OPENAI_API_KEY', 'OPENAI_BASE_URL',\n"
        "        'DEEPANALYZE_MCP_URL', 'DEEPANALYZE_TASK_ID')\n"
        "seen = {k: os.environ.get(k) for k in keys} | {'argv': sys.argv[1:]}\n"
        f"open({str(seen)!r}, 'w').write(json.dumps(seen))\n"
    )
    upstream = Upstream("http://127.0.0.1:9/v1", "sk-secret", api_key_env="MY_UPSTREAM_KEY")
    spec = AgentSpec(f"{sys.executable} {agent} {{task_id}} {{mcp_url}}", 30, upstream)
    run_collect(spec, rows[:1], workspace_root, tmp_path / "run")
    env = json.loads(seen.read_text())
    assert env["MY_UPSTREAM_KEY"] is None and env["OPENAI_API_KEY"] not in (None, "", "sk-secret")
    assert env["OPENAI_API_KEY"] in env["OPENAI_BASE_URL"]  # the token names its proxy route
    assert (
        env["argv"] == ["best-store", env["DEEPANALYZE_MCP_URL"]]
        and env["DEEPANALYZE_TASK_ID"] == "best-store"
    )


def test_sft_selects_collected_episodes_as_tool_call_records(cli_run):
    from deepanalyze_env.core.tool_calls import is_tools_record
    from deepanalyze_env.trainers.trl.sft_data import load_records, select_records

    selection = select_records(load_records([cli_run]), keep="reward >= 1")
    assert len(selection.records) == 2 and selection.total == 2
    for record in selection.records:
        assert is_tools_record(record)
        calls = [m["tool_calls"][0]["function"]["name"] for m in record["messages"] if m.get("tool_calls")]
        assert calls == ["run_python", "submit_answer"]


def test_concurrent_agents_each_get_an_episode_even_under_a_lower_session_cap(rows, workspace_root, tmp_path):
    with FakeToolModel(SCRIPTS) as model:
        spec = AgentSpec(OPENAI_AGENT, 60, Upstream(model.url, "k"))
        outcome = run_collect(
            spec,
            rows,
            workspace_root,
            tmp_path / "run",
            samples=2,
            concurrency=4,
            limits=ServeLimits(max_sessions=1),
        )
    assert not outcome.failed
    recorded = episodes(tmp_path / "run")
    assert len(recorded) == 4 and all(r["reward"] == 1.0 for r in recorded)
    assert len({r["episode_id"] for r in recorded}) == 4


def test_a_stream_merge_keeps_a_bounded_trace_of_a_huge_stream():
    from deepanalyze_env.serve.proxy import MAX_RECORDED_CHARS, StreamMerge

    merge = StreamMerge()
    chunk = json.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 10_000}}]})
    for _ in range(MAX_RECORDED_CHARS // 10_000 + 50):
        merge.feed(f"data: {chunk}")
    response = merge.response()
    kept = len(response["choices"][0]["message"]["content"])
    lines_kept = MAX_RECORDED_CHARS // len(f"data: {chunk}")  # the cap counts the stream's lines
    assert response["truncated"] is True and kept == lines_kept * 10_000
