"""``backend: skyrl`` recipes: turn the recipe into SkyRL overrides and run the entrypoint.

The recipe's own keys map onto SkyRL's config (below); ``skyrl:`` is SkyRL's config tree as
nested YAML and is passed through as dotted overrides, last, so it wins. Task files listed in
``data`` are rendered once into ``<output_dir>/data/train.parquet`` (what ``prepare-data`` does);
the entrypoint then runs as ``python -m deepanalyze_env.trainers.skyrl`` with this interpreter.

| recipe | SkyRL |
|---|---|
| model | trainer.policy.model.path |
| data | data.train_data (after rendering) |
| output_dir | trainer.ckpt_path, trainer.export_path, trainer.log_path under it |
| max_steps (> 0) | trainer.max_training_steps |
| env.* | environment.skyrl_gym.deepanalyze.* (env.max_turns also sets generator.max_turns) |
| rollout.max_turn_tokens | generator.sampling_params.max_generate_length |
| rollout.score_truncated | deepanalyze.score_truncated (and the overlong filter off) |
| rollout.env_workers | environment.skyrl_gym.max_env_workers |
| curriculum.* | deepanalyze.curriculum.* (every field, validated again by the entrypoint) |
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.core.tasks import load_rows, write_parquet
from deepanalyze_env.trainers.recipes import Recipe

log = logging.getLogger(__name__)

ENV_PREFIX = "environment.skyrl_gym.deepanalyze"


def flatten(tree: JsonObject, prefix: str = "") -> JsonObject:
    out: JsonObject = {}
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted))
        else:
            out[dotted] = value
    return out


def render_data(recipe: Recipe) -> list[str]:
    """Parquet files pass through; anything else is rendered into one parquet file."""
    if all(p.endswith(".parquet") for p in recipe.data):
        return list(recipe.data)
    root = recipe.env.get("workspace_root")
    rows = load_rows(recipe.data, root)
    if not rows:
        raise ConfigError("the recipe's data files hold no tasks")
    out = Path(recipe.output_dir) / "data" / "train.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_parquet(rows, out)
    log.info("rendered %d tasks into %s", len(rows), out)
    return [str(out)]


def overrides(recipe: Recipe, train_data: list[str]) -> JsonObject:
    out_dir = Path(recipe.output_dir).resolve()
    result: JsonObject = {
        "trainer.policy.model.path": recipe.model,
        "data.train_data": train_data,
        "trainer.ckpt_path": str(out_dir / "ckpt"),
        "trainer.export_path": str(out_dir / "export"),
        "trainer.log_path": str(out_dir / "logs"),
    }
    if recipe.max_steps > 0:
        result["trainer.max_training_steps"] = recipe.max_steps
    env = dict(recipe.env)
    if "max_turns" in env:
        result["generator.max_turns"] = env["max_turns"]
    flat_env = flatten(env)  # relative paths are made absolute by the entrypoint's config
    result.update({f"{ENV_PREFIX}.{k}": v for k, v in flat_env.items()})
    rollout = recipe.rollout
    if "max_turn_tokens" in rollout:
        result["generator.sampling_params.max_generate_length"] = rollout["max_turn_tokens"]
    if rollout.get("score_truncated"):
        result["deepanalyze.score_truncated"] = True
        result["generator.apply_overlong_filtering"] = False
    if "env_workers" in rollout:
        result["environment.skyrl_gym.max_env_workers"] = rollout["env_workers"]
    if recipe.curriculum is not None:
        for key, value in dataclasses.asdict(recipe.curriculum).items():
            result[f"deepanalyze.curriculum.{key}"] = list(value) if isinstance(value, tuple) else value
    result.update(flatten(recipe.skyrl))  # SkyRL's own settings win
    return result


def as_dotlist(settings: JsonObject) -> list[str]:
    """JSON values: OmegaConf reads them as YAML, so types survive (lists, null, quoted text)."""
    return [f"{key}={json.dumps(value, ensure_ascii=False, default=str)}" for key, value in settings.items()]


def train_skyrl(recipe: Recipe, check: bool = False) -> int:
    from deepanalyze_env.trainers.skyrl import INSTALL_HINT, skyrl_available

    if not skyrl_available():
        raise ConfigError(INSTALL_HINT)
    argv = as_dotlist(overrides(recipe, render_data(recipe)))
    cmd = [sys.executable, "-m", "deepanalyze_env.trainers.skyrl", *(["--check"] if check else []), *argv]
    Console().print(f"[bold]SkyRL[/bold]: {' '.join(cmd[:4])} … ({len(argv)} overrides)")
    return subprocess.call(cmd)
