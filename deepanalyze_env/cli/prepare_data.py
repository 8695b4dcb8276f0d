"""``deepanalyze-rl prepare-data``: task files → dataset rows for SkyRL (parquet) or TRL.

Rows follow docs/design.md §4 and SkyRL's columns (``data_source``, ``prompt``, ``env_class``,
``reward_spec``, ``data``, ``workspace_id``, ``input_seq``, ``extra_info``). DeepAnalyze's own
RL rows (JSON/JSONL/parquet with ``prompt`` and ``reward_spec``) pass through unchanged.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from deepanalyze_env.cli.common import SubParsers, UsageError, console, make_parser
from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.core.tasks import load_rows, task_to_row, write_parquet

log = logging.getLogger(__name__)


def add_parser(sub: SubParsers) -> None:
    p = make_parser(
        sub,
        "prepare-data",
        "render task files into SkyRL/TRL dataset rows",
        "deepanalyze-rl prepare-data --format skyrl --tasks data/tasks/*.jsonl --workspace-root data "
        "--out train.parquet",
    )
    p.add_argument(
        "--tasks",
        nargs="+",
        metavar="FILE",
        help="task files (JSONL) or DeepAnalyze RL rows (JSON, JSONL, parquet)",
    )
    p.add_argument(
        "--workspace-root",
        metavar="DIR",
        help="folder holding <data>/<workspace_id>/ (--from dabench: where the CSVs go; default: "
        "--out's folder)",
    )
    p.add_argument(
        "--from", dest="source", choices=["tasks", "dabench"], default="tasks", help="what to convert (tasks)"
    )
    p.add_argument("--questions", metavar="FILE", help="--from dabench: the questions JSONL")
    p.add_argument("--labels", metavar="FILE", help="--from dabench: the labels JSONL")
    p.add_argument("--tables", metavar="DIR", help="--from dabench: the folder of CSV tables")
    p.add_argument("--out", required=True, metavar="FILE", help=".parquet, or .jsonl for --format trl")
    p.add_argument("--format", choices=["skyrl", "trl"], default="skyrl")
    p.add_argument("--data-source", default="deepanalyze", help="value of the data_source column")
    p.set_defaults(func=cmd_prepare_data)


def dabench_rows(args: argparse.Namespace, out: Path) -> list[JsonObject]:
    """Convert DABench files (``offline.bank.dabench``), report skipped lines, render the rows."""
    from deepanalyze_env.offline.bank.dabench import convert

    for flag in ("questions", "labels", "tables"):
        if not getattr(args, flag):
            raise UsageError(f"--from dabench needs --{flag}")
    for flag in ("questions", "labels"):
        if not Path(getattr(args, flag)).is_file():
            raise UsageError(f"--{flag}: no such file {getattr(args, flag)}")
    if not Path(args.tables).is_dir():
        raise UsageError(f"--tables: no such folder {args.tables}")
    root = Path(args.workspace_root) if args.workspace_root else out.parent
    result = convert(Path(args.questions), Path(args.labels), Path(args.tables), root)
    for problem in result.problems:
        console.print(f"[yellow]skipped[/yellow] {problem}", highlight=False, soft_wrap=True)
    rows = []
    for index, task in enumerate(result.tasks):
        row = task_to_row(task, str(root))
        row["data_source"] = "dabench"
        row["extra_info"] = {
            "task_id": row["task_id"],
            "index": index,
            "method": task["method"],
            "level": task["level"],
        }
        rows.append(row)
    console.print(
        f"DABench: {len(rows)} questions converted, {len(result.problems)} lines skipped; "
        f"workspaces in {root}"
    )
    return rows


def cmd_prepare_data(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.source == "dabench":
        out.parent.mkdir(parents=True, exist_ok=True)
        rows = dabench_rows(args, out)
    else:
        if not args.tasks or not args.workspace_root:
            raise UsageError("prepare-data needs --tasks and --workspace-root (or --from dabench)")
        rows = load_rows(args.tasks, args.workspace_root, args.data_source)
    if not rows:
        raise UsageError("the task files hold no tasks")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        how = write_parquet(rows, out)
    elif out.suffix in (".jsonl", ".json"):
        with open(out, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        how = "jsonl"
    else:
        raise UsageError(f"--out must end in .parquet or .jsonl, got {out.name}")
    console.print(f"wrote {len(rows)} rows to {out} ({args.format}, {how})")
    return 0
