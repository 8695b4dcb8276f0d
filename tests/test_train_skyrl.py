"""``backend: skyrl`` recipes: the mapping onto SkyRL's config, and the missing-SkyRL message.

The SkyRL run itself is tested in ``tests/skyrl`` (Python 3.12 venv)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deepanalyze_env.trainers.recipes import load_recipe
from deepanalyze_env.trainers.skyrl import skyrl_available
from deepanalyze_env.trainers.skyrl.launch import as_dotlist, overrides

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "skyrl_grpo.yaml"


def settings(*extra: str) -> dict:
    return overrides(load_recipe(RECIPE, list(extra)), ["/abs/train.parquet"])


def test_recipe_keys_map_onto_skyrl_settings():
    got = settings("rollout.max_turn_tokens=2048", "rollout.env_workers=8", "max_steps=3")
    assert got["generator.sampling_params.max_generate_length"] == 2048
    assert got["environment.skyrl_gym.max_env_workers"] == 8
    assert got["trainer.max_training_steps"] == 3
    assert got["data.train_data"] == ["/abs/train.parquet"]
    assert got["generator.max_turns"] == 30  # env.max_turns drives SkyRL's turn limit too
    assert got["environment.skyrl_gym.deepanalyze.judge.concurrency"] == 64


def test_the_skyrl_section_wins_over_recipe_keys():
    got = settings("skyrl.generator.max_turns=5")
    assert got["generator.max_turns"] == 5


def test_scoring_truncated_episodes_turns_the_overlong_filter_off():
    got = settings("rollout.score_truncated=true")
    assert got["deepanalyze.score_truncated"] is True
    assert got["generator.apply_overlong_filtering"] is False


def test_values_travel_as_json_so_lists_and_text_keep_their_types():
    dotlist = as_dotlist({"generator.sampling_params.stop": ["</Code>", "</Answer>"], "a.b": "null"})
    assert dotlist == ['generator.sampling_params.stop=["</Code>", "</Answer>"]', 'a.b="null"']


def test_non_ascii_text_is_passed_as_is():
    assert as_dotlist({"env.policy_id": "модель-🙂"}) == ['env.policy_id="модель-🙂"']


@pytest.mark.skipif(skyrl_available(), reason="this interpreter has SkyRL; the message is for those without")
def test_without_skyrl_the_command_says_how_to_install_it_in_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "deepanalyze_env.cli", "train", str(RECIPE), f"output_dir={tmp_path}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 2
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert len(lines) == 1
    assert "Python >= 3.12" in lines[0] and '".[skyrl,kernel]"' in lines[0]
