"""Task files → dataset rows (docs/design.md §4), with the user message in DeepAnalyze's layout.

The layout (``# Instruction`` … ``# Data`` then one ``File N: {"name", "size"}`` line per file,
sizes in KB with one decimal, base 1024) is what DeepAnalyze models saw in training; keeping it
byte-for-byte avoids a prompt-distribution shift when fine-tuning them further.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from deepanalyze_env import ENV_ID
from deepanalyze_env.core.cells import resolve_workspace
from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.contracts import JsonObject, JsonValue

TASK_KEYS = ("id", "method", "instruction", "reward_spec")
DATA_SOURCE = "deepanalyze"  # SkyRL's data_source column for rendered tasks


def format_size(num_bytes: int) -> str:
    return f"{num_bytes / 1024:.1f}KB"


def render_user_message(instruction: str, workspace: Path | None) -> str:
    files = sorted(p for p in workspace.iterdir() if p.is_file()) if workspace else []
    if not files:
        return f"# Instruction\n{instruction}"
    lines = [
        f"File {i}: "
        + json.dumps({"name": p.name, "size": format_size(p.stat().st_size)}, ensure_ascii=False)
        for i, p in enumerate(files, 1)
    ]
    return f"# Instruction\n{instruction}\n\n# Data\n" + "\n".join(lines)


def is_dataset_row(obj: JsonObject) -> bool:
    return "prompt" in obj and "reward_spec" in obj


def missing_source_message(task: JsonObject, workspace_root: str | None) -> str:
    """A task built from a packaged table (the bank) whose workspace is absent: say what to install
    (when the table's package is missing) or what to build."""
    import importlib.util

    for src in task["sources"]:
        module = str(src.get("module", ""))
        if module and importlib.util.find_spec(module) is None:
            return (
                f"task {task.get('id')!r} uses table {src.get('table')!r} from {src.get('package')}, "
                f"which is not installed: pip install 'deepanalyze-env[{src.get('extra', 'kernel')}]', "
                "then build the bank"
            )
    return (
        f"task {task.get('id')!r}: workspace {task.get('data')}/{task.get('workspace_id')} is missing under "
        f"{workspace_root}; build the bank there: deepanalyze-rl bank build --out {workspace_root}"
    )


def task_to_row(task: JsonObject, workspace_root: str | None) -> JsonObject:
    missing = [k for k in TASK_KEYS if k not in task]
    if missing:
        raise ConfigError(f"task {task.get('id', '?')!r} is missing {', '.join(missing)}")
    try:
        workspace = resolve_workspace(workspace_root, task.get("data"), task.get("workspace_id"))
    except ConfigError:
        if task.get("sources"):
            raise ConfigError(missing_source_message(task, workspace_root)) from None
        raise
    return {
        "prompt": [{"role": "user", "content": render_user_message(task["instruction"], workspace)}],
        "env_class": ENV_ID,
        "reward_spec": task["reward_spec"],
        "data": task.get("data"),
        "workspace_id": task.get("workspace_id"),
        "input_seq": task.get("input_seq") or task["instruction"],
        "task_id": task["id"],
    }


def read_jsonl(path: str | Path) -> Iterator[JsonObject]:
    """One JSON object per non-blank line; a bad line is a ``ConfigError`` naming file and line."""
    if not Path(path).is_file():
        raise ConfigError(f"no such file: {path}")
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{lineno}: not valid JSON ({exc.msg})")
            if not isinstance(obj, dict):
                raise ConfigError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield obj


def read_task_file(path: str | Path) -> list[JsonObject]:
    """Task objects or dataset rows from JSONL, a JSON list or Parquet (DeepAnalyze's RL files)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no such file: {path}")
    if path.suffix == ".parquet":
        import pandas as pd

        return [_plain(r) for r in pd.read_parquet(path).to_dict(orient="records")]
    if path.suffix == ".json":
        text = path.read_text(encoding="utf-8")
        if text.lstrip().startswith("["):
            try:
                items = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})")
            bad = [i for i, item in enumerate(items) if not isinstance(item, dict)]
            if bad:
                raise ConfigError(f"{path}: item {bad[0]} is not a JSON object")
            return items
    return list(read_jsonl(path))


def _plain(value: object) -> JsonValue:
    """numpy arrays (how pandas returns list columns) back to lists, so rows stay JSON-shaped."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def load_rows(
    paths: Iterable[str | Path], workspace_root: str | None, data_source: str = DATA_SOURCE
) -> list[JsonObject]:
    """The one loader of training/evaluation rows, used by both trainers and every command.

    Task objects become rows (:func:`task_to_row`) with SkyRL's ``data_source`` and
    ``extra_info`` (task id, index, method, and the bank's family and difficulty) columns;
    DeepAnalyze's own rows (``prompt`` + ``reward_spec``) pass through unchanged (see
    :func:`with_task_ids` for consumers that need an id on every row). Rows come in file order; a
    problem is a ``ConfigError`` naming the file.
    """
    rows = []
    for path in paths:
        for index, obj in enumerate(read_task_file(path)):
            if is_dataset_row(obj):
                rows.append(dict(obj))
                continue
            try:
                row = task_to_row(obj, workspace_root)
            except ConfigError as exc:
                raise ConfigError(f"{path}: task {index}: {exc}")
            row["data_source"] = data_source
            row["extra_info"] = {
                "task_id": row["task_id"],
                "index": index,
                "method": obj.get("method"),
                **{k: obj[k] for k in ("family", "difficulty") if k in obj},
            }
            rows.append(row)
    return rows


def load_task_files(paths: Iterable[str | Path], workspace_root: str | None) -> list[JsonObject]:
    """Rows for commands that run episodes (``rollout``, ``eval``): every file must exist and
    together they must hold at least one task."""
    paths = list(paths)
    for path in paths:
        if not Path(path).is_file():
            raise ConfigError(f"--tasks: no such file {path}")
    rows = load_rows(paths, workspace_root)
    if not rows:
        raise ConfigError("--tasks: the files hold no tasks")
    return with_task_ids(rows)


def with_task_ids(rows: list[JsonObject]) -> list[JsonObject]:
    """Give every row a ``task_id`` (its ``extra_info`` one, else ``task-<position>``), in place, so
    that jobs, records and reports agree on it; DeepAnalyze's own rows may have none."""
    for index, row in enumerate(rows):
        info = row.get("extra_info")
        info = info if isinstance(info, dict) else {}
        row["task_id"] = row.get("task_id") or info.get("task_id") or f"task-{index}"
    return rows


def write_parquet(rows: list[JsonObject], out: Path) -> str:
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


def env_extras(row: JsonObject) -> JsonObject:
    """Everything but ``prompt``/``env_class`` reaches the env, as SkyRL's dataset does it."""
    return {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
