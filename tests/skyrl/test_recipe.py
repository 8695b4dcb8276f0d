"""The shipped SkyRL recipe resolves to a valid SkyRL config, with its data rendered for SkyRL and
every row checked."""

from __future__ import annotations

import json
import subprocess
import sys

from skyrl.train.dataset import PromptDataset

from tests.skyrl.conftest import ROOT


def test_shipped_recipe_validates_and_renders_loadable_data(tmp_path, tiny_tokenizer):
    cmd = [sys.executable, "-m", "deepanalyze_env.cli", "train", "recipes/skyrl_grpo.yaml"]
    out = subprocess.run(
        [*cmd, f"output_dir={tmp_path}", "--check"], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    shown = json.loads(out.stdout[out.stdout.index("{") :])
    assert shown["advantage_estimator"] == "deepanalyze_grpo"
    assert shown["rows_checked"] == 9  # --check built the env for every row (test_rows: bad rows)
    assert shown["stop"] == ["</Code>", "</Answer>"] and shown["use_conversation_multi_turn"] is False
    assert shown["environment.skyrl_gym.deepanalyze"]["workspace_root"] == str(ROOT / "data")
    parquet = tmp_path / "data" / "train.parquet"
    assert shown["train_data"] == [str(parquet)]
    dataset = PromptDataset(str(parquet), tiny_tokenizer, max_prompt_length=100000, num_workers=1)
    assert len(dataset) == 9  # the nine shipped tasks
    prompt, env_class, extras, _ = dataset[0]
    assert env_class == "deepanalyze" and prompt[0]["role"] == "user"
    assert {"reward_spec", "data", "workspace_id", "input_seq", "extra_info"} <= set(extras)
