"""``deepanalyze-rl bank build``: build (or check) the task bank over real public tables.

The bank is not committed (a full build is ~1,000 task files' worth of workspaces and episodes);
it is built on first use into ``--out`` (default: the user cache folder) and is byte-identical
for the same seed and package versions, which ``--check`` verifies against an existing build.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from deepanalyze_env.cli.common import SubParsers, UsageError, console, make_parser


def default_out(seed: int) -> Path:
    from deepanalyze_env.offline.bank.build import cache_folder

    return cache_folder(seed)


def add_parser(sub: SubParsers) -> None:
    p = make_parser(
        sub,
        "bank",
        "build the task bank over real public tables",
        "deepanalyze-rl bank build --out runs/bank",
    )
    bank_sub = p.add_subparsers(dest="bank_command", required=True, metavar="ACTION")
    b = make_parser(
        bank_sub,
        "build",
        "build the bank (or --check an existing one)",
        "deepanalyze-rl bank build --out runs/bank --seed 13",
    )
    b.add_argument(
        "--out",
        metavar="DIR",
        help="bank folder (default: ~/.cache/deepanalyze-env/bank-seed<N>-r<REVISION>)",
    )
    b.add_argument("--seed", type=int, default=13, metavar="N", help="seed of every random choice (13)")
    b.add_argument("--families", nargs="+", metavar="NAME", help="build only these families (default: all)")
    b.add_argument("--tables", nargs="+", metavar="NAME", help="build only these tables (default: all)")
    b.add_argument("--workers", type=int, default=2, metavar="N", help="reference episodes in flight (2)")
    b.add_argument(
        "--check", action="store_true", help="rebuild in a temporary folder and name what differs from --out"
    )
    b.set_defaults(func=cmd_bank_build)


def _progress() -> tuple[Progress, Callable[[str, int, int], None]]:
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    bars: dict[str, TaskID] = {}

    def tick(stage: str, done: int, total: int) -> None:
        if stage not in bars:
            bars[stage] = progress.add_task(stage, total=total)
        progress.update(bars[stage], completed=done, total=total)

    return progress, tick


def cmd_bank_build(args: argparse.Namespace) -> int:
    from deepanalyze_env.offline.bank import BankError
    from deepanalyze_env.offline.bank.build import build, check

    out = Path(args.out) if args.out else default_out(args.seed)
    if args.workers < 1:
        raise UsageError("--workers must be >= 1")
    if not args.check and (out / "manifest.json").is_file():
        console.print(f"a bank is already built at {out}; --check verifies it, another --out builds anew")
        return 0
    kwargs = {"seed": args.seed, "families": args.families, "tables": args.tables, "workers": args.workers}
    progress, tick = _progress()
    try:
        with progress:
            if args.check:
                diffs = check(out, progress=tick, **kwargs)
            else:
                result = build(out, progress=tick, **kwargs)
    except BankError as exc:
        raise UsageError(str(exc)) from None
    if args.check:
        if diffs:
            for line in diffs:
                console.print(f"[red]{line}[/red]", highlight=False)
            console.print(f"{len(diffs)} differences against {out}")
            return 1
        console.print(f"[green]identical[/green]: a fresh build matches {out} byte for byte")
        return 0
    counts = result.manifest["counts"]["family_split_method"]
    table = Table(title=f"bank at {out}")
    for col in ("family", "method", "train", "dev", "test"):
        table.add_column(col)
    for family, splits in sorted(counts.items()):
        method = next(iter(next(iter(splits.values()))))
        table.add_row(
            family, method, *(str(sum(splits.get(s, {}).values())) for s in ("train", "dev", "test"))
        )
    console.print(table)
    console.print(f"tasks per split: {result.manifest['counts']['per_split']}")
    console.print("dropped by the quality gate: " + ", ".join(f"{k} {v}" for k, v in result.dropped.items()))
    console.print(f"self-check: {result.self_check}")
    for line in result.failures[:20]:
        console.print(f"[yellow]self-check failed[/yellow] {line}", highlight=False, soft_wrap=True)
    return 0 if not result.failures else 1
