"""Action formats (``core/formats``): the env plays whatever format is registered by name, and
``EnvConfig`` is where every setting, the profile included, is checked once."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from deepanalyze_env.core import protocol
from deepanalyze_env.core.config import ConfigError, EnvConfig
from deepanalyze_env.core.env import DeepAnalyzeEnv
from deepanalyze_env.core.formats import FORMATS, Action, ActionFormat, get_format
from deepanalyze_env.core.profiles import PROFILES
from deepanalyze_env.core.tool_calls import ParsedTurn, ToolCall
from tests.conftest import qa_extras

PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]
SUMS = "import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum().idxmax())"


class JsonLines(ActionFormat):
    """A third format, made only here: each turn is one JSON object, ``{"code": …}`` or
    ``{"answer": …}``; outputs come back as ``{"output": …}``; a turn that is no such object
    fails the gate."""

    name = "jsonl"
    prompt_file = "prompts/protocol.md"

    def read(self, text: str, profile) -> Action:
        message = {"role": "assistant", "content": text}
        try:
            turn = json.loads(text)
        except ValueError:
            return Action(text, message, no_code="not JSON", error="not JSON")
        if "answer" in turn:
            return Action(text, message, end="answer", submitted=str(turn["answer"]))
        return Action(text, message, code=turn.get("code"), no_code="no code")

    def read_at_eos(self, text: str, profile) -> Action:
        return Action(text, {"role": "assistant", "content": text}, end="eos")

    def observation(self, output: str, config: EnvConfig):
        return {"role": "user", "content": json.dumps({"output": output})}

    def gate(self, ctx, fence: bool):
        if ctx.tool_errors:
            return "tools", "; ".join(ctx.tool_errors)
        return None if ctx.answer is not None else ("tools", "no answer")

    def answer(self, policy_turns: Sequence[str], submitted: str | None) -> str | None:
        return protocol.answer_value(submitted)

    def own_text(self, turn: str) -> str:
        return turn


@pytest.fixture
def jsonl(monkeypatch):
    monkeypatch.setitem(FORMATS, JsonLines.name, JsonLines())


def test_a_third_format_is_one_class_registered_by_name(jsonl, workspace_root: Path):
    env = DeepAnalyzeEnv(
        {"workspace_root": str(workspace_root), "action_format": "jsonl", "executor": {"timeout_s": 5}},
        extras=qa_extras(),
    )
    env.init(PROMPT)
    try:
        out = env.step(json.dumps({"code": SUMS}))
        assert not out["done"] and out["metadata"]["code_pass"] == 1
        assert json.loads(out["observations"][0]["content"]) == {"output": "B\n"}
        final = env.step(json.dumps({"answer": "B"}))
    finally:
        env.close()
    meta = final["metadata"]
    assert final["done"] and meta["termination"] == "answer" and meta["reward_status"] == "scored"
    assert meta["format_ok"] and final["reward"] == 1.0


def test_an_invalid_turn_of_that_format_fails_its_gate(jsonl, workspace_root: Path):
    env = DeepAnalyzeEnv(
        {"workspace_root": str(workspace_root), "action_format": "jsonl"}, extras=qa_extras()
    )
    env.init(PROMPT)
    try:
        out = env.step("print(1)")
        assert out["observations"][0]["content"] == json.dumps({"output": "not JSON"})
        assert out["metadata"]["exec"]["status"] == "no_code"
        final = env.step(json.dumps({"answer": "B"}))
    finally:
        env.close()
    assert final["metadata"]["gate"] == "tools" and final["reward"] == -1.0
    assert final["metadata"]["reward_notes"]["format_gate"] == "turn 1: not JSON"


def test_the_registry_names_the_known_formats():
    assert list(FORMATS) == ["tags", "tools"]
    with pytest.raises(ConfigError, match="action_format must be one of tags, tools, got 'xml'"):
        get_format("xml")


def test_act_is_only_for_a_format_that_acts_through_calls(workspace_root: Path):
    env = DeepAnalyzeEnv({"workspace_root": str(workspace_root)}, extras=qa_extras())
    with pytest.raises(ConfigError, match="act\\(\\) is the tools action format's step"):
        env.act(ParsedTurn("", ToolCall("submit_answer", "B")))


@pytest.mark.parametrize("config", [{"profile": "v9"}, EnvConfig(profile="v9")])
def test_the_profile_is_checked_by_the_config_itself(config):
    with pytest.raises(ConfigError, match=r"env_config\.profile must be one of v1, upstream, got .v9."):
        EnvConfig.from_any(config)


def test_the_tools_format_reads_its_call_tags_in_the_fold():
    """One reading (docs/design.md §6): FULLWIDTH brackets and a ZERO WIDTH SPACE around the call
    still make a call; its JSON, and the code in it, are read as typed."""
    call = json.dumps({"name": "run_python", "arguments": {"code": "print('\u0412')"}}, ensure_ascii=False)
    action = get_format("tools").read(f"ran:\n\uff1ctool_call\uff1e{call}<\u200b/tool_call>\nmore", None)
    assert (action.code, action.error, action.text) == (
        "print('\u0412')",
        None,
        f"ran:\n\uff1ctool_call\uff1e{call}<\u200b/tool_call>",
    )


def test_the_tags_format_runs_a_look_alike_code_block_as_typed():
    action = get_format("tags").read("<\u0421ode>\nprint('\u0415')\n</\u0421ode> more", PROFILES["v1"])
    assert (action.code, action.text, action.end) == (
        "print('\u0415')",
        "<\u0421ode>\nprint('\u0415')\n</\u0421ode>",
        None,
    )
