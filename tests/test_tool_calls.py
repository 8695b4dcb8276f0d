"""The tools action format (``env_config.action_format: tools``): how a turn's tool call is read,
and episodes through the real skyrl_gym registry, kernels and workspaces — including the parity
of one scripted analysis played in both formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import skyrl_gym

from deepanalyze_env.core.config import ConfigError, EnvConfig
from deepanalyze_env.core.formats import get_format
from deepanalyze_env.core.tool_calls import (
    ParsedTurn,
    ToolCall,
    from_tags,
    parse_turn,
    render_call,
    tool_schemas,
)
from tests.conftest import code, qa_extras

PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]
SUMS = "import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum())"


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def make(root: Path, **config):
    config.setdefault("workspace_root", str(root))
    config.setdefault("executor", {"timeout_s": 2})
    config.setdefault("action_format", "tools")
    env = skyrl_gym.make("deepanalyze", env_config=config, extras=qa_extras())
    env.init(PROMPT)
    return env


# ---------------------------------------------------------------------------- reading a turn


def test_a_run_python_call_is_read_with_the_text_before_it():
    turn = parse_turn("Let me look.\n" + call("run_python", code="print(1)"))
    assert turn == ParsedTurn("Let me look.\n", ToolCall("run_python", "print(1)"))


def test_arguments_given_as_json_text_are_read():
    text = '<tool_call>{"name": "submit_answer", "arguments": "{\\"answer\\": \\"B\\"}"}</tool_call>'
    assert parse_turn(text).call == ToolCall("submit_answer", "B")


def test_a_numeric_answer_is_read_as_its_json_text():
    assert parse_turn(call("submit_answer", answer=3.5)).call == ToolCall("submit_answer", "3.5")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<tool_call>{not json}</tool_call>", "unparsable"),
        ('<tool_call>{"name": "run_python"}</tool_call>', "unparsable"),
        ('<tool_call>{"name": "run_python", "arguments": {"code": "print(1)"}}', "unparsable"),
        (call("delete_everything", path="/"), "unknown_tool"),
        (call("run_python", code="print(1)", timeout=99), "bad_arguments"),
        (call("run_python", source="print(1)"), "bad_arguments"),
        (call("run_python", code="   "), "bad_arguments"),
        (call("submit_answer", answer=True), "bad_arguments"),
        ('<tool_call>{"name": "run_python", "arguments": "print(1)"}</tool_call>', "bad_arguments"),
    ],
)
def test_an_invalid_call_has_a_named_reason(text, error):
    turn = parse_turn(text)
    assert turn.call is None and turn.error == error and turn.detail


DEEP = "[" * 3000 + "]" * 3000  # nested past the JSON reader's recursion limit: 6 KB


def test_a_call_nested_past_the_readers_depth_is_unparsable():
    turn = parse_turn(f"<tool_call>{DEEP}</tool_call>")
    assert turn.call is None and turn.error == "unparsable" and "nested" in turn.detail


def test_arguments_text_nested_past_the_readers_depth_are_bad_arguments():
    turn = parse_turn(call("run_python", code="x").replace('{"code": "x"}', json.dumps(DEEP)))
    assert turn.call is None and turn.error == "bad_arguments" and "nested" in turn.detail


def test_a_turn_without_a_call_has_neither_call_nor_error():
    assert parse_turn("I think the answer is B.") == ParsedTurn("I think the answer is B.", None)


def test_a_turn_is_cut_after_its_first_closing_tag():
    first, second = call("run_python", code="print(1)"), call("submit_answer", answer="B")
    assert get_format("tools").cut(first + "\n" + second) == first


def test_a_rendered_call_reads_back_as_itself_even_when_its_code_names_the_closing_tag():
    for c in (ToolCall("run_python", 'print("a</tool_call>b")'), ToolCall("submit_answer", "B")):
        assert parse_turn(get_format("tools").cut(render_call(c) + "tail")).call == c


def test_the_schemas_name_the_two_tools_with_one_required_argument_each():
    shown = {s["function"]["name"]: s["function"]["parameters"]["required"] for s in tool_schemas()}
    assert shown == {"run_python": ["code"], "submit_answer": ["answer"]}


# ---------------------------------------------------------------------------- config


def test_an_unknown_action_format_is_a_config_error():
    with pytest.raises(ConfigError, match="action_format must be one of tags, tools"):
        EnvConfig.from_any({"action_format": "json"})


def test_the_tools_format_needs_the_v1_profile():
    with pytest.raises(ConfigError, match="needs profile v1"):
        EnvConfig.from_any({"action_format": "tools", "profile": "upstream"})


def test_the_protocol_prompt_of_the_tools_format_teaches_the_tools(workspace_root):
    env = make(workspace_root, system_prompt="protocol")
    system = env.messages[0]["content"]
    env.close()
    assert "run_python" in system and "submit_answer" in system and "<Code>" not in system


# ---------------------------------------------------------------------------- episodes


def test_a_run_python_call_runs_as_a_cell_and_its_output_is_the_tool_result(workspace_root):
    env = make(workspace_root)
    out = env.step("Sum per store.\n" + call("run_python", code=SUMS))
    env.close()
    assert out["done"] is False and out["metadata"]["code_pass"] == 1
    assert out["metadata"]["exec"]["status"] == "ok"
    [obs] = out["observations"]
    assert obs["role"] == "tool" and obs["name"] == "run_python" and "32" in obs["content"]
    assert "<Execute>" not in obs["content"]
    [sent] = env.messages[-2]["tool_calls"]
    assert sent["function"] == {"name": "run_python", "arguments": {"code": SUMS}}


def test_text_after_the_call_is_cut_and_not_run(workspace_root):
    env = make(workspace_root)
    out = env.step(call("run_python", code="print(1)") + call("submit_answer", answer="B"))
    env.close()
    assert out["done"] is False and out["observations"][0]["content"].strip() == "1"


def test_an_invalid_call_runs_nothing_says_why_and_fails_the_gate(workspace_root):
    env = make(workspace_root)
    bad = env.step(call("shell", cmd="ls"))
    assert bad["done"] is False
    no_code = {"status": "no_code", "elapsed_ms": 0.0, "truncated": False}
    assert bad["metadata"] == {"code_pass": 0, "exec": no_code}
    assert "invalid tool call (unknown_tool)" in bad["observations"][0]["content"]
    final = env.step(call("submit_answer", answer="B"))
    env.close()
    meta = final["metadata"]
    assert final["reward"] == -1.0 and meta["reward_status"] == "scored"
    assert meta["format_ok"] is False and meta["gate"] == "tools"
    assert "turn 1: unknown_tool" in meta["reward_notes"]["format_gate"]


def test_a_call_nested_past_the_readers_depth_is_the_policys_invalid_call(workspace_root):
    env = make(workspace_root)
    bad = env.step(f"<tool_call>{DEEP}</tool_call>")
    assert bad["done"] is False and "invalid tool call (unparsable)" in bad["observations"][0]["content"]
    final = env.step(call("submit_answer", answer="B"))
    env.close()
    assert final["reward"] == -1.0 and final["metadata"]["reward_status"] == "scored"
    assert final["metadata"]["gate"] == "tools"


def test_a_deeply_nested_call_ended_by_eos_is_scored_as_a_failed_gate(workspace_root):
    env = make(workspace_root)
    out = env.end_with_eos(f"<tool_call>{DEEP}</tool_call>")
    env.close()
    meta = out["metadata"]
    assert out["done"] is True and meta["termination"] == "eos" and meta["reward_status"] == "scored"
    assert out["reward"] == -1.0 and meta["gate"] == "tools"


def test_a_reader_that_raises_on_a_turn_fails_the_turn_not_the_trainer(workspace_root, monkeypatch):
    """A reader bug cannot be produced from real text once the readers are total, so this one
    is simulated by replacing the tools reader: the guard around reading is what is tested."""

    def broken(text: str):
        raise RecursionError("simulated reader failure")

    monkeypatch.setattr("deepanalyze_env.core.tool_calls.parse_turn", broken)
    env = make(workspace_root)
    out = env.step("anything")
    env.close()
    meta = out["metadata"]
    assert out["done"] is True and meta["reward_status"] == "scored" and out["reward"] == -1.0
    assert meta["gate"] == "tools" and "unreadable" in meta["reward_notes"]["format_gate"]


def test_a_message_without_a_call_ends_the_episode_without_an_answer(workspace_root):
    env = make(workspace_root)
    out = env.step("The answer is B.")
    env.close()
    meta = out["metadata"]
    assert out["done"] is True and meta["termination"] == "eos"
    assert meta["gate"] == "tools" and "without a submit_answer" in meta["reward_notes"]["format_gate"]


def test_the_turn_limit_ends_a_tools_episode_as_it_ends_a_tags_one(workspace_root):
    env = make(workspace_root, max_turns=2)
    env.step(call("run_python", code="print(1)"))
    out = env.step(call("run_python", code="print(2)"))
    env.close()
    assert out["done"] is True and out["metadata"]["termination"] == "max_turns"
    assert out["metadata"]["code_pass"] == [1]  # the last turn's call is not run


def test_act_takes_a_call_a_trainer_parsed_itself(workspace_root):
    env = make(workspace_root)
    env.act(ParsedTurn("", ToolCall("run_python", SUMS)))
    final = env.act(ParsedTurn("Done.", ToolCall("submit_answer", "B")))
    env.close()
    assert final["metadata"]["reward_components"] == {"qa_accuracy": 1.0, "qa_exact": 1.0}
    assert env.turns == 2 and env.policy_turns[-1] == "Done." + render_call(ToolCall("submit_answer", "B"))


def test_act_refuses_a_tags_env(workspace_root):
    env = make(workspace_root, action_format="tags")
    with pytest.raises(ConfigError, match="action_format: tags"):
        env.act(ParsedTurn("", ToolCall("submit_answer", "B")))
    env.close()


SCRIPT = [  # (code or None for the answer, answer)
    (SUMS, None),
    ("print(undefined_name)", None),
    ("import pandas as pd\nprint(pd.read_csv('sales.csv').revenue.max())", None),
    (None, "Store B has the most.\nAnswer: B"),
]


def _play(env, fmt: str) -> dict:
    out = None
    for src, answer in SCRIPT:
        if fmt == "tags":
            action = code(src) if src else f"<Analyze>done</Analyze>\n<Answer>\n{answer}\n</Answer>"
        else:
            action = call("run_python", code=src) if src else call("submit_answer", answer=answer)
            action = "step\n" + action
        out = env.step(action)
    env.close()
    return out


def test_one_analysis_scores_the_same_in_both_formats(workspace_root):
    """Parity: the same cells and answer, written as tags and as tool calls, give the same reward,
    components, status and code_pass sequence (expected values by hand: B is the ground truth,
    the second cell raises)."""
    tags = _play(make(workspace_root, action_format="tags"), "tags")
    tools = _play(make(workspace_root), "tools")
    for out in (tags, tools):
        meta = out["metadata"]
        assert out["reward"] == 1.0
        assert meta["reward_components"] == {"qa_accuracy": 1.0, "qa_exact": 1.0}
        assert meta["reward_status"] == "scored" and meta["format_ok"] is True and meta["gate"] is None
        assert meta["code_pass"] == [1, 0, 1] and [e["status"] for e in meta["exec"]] == ["ok", "error", "ok"]
        assert meta["termination"] == "answer" and meta["turns"] == 4


def test_a_wrong_answer_scores_the_same_in_both_formats(workspace_root):
    scores = []
    for fmt, action in (
        ("tags", "<Analyze>done</Analyze>\n<Answer>\nAnswer: A\n</Answer>"),
        ("tools", call("submit_answer", answer="A")),
    ):
        env = make(workspace_root, action_format=fmt)
        out = env.step(action)
        env.close()
        scores.append((out["reward"], out["metadata"]["reward_components"], out["metadata"]["format_ok"]))
    assert scores[0] == scores[1] == (0.0, {"qa_accuracy": 0.0, "qa_exact": 0.0}, True)


# ---------------------------------------------------------------------------- tag turns as tool calls


def test_a_tag_code_turn_becomes_its_analysis_and_a_run_python_call():
    turn = code("print(1)")  # "<Analyze>step</Analyze> <Code>```python print(1)```</Code>"
    assert from_tags(turn) == "step\n" + render_call(ToolCall("run_python", "print(1)"))


def test_a_tag_answer_turn_becomes_a_submit_answer_call():
    turn = "<Analyze>done</Analyze>\n<Answer>\nStore B.\nAnswer: B\n</Answer>"
    assert parse_turn(from_tags(turn)) == ParsedTurn(
        "done\n", ToolCall("submit_answer", "Store B.\nAnswer: B")
    )


def test_a_tag_turn_without_code_or_answer_stays_free_text():
    assert from_tags("<Analyze>thinking</Analyze>") == "thinking"


def test_scripted_references_score_the_same_in_both_formats(workspace_root, tmp_path):
    """``rollout --policy scripted`` with ``action_format: tools`` replays the tag trajectories as
    tool calls: the same cells and answers, so the same rewards and code_pass (by hand: the sums
    pass, the typo fails, B is right)."""
    from deepanalyze_env.cli import main
    from deepanalyze_env.core.records import read_records

    turns = [
        code(SUMS),
        code("print(undefined_name)"),
        "<Analyze>done</Analyze>\n<Answer>\nAnswer: B\n</Answer>",
    ]
    trajectories = tmp_path / "trajectories.jsonl"
    trajectories.write_text(json.dumps({"task_id": "t0", "label": "good", "turns": turns}) + "\n")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task_id": "t0", "prompt": PROMPT, **qa_extras()}) + "\n")
    found = {}
    for fmt in ("tags", "tools"):
        config = tmp_path / f"{fmt}.yaml"
        config.write_text(json.dumps({"workspace_root": str(workspace_root), "action_format": fmt}))
        out = tmp_path / fmt
        argv = ["rollout", "--policy", "scripted", "--trajectories", str(trajectories), "--labels", "good"]
        assert main([*argv, "--tasks", str(tasks), "--config", str(config), "--out", str(out)]) == 0
        [record] = read_records(out / "episodes.jsonl")
        found[fmt] = (record["reward"], record["reward_components"], record["code_pass"], record["format_ok"])
    assert found["tags"] == found["tools"] == (1.0, {"qa_accuracy": 1.0, "qa_exact": 1.0}, [1, 0], True)
