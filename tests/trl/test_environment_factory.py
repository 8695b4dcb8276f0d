"""TRL's ``environment_factory`` path: the instances our factory makes, driven the way
``GRPOTrainer`` drives them (``reset(**row)``, the tool methods with keyword arguments,
``get_reward()``), over real kernels and workspaces; then the real ``GRPOTrainer`` with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.records import read_records
from deepanalyze_env.trainers.trl.environment import (
    ENDED,
    environment_factory,
    episode_metrics,
    tool_dataset_rows,
)
from tests.conftest import qa_extras
from tests.tiny_llama import tiny_llama

PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]
SUMS = "import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum())"


def dataset_row(**over) -> dict:
    """A row as TRL hands it to ``reset``: what ``tool_dataset_rows`` made (reward_spec as JSON text)."""
    row = {"prompt": PROMPT, "task_id": "t0", **qa_extras()}
    row.update(over)
    [out] = tool_dataset_rows([row])
    return out


@pytest.fixture
def factory(workspace_root: Path, tmp_path: Path):
    return environment_factory(
        {
            "workspace_root": str(workspace_root),
            "executor": {"timeout_s": 2},
            "records_dir": str(tmp_path / "rec"),
        }
    )


def test_an_episode_driven_as_trl_drives_it_gets_the_env_reward(factory, tmp_path):
    env = factory()
    assert env.reset(**dataset_row()) is None
    output = env.run_python(code=SUMS)
    assert "32" in output and "<Execute>" not in output
    assert env.submit_answer(answer="Store B.\nAnswer: B") == "Answer submitted."
    assert env.get_reward() == 1.0
    env.reset(**dataset_row(task_id="t1"))  # the next rollout closes this one: its record is written
    [record] = read_records(next((tmp_path / "rec").glob("episodes-*.jsonl")))
    assert record["task_id"] == "t0" and record["reward_components"] == {"qa_accuracy": 1.0, "qa_exact": 1.0}
    call = record["messages"][-3]["tool_calls"][0]["function"]
    assert call == {"name": "run_python", "arguments": {"code": SUMS}}
    assert record["messages"][-2] == {"role": "tool", "name": "run_python", "content": output}


def test_a_rollout_that_stops_calling_tools_without_an_answer_fails_the_gate(factory):
    env = factory()
    env.reset(**dataset_row())
    env.run_python(code="print(1)")
    assert env.get_reward() == -1.0


def test_a_dispatched_call_with_an_empty_argument_fails_the_gate_with_its_reason(factory):
    env = factory()
    env.reset(**dataset_row())
    assert "invalid tool call (bad_arguments)" in env.run_python(code="  ")
    env.submit_answer(answer="B")
    assert env.get_reward() == -1.0
    assert "bad_arguments" in env._env.final_metadata["reward_notes"]["format_gate"]


def test_calls_after_the_answer_change_nothing(factory):
    env = factory()
    env.reset(**dataset_row())
    env.submit_answer(answer="B")
    assert env.run_python(code="print(2)") == ENDED
    assert env.submit_answer(answer="A") == ENDED
    assert env.get_reward() == 1.0


def test_an_episode_that_cannot_train_has_no_reward(workspace_root):
    factory = environment_factory({"workspace_root": str(workspace_root), "row_errors": "episode"})
    env = factory()
    env.reset(**dataset_row(reward_spec=json.dumps({"method": "no_such_method"})))
    env.submit_answer(answer="B")
    assert env.get_reward() is None  # environment_error: out of the gradient, not a silent 0


def test_the_factory_refuses_a_bad_env_config():
    with pytest.raises(ConfigError, match=r"unknown key env_config\.turns"):
        environment_factory({"turns": 3})


def test_the_dataset_rows_carry_the_tools_prompt_and_the_spec_as_text():
    row = {"prompt": PROMPT, "task_id": "t0", **qa_extras()}
    [out] = tool_dataset_rows([row], {"system_prompt": "protocol"})
    assert out["prompt"][0]["role"] == "system" and "submit_answer" in out["prompt"][0]["content"]
    assert out["prompt"][1] == PROMPT[0]
    assert json.loads(out["reward_spec"]) == row["reward_spec"]
    assert (out["data"], out["workspace_id"], out["task_id"]) == ("data", "ws", "t0")


# ---------------------------------------------------------------------------- the real GRPOTrainer

RIGHT, WRONG = "B", "A"


def scripted_turns(tok):
    """The policy's text, scripted: a 135M model does not emit tool calls, so generation is the one
    part replaced (``_generate_single_turn``). Everything else is TRL's own: the chat template
    (Qwen3's, shipped by TRL, on the embedded SmolLM2 tokenizer), its parsing of the calls, its
    dispatch to our methods, its tool masks, ``get_reward`` and the optimizer step. Rollout i
    runs the sums, then answers B (right) for even i and A (wrong) for odd i."""

    def generate(trainer, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        out = []
        for i, ids in enumerate(prompt_ids):
            seen = tok.decode(ids).count("<tool_response>")
            if seen == 0:
                call = {"name": "run_python", "arguments": {"code": SUMS}}
            else:
                call = {"name": "submit_answer", "arguments": {"answer": RIGHT if i % 2 == 0 else WRONG}}
            text = f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>"
            out.append(tok.encode(text, add_special_tokens=False))
        return out, None

    return generate


def test_grpo_trainer_runs_episodes_through_the_factory(
    smollm2_tokenizer, workspace_root, tmp_path, monkeypatch
):
    torch = pytest.importorskip("torch")
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer.name_or_path)
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    torch.manual_seed(0)
    model = tiny_llama(tok, max_position_embeddings=2048)
    monkeypatch.setattr(trl.GRPOTrainer, "_generate_single_turn", scripted_turns(tok))
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    env_config = {"workspace_root": str(workspace_root), "executor": {"timeout_s": 5}}
    rows = [{"prompt": PROMPT, "task_id": "t0", **qa_extras()}]
    config = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        max_steps=1,
        logging_steps=1,
        learning_rate=1e-4,
        beta=0.0,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=512,
        mask_truncated_completions=True,
        reward_weights=[0.0],  # episode_metrics only logs, as the train command sets it
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[episode_metrics],
        args=config,
        processing_class=tok,
        train_dataset=Dataset.from_list(tool_dataset_rows(rows, env_config)),
        environment_factory=environment_factory(env_config),
    )
    trainer.train()
    logs = trainer.state.log_history[0]
    assert logs["rewards/DeepAnalyzeToolEnvironment/mean"] == pytest.approx(0.5)  # one right, one wrong
    assert logs["reward_std"] > 0
    assert logs["reward"] == pytest.approx(0.5)  # the logging function's weight 0 adds nothing
    # component means and counts reach TRL's logs, as on the rollout_func path
    assert logs["reward_components/qa_accuracy"] == pytest.approx(0.5)
    assert logs["reward_status/scored"] == 2 and logs["termination/answer"] == 2
    # the exclusion curves exist from the first step, at 0 when nothing was excluded
    assert [
        logs[f"verifier_error/{c}"] for c in ("judge_parse", "context_length", "judge_call", "reward_raised")
    ] == [0.0] * 4
