"""One module per ``deepanalyze-rl`` subcommand, each with ``add_parser(subparsers)``."""

from __future__ import annotations

COMMANDS = ("train", "rollout", "prepare_data")  # modules under deepanalyze_env.commands, in --help order
