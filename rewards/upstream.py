"""The ``upstream`` profile's scoring: DeepAnalyze's reward, reproduced for comparison runs.

Given the same trajectory and the same judge replies this gives the reward DeepAnalyze's RL
environment gave (docs/design.md §8): gate and answer over the whole history *including*
execution output, raw ``==`` after splitting on ``Answer:``, the ```python fence gate, the
first ``SCORE:`` match, DeepAnalyze's component names (a scalar judge keyed by
``str(reward_spec["function"])``, so two scalar functions collide exactly as there), and a plain
mean. Kept from v1: unknown function names fail at construction, and a judge failure — scored
0.0 as upstream did — is flagged ``verifier_error`` instead of passing as a real 0.

Judge replies are rendered, asked and read by the episode's :class:`~rewards.judge.JudgeSession`
(with the profile's first-``SCORE:`` rule), the same code ``judge-eval`` scores through, so one
reply is one score under both; a reply that rule cannot read (no score, a score out of the
rubric's range) is a judge failure here too.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

from deepanalyze_env.core import protocol
from deepanalyze_env.core.contracts import JsonValue
from rewards.judge.errors import JudgeError
from rewards.judge.parse import DIMENSIONS
from rewards.plan import FORMAT_GATE, GATE_PENALTY, Failure, RewardContext, RewardOutcome
from rewards.registry import RewardSpecError, resolve

GATE_TAGS = protocol.GATE_TAGS  # the same four tags; upstream reads them over the whole history
# The fields of each judge's prompt that the episode wrote: a failure their text causes (too long
# for the judge, a verdict of its own read back) is the policy's and scores 0 (docs/design.md §6).
_POLICY_FIELDS = {
    "judge_analysis": ("trajectory",),
    "judge_accuracy": ("candidate",),
    "judge_opendomain": ("candidate",),
}


def upstream_answer(history: str) -> str:
    """Text of the last ``<Answer>`` block in the history; ``""`` when it has no closing tag."""
    start = history.rfind("<Answer>")
    if start < 0:
        return ""
    end = history.find("</Answer>", start)  # a plain find: no regex scan a policy can make slow
    return history[start + len("<Answer>") : end].strip() if end >= 0 else ""


def upstream_exact(history: str, ground_truth: JsonValue) -> float:
    answer = upstream_answer(history)
    if "Answer:" in answer:
        answer = answer.split("Answer:")[1].strip()
    return float(answer == ground_truth)  # raw equality: "42" != 42, as upstream


def fence_ok(history: str) -> bool:
    for block in protocol.blocks(history, protocol.CODE_OPEN, protocol.CODE_CLOSE):
        body = block.strip()
        if not (body.startswith("```python") and body.endswith("```")):
            return False
    return True


@dataclass
class UpstreamPlan:
    """DeepAnalyze's own reward computation (the ``upstream`` profile), reproduced so v1's fixes can be
    measured against it."""

    method: str
    functions: list[str]  # canonical judge names, in reward_spec order
    function_key: str  # str(reward_spec["function"]): the component name of a scalar judge

    @classmethod
    def build(cls, reward_spec: Mapping) -> UpstreamPlan:
        method = reward_spec.get("method")
        if method not in ("qa", "datatask", "openresearch"):
            raise RewardSpecError(
                f"profile upstream knows methods qa, datatask, openresearch; got {method!r}"
            )
        if reward_spec.get("weights"):
            raise RewardSpecError(
                "profile upstream scores a plain mean; remove reward_spec.weights or use v1"
            )
        raw = reward_spec.get("function") or []
        refs = [raw] if isinstance(raw, str | Mapping) else list(raw)
        if not all(isinstance(ref, str) for ref in refs):
            raise RewardSpecError("profile upstream takes reward_spec.function as names only (no args)")
        functions = []
        if method != "qa":
            for ref in refs:
                from rewards.judges import RUBRIC_OF

                fn = resolve(ref)  # v1 kept: an unknown name fails here, not silently later
                if fn.name not in RUBRIC_OF:
                    raise RewardSpecError(f"profile upstream only runs DeepAnalyze's judges, not {ref!r}")
                functions.append(RUBRIC_OF[fn.name])
        return cls(method, functions, str(raw))

    @property
    def needs_judge(self) -> list[str]:
        return ["judge_analysis"] if self.method == "qa" else list(self.functions)

    @property
    def needs_prefix(self) -> list[str]:
        """None of DeepAnalyze's judges scores a recovery prefix."""
        return []

    @property
    def weights(self) -> None:
        """None: upstream scored a plain mean of whatever components an episode produced."""
        return None

    @property
    def fence_gate(self) -> bool:
        return self.method != "qa"

    def fingerprint(self) -> str:
        blob = json.dumps({"profile": "upstream", "method": self.method, "functions": self.functions})
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def score(self, ctx: RewardContext) -> RewardOutcome:
        history = ctx.trajectory
        if any(tag not in history for tag in GATE_TAGS):
            return RewardOutcome(GATE_PENALTY, {FORMAT_GATE: GATE_PENALTY}, "scored", False, "tags")
        if self.fence_gate and not fence_ok(history):
            return RewardOutcome(GATE_PENALTY, {FORMAT_GATE: GATE_PENALTY}, "scored", False, "fence")
        from rewards.aio import run_sync

        errors: list[Failure] = []
        components: dict[str, float] = {}
        if self.method == "qa":
            components["qa_acc_reward"] = upstream_exact(history, ctx.ground_truth)
            value = run_sync(self._judge(ctx, "judge_analysis", errors))
            components["qa_analysisc_reward"] = value if isinstance(value, float) else 0.0
        else:

            async def all_judges() -> list:
                return await asyncio.gather(*(self._judge(ctx, fn, errors) for fn in self.functions))

            values = run_sync(all_judges())
            for value in values:
                if isinstance(value, dict):
                    components.update(value)
                else:
                    components[self.function_key] = value
            if ctx.code_pass:
                components[f"{self.method}_code_reward"] = sum(ctx.code_pass) / len(ctx.code_pass)
            if self.method == "openresearch":
                components["openresearch_turns_reward"] = min(ctx.turns / 10.0, 1.0)
        reward = sum(components.values()) / len(components) if components else 0.0
        if errors:
            error = "; ".join(f.message for f in errors)
            return RewardOutcome(
                reward, components, "verifier_error", True, None, error, cause=errors[0].cause
            )
        return RewardOutcome(reward, components, "scored", True, None, None)

    async def _judge(self, ctx: RewardContext, name: str, errors: list[Failure]) -> float | dict[str, float]:
        """One judge call through the episode's session, scaled as upstream did (/5); any failure
        scores 0.0 and is recorded (the session keeps the call, reply and parse error)."""
        history = ctx.trajectory
        answer = upstream_answer(history)
        zero: float | dict[str, float] = dict.fromkeys(DIMENSIONS, 0.0) if name == "judge_opendomain" else 0.0
        if name != "judge_analysis" and not answer:
            return zero  # upstream returned 0.0 without calling when there was no answer
        reference = "" if ctx.ground_truth is None else str(ctx.ground_truth)
        fields = {
            "judge_analysis": {"question": ctx.question or "", "trajectory": history},
            "judge_accuracy": {"question": ctx.question or "", "reference": reference, "candidate": answer},
            "judge_opendomain": {"question": ctx.question or "", "reference": reference, "candidate": answer},
        }[name]
        try:
            if ctx.judge is None:
                raise RuntimeError(f"{name} needs a judge but none was configured (env_config.judge)")
            verdict = await ctx.judge.evaluate(name, fields, policy_fields=_POLICY_FIELDS[name])
        except JudgeError as exc:
            if not exc.policy_caused:  # the judge's or the task's fault: flagged, not a real 0
                errors.append(Failure.raised(name, exc))
            return zero  # the episode's own text made the call fail: its 0, scored (as in v1)
        except Exception as exc:
            errors.append(Failure.raised(name, exc))
            return zero
        if isinstance(verdict, dict):
            return {dim: float(verdict[dim]) / 5.0 for dim in DIMENSIONS}
        return float(verdict) / 5.0
