"""Compare a file the agent wrote with the reference output of a data-cleaning task.

``reward_spec["expected_file"]`` holds the reference table inline (``name``, ``columns``,
``rows``; an optional ``tolerance`` for numeric cells), so scoring needs no file outside the
episode's scratch workspace. The comparison reports three components, so a score says *what*
differs: ``file_schema`` (column names: shared / all, a name written twice counting twice),
``file_rows`` (row counts: smaller / larger) and ``file_values`` (cells of the shared columns
that agree, in row order or, failing that, after sorting both tables; over the larger row
count). :func:`compare_table` also returns
the differences as sentences for people (``deepanalyze-rl bank`` and the tests print them).
"""

from __future__ import annotations

import csv
import io
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deepanalyze_env.core.contracts import JsonValue
from rewards.normalize import as_number, compare, normalise_text
from rewards.registry import register_reward, with_notes
from tools.policy_files import read_policy_file

log = logging.getLogger(__name__)

COMPONENTS = ("file_schema", "file_rows", "file_values")
MISSING = {"", "nan", "none", "null", "na", "n/a"}


@dataclass
class FileDiff:
    """How far a written CSV is from the expected table (schema, rows, values) and what differs, in
    words for the episode's error text."""

    schema: float
    rows: float
    values: float
    problems: list[str] = field(default_factory=list)

    def components(self) -> dict[str, float]:
        return {"file_schema": self.schema, "file_rows": self.rows, "file_values": self.values}


def cell_equal(a: str, b: JsonValue, tolerance: float) -> bool:
    """One cell the policy wrote (``a``) against the expected one (``b``): both missing, or by the
    answers' rule (``rewards.normalize.compare``): a number within ``tolerance`` exactly — no
    slack that grows with the magnitude, no ``inf`` — else normalised text."""
    a_missing = normalise_text(a) in MISSING
    b_missing = b is None or (isinstance(b, float) and math.isnan(b)) or normalise_text(b) in MISSING
    if a_missing or b_missing:
        return a_missing and b_missing
    return compare(a, b, tolerance).match


def _sort_key(row: Sequence[JsonValue]) -> tuple[tuple[int, float, str], ...]:
    key = []
    for cell in row:
        num = as_number(cell) if cell is not None else None
        key.append((0, round(num, 6), "") if num is not None else (1, 0.0, normalise_text(cell)))
    return tuple(key)


MAX_LINE_CHARS = 256 * 1024  # one physical line of a scored CSV (csv's own field cap is 128 KiB)
MIN_CELL_BUDGET = 100_000  # cells kept for comparison, at least (4x the expected table's, else)


class _Unreadable(ValueError):
    """The policy's file cannot be compared: the reason is its problem line."""


class _Lines:
    """Physical lines of the decoded text, each capped at ``MAX_LINE_CHARS``; counts them."""

    def __init__(self, text: io.TextIOBase):
        self.text = text
        self.count = 0

    def __iter__(self) -> Iterator[str]:
        while line := self.text.readline(MAX_LINE_CHARS + 1):
            if len(line) > MAX_LINE_CHARS:
                raise _Unreadable(f"has a line longer than {MAX_LINE_CHARS} characters")
            self.count += 1
            yield line


@dataclass
class _Table:
    header: list[str]
    rows: list[list[str]]  # the first rows, each cut to the header's width
    n_rows: int  # every data row, kept or not
    complete: bool  # False: more cells than the budget, values cannot be compared


def _read_table(data: bytes, cell_budget: int) -> _Table:
    """Parse CSV ``data`` with memory bounded by ``data`` itself: lines are capped, and once
    the rows kept reach ``cell_budget`` cells parsing stops and each remaining physical line
    counts as one row (C speed: 20 MiB of newlines is 20 million rows; as lists they took ~80x
    the file, and parsing them seconds of trainer CPU)."""
    text = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline="")
    lines = _Lines(text)
    header: list[str] | None = None
    rows: list[list[str]] = []
    n_rows, cells = 0, 0
    for row in csv.reader(lines):
        if header is None:
            header = [h.strip() for h in row]
            continue
        kept = row[: len(header)]
        cells += max(1, len(kept))
        if cells > cell_budget:
            total = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
            return _Table(header, [], n_rows + 1 + max(0, total - lines.count), False)
        n_rows += 1
        rows.append(kept)
    return _Table(header or [], rows, n_rows, True)


def read_csv_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a CSV the policy wrote, through the bounded reader; raises
    ValueError with the reason when it cannot be read or is too large to keep."""
    found = read_policy_file(path.parent, path.name)
    if found.data is None:
        raise ValueError(found.refused)
    table = _read_table(found.data, MIN_CELL_BUDGET)
    if not table.complete:
        raise ValueError(f"{path.name} has more than {MIN_CELL_BUDGET} cells")
    return table.header, table.rows


def compare_table(path: Path, expected: Mapping[str, JsonValue]) -> FileDiff:
    """How far the CSV at ``path`` is from ``expected`` (``columns``, ``rows``, ``tolerance``)."""
    return compare_file(path.parent, path.name, expected)


def compare_file(workspace: Path, name: str, expected: Mapping[str, JsonValue]) -> FileDiff:
    """How far the CSV ``name`` in ``workspace`` is from ``expected``. A file that is missing,
    a link, not a regular file, over the size cap or not CSV scores 0 on every component with
    the reason as its problem: the policy's failure, never a verifier error."""
    want_cols = [str(c) for c in expected["columns"]]
    want_rows = [list(r) for r in expected["rows"]]
    tolerance = float(expected.get("tolerance", 1e-6))
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ValueError(f"expected_file.tolerance must be a finite number >= 0, got {tolerance!r}")
    found = read_policy_file(workspace, name)
    if found.data is None:
        return FileDiff(0.0, 0.0, 0.0, [str(found.refused)])
    budget = max(MIN_CELL_BUDGET, 4 * max(1, len(want_cols)) * max(1, len(want_rows)))
    try:
        table = _read_table(found.data, budget)
    except _Unreadable as exc:
        return FileDiff(0.0, 0.0, 0.0, [f"{name} is not a readable CSV file (it {exc})"])
    except (UnicodeDecodeError, csv.Error) as exc:
        return FileDiff(0.0, 0.0, 0.0, [f"{name} is not a readable CSV file ({exc})"])
    got_cols, got_rows = table.header, table.rows
    problems: list[str] = []
    shared = [c for c in want_cols if c in got_cols]
    union = set(want_cols) | set(got_cols)
    # a name written twice is two columns (the values compared are the first one's): without
    # this, a right column followed by junk under the same name scored full schema marks
    repeats = len(got_cols) - len(set(got_cols))
    schema = len(shared) / (len(union) + repeats) if union else 1.0
    if missing := [c for c in want_cols if c not in got_cols]:
        problems.append(f"missing columns: {', '.join(missing)}")
    if repeats:
        twice = sorted({c for c in got_cols if got_cols.count(c) > 1})
        problems.append(f"columns named more than once: {', '.join(c or '(unnamed)' for c in twice)}")
    if extra := [c for c in got_cols if c not in want_cols]:
        problems.append(f"unexpected columns: {', '.join(c or '(unnamed: an index column?)' for c in extra)}")
    n_got, n_want = table.n_rows, len(want_rows)
    rows = min(n_got, n_want) / max(n_got, n_want) if max(n_got, n_want) else 1.0
    if n_got != n_want:
        problems.append(f"{n_got} rows, expected {n_want}")
    values = 0.0
    if not table.complete:
        problems.append(f"more than {budget} cells: too large to compare the values")
    elif shared and max(n_got, n_want):
        gi = [got_cols.index(c) for c in shared]
        wi = [want_cols.index(c) for c in shared]
        got = [[r[i] if i < len(r) else "" for i in gi] for r in got_rows]
        want = [[r[i] for i in wi] for r in want_rows]

        def agreeing(a_rows: list[list[str]], b_rows: list[list[JsonValue]]) -> int:
            return sum(
                cell_equal(a, b, tolerance)
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
    diff = compare_file(Path(workspace), str(expected["name"]), expected)
    if diff.problems:
        log.info("file_match %s: %s", expected["name"], "; ".join(diff.problems))
    return with_notes(diff.components(), *diff.problems)
