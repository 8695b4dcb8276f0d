"""The tools action format under SkyRL: the same env reads hermes-style tool calls from SkyRL's
text actions, turns stop at ``</tool_call>``, and tool results go through the chat template.

Through SkyRL's own ``SkyRLGymGenerator`` with ``VllmLikeEngine`` (vLLM's stopping rules; vLLM
itself needs a GPU) and a tokenizer built in the test whose chat template renders tool calls and
tool results the way Qwen-style templates do.
"""

from __future__ import annotations

import json

import pytest

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.trainers.skyrl.config import parse_config
from tests.conftest import build_tiny_tokenizer
from tests.skyrl.conftest import make_cfg, run_vllm_episode

TOOLS = "environment.skyrl_gym.deepanalyze.action_format=tools"
TOOL_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<|user|>\n<tool_response>\n{{ m['content'] }}\n</tool_response><|end|>\n"
    "{% elif m.get('tool_calls') %}<|assistant|>\n{{ m['content'] }}{% for c in m['tool_calls'] %}"
    "<tool_call>\n{{ c['function'] | tojson }}\n</tool_call>{% endfor %}<|end|>\n"
    "{% else %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SUMS = "import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum())"


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.fixture
def tool_tokenizer():
    tok = build_tiny_tokenizer()
    tok.chat_template = TOOL_TEMPLATE
    return tok


def test_the_tools_format_stops_turns_at_the_closing_call_tag_and_templates_results():
    cfg = parse_config(["trainer.policy.model.path=/unused", TOOLS])
    assert cfg.generator.sampling_params.stop == ["</tool_call>"]
    assert cfg.generator.eval_sampling_params.stop == ["</tool_call>"]
    assert cfg.generator.use_conversation_multi_turn is True


def test_a_stop_list_without_the_closing_call_tag_is_refused():
    with pytest.raises(ConfigError, match="lacks </tool_call>"):
        parse_config(["trainer.policy.model.path=/unused", TOOLS, "generator.sampling_params.stop=[</Code>]"])


def test_the_tag_format_keeps_its_own_stops():
    cfg = parse_config(["trainer.policy.model.path=/unused"])
    assert cfg.generator.sampling_params.stop == ["</Code>", "</Answer>"]
    assert cfg.generator.use_conversation_multi_turn is False


def test_a_tool_calling_episode_through_skyrls_generator(tool_tokenizer, workspace_root, tmp_path):
    tok = tool_tokenizer
    records = f"environment.skyrl_gym.deepanalyze.records_dir={tmp_path}"
    cfg = make_cfg(TOOLS, records, workspace_root=workspace_root)
    # what the model would write if nothing stopped it: text runs on past each call
    plan = [
        "Sum per store.\n" + call("run_python", code=SUMS) + "\n<tool_response>\nmade up",
        call("submit_answer", answer="B") + "\nand more",
    ]
    out, engine = run_vllm_episode(cfg, tok, plan, turn_marker="</tool_response>", task_id="t-tools")
    assert engine.stop_reasons == ["stop", "stop"]
    assert out.env_metrics["reward"] == 1.0 and out.env_metrics["exec_ok"] == 1.0
    # the tool result reached the model through the chat template, outside the loss
    observed = [t for t, m in zip(out.response_ids, out.loss_mask, strict=True) if m == 0]
    shown = tok.decode(observed)
    assert "<tool_response>" in shown and "32" in shown and "made up" not in shown
    [record] = [json.loads(x) for f in tmp_path.glob("*.jsonl") for x in f.read_text().splitlines()]
    assert record["reward_components"] == {"qa_accuracy": 1.0, "qa_exact": 1.0}
    calls = [m["tool_calls"][0]["function"]["name"] for m in record["messages"] if m.get("tool_calls")]
    assert calls == ["run_python", "submit_answer"]
