"""What every ``deepanalyze-rl`` command shares: the console, usage errors, the shared flags."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import yaml
from rich.console import Console
from rich.table import Table

from deepanalyze_env.core.config import JUDGE_BACKENDS, EnvConfig
from deepanalyze_env.core.contracts import JsonObject

if TYPE_CHECKING:
    from deepanalyze_env.offline.eval_schema import EvalReport
    from deepanalyze_env.serve.session import ServeLimits

# what ``add_subparsers()`` returns: each command module adds its parser to it
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

console = Console(width=None if sys.stdout.isatty() else 150)

SHIPPED_DATA = Path(__file__).resolve().parent.parent.parent / "data"


class UsageError(Exception):
    """A mistake in how the command was called."""


def template_kwargs(text: str | None, flag: str) -> JsonObject | None:
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


def load_env_config(args: argparse.Namespace) -> JsonObject:
    """The env_config file (if any) with command-line flags layered on top, validated (the raw
    mapping: commands hand it on to the env, which reads it into ``EnvConfig``)."""
    config: JsonObject = {}
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


def make_parser(sub: SubParsers, name: str, help_text: str, example: str) -> argparse.ArgumentParser:
    """A subcommand parser whose ``--help`` ends with a runnable example."""
    return sub.add_parser(
        name,
        help=help_text,
        epilog=f"example: {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def task_files(args: argparse.Namespace, env_config: JsonObject) -> list[str]:
    """``--tasks``, else the shipped tasks (whose workspaces are the shipped data folder, made
    ``workspace_root`` unless the config names one)."""
    env_config.setdefault("workspace_root", str(SHIPPED_DATA))
    return list(args.tasks or sorted(str(p) for p in (SHIPPED_DATA / "tasks").glob("*.jsonl")))


# ---------------------------------------------------------------------------- serve and collect


# flag -> (ServeLimits field, type, metavar, help): one table for serve and collect
LIMIT_FLAGS: dict[str, tuple[str, type, str, str]] = {
    "--max-sessions": ("max_sessions", int, "N", "sessions (episodes) open at once"),
    "--max-calls": ("max_calls", int, "N", "tool calls per episode"),
    "--max-payload-bytes": ("max_payload_bytes", int, "N", "largest tool argument"),
    "--max-request-bytes": ("max_request_bytes", int, "N", "largest HTTP request or WebSocket message"),
    "--idle-timeout": (
        "idle_timeout_s",
        float,
        "S",
        "end a session with no tool call this long (pings, reads do not count)",
    ),
}


def add_limit_flags(p: argparse.ArgumentParser) -> None:
    from deepanalyze_env.serve.session import ServeLimits

    defaults = ServeLimits()
    g = p.add_argument_group("limits (a client past one gets a one-line error)")
    for flag, (name, kind, metavar, about) in LIMIT_FLAGS.items():
        g.add_argument(
            flag, dest=name, type=kind, default=getattr(defaults, name), metavar=metavar, help=about
        )


def limits_from(args: argparse.Namespace) -> ServeLimits:
    from deepanalyze_env.serve.session import ServeLimits

    limits = ServeLimits(**{name: getattr(args, name) for name, *_ in LIMIT_FLAGS.values()})
    try:
        limits.validate()
    except ValueError as exc:
        flag = next(f for f, (name, *_) in LIMIT_FLAGS.items() if str(exc).startswith(name))
        raise UsageError(f"{flag}: {exc}")
    return limits


def require_serve_extra() -> None:
    import importlib.util

    missing = [
        m for m in ("mcp", "openenv", "uvicorn", "starlette", "httpx") if importlib.util.find_spec(m) is None
    ]
    if missing:
        raise UsageError(
            f"serving needs the serve extra ({', '.join(missing)} missing): "
            "pip install 'deepanalyze-env[serve]'"
        )


# ---------------------------------------------------------------------------- eval reports (eval, collect)


def print_report(report: EvalReport, title: str) -> None:
    from deepanalyze_env.offline.eval_report import episode_line, summary_row

    ks = report["pass_at_ks"]
    table = Table(title=f"eval {title}", title_justify="left")
    for col in ("group", "episodes", "reward", "95% CI", "format gate", *(f"pass@{k}" for k in ks), "turns"):
        table.add_column(col, justify="right" if col != "group" else "left")
    rows = [("all", report["overall"])] + [
        (f"{key}={name}", s) for key, groups in report["breakdowns"].items() for name, s in groups.items()
    ]
    for name, s in rows:
        table.add_row(*summary_row(name, s, ks))
    console.print(table)
    console.print(episode_line(report["episodes"]), highlight=False)
    o = report["overall"]
    console.print(
        "status: "
        + ", ".join(f"{k} {v:.2f}" for k, v in o["status_rates"].items())
        + " · termination: "
        + ", ".join(f"{k} {v:.2f}" for k, v in o["termination_rates"].items()),
        highlight=False,
    )
    console.print(f"report: {report['folder']}/report.md (report.json, report.png)", highlight=False)
