"""``JudgeSettings`` (the client's frozen key) and ``JudgeConfig`` (what users write) must agree."""

from __future__ import annotations

import dataclasses

from deepanalyze_env.core.config import JudgeConfig
from rewards.judge import JudgeSettings


def test_every_judge_config_field_exists_in_the_settings_with_the_same_default():
    settings = {f.name: f for f in dataclasses.fields(JudgeSettings)}
    for field in dataclasses.fields(JudgeConfig):
        assert field.name in settings, f"JudgeSettings lacks {field.name}"
        if field.name in ("backend", "model"):  # required there: a judge must name both
            continue
        assert settings[field.name].default == field.default, field.name


def test_a_default_judge_config_becomes_settings_with_its_values():
    config = JudgeConfig(backend="openai", base_url="http://127.0.0.1:9/v1", model="m")
    settings = JudgeSettings.from_config(config)
    for field in dataclasses.fields(JudgeConfig):
        assert getattr(settings, field.name) == getattr(config, field.name), field.name
