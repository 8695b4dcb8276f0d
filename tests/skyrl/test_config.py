"""The SkyRL config: our env section reaches the env; mistakes are one clear line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.tasks import env_extras
from deepanalyze_env.trainers.skyrl.config import ESTIMATOR, parse_config
from deepanalyze_env.trainers.skyrl.entrypoint import main
from tests.conftest import qa_extras
from tests.skyrl.conftest import ROOT, ScriptedEngine, make_cfg, make_generator

SLEEPY = "<Analyze>wait</Analyze>\n<Code>\n```python\nimport time\ntime.sleep(5)\n```\n</Code>"
ANSWER = "<Analyze>done</Analyze>\n<Answer>Answer: B</Answer>"


def test_env_overrides_reach_the_env(tiny_tokenizer, workspace_root, tmp_path):
    records = tmp_path / "records"
    cfg = make_cfg(
        "environment.skyrl_gym.deepanalyze.executor.timeout_s=1",
        f"environment.skyrl_gym.deepanalyze.records_dir={records}",
        "environment.skyrl_gym.deepanalyze.policy_id=override-check",
        workspace_root=workspace_root,
    )
    row = {"prompt": [{"role": "user", "content": "Which store?"}], "task_id": "t-1", **qa_extras()}
    engine = ScriptedEngine(tiny_tokenizer, {"Which store?": [SLEEPY, ANSWER]})
    gen = make_generator(cfg, tiny_tokenizer, engine)
    out = asyncio.run(gen.agent_loop(row["prompt"], "deepanalyze", env_extras(row), 4096, 200000))
    assert out.env_metrics["exec_timeout"] == 1.0  # the 1 s limit, not the default 10 s
    lines = [json.loads(x) for f in records.glob("*.jsonl") for x in f.read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["versions"]["policy_id"] == "override-check"


def test_our_defaults_apply_and_the_users_overrides_win():
    cfg = parse_config([])
    assert cfg.environment.env_class == "deepanalyze"
    assert cfg.generator.sampling_params.stop == ["</Code>", "</Answer>"]
    assert cfg.generator.use_conversation_multi_turn is False
    assert cfg.trainer.algorithm.advantage_estimator == ESTIMATOR
    assert parse_config(["generator.max_turns=4"]).generator.max_turns == 4


def test_an_unknown_key_in_the_env_section_is_named_with_its_path(capsys):
    assert main(["--check", "environment.skyrl_gym.deepanalyze.executor.timout_s=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "environment.skyrl_gym.deepanalyze.executor.timout_s" in err


def test_an_unknown_skyrl_key_is_named(capsys):
    assert main(["--check", "generator.n_sample_per_prompt=5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "n_sample_per_prompt" in err


def test_a_bad_value_in_the_env_section_is_named():
    with pytest.raises(ConfigError, match=r"deepanalyze\.executor\.timeout_s must be a number"):
        parse_config(["environment.skyrl_gym.deepanalyze.executor.timeout_s=soon"])


def test_scoring_truncated_episodes_needs_the_overlong_filter_off():
    with pytest.raises(ConfigError, match="apply_overlong_filtering=false"):
        parse_config(["deepanalyze.score_truncated=true"])
    cfg = parse_config(["deepanalyze.score_truncated=true", "generator.apply_overlong_filtering=false"])
    assert cfg.deepanalyze.score_truncated is True


def test_check_prints_the_resolved_settings(capsys, judge_free_data):
    assert main(["--check", "environment.skyrl_gym.deepanalyze.max_turns=7", *judge_free_data]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["environment.skyrl_gym.deepanalyze"]["max_turns"] == 7
    assert shown["advantage_estimator"] == ESTIMATOR
    assert shown["rows_checked"] == 3


def test_relative_paths_become_absolute_for_ray_workers(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.parquet").write_bytes(b"")
    cfg = parse_config(
        [
            "environment.skyrl_gym.deepanalyze.workspace_root=data",
            "environment.skyrl_gym.deepanalyze.judge.cache_path=cache/j.sqlite",
            "environment.skyrl_gym.deepanalyze.executor.python=python3",
            "data.train_data=['train.parquet']",
        ]
    )
    env = cfg.environment.skyrl_gym.deepanalyze
    assert env.workspace_root == str(tmp_path / "data")
    assert env.judge.cache_path == str(tmp_path / "cache" / "j.sqlite")
    assert env.executor.python == "python3"  # a command, not a path
    assert cfg.data.train_data == [str(tmp_path / "train.parquet")]


def test_evaluation_stops_at_the_tags_too():
    cfg = parse_config([])
    assert cfg.generator.eval_sampling_params.stop == ["</Code>", "</Answer>"]
    assert cfg.generator.eval_sampling_params.temperature == 0.0  # SkyRL's eval default kept


def test_the_envs_turn_limit_given_alone_becomes_the_generators():
    cfg = parse_config(["environment.skyrl_gym.deepanalyze.max_turns=7"])
    assert cfg.generator.max_turns == 7


def test_two_different_turn_limits_are_an_error():
    with pytest.raises(ConfigError, match="disagree"):
        parse_config(["environment.skyrl_gym.deepanalyze.max_turns=7", "generator.max_turns=9"])


def test_lengths_default_to_deepanalyzes_and_no_gsm8k_validation_set():
    cfg = parse_config([])
    assert cfg.trainer.max_prompt_length == 8000 and cfg.generator.max_input_length == 32768
    assert cfg.data.val_data == []


def test_the_judge_key_variable_is_forwarded_to_the_training_task(monkeypatch):
    from deepanalyze_env.trainers.skyrl.entrypoint import forwarded_env

    monkeypatch.setenv("MY_JUDGE_KEY", "sk-test")
    monkeypatch.delenv("DEEPANALYZE_CACHE", raising=False)
    cfg = parse_config(["environment.skyrl_gym.deepanalyze.judge.api_key_env=MY_JUDGE_KEY"])
    env = forwarded_env(cfg)
    assert env["MY_JUDGE_KEY"] == "sk-test" and "DEEPANALYZE_CACHE" not in env


def test_a_dead_judge_stops_training_after_three_all_failed_batches():
    from types import SimpleNamespace

    from deepanalyze_env.trainers.skyrl.trainer import DeepAnalyzeTrainer

    trainer = SimpleNamespace()  # the guard only keeps a counter on the trainer
    DeepAnalyzeTrainer._guard_outage(trainer, 8, 8)
    DeepAnalyzeTrainer._guard_outage(trainer, 3, 8)  # a partial outage resets the streak
    DeepAnalyzeTrainer._guard_outage(trainer, 8, 8)
    DeepAnalyzeTrainer._guard_outage(trainer, 8, 8)
    with pytest.raises(RuntimeError, match="judge endpoint"):
        DeepAnalyzeTrainer._guard_outage(trainer, 8, 8)


def test_training_on_a_machine_without_gpus_is_one_clear_line(tmp_path, judge_free_data):
    cmd = [sys.executable, "-m", "deepanalyze_env.trainers.skyrl", "trainer.policy.model.path=/unused"]
    cmd += judge_free_data
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a fresh local Ray, CPUs only
    out = subprocess.run(
        [*cmd, f"trainer.log_path={tmp_path}"], capture_output=True, text=True, cwd=ROOT, timeout=300, env=env
    )
    assert out.returncode == 2, out.stderr[-1500:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no GPUs" in errors[0]


def test_trainer_output_paths_become_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    cfg = parse_config(["trainer.log_path=logs", "trainer.ckpt_path=out/ckpt", "trainer.export_path=~/exp"])
    assert cfg.trainer.log_path == str(tmp_path / "logs")
    assert cfg.trainer.ckpt_path == str(tmp_path / "out" / "ckpt")
    assert cfg.trainer.export_path == os.path.join(os.path.expanduser("~"), "exp")


def test_no_kl_loss_by_default_as_deepanalyze_trained():
    assert parse_config([]).trainer.algorithm.use_kl_loss is False
    assert parse_config(["trainer.algorithm.use_kl_loss=true"]).trainer.algorithm.use_kl_loss is True


@pytest.mark.parametrize("setting", ["top_p=0.95", "top_k=50", "min_p=0.05"])
def test_a_truncating_training_sampler_is_refused_by_name(setting):
    """SkyRL's loss scores the full distribution: a truncated sampler would bias every ratio."""
    key = setting.partition("=")[0]
    with pytest.raises(ConfigError, match=f"generator.sampling_params.{key}="):
        parse_config([f"generator.sampling_params.{setting}"])
    assert parse_config(["generator.sampling_params.top_p=1.0"]).generator.sampling_params.top_p == 1.0
