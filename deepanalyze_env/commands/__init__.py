"""One module per ``deepanalyze-rl`` subcommand, each with ``add_parser(subparsers)``."""

from __future__ import annotations

# modules under deepanalyze_env.commands, in --help order
COMMANDS = ("train", "rollout", "eval", "judge_eval", "stats", "rescore", "prepare_data")
