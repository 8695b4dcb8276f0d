"""Report helpers shared by ``stats``, ``judge-eval``, ``rescore``, ``rollout`` and the trainers'
summaries: number formatting, quantiles, distributions and bootstrap intervals, and the one
progress-bar style.

Example::

    from deepanalyze_env.offline.report import distribution, fmt, progress_bar

    with progress_bar("rollout", total=len(jobs), console=console) as (progress, bar):
        for job in jobs:
            run(job)
            progress.update(bar, advance=1, info=f"mean {fmt(distribution(rewards).get('mean'))}")
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Required, TypedDict

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

DASH = "–"  # what a missing number prints as


def fmt(value: object, digits: int = 3) -> str:
    """A number for a table: ``digits`` decimals for floats, ``–`` for None/NaN, else ``str``."""
    if value is None:
        return DASH
    if isinstance(value, float):
        return DASH if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def pct(value: float | None, digits: int = 1) -> str:
    """A rate as a percentage (``0.125`` → ``12.5%``); ``–`` for None."""
    return DASH if value is None else f"{100 * value:.{digits}f}%"


def rate(num: int, den: int) -> float | None:
    return num / den if den else None


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def quantile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0


def bootstrap_ci(
    groups: Sequence[Sequence[float]],
    statistic: Callable[[list[list[float]]], float] | None = None,
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """95 % percentile interval of ``statistic`` over ``groups`` resampled with replacement.

    The default statistic is the mean of all values in the resampled groups (episode-weighted).
    """
    groups = [list(g) for g in groups if len(g)]
    if not groups:
        return None
    if statistic is None:

        def statistic(gs: list[list[float]]) -> float:
            flat = [x for g in gs for x in g]
            return sum(flat) / len(flat)

    import numpy as np

    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(groups), size=(samples, len(groups)))
    values = np.array([statistic([groups[i] for i in row]) for row in idx])
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def median(values: Sequence[float]) -> float | None:
    return quantile(values, 0.5)


class Distribution(TypedDict, total=False):
    """n, mean, population std, min, p50, p90, max of some values (:func:`distribution`); only
    ``n`` when there are none."""

    n: Required[int]
    mean: float
    std: float
    min: float
    p50: float
    p90: float
    max: float


def distribution(values: Sequence[float]) -> Distribution:
    """n, mean, population std, min, p50, p90, max; ``{"n": 0}`` for no values."""
    if not values:
        return {"n": 0}
    m = sum(values) / len(values)
    return {
        "n": len(values),
        "mean": float(m),
        "std": float(math.sqrt(sum((v - m) ** 2 for v in values) / len(values))),
        "min": float(min(values)),
        "p50": float(quantile(values, 0.5)),  # type: ignore[arg-type]
        "p90": float(quantile(values, 0.9)),  # type: ignore[arg-type]
        "max": float(max(values)),
    }


@contextmanager
def progress_bar(
    label: str, total: int, console: Console | None = None, *, completed: int = 0, eta: bool = False
) -> Iterator[tuple[Progress, TaskID]]:
    """The project's progress bar: label, bar, done/total, elapsed (and ETA), then an ``info`` field."""
    columns: list[ProgressColumn] = [
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    if eta:
        columns += [TextColumn("eta"), TimeRemainingColumn()]
    columns.append(TextColumn("{task.fields[info]}"))
    with Progress(*columns, console=console, transient=False) as progress:
        yield progress, progress.add_task(label, total=total, completed=completed, info="")
