"""``deepanalyze-rl rollout`` with real parts: a local chat-completions server as teacher and judge
(the real openai client over HTTP), real kernels, a real SIGKILL mid-run and ``--resume``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from deepanalyze_env.cli import main
from deepanalyze_env.core.formats import get_format
from deepanalyze_env.core.records import episode_id, read_records
from deepanalyze_env.core.tasks import load_rows
from deepanalyze_env.offline.policies import (
    PolicyTurn,
    ScriptedPolicy,
    TurnContext,
    continue_layout,
    openai_turn_end,
)
from deepanalyze_env.offline.rollout import plan_jobs, run_jobs
from rewards.judge.fake_server import FakeJudgeServer, Reply
from tests.conftest import ROOT

# What a served model returns when stopped at </Code> or </Answer>: the stop string is missing.
TEACHER_CODE = (
    "<Analyze>Sum revenue per store.</Analyze>\n<Code>\n```python\nimport pandas as pd\n"
    "print(pd.read_csv('sales.csv').groupby('store').revenue.sum().idxmax())\n```\n"
)
TEACHER_ANSWER = "<Analyze>B has the most revenue.</Analyze>\n<Answer>\nAnswer: B\n"


def write_tasks(path: Path, n: int, method: str = "qa", marker: str = "") -> Path:
    lines = [
        {
            "id": f"t{i}",
            "method": method,
            "instruction": f"Which store has the highest revenue? (task {i}){marker if i == 1 else ''}",
            "data": "data",
            "workspace_id": "ws",
            "reward_spec": {"method": method, "ground_truth": "B"},
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture
def teacher():
    with FakeJudgeServer(Reply(text=TEACHER_CODE)) as server:
        server.script(Reply(text=TEACHER_ANSWER), match="<Execute>")
        yield server


@pytest.fixture
def judge():
    with FakeJudgeServer(Reply(text="Weaknesses:\n- terse\nSCORE: 4")) as server:
        yield server


def teacher_args(tasks: Path, root: Path, out: Path, teacher, judge, *extra: str) -> list[str]:
    return [
        "rollout",
        "--tasks",
        str(tasks),
        "--workspace-root",
        str(root),
        "--out",
        str(out),
        "--policy",
        "openai",
        "--policy-base-url",
        teacher.url,
        "--policy-model",
        "teacher-m",
        "--judge-base-url",
        judge.url,
        "--judge-model",
        "judge-m",
        *extra,
    ]


def test_openai_teacher_episodes_keep_and_usage(tmp_path: Path, workspace_root: Path, teacher, judge):
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
    out = tmp_path / "run"
    keep = 'reward_status == "scored" and reward >= 0.5 and method == "qa" and len(messages) == 4'
    args = teacher_args(tasks, workspace_root, out, teacher, judge, "--samples", "2", "--concurrency", "3")
    assert main([*args, "--keep", keep]) == 0
    records = read_records(out / "episodes.jsonl")
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    assert [r["episode_id"] for r in records] == [
        episode_id(run_id, t, s) for t in range(2) for s in range(2)
    ]
    for r in records:
        assert r["reward_status"] == "scored" and r["termination"] == "answer"
        assert r["reward"] == pytest.approx((1.0 + 0.8) / 2)  # qa_accuracy, judge 4/5; qa_exact weight 0
        assistant = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
        assert assistant == [TEACHER_CODE + "</Code>", TEACHER_ANSWER + "</Answer>"]  # stop strings put back
        assert r["code_pass"] == [1] and "\nB\n" in r["messages"][2]["content"]
        assert r["versions"]["policy_id"] == "openai:teacher-m"
        per_turn = r["usage"]["per_turn"]
        assert [u["completion_tokens"] for u in per_turn] == [8, 8] and all(
            u["prompt_tokens"] > 0 for u in per_turn
        )
        assert r["usage"]["completion_tokens"] == 16
    # the teacher saw the conversation as the env keeps it, the observation as the last user turn
    assert teacher.calls == 8 and sum("<Execute>" in q["prompt"] for q in teacher.requests) == 4
    assert {q["model"] for q in teacher.requests} == {"teacher-m"}
    kept = read_records(out / "kept.jsonl")
    assert [r["episode_id"] for r in kept] == [r["episode_id"] for r in records]

    # a second run into the same folder is refused; a stricter --keep on resume rewrites kept.jsonl
    assert main(teacher_args(tasks, workspace_root, out, teacher, judge, "--samples", "2")) == 2
    strict = teacher_args(tasks, workspace_root, out, teacher, judge, "--samples", "2", "--resume")
    assert main([*strict, "--keep", "reward > 0.95"]) == 0
    assert read_records(out / "kept.jsonl") == []
    assert teacher.calls == 8  # nothing re-ran
    # resuming with other settings is refused rather than mixing two runs under one id scheme
    assert main(teacher_args(tasks, workspace_root, out, teacher, judge, "--samples", "3", "--resume")) == 2


def test_teacher_failure_drops_the_episode_and_resume_retries_it(tmp_path: Path, workspace_root: Path, judge):
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2, marker=" FAILME")
    out = tmp_path / "run"
    with FakeJudgeServer(Reply(text=TEACHER_CODE)) as teacher:
        teacher.script(Reply(status=400, text="model overloaded"), match="FAILME")
        teacher.script(Reply(text=TEACHER_ANSWER), match="<Execute>")
        assert main(teacher_args(tasks, workspace_root, out, teacher, judge)) == 1
        assert [r["task_id"] for r in read_records(out / "episodes.jsonl")] == ["t0"]  # no half episode
        teacher.reset()
        teacher.script(Reply(text=TEACHER_ANSWER), match="<Execute>")
        assert main(teacher_args(tasks, workspace_root, out, teacher, judge, "--resume")) == 0
        assert teacher.calls == 2  # only the missing episode ran
    records = read_records(out / "episodes.jsonl")
    assert [r["task_id"] for r in records] == ["t0", "t1"] and {r["reward_status"] for r in records} == {
        "scored"
    }


def test_resume_after_sigkill_mid_run_has_no_duplicates_and_no_gaps(
    tmp_path: Path, workspace_root: Path, judge
):
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2)
    out = tmp_path / "run"
    with FakeJudgeServer(Reply(text=TEACHER_CODE, delay_s=0.1)) as teacher:
        teacher.script(Reply(text=TEACHER_ANSWER, delay_s=0.1), match="<Execute>")
        args = teacher_args(
            tasks, workspace_root, out, teacher, judge, "--samples", "6", "--concurrency", "2"
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "deepanalyze_env.cli", *args],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            files = list((out / "records").glob("episodes-*.jsonl"))
            if files and sum(len(read_records(f)) for f in files) >= 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL, "the run ended before it could be killed"
        [raw] = (out / "records").glob("episodes-*.jsonl")
        before = len(read_records(raw))
        assert 3 <= before < 12
        assert not (out / "episodes.jsonl").exists()
        with raw.open("ab") as fh:  # what a writer killed inside write() could leave behind
            fh.write(b'{"episode_id": "torn", "messages": [{"role": "us')
        assert main([*args, "--resume"]) == 0
    assert raw.read_bytes().endswith(b"\n") and b'"torn"' not in raw.read_bytes()
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    expected = [episode_id(run_id, t, s) for t in range(2) for s in range(6)]
    raw_ids = [r["episode_id"] for f in (out / "records").glob("episodes-*.jsonl") for r in read_records(f)]
    assert sorted(raw_ids) == sorted(expected)  # every episode exactly once across both processes
    assert [r["episode_id"] for r in read_records(out / "episodes.jsonl")] == expected
    assert all(r["reward_status"] == "scored" for r in read_records(out / "episodes.jsonl"))


@pytest.mark.slow  # CPU generation: seconds on an idle 2-core machine, a minute under load
def test_transformers_policy_runs_the_embedded_model(tmp_path: Path, workspace_root: Path):
    pytest.importorskip("transformers")
    tasks = write_tasks(tmp_path / "tasks.jsonl", 1, method="qa_plain")
    config = tmp_path / "env.yaml"
    config.write_text("max_turns: 1\n")
    out = tmp_path / "run"
    args = ["rollout", "--tasks", str(tasks), "--workspace-root", str(workspace_root), "--out", str(out)]
    args += ["--config", str(config), "--policy", "transformers", "--policy-max-tokens", "8"]
    assert main(args) == 0
    [record] = read_records(out / "episodes.jsonl")
    assert record["versions"]["policy_id"] == "transformers:embedded:smollm2"
    assert record["reward_status"] == "scored" and record["turns"] == 1
    [usage] = record["usage"]["per_turn"]
    assert usage["prompt_tokens"] > 20 and 1 <= usage["completion_tokens"] <= 8


def test_stop_string_is_put_back_only_where_one_is_missing():
    tags, tools = get_format("tags"), get_format("tools")
    assert tags.put_back("<Code>\nx=1\n") == "<Code>\nx=1\n</Code>"
    assert tags.put_back("<Code>x</Code>") == "<Code>x</Code>"  # servers that keep the stop string
    assert tags.put_back("<Code>x</Code><Answer>B") == "<Code>x</Code><Answer>B</Answer>"
    assert tags.put_back("<Answer>B <Code>x") == "<Answer>B <Code>x</Answer>"  # an open answer wins
    assert tags.put_back("<Code>x", "</Code>") == "<Code>x</Code>"  # vLLM's stop_reason
    assert tags.put_back("just talk") == "just talk"  # a natural end of turn
    assert (
        tools.put_back('<tool_call>{"name": "run_python"}') == '<tool_call>{"name": "run_python"}</tool_call>'
    )
    assert tools.put_back("<tool_call>{}", "</tool_call>") == "<tool_call>{}</tool_call>"
    assert tools.put_back("no call") == "no call"


def test_a_teacher_reply_that_ends_its_message_ends_the_episode_after_one_call(
    tmp_path: Path, workspace_root: Path, judge
):
    """Issue 53's "done when": ``finish_reason: "stop"`` with no stop string matched is the end of
    the message, the game GRPO trains: the episode ends there (``eos``), not after max_turns calls."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", 1, method="qa_plain")
    out = tmp_path / "run"
    with FakeJudgeServer(Reply(text="<Analyze>I think it is B.</Analyze>\nNothing more to run.")) as teacher:
        assert main(teacher_args(tasks, workspace_root, out, teacher, judge)) == 0
        assert teacher.calls == 1
    [record] = read_records(out / "episodes.jsonl")
    assert record["termination"] == "eos" and record["turns"] == 1
    assert record["reward_status"] == "scored" and record["reward"] == -1.0  # no answer: the gate fails
    assert record["usage"]["per_turn"][0]["finish_reason"] == "stop"


def test_a_teacher_reply_cut_by_max_tokens_is_stepped_as_it_stands(
    tmp_path: Path, workspace_root: Path, judge
):
    """``finish_reason: "length"``: the turn's own limit, stepped (a no-code turn), as the TRL rollout
    steps a turn cut by ``max_turn_tokens``; the episode goes on to the answer."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", 1, method="qa_plain")
    out = tmp_path / "run"
    with FakeJudgeServer(Reply(text="<Analyze>Let me think about", finish_reason="length")) as teacher:
        teacher.script(Reply(text=TEACHER_ANSWER), match="<Execute>")
        assert main(teacher_args(tasks, workspace_root, out, teacher, judge)) == 0
        assert teacher.calls == 2
    [record] = read_records(out / "episodes.jsonl")
    assert record["termination"] == "answer" and record["turns"] == 2
    assert [e["status"] for e in record["exec"]] == ["no_code"] and record["reward"] == 1.0
    assert [u["finish_reason"] for u in record["usage"]["per_turn"]] == ["length", "stop"]


@pytest.mark.parametrize(
    ("text", "finish", "extra", "expected"),
    [
        ("<Code>x", "stop", {}, ("<Code>x</Code>", "stop")),  # a swallowed stop string, put back
        ("<Code>x</Code>", "stop", {}, ("<Code>x</Code>", "stop")),  # a server that keeps it
        ("I am done.", "stop", {}, ("I am done.", "eos")),  # nothing open, no stop string: message end
        ("<Code>x", "stop", {"stop_reason": "</Code>"}, ("<Code>x</Code>", "stop")),  # vLLM names it
        ("<Code>x", "stop", {"stop_reason": None}, ("<Code>x", "eos")),  # vLLM: an EOS, no tag to add
        ("<Code>x", "stop", {"stop_reason": 151645}, ("<Code>x", "eos")),  # vLLM: a stop token id
        ("<Code>x", "length", {}, ("<Code>x", "length")),  # max_tokens: nothing put back
        ('\n<tool_call>\n{"name": "run_python"}\n</tool_call>', "tool_calls", {}, None),  # the call ends it
        ("I can't help", "content_filter", {}, ("I can't help", "eos")),  # the server ended the message
    ],
)
def test_a_teachers_finish_reason_maps_to_the_token_engines_turn_ends(text, finish, extra, expected):
    if expected is None:
        expected = (text, "stop")
    assert openai_turn_end(text, finish, extra) == expected


def test_a_teachers_tool_call_is_a_turn_that_ended_at_its_call():
    """A chat server that answers with a structured call (``finish_reason: "tool_calls"``): the call
    is written as hermes text, the text the tools format reads, and the turn ended there (stop); its
    plain reply after the script ends its message (eos)."""
    from deepanalyze_env.offline.policies import OpenAIPolicy
    from tests.serve.fake_openai import FakeToolModel

    with FakeToolModel({"Which store": [("run_python", {"code": "print(1)"})]}) as model:
        policy = OpenAIPolicy(model="m", base_url=model.url, max_retries=0)
        prompt = [{"role": "user", "content": "Which store?"}]
        first = policy.act(TurnContext("e", "t", None, 0, prompt, 1))
        result = {"role": "tool", "name": "run_python", "content": "1"}
        second = policy.act(
            TurnContext("e", "t", None, 1, [*prompt, {"role": "assistant", "content": ""}, result], 1)
        )
    assert first.finish_reason == "tool_calls" and first.end == "stop"
    assert (
        first.text.strip()
        == '<tool_call>\n{"name": "run_python", "arguments": {"code": "print(1)"}}\n</tool_call>'
    )
    assert (second.text, second.finish_reason, second.end) == ("I am done.", "stop", "eos")


def test_a_scripted_turn_ends_at_its_stop_string_or_else_at_the_end_of_its_message():
    scripts = {("t", "good"): ["<Analyze>a</Analyze>\n<Code>\nprint(1)\n</Code>", "no tags at all"]}
    tags, tools = ScriptedPolicy(scripts), ScriptedPolicy(scripts, action_format="tools")
    ends = [tags.act(TurnContext("e", "t", "good", k, [], 0)).end for k in range(3)]
    assert ends == ["stop", "eos", "eos"]  # past its script the policy's empty message ends it too
    turn = tools.act(TurnContext("e", "t", "good", 0, [], 0))
    assert turn.end == "stop" and turn.text.endswith("</tool_call>")  # the cell as a closed call
    assert tools.act(TurnContext("e", "t", "good", 1, [], 0)).end == "eos"  # free text: no call


def test_stop_leaves_no_record_for_episodes_in_flight(tmp_path: Path, workspace_root: Path):
    """Ctrl-C sets the stop event: episodes in flight end at their next turn, unrecorded."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", 4, method="qa_plain")
    rows = load_rows([tasks], str(workspace_root))
    stop = threading.Event()

    class Slow:
        name = policy_id = "slow"

        def act(self, ctx: TurnContext) -> PolicyTurn:
            if ctx.task_id == "t1" and ctx.turn == 1:
                stop.set()  # Ctrl-C arrives while t1 is mid-episode; it asks for another cell
                return PolicyTurn(TEACHER_CODE + "</Code>")
            if ctx.turn == 0:
                return PolicyTurn(TEACHER_CODE + "</Code>")
            return PolicyTurn(TEACHER_ANSWER + "</Answer>")

    config = {"workspace_root": str(workspace_root), "records_dir": str(tmp_path / "rec")}
    results = run_jobs(plan_jobs(rows, "r", 1), config, Slow(), concurrency=1, stop=stop)
    assert [(r.task_id, r.status) for r in results] == [("t0", "scored"), ("t1", "interrupted")]
    [raw] = (tmp_path / "rec").glob("episodes-*.jsonl")
    assert [r["task_id"] for r in read_records(raw)] == ["t0"]


def test_bad_keep_expression_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture):
    assert main(["rollout", "--out", str(tmp_path / "o"), "--keep", "__import__('os').system('true')"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: --keep: only len, min, max") and len(out.strip().splitlines()) == 1
    assert main(["rollout", "--out", str(tmp_path / "o"), "--keep", "rewrd > 1"]) == 2
    assert "unknown name 'rewrd'" in capsys.readouterr().out
    assert not (tmp_path / "o").exists()


def test_continue_layout_joins_the_episode_into_one_assistant_message():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<Code>x</Code>"},
        {"role": "user", "content": "\n<Execute>\n1\n</Execute>\n"},
    ]
    assert continue_layout(messages, 2) == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<Code>x</Code>\n<Execute>\n1\n</Execute>\n"},
    ]
    assert continue_layout(messages[:2], 2) == messages[:2]


def test_a_malformed_policy_chat_template_kwargs_is_a_one_line_error(tmp_path, capsys):
    argv = ["rollout", "--policy", "transformers", "--out", str(tmp_path / "r")]
    assert main([*argv, "--policy-chat-template-kwargs", "[1]"]) == 2
    assert "--policy-chat-template-kwargs: give a JSON object" in capsys.readouterr().out


def test_policy_chat_template_kwargs_reach_the_transformers_policy(monkeypatch):
    """The flag's JSON object is what the policy renders prompts with (a spy stands in for the
    model load: the template arguments are the point, the embedded run is tested above)."""
    import argparse

    from deepanalyze_env.cli.rollout import build_policy
    from deepanalyze_env.offline import policies

    seen = {}
    monkeypatch.setattr(policies, "TransformersPolicy", lambda **options: seen.update(options))
    args = argparse.Namespace(
        policy="transformers",
        trajectories=None,
        policy_model="embedded:smollm2",
        policy_base_url=None,
        policy_api_key_env=None,
        policy_temperature=None,
        policy_max_tokens=None,
        policy_timeout=None,
        policy_layout=None,
        concurrency=2,
        policy_chat_template_kwargs='{"enable_thinking": false}',
        policy_chat_template=None,
    )
    build_policy(args)
    assert seen["chat_template_kwargs"] == {"enable_thinking": False} and seen["max_batch"] == 2
