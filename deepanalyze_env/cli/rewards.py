"""``deepanalyze-rl rewards``: the reward functions this environment has, and a check of task files.

Lists every function a ``reward_spec`` can name here — built-in, registered, or declared by an
installed package as a ``deepanalyze_env.rewards`` entry point — with the package it comes
from, the context fields it reads, the arguments a task may set, its components and whether it
needs a judge. ``--check TASKS`` builds every task's plan the way the env will and reports all
problems at once (exit 1), so a bad spec is found before a run, not in it.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from deepanalyze_env.cli.common import (
    SubParsers,
    UsageError,
    add_shared_flags,
    console,
    load_env_config,
    make_parser,
)
from deepanalyze_env.core.contracts import JsonObject

if TYPE_CHECKING:
    from deepanalyze_env.core.config import EnvConfig
    from deepanalyze_env.offline.reward_check import CheckResult
    from rewards.catalog import FunctionInfo


def add_parser(sub: SubParsers) -> None:
    p = make_parser(
        sub,
        "rewards",
        "list the reward functions available here (built-in and plugins); --check task files' reward specs",
        "deepanalyze-rl rewards --check data/tasks/qa.jsonl data/tasks/datatask.jsonl",
    )
    p.add_argument(
        "--check",
        nargs="+",
        metavar="TASKS",
        help="task files or dataset rows: build every task's reward plan and report every problem",
    )
    p.add_argument("--json", action="store_true", help="print the listing (and the check) as one JSON object")
    add_shared_flags(p)
    p.set_defaults(func=cmd_rewards)


def cmd_rewards(args: argparse.Namespace) -> int:
    from deepanalyze_env.core.config import EnvConfig
    from deepanalyze_env.offline.reward_check import check_task_files
    from rewards.catalog import catalog, plugin_problems

    config = EnvConfig.from_any(load_env_config(args))
    infos = catalog()
    problems = plugin_problems()
    check = None
    if args.check:
        try:
            check = check_task_files(args.check, config.profile)
        except OSError as exc:
            raise UsageError(f"--check: {exc}")
    if args.json:
        out: JsonObject = {"functions": [i.as_dict() for i in infos], "plugin_problems": problems}
        if check is not None:
            out["check"] = {**check.as_dict(), "profile": config.profile}
        print(json.dumps(out, indent=2, ensure_ascii=False))
    else:
        _print_listing(infos)
        for line in problems:
            console.print(f"[red]plugin problem[/red]: {escape(line)}", highlight=False, soft_wrap=True)
        if check is not None:
            _print_check(check, config)
    failed = bool(problems) or (check is not None and bool(check.problems))
    return 1 if failed else 0


def _print_listing(infos: list[FunctionInfo]) -> None:
    table = Table(title=f"reward functions ({len(infos)})", title_justify="left", show_lines=False)
    for col in ("function", "package", "reads", "arguments", "components", "judge"):
        table.add_column(col, overflow="fold")
    for info in infos:
        name = info.name + (f" (also {', '.join(info.aliases)})" if info.aliases else "")
        table.add_row(
            escape(name),
            escape(info.package),
            ", ".join(info.context),
            escape(", ".join(info.arguments)) or "-",
            ", ".join(info.components) + (" (optional)" if info.optional else ""),
            "yes" if info.needs_judge else "no",
        )
    console.print(table)


def _print_check(check: CheckResult, config: EnvConfig) -> None:
    console.print(
        f"checked {check.tasks} tasks (profile {config.profile}): {check.built} plans built, "
        f"{len(check.problems)} problem{'' if len(check.problems) == 1 else 's'}",
        highlight=False,
    )
    for problem in check.problems:
        console.print(f"[red]problem[/red]: {escape(str(problem))}", highlight=False, soft_wrap=True)
    if check.judge_functions:
        used = ", ".join(f"{name} ({n} tasks)" for name, n in sorted(check.judge_functions.items()))
        note = "" if config.judge.configured else " — give --judge-base-url and --judge-model to run them"
        console.print(f"judge functions used: {used}{note}", highlight=False)
