"""The SkyRL entrypoint: parse and check the config, start Ray, train inside a Ray task.

Registration happens inside the Ray task (``register_all``), not only in the driver: the
skyrl_gym registry is per process and the task runs in a worker process that never executed the
driver's script. (SkyRL syncs its estimator registry to workers through a Ray actor; registering
it there too is harmless, and importing ``deepanalyze_env`` registers the env as well.)
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import ray
from skyrl.train.entrypoints.main_base import BasePPOExp  # also sets multiprocessing to spawn

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.trainers.skyrl.advantage import register_estimator
from deepanalyze_env.trainers.skyrl.config import (
    ENV_SECTION,
    ESTIMATOR,
    DeepAnalyzeSkyRLConfig,
    apply_tag_tokens,
    parse_config,
)
from deepanalyze_env.trainers.skyrl.trainer import DeepAnalyzeTrainer

log = logging.getLogger(__name__)

# where the env keeps scratch workspaces and converted models, when the user moved them
FORWARDED = ("DEEPANALYZE_SCRATCH", "DEEPANALYZE_CACHE")


def register_all() -> None:
    """Everything a process needs before SkyRL looks our names up; safe to call repeatedly."""
    import deepanalyze_env

    deepanalyze_env.register()
    register_estimator()


class DeepAnalyzeExp(BasePPOExp):
    """SkyRL's experiment with our trainer; generator, datasets and inference are SkyRL's own."""

    def __init__(self, cfg):
        super().__init__(cfg)
        # the tokenizer SkyRL loaded is the one generation runs with: its tag tokens decide the
        # stop ids (the driver did the same when it could read the tokenizer; this is idempotent)
        apply_tag_tokens(self.cfg, self.tokenizer)

    def get_tracker(self):
        # SkyRL's tensorboard backend writes to $TENSORBOARD_DIR or ./tensorboard_log in the Ray
        # task's working directory, which is not the user's: keep it with the run's logs.
        os.environ.setdefault("TENSORBOARD_DIR", os.path.join(self.cfg.trainer.log_path, "tensorboard"))
        return super().get_tracker()

    def get_trainer(
        self,
        cfg,
        tracker,
        tokenizer,
        train_dataset,
        eval_dataset,
        inference_engine_client,
        generator,
        colocate_pg,
    ) -> DeepAnalyzeTrainer:
        return DeepAnalyzeTrainer(
            cfg=cfg,
            tracker=tracker,
            tokenizer=tokenizer,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            inference_engine_client=inference_engine_client,
            generator=generator,
            colocate_pg=colocate_pg,
        )


@ray.remote(num_cpus=1)
def deepanalyze_entrypoint(cfg: DeepAnalyzeSkyRLConfig) -> None:
    register_all()
    DeepAnalyzeExp(cfg).run()


def check_config(cfg: DeepAnalyzeSkyRLConfig) -> None:
    """SkyRL's own validation (batch sizes, placement, registered names), one-line errors."""
    from skyrl.train.utils import validate_cfg

    register_all()
    try:
        validate_cfg(cfg)
    except (AssertionError, ValueError) as exc:
        raise ConfigError(f"SkyRL config: {exc}") from exc
    if cfg.trainer.algorithm.dynamic_sampling.type is not None:
        log.warning(
            "trainer.algorithm.dynamic_sampling runs before episodes without a measured reward are "
            "excluded, so it judges group variance with their placeholder rewards"
        )
    if cfg.trainer.algorithm.advantage_estimator != ESTIMATOR:
        log.warning(
            "trainer.algorithm.advantage_estimator=%s: episodes without a measured reward are still "
            "kept out of the loss, but they enter their group's baseline; use %s to keep them out",
            cfg.trainer.algorithm.advantage_estimator,
            ESTIMATOR,
        )


def check_tokenizer(cfg: DeepAnalyzeSkyRLConfig) -> dict[str, int] | None:
    """Read the policy's tokenizer when it is a local folder and apply its tag tokens (see
    ``apply_tag_tokens``); a hub name is read by the training task instead (no download here)."""
    from pathlib import Path

    path = Path(cfg.trainer.policy.model.path)
    if not path.is_dir():
        log.warning(
            "%s is not a local folder: its tag tokens are checked when the training task loads it",
            cfg.trainer.policy.model.path,
        )
        return None
    from skyrl.utils.tok import get_tokenizer

    try:
        tokenizer = get_tokenizer(
            str(path), use_fast=not cfg.trainer.disable_fast_tokenizer, padding_side="left"
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the tokenizer of {path}: {exc}") from exc
    return apply_tag_tokens(cfg, tokenizer)


def check_rows(cfg: DeepAnalyzeSkyRLConfig) -> int:
    """Every training and evaluation row, with the env's own checks (``row_check``)."""
    from deepanalyze_env.core.row_check import check_data

    sources = [*cfg.data.train_data, *(cfg.data.val_data or [])]
    return check_data(sources, cfg.environment.skyrl_gym.deepanalyze)


def check_curriculum(cfg: DeepAnalyzeSkyRLConfig) -> JsonObject | None:
    """With ``deepanalyze.curriculum`` set: the training rows' task ids are unique, a batch fits
    in them and ``from_records`` loads — checked before Ray starts. Returns what ``--check``
    prints (None when the curriculum is off). SkyRL may still drop over-long prompts; the trainer
    builds the curriculum over the tasks it keeps."""
    from deepanalyze_env.core.row_check import is_local_data, read_rows
    from deepanalyze_env.core.tasks import with_task_ids
    from deepanalyze_env.trainers.skyrl.curriculum import build_curriculum, curriculum_config

    config = curriculum_config(cfg.deepanalyze.curriculum)
    if config is None:
        return None
    if not all(is_local_data(d) for d in cfg.data.train_data):
        log.warning("deepanalyze.curriculum: hub datasets are checked when the trainer loads them")
        return {"kind": config.kind, "tasks": None}
    rows = with_task_ids([r for source in cfg.data.train_data for r in read_rows(source)])
    task_ids = [str(r["task_id"]) for r in rows]
    curriculum = build_curriculum(config, task_ids, cfg.trainer.seed)
    if cfg.trainer.train_batch_size > len(task_ids):
        raise ConfigError(
            f"deepanalyze.curriculum: trainer.train_batch_size={cfg.trainer.train_batch_size} is larger "
            f"than the {len(task_ids)} training tasks (each batch holds distinct tasks)"
        )
    seeded = sum(t.episodes for t in curriculum.tasks)
    return {"kind": config.kind, "tasks": len(task_ids), "seeded_episodes": seeded}


def summary(cfg: DeepAnalyzeSkyRLConfig) -> JsonObject:
    import dataclasses

    return {
        "model": cfg.trainer.policy.model.path,
        "train_data": cfg.data.train_data,
        "env_class": cfg.environment.env_class,
        "advantage_estimator": cfg.trainer.algorithm.advantage_estimator,
        "max_turns": cfg.generator.max_turns,
        "n_samples_per_prompt": cfg.generator.n_samples_per_prompt,
        "stop": cfg.generator.sampling_params.stop,
        "stop_token_ids": (cfg.generator.sampling_params.additional_kwargs or {}).get("stop_token_ids"),
        "use_kl_loss": cfg.trainer.algorithm.use_kl_loss,
        "use_conversation_multi_turn": cfg.generator.use_conversation_multi_turn,
        "apply_overlong_filtering": cfg.generator.apply_overlong_filtering,
        "score_truncated": cfg.deepanalyze.score_truncated,
        "curriculum": cfg.deepanalyze.curriculum,
        ENV_SECTION: dataclasses.asdict(cfg.environment.skyrl_gym.deepanalyze),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deepanalyze_env.trainers.skyrl",
        description="GRPO on SkyRL with the deepanalyze env. Arguments are SkyRL config overrides; "
        f"the env config lives under {ENV_SECTION}.",
        epilog="example: python -m deepanalyze_env.trainers.skyrl trainer.policy.model.path=/models/m "
        "data.train_data=['train.parquet'] environment.skyrl_gym.deepanalyze.workspace_root=data",
    )
    parser.add_argument("--check", action="store_true", help="validate the config, print it, do not train")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value")
    args = parser.parse_args(argv)
    try:
        cfg = parse_config(args.overrides)
        check_tokenizer(cfg)
        check_config(cfg)
        rows = check_rows(cfg)
        curriculum = check_curriculum(cfg)
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if args.check:
        import json

        shown = {**summary(cfg), "rows_checked": rows}
        if curriculum is not None:
            shown["curriculum_check"] = curriculum
        sys.stdout.write(json.dumps(shown, indent=2, default=str) + "\n")
        return 0
    from skyrl.train.utils.utils import initialize_ray

    initialize_ray(cfg)
    if not ray.cluster_resources().get("GPU", 0):
        # SkyRL would otherwise wait minutes for a placement group and end in a Ray traceback
        ray.shutdown()
        sys.stderr.write(
            "error: the Ray cluster has no GPUs; SkyRL training needs them (on a CPU machine, "
            "`--check` validates the config)\n"
        )
        return 2
    task = deepanalyze_entrypoint.options(runtime_env={"env_vars": forwarded_env(cfg)})
    ray.get(task.remote(cfg))
    return 0


def forwarded_env(cfg: DeepAnalyzeSkyRLConfig) -> dict[str, str]:
    """Variables the envs read, passed to the training task wherever Ray places it: SkyRL's
    runtime env forwards a fixed list, and a node whose Ray was started without the judge's key
    would turn every episode into a verifier_error."""
    names = [cfg.environment.skyrl_gym.deepanalyze.judge.api_key_env, *FORWARDED]
    return {name: os.environ[name] for name in names if name and name in os.environ}
