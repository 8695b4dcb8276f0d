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

from deepanalyze_env.commands.common import UsageError, console, make_parser
from deepanalyze_env.tasks import is_dataset_row, task_to_row

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


def read_any(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise UsageError(f"--tasks: no such file {path}")
    if path.suffix == ".parquet":
        import pandas as pd

        return [_from_parquet(r) for r in pd.read_parquet(path).to_dict(orient="records")]
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        return json.loads(text)
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{lineno}: not valid JSON ({exc.msg})")
    return rows


def _from_parquet(row: dict[str, Any]) -> dict[str, Any]:
    """numpy arrays (how pandas returns list columns) back to lists, so rows stay JSON-shaped."""

    def plain(value: Any) -> Any:
        if hasattr(value, "tolist"):
            value = value.tolist()
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    return {k: plain(v) for k, v in row.items()}


def to_rows(paths: list[Path], workspace_root: str, data_source: str) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        for index, obj in enumerate(read_any(path)):
            if is_dataset_row(obj):
                rows.append(obj)  # DeepAnalyze's own rows: unchanged
                continue
            row = task_to_row(obj, workspace_root)
            task_id = row.pop("task_id")
            row["data_source"] = data_source
            row["extra_info"] = {"task_id": task_id, "index": index, "method": obj.get("method")}
            row["task_id"] = task_id
            rows.append(row)
    return rows


def write_parquet(rows: list[dict[str, Any]], out: Path) -> str:
    """Parquet needs one type per field; ground truths mix text and numbers across tasks, so
    ``reward_spec`` falls back to a JSON string column (the env decodes it) when needed."""
    import pandas as pd
    import pyarrow as pa

    frame = pd.DataFrame(rows)
    try:
        frame.to_parquet(out, index=False)
        return "native"
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        frame["reward_spec"] = [json.dumps(spec, ensure_ascii=False) for spec in frame["reward_spec"]]
        frame.to_parquet(out, index=False)
        return "json-string reward_spec"


def dabench_rows(args: Any, out: Path) -> list[dict[str, Any]]:
    """Convert DABench files (deepanalyze_env.bank.dabench), report skipped lines, render the rows."""
    from deepanalyze_env.bank.dabench import convert

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
        task_id = row.pop("task_id")
        row["data_source"] = "dabench"
        row["extra_info"] = {
            "task_id": task_id,
            "index": index,
            "method": task["method"],
            "level": task["level"],
        }
        row["task_id"] = task_id
        rows.append(row)
    console.print(
        f"DABench: {len(rows)} questions converted, {len(result.problems)} lines skipped; "
        f"workspaces in {root}"
    )
    return rows


def cmd_prepare_data(args: Any) -> int:
    out = Path(args.out)
    if args.source == "dabench":
        out.parent.mkdir(parents=True, exist_ok=True)
        rows = dabench_rows(args, out)
    else:
        if not args.tasks or not args.workspace_root:
            raise UsageError("prepare-data needs --tasks and --workspace-root (or --from dabench)")
        rows = to_rows([Path(p) for p in args.tasks], args.workspace_root, args.data_source)
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
