"""``deepanalyze-rl rollout``: run episodes with a policy outside a trainer and record them."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from deepanalyze_env.commands.common import (
    SHIPPED_DATA,
    UsageError,
    add_shared_flags,
    console,
    load_env_config,
    make_parser,
)
from deepanalyze_env.config import ConfigError


def add_parser(sub: Any) -> None:
    p = make_parser(
        sub,
        "rollout",
        "run episodes with a policy and record them",
        "deepanalyze-rl rollout --policy scripted --tasks data/tasks/qa.jsonl --workspace-root data "
        "--judge-base-url http://127.0.0.1:8000/v1 --judge-model judge --out runs/scripted",
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
