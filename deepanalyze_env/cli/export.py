"""``deepanalyze-rl export RUN_DIR --out DIR``: run records as a Hub-ready dataset (Parquet + card)."""

from __future__ import annotations

import argparse
from pathlib import Path

from deepanalyze_env.cli.common import SubParsers, UsageError, console, make_parser


def add_parser(sub: SubParsers) -> None:
    p = make_parser(
        sub,
        "export",
        "export run records as a dataset folder (Parquet shards + README.md card) for datasets / the Hub",
        "deepanalyze-rl export runs/teacher --out datasets/teacher "
        "--keep 'reward_status == \"scored\" and reward >= 0.5' --splits train=0.9 test=0.1",
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="run folders or records JSONL files; several are merged (a repeated episode id is kept once)",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="the dataset folder (new or empty)")
    p.add_argument(
        "--keep", metavar="EXPR", help="export only episodes matching EXPR (the rollout --keep language)"
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--split-by",
        metavar="FIELD",
        help="one split per value of FIELD (e.g. method, policy_id, reward_status)",
    )
    group.add_argument(
        "--splits",
        nargs="+",
        metavar="NAME=SPEC",
        help="NAME=FRACTION … (by task: a task's samples share a split) or NAME=EXPR … (first match wins)",
    )
    p.add_argument("--license", default="unknown", metavar="ID", help="Hub licence id for the card (unknown)")
    p.add_argument("--name", metavar="TEXT", help="the dataset's pretty name in the card")
    p.add_argument("--shard-rows", type=int, default=5000, metavar="N", help="rows per Parquet shard (5000)")
    p.add_argument("--no-rescored", action="store_true", help="ignore rescored-*.jsonl")
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    try:
        from deepanalyze_env.offline.export import ExportError, export_runs
    except ImportError as exc:
        raise UsageError(f"export needs the datasets package ({exc}); pip install -e '.[export]'")
    from deepanalyze_env.core.filters import FilterError

    if args.shard_rows < 1:
        raise UsageError("--shard-rows must be >= 1")
    try:
        report = export_runs(
            args.runs,
            args.out,
            keep=args.keep,
            split_by=args.split_by,
            splits=args.splits,
            license_id=args.license,
            pretty_name=args.name,
            shard_rows=args.shard_rows,
            rescored=not args.no_rescored,
        )
    except FilterError as exc:
        raise UsageError(f"--keep/--splits: {exc}")
    except FileNotFoundError as exc:
        raise UsageError(str(exc))
    except (ExportError, ValueError) as exc:
        raise UsageError(str(exc))
    counts = ", ".join(f"{k} {v}" for k, v in report.split_counts.items())
    console.print(
        f"{sum(report.split_counts.values())} of {report.episodes_in} episodes in [bold]{report.out}[/bold] "
        f"({counts}; {len(report.shards)} Parquet shards + README.md)",
        highlight=False,
    )
    if report.duplicates:
        shown = ", ".join(report.duplicates[:5])
        console.print(
            f"[yellow]{len(report.duplicates)} duplicate episode ids[/yellow] across the runs, kept once "
            f"(first run's copy): {shown}{' …' if len(report.duplicates) > 5 else ''}",
            highlight=False,
        )
    if report.dropped_by_splits:
        console.print(f"{report.dropped_by_splits} episodes matched no --splits expression and were left out")
    console.print(
        f"load: datasets.load_dataset({str(Path(report.out))!r}); upload: hf upload USER/NAME {report.out} "
        "--repo-type dataset",
        highlight=False,
    )
    return 0
