"""Check every dataset row before training: one bad row must not kill a run hours in.

A trainer builds an env per episode from a row's columns (``extras``); a row whose reward spec
is broken, whose workspace folder is missing or whose reward needs a judge that is not
configured makes that construction fail, and inside SkyRL's generator that fails the whole
batch. So each row is built here once, with the env's own construction checks (the env is
made, not started: no kernel, no workspace copy), and every bad row is reported at once with
its file, its index and what is wrong — before any GPU is touched.

Rows are read as trainers read them: parquet with pyarrow (SkyRL loads it through ``datasets``,
which is pyarrow underneath), ``.jsonl``/``.json`` as JSON rows. Rows of another env class are
not ours to judge and are skipped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from deepanalyze_env import ENV_ID
from deepanalyze_env.core.config import ConfigError, EnvConfig
from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.core.tasks import env_extras

log = logging.getLogger(__name__)

SHOWN = 50  # bad rows listed in the error; the rest are counted


@dataclass(frozen=True)
class BadRow:
    """One row that would fail at training time (its file, position and problem), collected so every bad
    row is reported at once instead of the first killing a run."""

    source: str
    index: int  # 0-based position in the file; -1 when the file itself could not be read
    problem: str

    def __str__(self) -> str:
        where = self.source if self.index < 0 else f"{self.source} row {self.index}"
        return f"{where}: {self.problem}"


class BadRowsError(ConfigError):
    """Every bad row, one line each (the first line says how many)."""

    def __init__(self, bad: list[BadRow], checked: int):
        self.bad = bad
        self.checked = checked
        lines = [str(b) for b in bad[:SHOWN]]
        if len(bad) > SHOWN:
            lines.append(f"… and {len(bad) - SHOWN} more")
        if any(b.index < 0 for b in bad):  # a whole file is unusable
            head = f"the data cannot be used ({len(bad)} problems, {checked} rows read; nothing was trained):"
        else:
            head = f"{len(bad)} of {checked} dataset rows cannot be used (nothing was trained):"
        super().__init__("\n  ".join([head, *lines]))


def is_local_data(source: str) -> bool:
    """A file trainers read from disk (else a hub dataset name, which is not checked here)."""
    return Path(source).suffix.lower() in (".parquet", ".jsonl", ".json")


def read_rows(source: str | Path) -> list[JsonObject]:
    path = Path(source)
    if not path.is_file():
        raise ConfigError("no such file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise ConfigError(f"not a readable parquet file ({type(exc).__name__}: {exc})") from exc
    text = path.read_text(encoding="utf-8")
    if suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"not valid JSON ({exc.msg})") from exc
        return [r if isinstance(r, dict) else {"_not_an_object": r} for r in rows]
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"line {lineno}: not valid JSON ({exc.msg})") from exc
        rows.append(obj if isinstance(obj, dict) else {"_not_an_object": obj})
    return rows


def row_problem(row: JsonObject, config: EnvConfig) -> str | None:
    """What is wrong with one row for this env config, or None."""
    from deepanalyze_env.core.env import DeepAnalyzeEnv

    if "_not_an_object" in row:
        return "not a JSON object"
    env_class = row.get("env_class")
    if env_class not in (None, "", ENV_ID):
        return None  # another env's row
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        if "instruction" in row and "reward_spec" in row:
            return "a task, not a dataset row (render task files with prepare-data first)"
        return "no prompt (a non-empty list of chat messages)"
    if not all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
        return "prompt messages need a role and a content"
    try:
        DeepAnalyzeEnv(config, env_extras(row))
    except ConfigError as exc:
        return str(exc)
    return None


def check_rows(rows: Iterable[tuple[str, int, JsonObject]], config: EnvConfig) -> tuple[list[BadRow], int]:
    """``(source, index, row)`` triples → the bad ones and how many were checked."""
    strict = dataclasses.replace(config, row_errors="raise")
    bad, checked = [], 0
    for source, index, row in rows:
        checked += 1
        problem = row_problem(row, strict)
        if problem is not None:
            bad.append(BadRow(source, index, problem))
    return bad, checked


def _file_rows(sources: Iterable[str], bad: list[BadRow]) -> Iterator[tuple[str, int, JsonObject]]:
    for source in sources:
        try:
            rows = read_rows(source)
        except (ConfigError, OSError, UnicodeDecodeError) as exc:
            bad.append(BadRow(str(source), -1, str(exc)))
            continue
        if not rows:
            bad.append(BadRow(str(source), -1, "holds no rows"))
        for index, row in enumerate(rows):
            yield str(source), index, row


def check_data(sources: Iterable[str], config: EnvConfig) -> int:
    """Check every row of every local file; raise :class:`BadRowsError` listing all bad rows.

    Returns how many rows were checked. Sources that are not local files (hub dataset names)
    are skipped with a warning.
    """
    local = []
    for source in sources:
        if is_local_data(str(source)):
            local.append(str(source))
        else:
            log.warning("dataset %s is not a local file: its rows are not checked before training", source)
    unreadable: list[BadRow] = []
    bad, checked = check_rows(_file_rows(local, unreadable), config)
    bad = unreadable + bad
    if bad:
        raise BadRowsError(bad, checked)
    log.info("checked %d dataset rows in %d files: all usable", checked, len(local))
    return checked
