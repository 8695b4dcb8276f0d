"""Re-score recorded episodes with the current judge (``deepanalyze-rl rescore``).

A judge outage during collection leaves ``verifier_error`` records whose trajectories are fine;
this recomputes their judge components from the record alone — messages, answer,
``reward_spec``, ``input_seq`` — without re-running the policy or the code (the workspace is
gone by then). Other components are kept as recorded; only those missing that need no
workspace are recomputed. The aggregate is redone with the plan's weights. The original record
is never edited: the caller writes the result to a new file with provenance under ``rescore``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from deepanalyze_env.core import protocol
from deepanalyze_env.core.profiles import PROFILES
from deepanalyze_env.core.records import judge_versions, own_turn_indices, package_version
from rewards import RewardContext, RewardPlan, RewardSpecError

log = logging.getLogger(__name__)


class RescoreSkip(Exception):
    """The record has nothing a judge could change (gate failed, episode never ran, no judge)."""


@dataclass
class Rescored:
    """One record after rescoring, with its status before and after (what the command reports)."""

    record: dict[str, Any]
    before: str  # reward_status before
    after: str


def selectable(record: dict[str, Any], everything: bool) -> bool:
    """``verifier_error`` records by default; with ``everything`` also scored ones."""
    status = record.get("reward_status")
    return status == "verifier_error" or (everything and status == "scored")


def plan_for(record: dict[str, Any]) -> tuple[Any, Any]:
    """The record's profile and reward plan, rebuilt from its ``versions.profile`` and ``reward_spec``."""
    name = (record.get("versions") or {}).get("profile") or "v1"
    profile = PROFILES.get(name)
    if profile is None:
        raise RescoreSkip(f"unknown profile {name!r}")
    try:
        return profile, profile.build_plan(record.get("reward_spec") or {})
    except RewardSpecError as exc:
        raise RescoreSkip(f"reward_spec no longer builds a plan: {exc}")


def judge_functions(records: list[dict[str, Any]]) -> list[str]:
    """Judge functions the records' plans use, so only their prompt files need to exist."""
    names: set[str] = set()
    for record in records:
        try:
            names.update(plan_for(record)[1].needs_judge)
        except RescoreSkip:
            continue
    return sorted(names)


def context_from_record(record: dict[str, Any], judge: Any) -> RewardContext:
    """The reward context the env built at the final step, rebuilt from the record.

    The episode's assistant messages are the last ``turns`` ones (each ``step`` appends exactly
    one), so a prompt that itself holds assistant messages (few-shot) is told apart correctly.
    """
    messages = [dict(m) for m in record.get("messages") or []]
    assistant = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    mine = own_turn_indices(record)
    start = mine[0] if mine else len(messages)
    policy_turns = [messages[i].get("content") or "" for i in mine]
    spec = record.get("reward_spec") or {}
    return RewardContext(
        answer=protocol.extract_answer(policy_turns),
        policy_text="\n".join(policy_turns),
        policy_turns=policy_turns,
        trajectory="".join(m.get("content") or "" for m in messages[start:]),
        messages=messages,
        ground_truth=spec.get("ground_truth"),
        question=record.get("input_seq"),
        code_pass=list(record.get("code_pass") or []),
        turns=len(policy_turns),
        workspace=None,
        reward_spec=dict(spec),
        judge=judge,
        exec_statuses=[str((e or {}).get("status")) for e in record.get("exec") or []],
        prefix_turns=len(assistant) - len(mine),  # a recovery task's prefix turns precede the episode's
    )


def _aggregate(components: dict[str, float], weights: dict[str, float]) -> float | None:
    total = sum(weights.get(c, 1.0) for c in components if weights.get(c, 1.0) > 0)
    if total <= 0:
        return None
    return sum(weights.get(c, 1.0) * v for c, v in components.items() if weights.get(c, 1.0) > 0) / total


@dataclass
class _Score:
    components: dict[str, float]
    reward: float
    status: str
    error: str | None
    recomputed: list[str]


def _score_v1(plan: RewardPlan, record: dict[str, Any], ctx: RewardContext) -> _Score:
    """Judge functions (and missing workspace-free ones) recomputed; recorded components kept."""
    recorded = dict(record.get("reward_components") or {})
    redo, keep, errors = [], {}, []
    for fn in plan.functions:
        names = fn.component_names
        if fn.needs_judge:
            redo.append(fn)
        elif all(n in recorded for n in names):
            keep.update({n: recorded[n] for n in names})
        elif "workspace" not in fn.params:
            redo.append(fn)
        elif not fn.optional:
            errors.append(f"{fn.name}: not in the record and needs the workspace, which is gone")
    sub = RewardPlan(plan.method, redo, {c: 1.0 for fn in redo for c in fn.component_names})
    outcome = sub.score(ctx)
    if not outcome.format_ok:
        raise RescoreSkip("the format gate fails on the recorded turns")
    if outcome.status != "scored" and outcome.error:
        errors.append(outcome.error)
    order = [c for fn in plan.functions for c in fn.component_names]
    merged = {**keep, **outcome.components}
    components = {c: merged[c] for c in order if c in merged}
    redone = [fn.name for fn in redo]
    reward = None if errors else _aggregate(components, plan.weights)
    if reward is None:
        error = "; ".join(errors) or "no component with weight > 0 applied to this episode"
        return _Score(components, 0.0, "verifier_error", error, redone)
    return _Score(components, reward, "scored", None, redone)


def rescore_record(record: dict[str, Any], judge_client: Any, *, source: str | None = None) -> Rescored:
    """A new record with judge components recomputed; raises :class:`RescoreSkip` when pointless."""
    from rewards.judge import JudgeSession

    if record.get("reward_status") == "environment_error":
        raise RescoreSkip("the episode hit an environment error; there is nothing to judge")
    if record.get("format_ok") is False:
        raise RescoreSkip("the format gate failed; no judge was involved")
    versions = dict(record.get("versions") or {})
    profile, plan = plan_for(record)
    if not plan.needs_judge:
        raise RescoreSkip("the reward plan has no judge components")
    session = JudgeSession(judge_client, score_rule=profile.score_rule)
    ctx = context_from_record(record, session)
    if isinstance(plan, RewardPlan):
        score = _score_v1(plan, record, ctx)
    else:  # the upstream plan scores from the history alone; rerun it whole
        outcome = plan.score(ctx)
        if not outcome.format_ok:
            raise RescoreSkip("the format gate fails on the recorded turns")
        score = _Score(
            dict(outcome.components),
            float(outcome.reward),
            outcome.status,
            outcome.error,
            list(plan.needs_judge),
        )
    judge_model, judge_prompts = judge_versions(judge_client, plan.needs_judge)
    new = dict(record)
    new.update(
        reward=score.reward,
        reward_components=score.components,
        reward_status=score.status,
        error=score.error,
        judge=session.summary() if session.calls else None,
        versions={
            **versions,
            "reward_plan": plan.fingerprint(),
            "judge_model": judge_model,
            "judge_prompts": judge_prompts,
        },
        rescore={
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "source": source,
            "package": package_version(),
            "judge": judge_client.describe(),
            "recomputed": score.recomputed,
            "previous": {
                k: record.get(k)
                for k in ("reward", "reward_components", "reward_status", "error", "judge", "rescore")
            }
            | {"versions": {k: versions.get(k) for k in ("reward_plan", "judge_model", "judge_prompts")}},
        },
    )
    return Rescored(new, str(record.get("reward_status")), score.status)
