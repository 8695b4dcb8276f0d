"""Deterministic reward components (no judge): answer match, code pass rate, turn shaping."""

from __future__ import annotations

from rewards.normalize import answers_match
from rewards.registry import Noted, register_reward


@register_reward("qa_accuracy")
def qa_accuracy(answer: str | None, ground_truth) -> float | Noted:
    """Normalised match of the final answer against the ground truth; a miss whose answer could not
    be read as the number the truth is carries the reason as its note."""
    verdict = answers_match(answer, ground_truth)
    return Noted(float(verdict.match), verdict.note) if verdict.note else float(verdict.match)


@register_reward("qa_exact")
def qa_exact(answer: str | None, ground_truth) -> float:
    """Raw string equality, as upstream scored it; reported for comparison, weight 0."""
    return float(answer is not None and answer == str(ground_truth))


@register_reward("datatask_code", optional=True)
@register_reward("openresearch_code", optional=True)
def code_pass_rate(code_pass: list[int]) -> float | None:
    """Mean per-turn code_pass; absent when no code turn ran (nothing to average)."""
    if not code_pass:
        return None
    return sum(code_pass) / len(code_pass)


@register_reward("openresearch_turns")
def openresearch_turns(turns: int) -> float:
    """Rewards taking several analysis steps on open-ended tasks: min(turns / 10, 1)."""
    return min(turns / 10.0, 1.0)
