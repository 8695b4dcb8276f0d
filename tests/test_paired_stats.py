"""``offline/paired.py``: the exact McNemar test against values computed by hand and an independent
oracle (scipy's binomial test), and the accuracy test read from ``compare_runs`` on crafted runs."""

from __future__ import annotations

import math

import pytest

from deepanalyze_env.offline.eval_report import compare_runs
from deepanalyze_env.offline.paired import above_zero, accuracy_test, mcnemar_exact


@pytest.mark.parametrize(
    ("b", "c", "p"),
    [
        (7, 1, 18 / 256),  # round one's SFT -> GRPO: 2 * (C(8,0) + C(8,1)) / 2^8 ≈ 0.0703
        (1, 7, 18 / 256),  # symmetric
        (3, 1, 10 / 16),  # 2 * (1 + 4) / 16
        (10, 0, 2 / 1024),
        (5, 5, 1.0),  # the doubled tail passes 1: capped
        (0, 0, 1.0),  # no discordant pair: no evidence
        (0, 1, 1.0),
    ],
)
def test_mcnemar_by_hand(b, c, p):
    assert math.isclose(mcnemar_exact(b, c), p, rel_tol=1e-12)


def test_mcnemar_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    for b in range(0, 13):
        for c in range(0, 13):
            if b + c == 0:
                continue
            expected = stats.binomtest(b, b + c, 0.5, alternative="two-sided").pvalue
            assert math.isclose(mcnemar_exact(b, c), expected, rel_tol=1e-9, abs_tol=1e-15), (b, c)


def test_mcnemar_refuses_negative_counts():
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def record(task: str, right: bool | float, episode: int = 0) -> dict:
    return {
        "episode_id": f"{task}-{episode}",
        "task_id": task,
        "reward_spec": {"method": "qa"},
        "reward_status": "scored",
        "reward": 1.0 if right else 0.0,
        "reward_components": {"qa_accuracy": float(right)},
        "format_ok": True,
    }


def runs(outcomes: list[tuple[bool, bool]]) -> tuple[list[dict], list[dict]]:
    a = [record(f"t{i}", ra) for i, (ra, _) in enumerate(outcomes)]
    b = [record(f"t{i}", rb) for i, (_, rb) in enumerate(outcomes)]
    return a, b


def test_accuracy_test_round_one_shape():
    """48 tasks, B right where A wrong on 7, the reverse on 1, both right on 1 (round one's
    SFT -> GRPO figures: 2 of 48 -> 8 of 48)."""
    outcomes = [(False, True)] * 7 + [(True, False)] + [(True, True)] + [(False, False)] * 39
    test = accuracy_test(compare_runs(*runs(outcomes)))
    assert test["tasks"] == 48 and test["binary"]
    assert (test["b_better"], test["a_better"], test["ties"]) == (7, 1, 40)
    assert math.isclose(test["accuracy_a"], 2 / 48) and math.isclose(test["accuracy_b"], 8 / 48)
    assert math.isclose(test["mean_diff"], 6 / 48)
    assert math.isclose(test["mcnemar_p"], 18 / 256)
    low, high = test["ci95"]
    assert 0 < low < 6 / 48 < high
    assert above_zero(test)


def test_accuracy_test_fractional_outcomes_have_no_mcnemar():
    a = [record("t0", True, 0), record("t0", False, 1), record("t1", False)]
    b = [record("t0", True, 0), record("t0", True, 1), record("t1", True)]
    test = accuracy_test(compare_runs(a, b))
    assert not test["binary"] and test["mcnemar_p"] is None
    assert (test["b_better"], test["a_better"]) == (2, 0)


def test_unpaired_task_fails_the_target():
    a, b = runs([(False, True)] * 20)
    test = accuracy_test(compare_runs([*a, record("only-a", False)], b))
    assert test["unpaired"] == 1 and test["ci95"][0] > 0
    assert not above_zero(test)


def test_no_difference_is_not_above_zero():
    test = accuracy_test(compare_runs(*runs([(True, True), (False, False)] * 5)))
    assert test["mean_diff"] == 0 and test["mcnemar_p"] == 1.0
    assert not above_zero(test)


def test_accuracy_interval():
    from deepanalyze_env.offline.paired import accuracy_interval

    a, _ = runs([(True, True)] * 6 + [(False, False)] * 18)
    acc = accuracy_interval(a)
    assert acc["tasks"] == 24 and math.isclose(acc["accuracy"], 0.25)
    low, high = acc["ci95"]
    assert 0 < low < 0.25 < high
    none = accuracy_interval(runs([(False, False)] * 4)[0])
    assert none["accuracy"] == 0 and none["ci95"] == (0.0, 0.0)
