"""SFT on tools-format records: rendered the way TRL's ``environment_factory`` path lays out a
rollout, checked against TRL's own code (its response parser reads the trained tokens back as
the calls; its tool-suffix builder gives the untrained tokens between turns)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from deepanalyze_env.core.records import read_records
from deepanalyze_env.core.tool_calls import is_tools_record
from deepanalyze_env.generation.tokens import training_template
from deepanalyze_env.trainers.trl.environment import environment_factory, tool_dataset_rows
from deepanalyze_env.trainers.trl.sft_data import IGNORE_INDEX, render_tool_record, sft_rows
from tests.conftest import qa_extras

trl = pytest.importorskip("trl")

PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]
SUMS = "import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum())"


@pytest.fixture
def tool_record(workspace_root, tmp_path):
    """A real tools-format record: two calls played through the env (TRL's path)."""
    make = environment_factory({"workspace_root": str(workspace_root), "records_dir": str(tmp_path / "rec")})
    env = make()
    env.reset(**tool_dataset_rows([{"prompt": PROMPT, "task_id": "t0", **qa_extras()}])[0])
    env.run_python(code=SUMS)
    env.submit_answer(answer="B")
    env._close()
    [record] = read_records(next((tmp_path / "rec").glob("*.jsonl")))
    return record


@pytest.fixture
def qwen3_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    return add_response_schema(tok)


def spans(rendered):
    """Consecutive runs of (mask, ids) over the completion."""
    out = []
    for token, mask in zip(rendered.completion_ids, rendered.completion_mask, strict=True):
        if out and out[-1][0] == mask:
            out[-1][1].append(token)
        else:
            out.append((mask, [token]))
    return out


def test_a_tools_record_is_recognised(tool_record):
    assert is_tools_record(tool_record)


def test_trained_tokens_are_the_calls_trl_would_parse(qwen3_tokenizer, tool_record):
    from trl.chat_template_utils import parse_response

    tok = qwen3_tokenizer
    rendered = render_tool_record(tok, tool_record)
    runs = spans(rendered)
    assert [m for m, _ in runs] == [1, 0, 1]  # call, tool result, call
    first = parse_response(tok, runs[0][1], prefix=rendered.prompt_ids)
    assert first["tool_calls"][0]["function"] == {"name": "run_python", "arguments": {"code": SUMS}}
    second = parse_response(tok, runs[2][1], prefix=rendered.prompt_ids + runs[0][1] + runs[1][1])
    assert second["tool_calls"][0]["function"] == {"name": "submit_answer", "arguments": {"answer": "B"}}
    assert runs[0][1][-1] == runs[2][1][-1] == tok.eos_token_id  # each turn ends on its sampled end token


def test_untrained_tokens_between_turns_are_trls_tool_suffix(qwen3_tokenizer, tool_record):
    tok = qwen3_tokenizer
    rendered = render_tool_record(tok, tool_record)
    [result] = [m for m in tool_record["messages"] if m["role"] == "tool"]
    stand_in = SimpleNamespace(
        processing_class=tok,
        _tokenizer=tok,
        chat_template=training_template(tok),
        chat_template_kwargs={},
        _is_vlm=False,
    )
    expected = trl.GRPOTrainer._get_tool_suffix_ids(stand_in, [result])
    assert spans(rendered)[1][1] == expected
    assert "<tool_response>" in tok.decode(expected) and "32" in tok.decode(expected)


def test_the_prompt_carries_the_tool_schemas(qwen3_tokenizer, tool_record):
    rendered = render_tool_record(qwen3_tokenizer, tool_record)
    prompt = qwen3_tokenizer.decode(rendered.prompt_ids)
    assert '"name": "run_python"' in prompt and '"name": "submit_answer"' in prompt


def test_sft_rows_pick_the_tools_rendering_for_tools_records(qwen3_tokenizer, tool_record):
    [row] = sft_rows(qwen3_tokenizer, [tool_record])
    rendered = render_tool_record(qwen3_tokenizer, tool_record)
    assert row["input_ids"] == rendered.input_ids
    assert sum(1 for label in row["labels"] if label != IGNORE_INDEX) == sum(rendered.completion_mask)
