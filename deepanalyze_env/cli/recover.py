"""``deepanalyze-rl recover DIR --out tasks.jsonl``: recovery tasks cut from failed episodes.

Each failed cell (exec ``error`` or ``timeout``) of a scored episode becomes a task row that
starts right after that cell's ``<Execute>`` observation (``offline/recover.py``). Every row's
prefix is replayed in a real kernel before it is written; rows whose replay differs are
skipped and counted, with the first reasons shown.
"""

from __future__ import annotations

import argparse
from pathlib import Path

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

SHOWN_REASONS = 5


def add_parser(sub: SubParsers) -> None:
    p = make_parser(
        sub,
        "recover",
        "write recovery tasks that start right after each failed cell of a run's episodes",
        "deepanalyze-rl recover runs/teacher --out recover.jsonl --workspace-root data --keep 'reward < 1'",
    )
    p.add_argument(
        "run", metavar="DIR", help="run folder (rollout --out, train output_dir) or a records JSONL file"
    )
    p.add_argument(
        "--out", required=True, metavar="FILE", help="the task rows to write (JSONL; must not exist)"
    )
    p.add_argument(
        "--keep", metavar="EXPR", help="only episodes this record filter keeps (as in rollout --keep)"
    )
    p.add_argument(
        "--cuts",
        choices=["all", "first"],
        default="all",
        help="a row per failed cell (all, default) or only the episode's first failure",
    )
    p.add_argument(
        "--recovery-weight",
        type=float,
        metavar="W",
        help="add the recovery component to every row's reward_spec at this weight (0: reported only)",
    )
    add_shared_flags(p)
    p.set_defaults(func=cmd_recover)


def cmd_recover(args: argparse.Namespace) -> int:
    from deepanalyze_env.core.filters import FilterError, RecordFilter
    from deepanalyze_env.core.records import load_run, write_jsonl_atomic
    from deepanalyze_env.offline.recover import RecoverReport, recover, status_counts
    from deepanalyze_env.offline.report import progress_bar

    source = Path(args.run)
    out = Path(args.out)
    if out.exists():
        raise UsageError(f"--out {out} exists; choose a new file (nothing is overwritten)")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: no such folder {out.parent}")
    if args.recovery_weight is not None and not (0 <= args.recovery_weight < float("inf")):
        raise UsageError("--recovery-weight must be a finite number >= 0")
    keep = None
    if args.keep:
        try:
            keep = RecordFilter(args.keep)
        except FilterError as exc:
            raise UsageError(f"--keep: {exc}")
    config = load_env_config(args)
    try:
        run = load_run(source)
    except FileNotFoundError:
        raise UsageError(f"no such run folder or file: {source}")
    except ValueError as exc:
        raise UsageError(str(exc))
    if not run.records:
        raise UsageError(f"{source} holds no episode records")

    with progress_bar("replay", total=0, console=console) as (progress, bar):

        def on_cut(report: RecoverReport) -> None:
            progress.update(
                bar,
                total=report.cuts,
                completed=report.done,
                info=f"{len(report.rows)} reproduced, {report.skipped} not",
            )

        report = recover(
            run.records,
            config,
            keep=keep,
            mode=args.cuts,
            recovery_weight=args.recovery_weight,
            on_cut=on_cut,
        )
    write_jsonl_atomic(out, report.rows)

    table = Table(title=f"recover: {source}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("count", justify="right")
    table.add_row("episodes read", str(report.read))
    if keep is not None:
        table.add_row("left out by --keep", str(report.filtered_out))
    table.add_row("not scored (left out)", str(report.not_scored))
    table.add_row("scored without a failed cell", str(report.no_failure))
    table.add_row("records whose turns cannot be found", str(len(report.unusable)))
    table.add_row("skipped: reward spec does not build", str(len(report.bad_spec)))
    table.add_row("failed cells (cuts)", str(report.cuts))
    table.add_row("skipped: not reproducible", str(report.skipped))
    by_status = ", ".join(f"{k} {v}" for k, v in sorted(status_counts(report).items()))
    table.add_row("rows written", f"{len(report.rows)}" + (f" ({by_status})" if by_status else ""))
    console.print(table)
    for title, reasons in (
        ("not reproducible", report.not_reproducible),
        ("bad reward spec", report.bad_spec),
        ("unusable record", report.unusable),
    ):
        for reason in reasons[:SHOWN_REASONS]:
            console.print(f"[yellow]{title}[/yellow]: {escape(reason)}", highlight=False, soft_wrap=True)
        if len(reasons) > SHOWN_REASONS:
            console.print(f"… and {len(reasons) - SHOWN_REASONS} more {title}", highlight=False)
    console.print(f"written: {out}", highlight=False)
    return 0
