"""Compare a file the agent wrote with the reference output of a data-cleaning task.

``reward_spec["expected_file"]`` holds the reference table inline (``name``, ``columns``,
``rows``; an optional ``tolerance`` for numeric cells), so scoring needs no file outside the
episode's scratch workspace. The comparison reports three components, so a score says *what*
differs: ``file_schema`` (column names: shared / all), ``file_rows`` (row counts: smaller /
larger) and ``file_values`` (cells of the shared columns that agree, in row order or, failing
that, after sorting both tables; over the larger row count). :func:`compare_table` also returns
the differences as sentences for people (``deepanalyze-rl bank`` and the tests print them).
"""

from __future__ import annotations

import csv
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewards.normalize import as_number, normalise_text
from rewards.registry import register_reward

log = logging.getLogger(__name__)

COMPONENTS = ("file_schema", "file_rows", "file_values")
MISSING = {"", "nan", "none", "null", "na", "n/a"}


@dataclass
class FileDiff:
    schema: float
    rows: float
    values: float
    problems: list[str] = field(default_factory=list)

    def components(self) -> dict[str, float]:
        return {"file_schema": self.schema, "file_rows": self.rows, "file_values": self.values}


def _cell_equal(a: str, b: Any, tolerance: float) -> bool:
    a_missing = normalise_text(a) in MISSING
    b_missing = b is None or (isinstance(b, float) and math.isnan(b)) or normalise_text(b) in MISSING
    if a_missing or b_missing:
        return a_missing and b_missing
    a_num, b_num = as_number(a), as_number(b)
    if a_num is not None and b_num is not None:
        return abs(a_num - b_num) <= tolerance + 1e-9 * max(1.0, abs(b_num))
    return normalise_text(a) == normalise_text(b)


def _sort_key(row: Sequence[Any]) -> tuple:
    key = []
    for cell in row:
        num = as_number(cell) if cell is not None else None
        key.append((0, round(num, 6), "") if num is not None else (1, 0.0, normalise_text(cell)))
    return tuple(key)


def read_csv_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        return [], []
    return [h.strip() for h in rows[0]], rows[1:]


def compare_table(path: Path, expected: Mapping[str, Any]) -> FileDiff:
    """How far the CSV at ``path`` is from ``expected`` (``columns``, ``rows``, ``tolerance``)."""
    want_cols = [str(c) for c in expected["columns"]]
    want_rows = [list(r) for r in expected["rows"]]
    tolerance = float(expected.get("tolerance", 1e-6))
    if not path.is_file():
        return FileDiff(0.0, 0.0, 0.0, [f"{path.name} was not written"])
    try:
        got_cols, got_rows = read_csv_rows(path)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        return FileDiff(0.0, 0.0, 0.0, [f"{path.name} is not a readable CSV file ({exc})"])
    problems: list[str] = []
    shared = [c for c in want_cols if c in got_cols]
    union = set(want_cols) | set(got_cols)
    schema = len(shared) / len(union) if union else 1.0
    if missing := [c for c in want_cols if c not in got_cols]:
        problems.append(f"missing columns: {', '.join(missing)}")
    if extra := [c for c in got_cols if c not in want_cols]:
        problems.append(f"unexpected columns: {', '.join(c or '(unnamed: an index column?)' for c in extra)}")
    n_got, n_want = len(got_rows), len(want_rows)
    rows = min(n_got, n_want) / max(n_got, n_want) if max(n_got, n_want) else 1.0
    if n_got != n_want:
        problems.append(f"{n_got} rows, expected {n_want}")
    values = 0.0
    if shared and max(n_got, n_want):
        gi = [got_cols.index(c) for c in shared]
        wi = [want_cols.index(c) for c in shared]
        got = [[r[i] if i < len(r) else "" for i in gi] for r in got_rows]
        want = [[r[i] for i in wi] for r in want_rows]

        def agreeing(a_rows: list[list[str]], b_rows: list[list[Any]]) -> int:
            return sum(
                _cell_equal(a, b, tolerance)
                for ra, rb in zip(a_rows, b_rows, strict=False)
                for a, b in zip(ra, rb, strict=True)
            )

        same = max(agreeing(got, want), agreeing(sorted(got, key=_sort_key), sorted(want, key=_sort_key)))
        total = len(shared) * max(n_got, n_want)
        values = same / total
        if same < total:
            problems.append(f"{total - same} of {total} cells in the shared columns differ")
    diff = FileDiff(schema, rows, values, problems)
    return diff


@register_reward("file_match", components=COMPONENTS)
def file_match(workspace: Path | None, reward_spec: dict) -> dict[str, float]:
    """Schema, row count and values of the written file against ``reward_spec.expected_file``."""
    expected = reward_spec.get("expected_file")
    if not isinstance(expected, Mapping) or not {"name", "columns", "rows"} <= set(expected):
        raise ValueError("file_match needs reward_spec.expected_file with name, columns and rows")
    if workspace is None:
        raise ValueError("file_match needs the episode's workspace")
    diff = compare_table(Path(workspace) / str(expected["name"]), expected)
    if diff.problems:
        log.info("file_match %s: %s", expected["name"], "; ".join(diff.problems))
    return diff.components()
