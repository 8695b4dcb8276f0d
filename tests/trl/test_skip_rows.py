"""Inert rows skip the update (trainers/trl/skip_rows.py): the gradient of a real GRPOTrainer step
with them skipped equals the gradient with them run, for the recipes' micro-batch of 1.

The step is one generation batch of two groups of 3 scripted episodes: a group with reward
variance (1, 0, and an unscored row whose mask is empty) and a zero-variance group (0.3 each,
a mean whose float rounding leaves TRL a non-zero advantage). Four of the six rows are inert.
"""

from __future__ import annotations

import copy

import pytest

from tests.tiny_llama import tiny_llama

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from deepanalyze_env.trainers.trl.rollout_func import environment_reward  # noqa: E402
from deepanalyze_env.trainers.trl.skip_rows import (  # noqa: E402
    SkippedRows,
    exact_zero_variance,
    inert_rows,
    skip_inert_rows,
)

REWARDS = [1.0, 0.0, None, 0.3, 0.3, 0.3]
TOKENS = 12


def _model(tok):
    torch.manual_seed(0)
    return tiny_llama(tok)


class _Grads(TrainerCallback):
    def __init__(self):
        self.grads: dict[str, torch.Tensor] = {}

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _step(tok, model, tmp_path, trainer_class, loss_type):
    def rollout(prompts, trainer):
        n = len(prompts)
        vocab = len(tok) - 10
        ids = [[(7 * i + j) % vocab + 5 for j in range(TOKENS)] + [tok.eos_token_id] for i in range(n)]
        rewards = [REWARDS[i % len(REWARDS)] for i in range(n)]
        return {
            "prompt_ids": [[3, 4, 5 + i] for i in range(n)],
            "completion_ids": ids,
            "logprobs": None,
            "env_mask": [[0 if r is None else 1] * len(x) for x, r in zip(ids, rewards, strict=True)],
            "env_reward": rewards,
            "reward_components": [{} for _ in range(n)],
            "reward_status": ["scored"] * n,
            "termination": ["answer"] * n,
        }

    grads = _Grads()
    config = trl.GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        max_steps=1,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=6,
        num_generations=3,
        max_completion_length=TOKENS + 1,
        beta=0.0,
        loss_type=loss_type,
        learning_rate=1e-6,
        seed=0,
    )
    rows = [{"prompt": [{"role": "user", "content": f"task {i}"}]} for i in range(2)]
    trainer = trainer_class(
        model=model,
        reward_funcs=[environment_reward],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        rollout_func=rollout,
        callbacks=[grads],
    )
    trainer.train()
    return grads.grads


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_skipping_inert_rows_leaves_the_gradient_unchanged(tiny_tokenizer, tmp_path, loss_type):
    tok = tiny_tokenizer
    model = _model(tok)
    full = _step(tok, copy.deepcopy(model), tmp_path / "full", trl.GRPOTrainer, loss_type)
    log = SkippedRows()
    skipping = skip_inert_rows(trl.GRPOTrainer, log)
    skipped = _step(tok, copy.deepcopy(model), tmp_path / "skip", skipping, loss_type)
    assert (log.rows, log.rows_seen, log.reason) == (4, 6, None)  # the masked row and the zero-variance group
    assert full.keys() == skipped.keys() and full
    for name, grad in full.items():
        # measured equal to the bit (a skipped row added exact zeros); the tolerance is float slack
        assert torch.allclose(grad, skipped[name], rtol=1e-6, atol=1e-12), name
    assert any(g.abs().sum() > 0 for g in skipped.values())


def test_a_group_of_equal_advantages_is_exactly_zero_and_an_empty_mask_is_inert():
    advantages = torch.tensor([0.7, -0.7, 0.0, 2e-4, 2e-4, 2e-4])
    mask = torch.ones(6, 4)
    mask[2] = 0  # an unscored row: TRL's advantage 0, empty mask; it does not make its group equal
    exact = exact_zero_variance(advantages, mask, group=3)
    assert exact.tolist() == pytest.approx([0.7, -0.7, 0.0, 0.0, 0.0, 0.0])
    assert exact[3:].eq(0).all()
    batch = {"advantages": exact, "completion_mask": mask}
    assert inert_rows(batch).tolist() == [False, False, True, True, True, True]


def test_a_kl_term_keeps_every_row():
    from deepanalyze_env.trainers.trl.skip_rows import skip_reason

    trainer = type("T", (), {"beta": 0.04})()
    assert "KL" in skip_reason(trainer)
