"""The SkyRL config: our env section reaches the env; mistakes are one clear line."""

from __future__ import annotations

import asyncio
import json

import pytest

from deepanalyze_env.config import ConfigError
from deepanalyze_env.skyrl.config import ESTIMATOR, parse_config
from deepanalyze_env.skyrl.entrypoint import main
from deepanalyze_env.tasks import env_extras
from tests.conftest import qa_extras
from tests.skyrl.conftest import ScriptedEngine, make_cfg, make_generator

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


def test_check_prints_the_resolved_settings(capsys):
    assert main(["--check", "environment.skyrl_gym.deepanalyze.max_turns=7"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["environment.skyrl_gym.deepanalyze"]["max_turns"] == 7
    assert shown["advantage_estimator"] == ESTIMATOR
