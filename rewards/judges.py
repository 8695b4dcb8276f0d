"""LLM-judge reward components (docs/design.md §7; issue "Rewards": judge components).

Each function is registered under its v1 name and under DeepAnalyze's name, so upstream
datasets that list ``llm_as_judgement_*`` in ``reward_spec["function"]`` run unchanged. The
``judge`` context field is the episode's :class:`rewards.judge.JudgeSession`; a failure outside
the policy (unreachable judge, unparsable reply, replay miss, a task too long for the judge)
raises, which the reward plan turns into ``verifier_error`` — a judge outage must never look
like a bad answer. A failure the episode's own text or output caused (a prompt that does not fit
because of it, content the judge refuses, a reply whose verdict is one the policy wrote or that
was cut while quoting its verdicts) scores the rubric 0 with the reason as a note: excluding it
would let a policy hide a bad episode from training.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from deepanalyze_env.core.contracts import JsonValue
from rewards.judge.client import Verdict
from rewards.judge.errors import JudgeError
from rewards.judge.parse import DIMENSIONS
from rewards.judge.session import JudgeSession
from rewards.judge.transcript import Transcript, episode_transcript
from rewards.registry import Noted, register_reward

OPENDOMAIN_COMPONENTS = tuple(f"openresearch_{dim}" for dim in DIMENSIONS)
NO_REFERENCE = "(no reference provided)"

# Registered name (v1 or upstream alias) → the rubric prompt file it renders.
RUBRIC_OF = {
    "judge_analysis": "judge_analysis",
    "llm_as_judgement_analyze": "judge_analysis",
    "judge_accuracy": "judge_accuracy",
    "llm_as_judgement_accuracy": "judge_accuracy",
    "judge_opendomain": "judge_opendomain",
    "llm_as_judgement_opendomain": "judge_opendomain",
}


def rubrics_for(function_names: Iterable[str]) -> tuple[str, ...]:
    """Rubrics a plan's functions use, so env construction can check their prompt files early."""
    return tuple(dict.fromkeys(RUBRIC_OF[name] for name in function_names if name in RUBRIC_OF))


def _session(judge: JudgeSession | None, function: str) -> JudgeSession:
    if judge is None:
        raise RuntimeError(f"{function} needs a judge but none was configured (env_config.judge)")
    return judge


async def _ask(
    session: JudgeSession,
    rubric: str,
    fields: dict[str, str | Transcript],
    policy_fields: tuple[str, ...],
    zero: Verdict,
) -> Verdict | Noted:
    """The judge's verdict, or ``zero`` with the reason when the failure is the policy's own
    (``JudgeError.policy_caused``: its text makes the prompt too long for the judge or is refused
    for its content, or the judge's verdict is one the policy wrote) — scored, never ``verifier_error``,
    which training masks: a policy could otherwise hide a bad episode by rambling or quoting."""
    try:
        return await session.evaluate(rubric, fields, policy_fields=policy_fields)
    except JudgeError as exc:
        if not exc.policy_caused:
            raise
        return Noted(zero, str(exc))


def _as_text(value: JsonValue) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True)
    return str(value)


@register_reward(
    "judge_analysis", components=("qa_analysis",), needs_judge=True, aliases=("llm_as_judgement_analyze",)
)
async def judge_analysis(
    question: str | None, messages: list[dict], turns: int, prefix_turns: int, judge: JudgeSession | None
) -> float | Noted:
    """Quality of the analysis process (1–5) over the whole trajectory, observations included → /5.

    The judge sees what the policy saw, so it can tell a conclusion the outputs support from
    one they contradict; the result lies in [0.2, 1]. It reads the episode as authored parts
    (:func:`rewards.judge.transcript.episode_transcript`), not the ``trajectory`` text: there an
    ``<Execute>`` block the policy typed itself is indistinguishable from a real observation. A
    recovery row's prefix is shown as recorded turns, for context.
    """
    session = _session(judge, "judge_analysis")
    transcript = episode_transcript(messages, turns, prefix_turns)
    fields = {"question": _as_text(question), "trajectory": transcript}
    score = await _ask(session, "judge_analysis", fields, ("trajectory",), 0.0)
    return score if isinstance(score, Noted) else float(score) / 5.0


@register_reward(
    "judge_accuracy", components=("judge_accuracy",), needs_judge=True, aliases=("llm_as_judgement_accuracy",)
)
async def judge_accuracy(
    question: str | None, answer: str | None, ground_truth: JsonValue, judge: JudgeSession | None
) -> float | Noted:
    """Agreement of the final answer with the reference (0–5) → /5.

    A missing answer scores 0.0 without a call: there is nothing to compare, and the format
    gate normally rejects such an episode before this runs. A missing reference is an error
    (the rubric cannot be applied), not a 0.
    """
    session = _session(judge, "judge_accuracy")
    if answer is None:
        return 0.0
    reference = _as_text(ground_truth)
    if not reference.strip():
        raise ValueError("judge_accuracy needs reward_spec.ground_truth (the reference answer); it is empty")
    fields = {"question": _as_text(question), "reference": reference, "candidate": answer}
    score = await _ask(session, "judge_accuracy", fields, ("candidate",), 0.0)
    return score if isinstance(score, Noted) else float(score) / 5.0


@register_reward(
    "judge_opendomain",
    components=OPENDOMAIN_COMPONENTS,
    needs_judge=True,
    aliases=("llm_as_judgement_opendomain",),
)
async def judge_opendomain(
    question: str | None, answer: str | None, ground_truth: JsonValue, judge: JudgeSession | None
) -> dict[str, float] | Noted:
    """Five report dimensions (usefulness, richness, soundness, interpretability, readability), each 1–5 → /5.

    A missing answer scores 0.0 on every dimension without a call: there is no report to
    judge. The reference (often empty for open research) is shown when given.
    """
    session = _session(judge, "judge_opendomain")
    if answer is None:
        return dict.fromkeys(OPENDOMAIN_COMPONENTS, 0.0)
    reference = _as_text(ground_truth)
    fields = {
        "question": _as_text(question),
        "reference": reference if reference.strip() else NO_REFERENCE,
        "candidate": answer,
    }
    scores = await _ask(
        session, "judge_opendomain", fields, ("candidate",), dict.fromkeys(OPENDOMAIN_COMPONENTS, 0.0)
    )
    if isinstance(scores, Noted):
        return scores
    assert isinstance(scores, dict)
    return {f"openresearch_{dim}": float(scores[dim]) / 5.0 for dim in DIMENSIONS}
