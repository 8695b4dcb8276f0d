"""``deepanalyze-rl``: the command line (DESIGN contract 7).

User mistakes (a bad flag, a missing file, a wrong config key) end with one ``error:`` line
and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from deepanalyze_env.config import ConfigError, EnvConfig

console = Console(width=None if sys.stdout.isatty() else 150)
log = logging.getLogger("deepanalyze_env.cli")

SHIPPED_DATA = Path(__file__).resolve().parent.parent / "data"


class UsageError(Exception):
    """A mistake in how the command was called."""


# ---------------------------------------------------------------------------- shared flags


def add_shared_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("shared settings (the same in every command)")
    group.add_argument("--config", metavar="ENV_CONFIG.yaml", help="env_config file (DESIGN contract 2)")
    group.add_argument("--workspace-root", metavar="DIR", help="folder holding the tasks' data folders")
    group.add_argument("--judge-backend", choices=["openai", "transformers", "replay"])
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


# ---------------------------------------------------------------------------- rollout


def cmd_rollout(args: argparse.Namespace) -> int:
    from deepanalyze_env.policies import ScriptedPolicy
    from deepanalyze_env.rollout import EpisodeResult, run_episode
    from deepanalyze_env.tasks import load_rows

    env_config = load_env_config(args)
    task_files = args.tasks or sorted(str(p) for p in (SHIPPED_DATA / "tasks").glob("*.jsonl"))
    env_config.setdefault("workspace_root", str(SHIPPED_DATA))
    for path in task_files:
        if not Path(path).is_file():
            raise UsageError(f"--tasks: no such file {path}")
    rows = load_rows(task_files, env_config.get("workspace_root"))
    if args.out:
        env_config["records_dir"] = args.out
    if args.policy != "scripted":
        raise UsageError(f"--policy {args.policy} is not available yet; use --policy scripted")
    trajectories = args.trajectories or [str(SHIPPED_DATA / "trajectories.jsonl")]
    policy = ScriptedPolicy.from_files(trajectories)
    labels = [x.strip() for x in args.labels.split(",") if x.strip()]
    jobs = [
        (row, label)
        for row in rows
        for label in labels
        if label in policy.labels_for(str(row["task_id"]))
        for _ in range(args.samples)
    ]
    if not jobs:
        raise UsageError("no episodes to run: no scripted trajectory matches these tasks and labels")
    results: list[EpisodeResult] = []
    with Progress(
        TextColumn("[bold]rollout"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task("episodes", total=len(jobs), info="")
        for row, label in jobs:
            try:
                result = run_episode(env_config, row, policy, label)
            except ConfigError as exc:
                result = EpisodeResult(str(row.get("task_id")), label, None, error=str(exc))
            results.append(result)
            scored = [r.reward for r in results if r.status == "scored"]
            mean = sum(scored) / len(scored) if scored else float("nan")
            progress.update(bar, advance=1, info=f"mean reward {mean:+.3f}")
    print_results(results)
    if args.out:
        console.print(f"episode records written under [bold]{args.out}[/bold]")
    return 0


def print_results(results: list[Any]) -> None:
    table = Table(title="episodes", show_lines=False)
    for col in ("task", "label", "reward", "status", "gate", "end", "turns", "code_pass", "components"):
        table.add_column(col, overflow="fold")
    for r in results:
        meta = r.metadata
        comps = ", ".join(f"{k}={v:.2f}" for k, v in meta.get("reward_components", {}).items())
        passes = meta.get("code_pass", [])
        table.add_row(
            r.task_id,
            r.label or "",
            "" if r.reward is None else f"{r.reward:+.3f}",
            r.status,
            str(meta.get("gate") or ""),
            str(meta.get("termination") or ""),
            str(meta.get("turns", "")),
            f"{sum(passes)}/{len(passes)}" if passes else "",
            comps or (r.error or meta.get("error") or ""),
        )
    console.print(table)
    counts = Counter(r.status for r in results)
    console.print("status counts: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))


# ---------------------------------------------------------------------------- train


def cmd_train(args: argparse.Namespace) -> int:
    from deepanalyze_env.recipes import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    if recipe.backend == "trl":
        from deepanalyze_env.train_trl import train_trl

        return train_trl(recipe)
    raise UsageError("backend skyrl is not available yet in this version; use a backend: trl recipe")


# ---------------------------------------------------------------------------- entry point

EXAMPLES = {
    "train": "example: deepanalyze-rl train recipes/trl_cpu_smoke.yaml max_steps=2 output_dir=runs/smoke",
    "rollout": "example: deepanalyze-rl rollout --policy scripted --tasks data/tasks/qa.jsonl "
    "--workspace-root data --out runs/scripted",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deepanalyze-rl", description="Train and evaluate DeepAnalyze data-analysis agents with RL."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug output")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "train",
        help="run a GRPO recipe (TRL or SkyRL backend)",
        epilog=EXAMPLES["train"],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("recipe", metavar="RECIPE", help="recipe YAML (DESIGN contract 7)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. env.max_turns=4")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "rollout",
        help="run episodes with a policy and record them",
        epilog=EXAMPLES["rollout"],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--tasks",
        nargs="+",
        metavar="FILE",
        help="task files or dataset rows (JSONL); default: the shipped tasks",
    )
    p.add_argument("--out", metavar="DIR", help="write episode records here")
    p.add_argument("--samples", type=int, default=1, metavar="N", help="episodes per task and label")
    p.add_argument("--policy", default="scripted", choices=["scripted"], help="who writes the actions")
    p.add_argument(
        "--trajectories",
        nargs="+",
        metavar="FILE",
        help="scripted policy: trajectory files (default: data/trajectories.jsonl)",
    )
    p.add_argument("--labels", default="good,bad", help="scripted policy: which trajectories to replay")
    add_shared_flags(p)
    p.set_defaults(func=cmd_rollout)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except (UsageError, ConfigError) as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
