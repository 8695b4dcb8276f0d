"""``deepanalyze-rl prepare-data``: task files → dataset rows for SkyRL (parquet) or TRL.

Rows follow DESIGN contract 1 and SkyRL's columns (``data_source``, ``prompt``, ``env_class``,
``reward_spec``, ``data``, ``workspace_id``, ``input_seq``, ``extra_info``). DeepAnalyze's own
RL rows (JSON/JSONL/parquet with ``prompt`` and ``reward_spec``) pass through unchanged.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from deepanalyze_env.cli.common import UsageError, console, make_parser
from deepanalyze_env.core.tasks import load_rows, write_parquet

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
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
        required=True,
        metavar="FILE",
        help="task files (JSONL) or DeepAnalyze RL rows (JSON, JSONL, parquet)",
    )
    p.add_argument(
        "--workspace-root", required=True, metavar="DIR", help="folder holding <data>/<workspace_id>/"
    )
    p.add_argument("--out", required=True, metavar="FILE", help=".parquet, or .jsonl for --format trl")
    p.add_argument("--format", choices=["skyrl", "trl"], default="skyrl")
    p.add_argument("--data-source", default="deepanalyze", help="value of the data_source column")
    p.set_defaults(func=cmd_prepare_data)


def cmd_prepare_data(args: Any) -> int:
    rows = load_rows(args.tasks, args.workspace_root, args.data_source)
    if not rows:
        raise UsageError("the task files hold no tasks")
    out = Path(args.out)
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
