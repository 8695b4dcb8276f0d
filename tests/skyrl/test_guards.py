"""The trainer's guards, through SkyRL's generator and our trainer's post-processing: the
dead-judge stop and the count of episodes kept out of the loss for length."""

from __future__ import annotations

import asyncio
import copy
import logging

import pytest

from deepanalyze_env.trainers.skyrl.trainer import DeepAnalyzeTrainer
from rewards.judge.fake_server import FakeJudgeServer, Reply
from tests.skyrl.conftest import (
    ScriptedEngine,
    VllmLikeEngine,
    generator_input,
    make_cfg,
    make_generator,
)

NO_RAY_MONITORS = (
    "generator.inference_engine.enable_ray_prometheus_stats=false",
    "trainer.enable_ray_gpu_monitor=false",
)
OUTAGE = "<Analyze>done</Analyze>\n<Answer>\nAnswer: Outage\n</Answer>"
NO_ANSWER = "<Analyze>look</Analyze>\n<Code>\n```python\nprint(1)\n```\n</Code>"


@pytest.fixture
def trainer_log():
    """Warnings our trainer logs during the test (a handler of its own: SkyRL reroutes logging)."""
    lines: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("deepanalyze_env.trainers.skyrl.trainer")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def trainer_for(cfg, tok, engine, gen):
    return DeepAnalyzeTrainer(
        cfg=cfg, tracker=None, tokenizer=tok, train_dataset=None,
        inference_engine_client=engine, generator=gen,
    )  # fmt: skip


def test_a_dead_judge_stops_the_run_even_when_some_episodes_fail_the_gate(tiny_tokenizer, rows, trainer_log):
    """A batch of 8: seven answers the judge fails on (HTTP 500) and one episode without an
    answer (format gate, scored -1 without a judge). Three such batches stop the run."""
    row = rows["qa-retail-001"]
    plans = {row["input_seq"][:60]: {i: [OUTAGE] for i in range(7)} | {7: [NO_ANSWER]}}
    judge = FakeJudgeServer(Reply(text="SCORE: 5"))
    judge.script(*[Reply(status=500)] * 50, match="Answer: Outage")
    with judge:
        cfg = make_cfg(
            "environment.skyrl_gym.deepanalyze.judge.backend=openai",
            f"environment.skyrl_gym.deepanalyze.judge.base_url={judge.url}",
            "environment.skyrl_gym.deepanalyze.judge.model=fake-judge",
            "environment.skyrl_gym.deepanalyze.judge.max_retries=0",
            "generator.max_turns=1",
            "generator.n_samples_per_prompt=8",
            *NO_RAY_MONITORS,
        )
        engine = ScriptedEngine(tiny_tokenizer, plans)
        gen = make_generator(cfg, tiny_tokenizer, engine)
        gen_input, uids = generator_input([row], 8, cfg)
        output = asyncio.run(gen.generate(gen_input, disable_tqdm=True))
    statuses = [m["status_verifier_error"] for m in output["env_metrics"]]
    assert statuses == [1.0] * 7 + [0.0]
    # the exclusions by cause, as SkyRL logs them: the 500s are the judge call's, 7 of 8 episodes
    logged = output["rollout_metrics"]
    assert logged["environment/verifier_error_judge_call"] == pytest.approx(7 / 8)
    assert (
        logged["environment/verifier_error_judge_parse"]
        == logged["environment/verifier_error_reward_raised"]
        == 0.0
    )
    assert output["env_metrics"][7]["format_ok"] == 0.0 and output["env_metrics"][7]["reward"] == -1.0
    trainer = trainer_for(cfg, tiny_tokenizer, engine, gen)
    lines = trainer_log
    trainer.postprocess_generator_output(copy.deepcopy(output), list(uids))
    assert "7 of 7 episodes that needed a measured reward (100%) got none" in lines[-1]
    trainer.postprocess_generator_output(copy.deepcopy(output), list(uids))
    assert "Outage batch 2 of 3 in a row" in lines[-1]
    with pytest.raises(RuntimeError, match="3 batches in a row"):
        trainer.postprocess_generator_output(copy.deepcopy(output), list(uids))


def test_the_outage_threshold_and_batch_count_are_settings():
    from types import SimpleNamespace

    from deepanalyze_env.trainers.skyrl.config import parse_config

    cfg = parse_config(["deepanalyze.outage_fraction=0.5", "deepanalyze.outage_batches=2"])
    trainer = SimpleNamespace(cfg=cfg)
    DeepAnalyzeTrainer._guard_outage(trainer, 4, 8)  # 50 %
    with pytest.raises(RuntimeError, match="2 batches in a row"):
        DeepAnalyzeTrainer._guard_outage(trainer, 5, 8)
    never = SimpleNamespace(cfg=parse_config(["deepanalyze.outage_batches=0"]))
    for _ in range(5):
        DeepAnalyzeTrainer._guard_outage(never, 8, 8)


def test_rows_the_overlong_filter_masked_count_as_excluded_for_length(tiny_tokenizer, workspace_root):
    """The env finished the episode (turn limit) but its last turn ran out of tokens, so SkyRL's
    overlong filter masked it; it must show in ``deepanalyze/excluded_length``."""
    row = {"prompt": [{"role": "user", "content": "Which store?"}], "task_id": "t-long"}
    from tests.conftest import qa_extras

    row.update(qa_extras())
    cfg = make_cfg(
        "generator.max_turns=1",
        "generator.sampling_params.max_generate_length=8",
        *NO_RAY_MONITORS,
        workspace_root=workspace_root,
    )
    engine = VllmLikeEngine(tiny_tokenizer, {"Which store?": [NO_ANSWER]})
    gen = make_generator(cfg, tiny_tokenizer, engine)
    gen_input, uids = generator_input([row], 1, cfg)
    output = asyncio.run(gen.generate(gen_input, disable_tqdm=True))
    assert output["stop_reasons"] == ["length"] and output["env_metrics"][0]["finished"] == 1.0
    assert sum(output["loss_masks"][0]) == 0  # SkyRL's filter
    trainer = trainer_for(cfg, tiny_tokenizer, engine, gen)
    trainer.postprocess_generator_output(output, uids)
    assert trainer.all_metrics["deepanalyze/excluded_length"] == 1
    assert trainer.all_metrics["deepanalyze/trained_fraction"] == 0.0
