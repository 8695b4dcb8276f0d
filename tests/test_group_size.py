"""``benchmarks/group_size.py``'s estimates and rules: the informative-group estimate is unbiased
(checked against the closed form 1 − p^g − (1 − p)^g over the binomial law, and against a brute
count of subsets), and the choice rules pick what their docstring says. Pure functions, no stage."""

from __future__ import annotations

import itertools
import sys
from math import comb
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from group_size import choose_group, groups_per_step, p_informative, p_reward_differs


@pytest.mark.parametrize("p", [0.0, 0.1, 0.37, 0.5, 0.9])
@pytest.mark.parametrize("g", [2, 4, 8])
def test_informative_estimate_is_unbiased_over_the_binomial_law(p: float, g: int) -> None:
    n = 8
    expected = sum(comb(n, c) * p**c * (1 - p) ** (n - c) * p_informative(n, c, g) for c in range(n + 1))
    assert expected == pytest.approx(1 - p**g - (1 - p) ** g, abs=1e-12)


@pytest.mark.parametrize(("n", "c", "g"), [(8, 3, 2), (8, 5, 4), (6, 1, 3), (8, 0, 4), (8, 8, 2)])
def test_informative_estimate_is_the_share_of_mixed_subsets(n: int, c: int, g: int) -> None:
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), g))
    mixed = sum(1 for s in subsets if 0 < sum(outcomes[i] for i in s) < g)
    assert p_informative(n, c, g) == pytest.approx(mixed / len(subsets))


def test_reward_differs_counts_subsets_with_two_values() -> None:
    # pairs of [1, 1, -1]: (1, 1) equal, (1, -1) twice differ
    assert p_reward_differs([1.0, 1.0, -1.0], 2) == pytest.approx(2 / 3)
    assert p_reward_differs([0.5, 0.5, 0.5, 0.5], 3) == 0.0


def row(group: int, per_episode: float) -> dict:
    return {
        "group": group,
        "informative": per_episode * group,
        "per_episode": per_episode,
        "reward_differs": 0.0,
        "groups_per_step": 1,
        "step_has_signal": 1.0,
    }


def test_the_larger_group_wins_within_ten_percent_of_the_best() -> None:
    assert choose_group([row(2, 0.143), row(4, 0.130), row(8, 0.078)])["group"] == 4  # 0.130 ≥ 0.1287
    assert choose_group([row(2, 0.143), row(4, 0.1275), row(8, 0.078)])["group"] == 2  # 10.8 % below


def test_groups_per_step_is_the_fewest_reaching_the_target() -> None:
    assert groups_per_step(0.51)[0] == 3  # 1 − 0.49² = 0.76 < 0.8; 1 − 0.49³ = 0.88
    assert groups_per_step(0.9)[0] == 1
    t, chance = groups_per_step(0.2)  # never reaches 0.8 within 4: capped, with the chance it has
    assert t == 4 and chance == pytest.approx(1 - 0.8**4)
