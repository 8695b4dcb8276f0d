"""``deepanalyze-rl train RECIPE [key=value ...]``: run a GRPO recipe."""

from __future__ import annotations

import argparse
from typing import Any

from deepanalyze_env.commands.common import UsageError, make_parser


def add_parser(sub: Any) -> None:
    p = make_parser(
        sub,
        "train",
        "run a GRPO recipe (TRL or SkyRL backend)",
        "deepanalyze-rl train recipes/trl_cpu_smoke.yaml max_steps=2 output_dir=runs/smoke",
    )
    p.add_argument("recipe", metavar="RECIPE", help="recipe YAML (DESIGN contract 7)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. env.max_turns=4")
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from deepanalyze_env.recipes import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    if recipe.backend == "trl":
        from deepanalyze_env.train_trl import train_trl

        return train_trl(recipe)
    raise UsageError("backend skyrl is not available yet in this version; use a backend: trl recipe")
