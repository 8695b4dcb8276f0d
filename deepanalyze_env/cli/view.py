"""``deepanalyze-rl view RUN_DIR``: read a run's episodes in a browser, from one offline HTML file."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from deepanalyze_env.cli.common import SubParsers, UsageError, console, make_parser


def add_parser(sub: SubParsers) -> None:
    p = make_parser(
        sub,
        "view",
        "write a run's episodes as one self-contained HTML page (filters, episode pages, no network)",
        "deepanalyze-rl view runs/teacher --out runs/teacher/episodes.html",
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="run folders (rollout --out, train output_dir, a records_dir) or records JSONL files",
    )
    p.add_argument("--out", metavar="FILE", help="the HTML file (default: RUN_DIR/episodes.html)")
    p.add_argument(
        "--keep",
        metavar="EXPR",
        help="mark these episodes as kept (default: the run's kept.jsonl or its --keep expression)",
    )
    p.add_argument("--no-rescored", action="store_true", help="ignore rescored-*.jsonl")
    p.set_defaults(func=cmd_view)


def cmd_view(args: argparse.Namespace) -> int:
    from deepanalyze_env.core.filters import FilterError, RecordFilter
    from deepanalyze_env.offline.viewer import ViewError, build_view

    first = Path(args.runs[0])
    if args.keep:
        try:
            RecordFilter(args.keep)
        except FilterError as exc:
            raise UsageError(f"--keep: {exc}")
    out = Path(args.out) if args.out else (first if first.is_dir() else first.parent) / "episodes.html"
    if out.suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"--out {out}: the page is an HTML file; name it *.html")
    try:
        with Progress(
            TextColumn("[bold]view"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as bar:
            task = bar.add_task("episodes", total=None)
            report = build_view(
                args.runs,
                out,
                keep=args.keep,
                rescored=not args.no_rescored,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )
    except FileNotFoundError as exc:
        raise UsageError(str(exc))
    except (ViewError, ValueError) as exc:
        raise UsageError(str(exc))
    size = f"{report.bytes / 1e6:.1f} MB" if report.bytes >= 1e6 else f"{report.bytes / 1e3:.0f} kB"
    console.print(
        f"{report.episodes} episodes in [bold]{report.path}[/bold] ({size}: the episodes take "
        f"{report.ratio:.2f}x their records' size, plus {report.fixed_bytes / 1e3:.0f} kB for the page); "
        "open it in any browser, it needs no network",
        highlight=False,
    )
    if report.kept_source:
        console.print(f"kept = {report.kept_source}", highlight=False)
    return 0
