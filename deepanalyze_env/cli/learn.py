"""``deepanalyze-rl learn PIPELINE``: parse, then run the pipeline (``deepanalyze_env.learn``)
and print its table."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.rule import Rule

from deepanalyze_env.cli.common import SubParsers, UsageError, console, make_parser
from deepanalyze_env.learn import (
    Pipeline,
    StageFailed,
    comparison_lines,
    memory_line,
    rft_lines,
    run_pipeline,
    table,
    warning_lines,
)


def add_parser(sub: SubParsers) -> None:
    p = make_parser(
        sub,
        "learn",
        "the learning pipeline: dev eval → SFT warm start → dev eval → GRPO → dev eval",
        "deepanalyze-rl learn recipes/learn_cpu.yaml eval.samples=2",
    )
    p.add_argument("pipeline", metavar="PIPELINE", help="pipeline YAML (recipes/learn_cpu.yaml)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. tasks.dev=20")
    p.add_argument("--fresh", action="store_true", help="rerun every stage (default: reuse finished ones)")
    p.set_defaults(func=cmd_learn)


def cmd_learn(args: argparse.Namespace) -> int:
    pipe = Pipeline.load(args.pipeline, args.overrides)
    try:
        summary = run_pipeline(pipe, fresh=args.fresh)
    except StageFailed as exc:
        raise UsageError(str(exc)) from exc
    console.print(Rule("[bold]result[/bold]"))
    for line in warning_lines(summary):
        console.print(line, style="bold red", highlight=False)
    console.print(table(summary))
    for line in [*comparison_lines(summary), *rft_lines(summary)]:
        console.print(line, highlight=False)
    memory = memory_line(summary)
    if memory:
        console.print(memory, highlight=False)
    out = Path(pipe.output_dir)
    console.print(f"run folder: {out} (learn.json, learn.md, learn.png, stages.json, one folder per stage)")
    return 0
