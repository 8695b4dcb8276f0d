"""Episodes without a measured reward get no advantage and leave their group's baseline alone.

The oracle is SkyRL's own ``grpo`` estimator run on the valid rows only: what the valid rows
would have received had the invalid ones never been sampled.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from skyrl.backends.skyrl_train.utils import ppo_utils

from deepanalyze_env.skyrl.advantage import register_estimator
from deepanalyze_env.skyrl.config import ESTIMATOR
from deepanalyze_env.skyrl.trainer import DeepAnalyzeTrainer
from rewards.judge.fake_server import FakeJudgeServer, Reply
from tests.skyrl.conftest import ScriptedEngine, generator_input, make_cfg, make_generator, trajectories

register_estimator()

# the trainer's Prometheus scraper and GPU monitor talk to a running Ray cluster; these tests
# call the trainer's methods directly, without Ray
# stands in for the policy workers' dispatch (built on GPUs by build_models): one data-parallel rank
ONE_WORKER = SimpleNamespace(get_lcm_dp_size=lambda: 1)
NO_RAY_MONITORS = (
    "generator.inference_engine.enable_ray_prometheus_stats=false",
    "trainer.enable_ray_gpu_monitor=false",
)


def outcome_batch(scores: list[float], length: int = 5):
    rewards = torch.zeros(len(scores), length)
    rewards[:, -1] = torch.tensor(scores)
    return rewards


def skyrl_grpo(scores, index):
    adv, _ = ppo_utils.compute_grpo_outcome_advantage(
        token_level_rewards=outcome_batch(scores),
        response_mask=torch.ones(len(scores), 5),
        index=np.array(index),
    )
    return adv[:, 0]


def ours(scores, index, valid):
    mask = torch.ones(len(scores), 5)
    mask[[i for i, v in enumerate(valid) if not v]] = 0
    adv, ret = ppo_utils.compute_advantages_and_returns(
        token_level_rewards=outcome_batch(scores),
        response_mask=mask,
        index=np.array(index),
        adv_estimator=ESTIMATOR,
        config=None,
    )
    assert torch.equal(adv, ret)
    return adv


def test_invalid_rows_get_zero_advantage_on_every_token():
    adv = ours([1.0, 0.0, 0.3, 0.5], ["a", "a", "a", "a"], [True, True, False, True])
    assert torch.count_nonzero(adv[2]) == 0
    assert torch.count_nonzero(adv[0]) == 5


def test_valid_rows_get_what_grpo_gives_without_the_invalid_rows():
    scores = [1.0, 0.0, 0.3, 0.5, -1.0, 0.2, 0.9]
    index = ["a", "a", "a", "a", "b", "b", "b"]
    valid = [True, True, False, True, True, False, True]
    adv = ours(scores, index, valid)
    keep = [i for i, v in enumerate(valid) if v]
    expected = skyrl_grpo([scores[i] for i in keep], [index[i] for i in keep])
    assert torch.allclose(adv[keep, 0], expected, atol=1e-6)


def test_an_invalid_rows_reward_value_does_not_move_its_siblings():
    index, valid = ["g"] * 4, [True, False, True, True]
    low = ours([1.0, -5.0, 0.0, 0.5], index, valid)
    high = ours([1.0, 9.0, 0.0, 0.5], index, valid)
    assert torch.equal(low, high)


def test_with_all_rows_valid_it_is_skyrls_grpo():
    scores, index = [0.2, 0.4, 1.0, 0.0, 0.0, 1.0], ["x", "x", "x", "y", "y", "y"]
    assert torch.allclose(ours(scores, index, [True] * 6)[:, 0], skyrl_grpo(scores, index), atol=1e-6)


# --- end to end: generator -> our trainer's postprocess -> SkyRL's batching -> advantages ------


def test_judge_outage_episode_is_masked_and_out_of_the_baseline(tiny_tokenizer, rows):
    """Two qa tasks, 3 samples each; the judge fails (HTTP 500) for every episode of one task
    whose answer is wrong. Those rows must train nothing and not enter their group's baseline."""
    row_a, row_b = rows["qa-retail-001"], rows["qa-inventory-001"]
    good_a = trajectories()["qa-retail-001"]
    wrong = [*good_a[:-1], "<Analyze>guess</Analyze>\n<Answer>\nAnswer: Nowhere\n</Answer>"]
    judge = FakeJudgeServer(Reply(text="Weaknesses:\n- none\nSCORE: 5"))
    judge.script(*[Reply(status=500)] * 50, match="Nowhere")
    with judge:
        cfg = make_cfg(
            "environment.skyrl_gym.deepanalyze.judge.backend=openai",
            f"environment.skyrl_gym.deepanalyze.judge.base_url={judge.url}",
            "environment.skyrl_gym.deepanalyze.judge.model=fake-judge",
            "environment.skyrl_gym.deepanalyze.judge.max_retries=0",
            *NO_RAY_MONITORS,
            "generator.n_samples_per_prompt=3",
            "trainer.train_batch_size=2",
            "trainer.policy_mini_batch_size=2",
        )
        # task A: the context decides the plan, so all 3 samples of A answer right; B answers wrong
        plans = {row_a["input_seq"][:60]: good_a, row_b["input_seq"][:60]: wrong}
        engine = ScriptedEngine(tiny_tokenizer, plans)
        gen = make_generator(cfg, tiny_tokenizer, engine)
        gen_input, uids = generator_input([row_a, row_b], 3, cfg)
        output = asyncio.run(gen.generate(gen_input, disable_tqdm=True))

    statuses = [m["status_verifier_error"] for m in output["env_metrics"]]
    assert statuses == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    trainer = DeepAnalyzeTrainer(
        cfg=cfg,
        tracker=None,
        tokenizer=tiny_tokenizer,
        train_dataset=None,
        inference_engine_client=engine,
        generator=gen,
    )
    trainer.dispatch = ONE_WORKER
    output, uids = trainer.postprocess_generator_output(output, uids)
    assert [sum(m) == 0 for m in output["loss_masks"]] == [False] * 3 + [True] * 3
    assert trainer.all_metrics["deepanalyze/excluded_infra"] == 3
    batch = trainer.convert_to_training_input(output, uids)
    batch["values"] = None  # what the critic-less forward pass leaves for GRPO
    batch = trainer.compute_advantages_and_returns(batch)
    adv = batch["advantages"]
    assert torch.count_nonzero(adv[3:]) == 0
    # group A: three equal rewards (1.0 and 5/5) -> zero advantage, and it stays zero
    assert torch.count_nonzero(adv[:3]) == 0
    assert torch.equal(batch["response_mask"].sum(-1) > 0, torch.ones(6, dtype=torch.bool))  # mask restored


def test_mixed_group_keeps_the_valid_rows_advantages(tiny_tokenizer, rows):
    """One group, 4 samples: right, wrong, judge outage, right. The valid rows' advantages are
    GRPO over (right, wrong, right) alone."""
    row = rows["qa-retail-001"]
    good = trajectories()["qa-retail-001"]
    variants = {
        "A": [*good[:-1], "<Analyze>a</Analyze>\n<Answer>\nAnswer: Harbor Point\n</Answer>"],
        "B": [*good[:-1], "<Analyze>b</Analyze>\n<Answer>\nAnswer: Elm Street\n</Answer>"],
        "C": [*good[:-1], "<Analyze>c</Analyze>\n<Answer>\nAnswer: Outage\n</Answer>"],
        "D": [*good[:-1], "<Analyze>d</Analyze>\n<Answer>\nAnswer: Harbor Point\n</Answer>"],
    }
    judge = FakeJudgeServer(Reply(text="Weaknesses:\n- none\nSCORE: 5"))
    judge.script(*[Reply(status=500)] * 20, match="Answer: Outage")
    with judge:
        cfg = make_cfg(
            "environment.skyrl_gym.deepanalyze.judge.backend=openai",
            f"environment.skyrl_gym.deepanalyze.judge.base_url={judge.url}",
            "environment.skyrl_gym.deepanalyze.judge.model=fake-judge",
            "environment.skyrl_gym.deepanalyze.judge.max_retries=0",
            *NO_RAY_MONITORS,
            "generator.n_samples_per_prompt=4",
            "trainer.train_batch_size=1",
            "trainer.policy_mini_batch_size=1",
        )
        marked = []
        for key in "ABCD":  # one prompt per variant so the engine can tell them apart, same uid
            r = dict(row)
            r["prompt"] = [{"role": "user", "content": f"[{key}] " + row["prompt"][0]["content"]}]
            marked.append(r)
        engine = ScriptedEngine(tiny_tokenizer, {f"[{k}] ": v for k, v in variants.items()})
        gen = make_generator(cfg, tiny_tokenizer, engine)
        gen_input, _ = generator_input(marked, 1, cfg)
        uids = ["task"] * 4
        output = asyncio.run(gen.generate(gen_input, disable_tqdm=True))

    trainer = DeepAnalyzeTrainer(
        cfg=cfg, tracker=None, tokenizer=tiny_tokenizer, train_dataset=None,
        inference_engine_client=engine, generator=gen,
    )  # fmt: skip
    trainer.dispatch = ONE_WORKER
    output, uids = trainer.postprocess_generator_output(output, uids)
    batch = trainer.convert_to_training_input(output, uids)
    batch["values"] = None  # what the critic-less forward pass leaves for GRPO
    batch = trainer.compute_advantages_and_returns(batch)
    scores = [sum(r) for r in output["rewards"]]
    assert scores[0] == pytest.approx(1.0) and scores[1] == pytest.approx(0.5)  # (0 + 5/5) / 2
    expected = skyrl_grpo([scores[0], scores[1], scores[3]], ["t", "t", "t"])
    adv = batch["advantages"]
    assert torch.allclose(adv[[0, 1, 3], 0], expected, atol=1e-5)  # one value per row, every token
    assert torch.count_nonzero(adv[2]) == 0
