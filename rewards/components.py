"""Deterministic reward components (no judge): answer match, code pass rate, turn shaping."""

from __future__ import annotations

from rewards.normalize import answers_match
from rewards.registry import Noted, register_reward, with_notes


@register_reward("qa_accuracy")
def qa_accuracy(answer: str | None, ground_truth) -> float | Noted:
    """Normalised match of the final answer against the ground truth; a miss whose answer could not
    be read as the number the truth is carries the reason as its note."""
    verdict = answers_match(answer, ground_truth)
    return with_notes(float(verdict.match), verdict.note)


@register_reward("qa_exact")
def qa_exact(answer: str | None, ground_truth) -> float:
    """Raw string equality, as upstream scored it; reported for comparison, weight 0."""
    return float(answer is not None and answer == str(ground_truth))


@register_reward("datatask_code")
@register_reward("openresearch_code")
def code_pass_rate(code_pass: list[int]) -> float:
    """Mean per-turn code_pass; 0 when no code turn ran. Leaving the component out then (as it
    once was) made skipping code pay: an answer-only episode was scored on its other components
    alone, while one failing cell halved the reward of an episode that tried."""
    if not code_pass:
        return 0.0
    return sum(code_pass) / len(code_pass)


@register_reward("openresearch_turns")
def openresearch_turns(code_pass: list[int]) -> float:
    """Rewards taking several analysis steps on open-ended tasks: min(steps / 10, 1), where a step
    is a cell that earned code_pass. Counting turns instead paid for turns that do nothing (a
    ``pass`` cell, a turn without code, a cell that fails): each one raised the component."""
    return min(sum(code_pass) / 10.0, 1.0)
