"""``deepanalyze_grpo``: GRPO's group-normalised outcome advantage that ignores invalid rows.

SkyRL needs a float reward for every episode, so an episode whose reward could not be computed
(``verifier_error``, ``environment_error``) still carries one. If it entered its group's mean
and std it would move every sibling's advantage by a number nobody measured. SkyRL 0.4 passes an
estimator ``token_level_rewards``, ``response_mask`` and ``index`` (the group ids) but not the
loss mask or any per-sample flag, so the flag travels in ``response_mask``: the trainer subclass
(``deepanalyze_env.trainers.skyrl.trainer``) hands the estimator a mask whose invalid rows are all zero.

Rule: a row whose mask is all zero is invalid; it gets advantage 0 and is left out of its
group's mean and std. Valid rows get exactly what SkyRL's ``grpo`` would give them if the invalid
rows had never been sampled — with one exception: a group sampled with several rows of which
one valid row is left has no baseline, so that row gets 0 too (SkyRL's rule for a group of one,
mean 0 and std 1, is meant for prompts sampled once and would hand it its raw reward). A prompt
sampled once keeps SkyRL's rule.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import numpy as np
import torch

from deepanalyze_env.trainers.skyrl.config import ESTIMATOR


def compute_valid_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | Sequence[Hashable],  # each row's group id (SkyRL: its prompt's uid)
    epsilon: float = 1e-6,
    grpo_norm_by_std: bool = True,
    **_: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = token_level_rewards.sum(dim=-1)
    valid = response_mask.sum(dim=-1) > 0
    groups: dict[Hashable, list[int]] = defaultdict(list)
    sampled: dict[Hashable, int] = defaultdict(int)
    for row, group in enumerate(np.asarray(index).tolist()):
        sampled[group] += 1
        if bool(valid[row]):
            groups[group].append(row)
    advantages = torch.zeros_like(scores)
    with torch.no_grad():
        for group, rows in groups.items():
            group_scores = scores[rows]
            if len(rows) == 1 and sampled[group] > 1:
                continue  # siblings all invalid: no baseline, no advantage
            if len(rows) == 1:
                mean, std = torch.tensor(0.0), torch.tensor(1.0)
            else:
                mean, std = group_scores.mean(), group_scores.std()
            centred = group_scores - mean
            advantages[rows] = centred / (std + epsilon) if grpo_norm_by_std else centred
    out = advantages.unsqueeze(-1) * response_mask
    return out, out


def register_estimator() -> None:
    """Idempotent: SkyRL's registry refuses a second registration of a name."""
    from skyrl.backends.skyrl_train.utils.ppo_utils import AdvantageEstimatorRegistry

    if ESTIMATOR not in AdvantageEstimatorRegistry.list_available():
        AdvantageEstimatorRegistry.register(ESTIMATOR, compute_valid_grpo_advantage)
