"""``deepanalyze-rl train RECIPE [key=value ...]``: run a GRPO recipe or an SFT warm start."""

from __future__ import annotations

import argparse

from deepanalyze_env.cli.common import SubParsers, UsageError, make_parser
from deepanalyze_env.core.config import ConfigError


def add_parser(sub: SubParsers) -> None:
    p = make_parser(
        sub,
        "train",
        "run a recipe: GRPO (TRL or SkyRL backend) or the SFT warm start (trl-sft)",
        "deepanalyze-rl train recipes/trl_cpu_smoke.yaml max_steps=2 output_dir=runs/smoke",
    )
    p.add_argument("recipe", metavar="RECIPE", help="recipe YAML (docs/design.md §10)")
    # REMAINDER so that --check may also come after the overrides (argparse would refuse it there)
    p.add_argument(
        "overrides",
        nargs=argparse.REMAINDER,
        metavar="key=value",
        help="dotted overrides, e.g. env.max_turns=4",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="validate the recipe (skyrl: the whole resolved SkyRL config) and print it; do not train",
    )
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from deepanalyze_env.learn.settings import is_pipeline_file
    from deepanalyze_env.trainers.recipes import load_recipe

    check = args.check or "--check" in args.overrides
    overrides = [o for o in args.overrides if o != "--check"]
    try:
        recipe = load_recipe(args.recipe, overrides)
    except ConfigError:
        if is_pipeline_file(args.recipe):
            command = " ".join(["deepanalyze-rl learn", args.recipe, *overrides])
            message = f"{args.recipe} is a learn pipeline file, not a training recipe: run {command}"
            raise UsageError(message) from None
        raise
    if recipe.backend == "skyrl":
        from deepanalyze_env.trainers.skyrl.launch import train_skyrl

        return train_skyrl(recipe, check=check)
    if recipe.backend == "trl-sft":
        from deepanalyze_env.trainers.trl.sft import train_sft

        return train_sft(recipe, check=check)
    from deepanalyze_env.trainers.trl.train import train_trl

    return train_trl(recipe, check=check)
