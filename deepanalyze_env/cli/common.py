"""What every ``deepanalyze-rl`` command shares: the console, usage errors, the shared flags."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from deepanalyze_env.core.config import JUDGE_BACKENDS, EnvConfig

console = Console(width=None if sys.stdout.isatty() else 150)

SHIPPED_DATA = Path(__file__).resolve().parent.parent.parent / "data"


class UsageError(Exception):
    """A mistake in how the command was called."""


def template_kwargs(text: str | None, flag: str) -> dict[str, Any] | None:
    """A ``--…chat-template-kwargs`` value: a JSON object, or ``None`` when the flag is absent."""
    if not text:
        return None
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: not JSON ({exc})")
    if not isinstance(value, dict):
        raise UsageError(f"{flag}: give a JSON object, e.g. '{{\"enable_thinking\": false}}'")
    return value


# ---------------------------------------------------------------------------- shared flags


def add_shared_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("shared settings (the same in every command)")
    group.add_argument("--config", metavar="ENV_CONFIG.yaml", help="env_config file (docs/design.md §5)")
    group.add_argument("--workspace-root", metavar="DIR", help="folder holding the tasks' data folders")
    group.add_argument("--judge-backend", choices=list(JUDGE_BACKENDS))
    group.add_argument("--judge-base-url", metavar="URL")
    group.add_argument("--judge-model", metavar="NAME")
    group.add_argument("--judge-concurrency", type=int, metavar="N")


def load_env_config(args: argparse.Namespace) -> dict[str, Any]:
    """The env_config file (if any) with command-line flags layered on top, validated."""
    config: dict[str, Any] = {}
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            raise UsageError(f"--config: no such file {args.config}")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise UsageError(f"--config {args.config}: expected a mapping at the top level")
        config.update(loaded)
    if args.workspace_root:
        config["workspace_root"] = args.workspace_root
    judge = dict(config.get("judge") or {})
    for flag, key in (
        ("judge_backend", "backend"),
        ("judge_base_url", "base_url"),
        ("judge_model", "model"),
        ("judge_concurrency", "concurrency"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            judge[key] = value
    if judge:
        config["judge"] = judge
    EnvConfig.from_any(config)  # fail on a bad key now, not per episode
    return config


def make_parser(sub: Any, name: str, help_text: str, example: str) -> argparse.ArgumentParser:
    """A subcommand parser whose ``--help`` ends with a runnable example."""
    return sub.add_parser(
        name,
        help=help_text,
        epilog=f"example: {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def task_files(args: argparse.Namespace, env_config: dict[str, Any]) -> list[str]:
    """``--tasks``, else the shipped tasks (whose workspaces are the shipped data folder, made
    ``workspace_root`` unless the config names one)."""
    env_config.setdefault("workspace_root", str(SHIPPED_DATA))
    return list(args.tasks or sorted(str(p) for p in (SHIPPED_DATA / "tasks").glob("*.jsonl")))
