"""A group with one unscorable episode: TRL must leave it out of the baseline and give it no
advantage. Real GRPOTrainer scoring code; generation is scripted (a stand-in for the policy,
so each episode's answer, and hence its reward, is known), the env and its scoring are real."""

from __future__ import annotations

import math

import pytest

from tests.tiny_llama import tiny_llama

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402

from deepanalyze_env.trainers.trl.rollout_func import (  # noqa: E402
    DeepAnalyzeRollout,
    environment_reward,
    trl_dataset_rows,
    trl_prompt,
)
from deepanalyze_env.trainers.trl.turns import Generated  # noqa: E402
from rewards import Method, register_method, register_reward  # noqa: E402
from tests.conftest import qa_extras  # noqa: E402


@register_reward("test_scorer_breaks_on_c")
def _breaks_on_c(answer: str | None) -> float:
    if answer == "C":
        raise RuntimeError("scorer cannot handle C")
    return 0.0


register_method(
    Method(
        "qa_breaks_on_c", ("qa_accuracy", "test_scorer_breaks_on_c"), weights={"test_scorer_breaks_on_c": 0.0}
    )
)
ANSWERS = ["B", "A", "C", "B"]  # rewards 1, 0, verifier_error, 1


def test_unscorable_episode_is_left_out_of_the_group_baseline(tiny_tokenizer, workspace_root, tmp_path):
    tok = tiny_tokenizer

    def generate(trainer, contexts, max_new):
        return [
            Generated(
                tok.encode(
                    f"<Analyze>a</Analyze><Answer>Answer: {ANSWERS[i]}</Answer>", add_special_tokens=False
                ),
                None,
            )
            for i in range(len(contexts))
        ]

    row = {
        "prompt": [{"role": "user", "content": "Which store?"}],
        "task_id": "t",
        **qa_extras(reward_spec={"method": "qa_breaks_on_c", "ground_truth": "B"}),
    }
    rollout = DeepAnalyzeRollout([row], {"workspace_root": str(workspace_root)}, generator=generate)
    model = tiny_llama(tok)
    config = trl.GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=64,
        beta=0.0,
        scale_rewards="group",
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[environment_reward],
        args=config,
        processing_class=tok,
        train_dataset=Dataset.from_list(trl_dataset_rows([row]) * 4),
        rollout_func=rollout,
    )
    out = trainer._generate_and_score_completions([{"prompt": trl_prompt(row)} for _ in ANSWERS])
    advantages = out["advantages"].tolist()
    # Baseline over the three scored rewards 1, 0, 1: mean 2/3, unbiased std sqrt(1/3).
    mean, std = 2 / 3, math.sqrt(1 / 3)
    expected = [(1 - mean) / (std + 1e-4), (0 - mean) / (std + 1e-4), 0.0, (1 - mean) / (std + 1e-4)]
    assert advantages == pytest.approx(expected, abs=1e-4)
    assert advantages[2] == 0.0
