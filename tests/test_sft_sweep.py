"""``benchmarks/sft_sweep.py``'s own rules (the sweep itself is a benchmark, never run in CI): the
validation tasks are whole held-out train tables, and the figures count a missing episode as
wrong, with Wilson intervals."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("sft_sweep", REPO / "benchmarks" / "sft_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_validation_is_whole_train_tables_that_sft_never_sees(sweep):
    train = [{"id": f"{t}-{i}", "family": "f", "tables": [t]} for t in "abcdef" for i in range(3)]
    fit, val, held = sweep.split_train(train, 2, seed=0)
    assert len(held) == 2 and {t["tables"][0] for t in val} == set(held)
    assert not {t["tables"][0] for t in fit} & set(held) and len(fit) + len(val) == len(train)
    assert sweep.split_train(train, 2, seed=0)[2] == held  # seeded
    with pytest.raises(SystemExit, match="--val-tables"):
        sweep.split_train(train, 6, seed=0)


def test_figures_count_a_missing_episode_as_wrong_with_wilson_intervals(sweep):
    # 4 planned tasks: 3 finished (2 correct, 3 passed the gate), 1 missing
    summary = {
        "tasks": 4,
        "episodes": 4,
        "pass_at": {"1": {"value": 2 / 3, "tasks": 3}},
        "format_gate_pass_rate": 0.75,
    }
    f = sweep.figures(summary)
    assert (f["correct"], f["tasks"], f["accuracy"], f["gate_passed"]) == (2, 4, 0.5, 3)
    assert f["accuracy_ci95"] == (0.15, 0.85) and sweep.wilson(0, 0) is None
    low, high = sweep.wilson(0, 48)
    assert low == 0.0 and 0.07 < high < 0.08


def test_sizes_are_counts_or_all(sweep):
    assert sweep.parse_args(["--tiny"]).sizes == ["2", "4", "all"]
    with pytest.raises(SystemExit):
        sweep.parse_args(["--sizes", "32", "half"])
