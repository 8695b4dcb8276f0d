"""``deepanalyze-rl stats DIR``: what a run's episodes look like, from their records alone."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from rich.table import Table

from deepanalyze_env.cli.common import SubParsers, UsageError, console, make_parser


def add_parser(sub: SubParsers) -> None:
    p = make_parser(
        sub,
        "stats",
        "summarise a run's episode records (statuses, rewards, judge latency, cost)",
        "deepanalyze-rl stats runs/teacher --price-prompt 0.15 --price-completion 0.60",
    )
    p.add_argument(
        "run",
        metavar="DIR",
        help="a run folder (rollout --out, train output_dir, a records_dir) or one records JSONL file",
    )
    p.add_argument("--out", metavar="DIR", help="where stats.json/.md/.png go (default: DIR itself)")
    p.add_argument("--price-prompt", type=float, metavar="USD", help="policy price per 1M prompt tokens")
    p.add_argument(
        "--price-completion", type=float, metavar="USD", help="policy price per 1M completion tokens"
    )
    p.add_argument(
        "--tokenizer",
        metavar="MODEL",
        help="count episode lengths in this tokenizer's tokens when records carry no usage "
        "(a path, hub id or embedded:smollm2)",
    )
    p.add_argument(
        "--no-rescored", action="store_true", help="ignore rescored-*.jsonl (show the run as collected)"
    )
    p.set_defaults(func=cmd_stats)


def _token_counter(ref: str | None) -> Callable[[str], int] | None:
    if not ref:
        return None
    try:
        from transformers import AutoTokenizer

        from deepanalyze_env.generation.models import resolve_model

        tok = AutoTokenizer.from_pretrained(resolve_model(ref))
    except (ImportError, OSError, ValueError) as exc:
        raise UsageError(f"--tokenizer {ref}: cannot load it ({exc})")
    return lambda text: len(tok.encode(text, add_special_tokens=False))


def cmd_stats(args: argparse.Namespace) -> int:
    from deepanalyze_env.core.records import load_run
    from deepanalyze_env.offline.rundir import read_plan
    from deepanalyze_env.offline.stats import compute_stats, summary_rows, write_outputs

    source = Path(args.run)
    try:
        run = load_run(source, rescored=not args.no_rescored)
    except FileNotFoundError:
        raise UsageError(f"no such run folder or file: {source}")
    except ValueError as exc:
        raise UsageError(str(exc))
    if not run.records:
        raise UsageError(f"{source} holds no episode records")
    stats = compute_stats(
        run.records,
        price_prompt=args.price_prompt,
        price_completion=args.price_completion,
        count_tokens=_token_counter(args.tokenizer),
    )
    plan = read_plan(source) if source.is_dir() else None
    if plan is not None:
        have = {str(r.get("episode_id")) for r in run.records}
        planned = [str(e["episode_id"]) for e in plan.get("episodes") or []]
        stats["planned_episodes"] = len(planned)
        stats["missing_episodes"] = sum(1 for e in planned if e not in have)
    stats["sources"] = [str(p) for p in run.sources]
    stats["rescored_records"] = run.rescored
    out = Path(args.out) if args.out else (source if source.is_dir() else source.parent)
    paths = write_outputs(stats, out, str(source))

    table = Table(title=f"run statistics: {source}", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", overflow="fold")
    for label, value in summary_rows(stats):
        table.add_row(label, value)
    console.print(table)
    if run.rescored:
        console.print(f"{run.rescored} records taken from rescored-*.jsonl (--no-rescored for the originals)")
    console.print("written: " + ", ".join(str(p) for p in paths), highlight=False)
    return 0
