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

from deepanalyze_env.trainers.skyrl.advantage import register_estimator
from deepanalyze_env.trainers.skyrl.config import ESTIMATOR
from deepanalyze_env.trainers.skyrl.trainer import DeepAnalyzeTrainer
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


def test_a_lone_measured_row_of_a_sampled_group_gets_no_advantage():
    adv = ours([0.7, 0.1, 0.4], ["g", "g", "solo"], [True, False, True])
    assert torch.count_nonzero(adv[0]) == 0 and torch.count_nonzero(adv[1]) == 0
    # a prompt sampled once keeps SkyRL's rule (mean 0, std 1): its advantage is its reward
    assert torch.allclose(adv[2], torch.full((5,), 0.4), atol=1e-5)


def test_with_all_rows_valid_it_is_skyrls_grpo():
    scores, index = [0.2, 0.4, 1.0, 0.0, 0.0, 1.0], ["x", "x", "x", "y", "y", "y"]
    assert torch.allclose(ours(scores, index, [True] * 6)[:, 0], skyrl_grpo(scores, index), atol=1e-6)


# --- end to end: generator -> our trainer's postprocess -> SkyRL's batching -> advantages ------


def test_judge_outage_episodes_are_masked_and_out_of_the_baseline(tiny_tokenizer, rows):
    """Two qa tasks, 4 samples each, every sample its own answer; the judge fails (HTTP 500) for
    the answers marked Outage. Through SkyRL's generator and our trainer's methods: those rows
    train nothing and get 0; the others get SkyRL's grpo over the measured rows of their group."""
    row_a, row_b = rows["qa-retail-001"], rows["qa-inventory-001"]
    good_a, good_b = trajectories()["qa-retail-001"], trajectories()["qa-inventory-001"]

    def answer(turns, text):
        return [*turns[:-1], f"<Analyze>final</Analyze>\n<Answer>\nAnswer: {text}\n</Answer>"]

    plans = {
        row_a["input_seq"][:60]: {
            0: good_a,
            1: answer(good_a, "Elm Street"),
            2: answer(good_a, "Outage one"),
            3: answer(good_a, "Harbor Point"),
        },
        row_b["input_seq"][:60]: {
            0: answer(good_b, "Outage two"),
            1: good_b,
            2: answer(good_b, "999"),
            3: answer(good_b, "998"),
        },
    }
    judge = FakeJudgeServer(Reply(text="Weaknesses:\n- none\nSCORE: 5"))
    judge.script(*[Reply(status=500)] * 50, match="Answer: Outage")
    with judge:
        cfg = make_cfg(
            "environment.skyrl_gym.deepanalyze.judge.backend=openai",
            f"environment.skyrl_gym.deepanalyze.judge.base_url={judge.url}",
            "environment.skyrl_gym.deepanalyze.judge.model=fake-judge",
            "environment.skyrl_gym.deepanalyze.judge.max_retries=0",
            *NO_RAY_MONITORS,
            "generator.n_samples_per_prompt=4",
            "trainer.train_batch_size=2",
            "trainer.policy_mini_batch_size=2",
        )
        engine = ScriptedEngine(tiny_tokenizer, plans)
        gen = make_generator(cfg, tiny_tokenizer, engine)
        gen_input, uids = generator_input([row_a, row_b], 4, cfg)
        output = asyncio.run(gen.generate(gen_input, disable_tqdm=True))

    invalid = [2, 4]
    assert [m["status_verifier_error"] for m in output["env_metrics"]] == [
        1.0 if i in invalid else 0.0 for i in range(8)
    ]
    trainer = DeepAnalyzeTrainer(
        cfg=cfg, tracker=None, tokenizer=tiny_tokenizer, train_dataset=None,
        inference_engine_client=engine, generator=gen,
    )  # fmt: skip
    trainer.dispatch = ONE_WORKER
    output, uids = trainer.postprocess_generator_output(output, uids)
    assert [sum(m) == 0 for m in output["loss_masks"]] == [i in invalid for i in range(8)]
    assert trainer.all_metrics["deepanalyze/excluded_infra"] == 2
    assert trainer.all_metrics["deepanalyze/trained_fraction"] == 6 / 8
    batch = trainer.convert_to_training_input(output, uids)
    batch["values"] = None  # what the critic-less forward pass leaves for GRPO
    mask_before = batch["response_mask"].clone()
    batch = trainer.compute_advantages_and_returns(batch)
    assert torch.equal(batch["response_mask"], mask_before)  # the real mask is back

    scores = [sum(r) for r in output["rewards"]]
    # right answers score (1 + 5/5)/2 = 1.0, wrong ones (0 + 5/5)/2 = 0.5 (hand-computed)
    assert [scores[i] for i in (0, 1, 3, 5, 6, 7)] == pytest.approx([1.0, 0.5, 1.0, 1.0, 0.5, 0.5])
    adv = batch["advantages"]
    # one value on every response token of a row (responses are padded, so average over the mask)
    per_row = adv.sum(-1) / mask_before.sum(-1)
    for group, members in (("a", [0, 1, 3]), ("b", [5, 6, 7])):
        expected = skyrl_grpo([scores[i] for i in members], [group] * len(members))
        assert torch.allclose(per_row[members], expected, atol=1e-4)
    for i in invalid:
        assert torch.count_nonzero(adv[i]) == 0
    # the same batch under SkyRL's plain grpo would move the valid rows (the oracle can fail)
    plain = skyrl_grpo(scores[:4], ["a"] * 4)
    assert not torch.allclose(per_row[[0, 1, 3]], plain[[0, 1, 3]], atol=1e-3)
