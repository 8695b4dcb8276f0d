"""Real GRPOTrainer steps through the real rollout_func, env and kernels.

The policy is a tiny randomly initialised Llama with a tokenizer built in the test (no
downloads), warmed up for a few seconds on two answers (right and wrong) so that sampled
groups differ in reward and GRPO has a non-zero advantage to learn from.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from deepanalyze_env.trainers.trl.rollout_func import DeepAnalyzeRollout, environment_reward, trl_dataset_rows  # noqa: E402
from tests.conftest import qa_extras  # noqa: E402

PROMPT = [{"role": "user", "content": "Which store?"}]
RIGHT = "<Analyze>done</Analyze>\n<Answer>\nAnswer: B\n</Answer>"
WRONG = "<Analyze>done</Analyze>\n<Answer>\nAnswer: A\n</Answer>"


def tiny_policy(tok):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    prompt_ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)
    if not isinstance(prompt_ids, list):
        prompt_ids = prompt_ids["input_ids"]
    batch = [prompt_ids + tok.encode(t, add_special_tokens=False) for t in (RIGHT, WRONG)]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(120):
        for seq in batch:
            ids = torch.tensor([seq])
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    return model


def test_grpo_takes_real_optimizer_steps_on_env_rewards(tiny_tokenizer, workspace_root, tmp_path):
    tok = tiny_tokenizer
    model = tiny_policy(tok)
    rows = [
        {
            "prompt": PROMPT,
            "task_id": f"t{i}",
            **qa_extras(reward_spec={"method": "qa_plain", "ground_truth": "B"}),
        }
        for i in range(2)
    ]
    rollout = DeepAnalyzeRollout(
        rows, {"workspace_root": str(workspace_root), "max_turns": 3}, max_turn_tokens=40
    )
    config = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-3,  # 5e-3 wrecked the tiny policy in one step on some sample draws
        beta=0.0,
        temperature=1.0,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=64,
        mask_truncated_completions=True,
        seed=0,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[environment_reward],
        args=config,
        train_dataset=Dataset.from_list(trl_dataset_rows(rows) * 4),
        processing_class=tok,
        rollout_func=rollout,
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    changed = [n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, "no parameter changed: the GRPO loss had no gradient"
    logs = {k for entry in trainer.state.log_history for k in entry}
    assert "reward_components/qa_accuracy" in logs or "reward_components/format_gate" in logs
    rewards = [e["reward"] for e in trainer.state.log_history if "reward" in e]
    assert rewards and all(-1.0 <= r <= 1.0 for r in rewards)
    assert any(e.get("reward_std", 0.0) > 0 for e in trainer.state.log_history)
