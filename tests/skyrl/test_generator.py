"""SkyRL's own ``SkyRLGymGenerator`` drives the env: token layout, masks, rewards, limits, metrics."""

from __future__ import annotations

import asyncio
import re

import pytest

from rewards.judge.fake_server import FakeJudgeServer, Reply
from tests.skyrl.conftest import (
    ScriptedEngine,
    generator_input,
    make_cfg,
    make_generator,
    run_agent_loop,
    trajectories,
)

TASK = "qa-retail-001"


@pytest.fixture
def judge():
    with FakeJudgeServer(Reply(text="Weaknesses:\n- brief\nSCORE: 4")) as server:
        yield [
            "environment.skyrl_gym.deepanalyze.judge.backend=openai",
            f"environment.skyrl_gym.deepanalyze.judge.base_url={server.url}",
            "environment.skyrl_gym.deepanalyze.judge.model=fake-judge",
            "environment.skyrl_gym.deepanalyze.judge.max_retries=0",
        ]


def code(src: str) -> str:
    return f"<Analyze>try</Analyze>\n<Code>\n```python\n{src}\n```\n</Code>"


def run_loop(cfg, tok, row, plan):
    return run_agent_loop(cfg, tok, ScriptedEngine(tok, {row["input_seq"][:60]: plan}), row)


def test_observation_tokens_are_loss_masked_and_policy_tokens_are_not(tiny_tokenizer, rows, judge):
    tok, row = tiny_tokenizer, rows[TASK]
    plan = trajectories()[TASK]
    out, _ = run_loop(make_cfg(*judge), tok, row, plan)
    ids, mask = out.response_ids, out.loss_mask
    assert len(ids) == len(mask)
    assert ids[-1] == tok.eos_token_id and mask[-1] == 1  # SkyRL closes the single assistant turn
    policy = tok.decode([t for t, m in zip(ids[:-1], mask[:-1], strict=True) if m == 1])
    assert policy == "".join(plan)
    observed = tok.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
    blocks = re.findall(r"\n<Execute>\n.*?\n</Execute>\n", observed, flags=re.S)
    assert blocks and "".join(blocks) == observed
    assert len(blocks) == len(plan) - 1  # one observation per code turn, none after the answer


def test_final_reward_is_the_envs_reward(tiny_tokenizer, rows, judge):
    out, _ = run_loop(make_cfg(*judge), tiny_tokenizer, rows[TASK], trajectories()[TASK])
    rewards = out.reward
    assert isinstance(rewards, list) and sum(1 for r in rewards if r != 0.0) == 1
    # qa = mean(qa_accuracy, qa_analysis): the right answer (1.0) and the judge's SCORE 4 (4/5)
    assert sum(rewards) == pytest.approx((1.0 + 0.8) / 2)
    assert out.env_metrics["reward"] == pytest.approx(sum(rewards))
    assert out.env_metrics["status_scored"] == 1.0 and out.env_metrics["finished"] == 1.0


def test_generator_max_turns_ends_the_episode(tiny_tokenizer, rows, judge):
    cfg = make_cfg(*judge, "generator.max_turns=2")
    out, engine = run_loop(cfg, tiny_tokenizer, rows[TASK], [code("print(1)")])
    assert len(engine.calls) == 2
    assert out.env_metrics["turns"] == 2 and out.env_metrics["termination_max_turns"] == 1.0
    assert sum(out.reward) == -1.0  # no answer: the format gate fails


def test_per_turn_metadata_reaches_skyrl_env_metrics(tiny_tokenizer, rows, judge):
    cfg = make_cfg(*judge, "generator.n_samples_per_prompt=2")
    row = rows[TASK]
    plan = [
        code("print(undefined_name)"),
        code("print(2)"),
        "<Analyze>ok</Analyze>\n<Answer>Answer: x</Answer>",
    ]
    engine = ScriptedEngine(tiny_tokenizer, {row["input_seq"][:60]: plan})
    gen = make_generator(cfg, tiny_tokenizer, engine)
    gen_input, _ = generator_input([row], 2, cfg)
    output = asyncio.run(gen.generate(gen_input, disable_tqdm=True))
    metrics = output["rollout_metrics"]
    assert metrics["environment/code_pass_rate"] == 0.5
    assert metrics["environment/exec_error"] == 0.5 and metrics["environment/exec_ok"] == 0.5
    assert metrics["environment/turns"] == 3.0
    assert metrics["environment/status_scored"] == 1.0
    assert metrics["environment/reward/qa_accuracy"] == 0.0  # "x" is not the store
    assert len(output["env_metrics"]) == 2
