"""Re-score recorded episodes (``deepanalyze-rl rescore``).

A judge outage during collection leaves ``verifier_error`` records whose trajectories are fine;
this recomputes their judge components from the record alone — messages, answer,
``reward_spec``, ``input_seq`` — without re-running the policy or the code (the workspace is
gone by then). Other components are kept as recorded; only those missing that need no
workspace are recomputed (a reward function that raised and has since been fixed). The
aggregate is redone with the plan's weights. The context is rebuilt by the env's own
constructor (:meth:`rewards.RewardContext.for_episode`) in the format the episode was played
in, so a ``tools`` episode passes the same gate and reads the same answer as it did live. A
judge is needed only for records whose plan has judge components. The original record is
never edited: the caller writes the result to a new file with provenance under ``rescore``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from deepanalyze_env.core import tool_calls
from deepanalyze_env.core.contracts import EpisodeRecord, JsonValue, JudgeSummary, VerifierErrorCause
from deepanalyze_env.core.profiles import PROFILES, Profile
from deepanalyze_env.core.records import judge_versions, own_turn_indices, package_version
from rewards import Plan, RewardContext, RewardPlan, RewardSpecError
from rewards.plan import NO_POSITIVE_WEIGHT, weighted_mean

if TYPE_CHECKING:
    from rewards.judge import JudgeClient, JudgeSession

log = logging.getLogger(__name__)


class RescoreSkip(Exception):
    """The record has nothing to re-score (the gate failed, the episode never ran, no plan builds)."""


class PreviousScore(TypedDict):
    """What a rescore replaced, as it was (``rescore.previous``)."""

    reward: float | None
    reward_components: dict[str, float]
    reward_status: str
    error: str | None
    judge: JudgeSummary | None
    rescore: RescoreInfo | None  # an earlier rescore's provenance
    versions: dict[str, JsonValue]  # reward_plan, judge_model, judge_prompts


class RescoreInfo(TypedDict):
    """A rescored record's provenance (``record["rescore"]``): when, from where, by what, and the
    fields it replaced as they were."""

    at: str
    source: str | None
    package: str
    judge: JsonValue  # the judge's identity (``JudgeClient.describe``); None without one
    recomputed: list[str]  # the functions rerun
    previous: PreviousScore


class RescoredRecord(EpisodeRecord):
    """A record after ``rescore``: the record, its scores replaced, with its provenance."""

    rescore: RescoreInfo


@dataclass
class Rescored:
    """One record after rescoring, with its status before and after (what the command reports)."""

    record: RescoredRecord
    before: str  # reward_status before
    after: str


def selectable(record: EpisodeRecord, everything: bool) -> bool:
    """``verifier_error`` records by default; with ``everything`` also scored ones."""
    status = record.get("reward_status")
    return status == "verifier_error" or (everything and status == "scored")


def plan_for(record: EpisodeRecord) -> tuple[Profile, Plan]:
    """The record's profile and reward plan, rebuilt from its ``versions.profile`` and ``reward_spec``."""
    name = (record.get("versions") or {}).get("profile") or "v1"
    profile = PROFILES.get(name)
    if profile is None:
        raise RescoreSkip(f"unknown profile {name!r}")
    try:
        return profile, profile.build_plan(record.get("reward_spec") or {})
    except RewardSpecError as exc:
        raise RescoreSkip(f"reward_spec no longer builds a plan: {exc}")


def judge_functions(records: list[EpisodeRecord]) -> list[str]:
    """Judge functions the records' plans use, so only their prompt files need to exist."""
    names: set[str] = set()
    for record in records:
        try:
            names.update(plan_for(record)[1].needs_judge)
        except RescoreSkip:
            continue
    return sorted(names)


def context_from_record(record: EpisodeRecord, judge: JudgeSession | None) -> RewardContext:
    """The reward context the env built at the final step, rebuilt from the record.

    The episode's assistant messages are the last ``turns`` ones (each ``step`` appends exactly
    one), so a prompt that itself holds assistant messages (few-shot) is told apart correctly. A
    ``tools`` episode (one with structured calls or tool results) gets its turns as the policy
    wrote them (calls as hermes text), its invalid calls as ``tool_errors`` and its
    ``submit_answer`` argument as the answer, as the env read them live.
    """
    messages = [dict(m) for m in record.get("messages") or []]
    assistant = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    mine = own_turn_indices(record)
    tools = tool_calls.is_tools_record(record)
    submitted, errors = None, []
    if tools:
        turns = [tool_calls.assistant_text(messages[i]) for i in mine]
        parsed = [tool_calls.parse_turn(turn) for turn in turns]
        errors = [f"turn {n}: {p.error}: {p.detail}" for n, p in enumerate(parsed, 1) if p.error is not None]
        last = parsed[-1].call if parsed else None
        submitted = last.argument if last is not None and last.name == tool_calls.SUBMIT_ANSWER else None
    else:
        turns = [str(messages[i].get("content") or "") for i in mine]
    return RewardContext.for_episode(
        messages=messages,
        episode_start=mine[0] if mine else len(messages),
        policy_turns=turns,
        reward_spec=record.get("reward_spec") or {},
        question=record.get("input_seq"),
        code_pass=record.get("code_pass") or [],
        exec_statuses=[str((e or {}).get("status")) for e in record.get("exec") or []],
        judge=judge,
        prefix_turns=len(assistant) - len(mine),  # a recovery task's prefix turns precede the episode's
        action_format="tools" if tools else "tags",
        submitted=submitted,
        tool_errors=errors,
    )


@dataclass
class _Score:
    components: dict[str, float]
    reward: float
    status: str
    error: str | None
    recomputed: list[str]
    cause: VerifierErrorCause | None = None  # the record's reward_error_cause


def _score_v1(plan: RewardPlan, record: EpisodeRecord, ctx: RewardContext) -> _Score:
    """Judge functions (and missing workspace-free ones) recomputed; recorded components kept."""
    recorded = dict(record.get("reward_components") or {})
    redo, keep, errors = [], {}, []
    for scorer in plan.functions:
        names = scorer.component_names
        if scorer.fn.needs_judge:
            redo.append(scorer)
        elif all(n in recorded for n in names):
            keep.update({n: recorded[n] for n in names})
        elif "workspace" not in scorer.fn.params:
            redo.append(scorer)
        elif not scorer.fn.optional:
            errors.append(f"{scorer.name}: not in the record and needs the workspace, which is gone")
    sub = RewardPlan(plan.method, redo, {c: 1.0 for s in redo for c in s.component_names})
    outcome = sub.score(ctx)
    if not outcome.format_ok:
        raise RescoreSkip("the format gate fails on the recorded turns")
    cause: VerifierErrorCause = "reward_raised"  # a component missing with its workspace, or no weight
    if outcome.status != "scored" and outcome.error:
        if not errors:
            cause = outcome.cause or "reward_raised"
        errors.append(outcome.error)
    order = [c for s in plan.functions for c in s.component_names]
    merged = {**keep, **outcome.components}
    components = {c: merged[c] for c in order if c in merged}
    redone = [s.name for s in redo]
    reward = None if errors else weighted_mean(components, plan.weights)
    if reward is None:
        error = "; ".join(errors) or NO_POSITIVE_WEIGHT
        return _Score(components, 0.0, "verifier_error", error, redone, cause)
    return _Score(components, reward, "scored", None, redone)


def rescore_record(
    record: EpisodeRecord, judge_client: JudgeClient | None, *, source: str | None = None
) -> Rescored:
    """A new record with judge components (and missing workspace-free ones) recomputed; raises
    :class:`RescoreSkip` when pointless. ``judge_client`` may be None when the plan needs none."""
    from rewards.judge import JudgeSession

    if record.get("reward_status") == "environment_error":
        raise RescoreSkip("the episode hit an environment error; there is nothing to score")
    if record.get("format_ok") is False:
        raise RescoreSkip("the format gate failed; no reward function ran")
    versions = dict(record.get("versions") or {})
    profile, plan = plan_for(record)
    if plan.needs_judge and judge_client is None:
        raise RescoreSkip(f"the plan needs a judge ({', '.join(plan.needs_judge)}) and none is configured")
    session = JudgeSession(judge_client, score_rule=profile.score_rule) if plan.needs_judge else None
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
            (outcome.cause or "reward_raised") if outcome.status == "verifier_error" else None,
        )
    used = judge_client if session is not None else None
    judge_model, judge_prompts = judge_versions(used, plan.needs_judge)
    new = dict(record)
    new.update(
        reward=score.reward,
        reward_components=score.components,
        reward_status=score.status,
        reward_error_cause=score.cause,
        error=score.error,
        judge=session.summary() if session is not None and session.calls else None,
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
            "judge": judge_client.describe() if session is not None else None,
            "recomputed": score.recomputed,
            "previous": {
                k: record.get(k)
                for k in (
                    "reward",
                    "reward_components",
                    "reward_status",
                    "reward_error_cause",
                    "error",
                    "judge",
                    "rescore",
                )
            }
            | {"versions": {k: versions.get(k) for k in ("reward_plan", "judge_model", "judge_prompts")}},
        },
    )
    return Rescored(new, str(record.get("reward_status")), score.status)
