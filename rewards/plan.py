"""A reward plan: the method's components for one task, built and checked at env construction.

Scoring order: format gate (tags over policy text; the fence gate for code methods) → every
component → weighted mean. A component that raises, returns a non-number, or a None it may
not return makes the episode ``verifier_error`` with the cause named; it is never scored 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepanalyze_env.core import protocol
from rewards.methods import Method, get_method
from rewards.registry import Noted, RewardFunction, RewardSpecError, resolve

log = logging.getLogger(__name__)

FORMAT_GATE = "format_gate"
GATE_PENALTY = -1.0


@dataclass
class RewardContext:
    """What a reward function may ask for: it names fields as parameters and gets only those.

    Example::

        @register_reward("short_answer")
        def short_answer(answer: str | None) -> float:
            return float(answer is not None and len(answer) < 200)
    """

    answer: str | None
    """The final answer: text of the policy's last ``<Answer>`` block, after its last ``Answer:``."""
    policy_text: str
    """The policy's own turns joined by newlines (no observations)."""
    trajectory: str
    """Everything after the prompt, observations included, as the model saw it."""
    messages: list[dict]
    """The whole conversation: prompt messages, policy turns, observations."""
    ground_truth: Any
    """``reward_spec["ground_truth"]``."""
    question: str | None
    """The row's ``input_seq`` (what judges are shown as the task)."""
    code_pass: list[int]
    """Per code turn: 1 when the cell passed (profile rule), else 0."""
    turns: int
    """Policy turns taken."""
    workspace: Path | None
    """The episode's scratch folder (files the policy wrote); valid only while scoring."""
    reward_spec: dict
    """The row's whole reward spec (for per-task options such as tolerances)."""
    judge: Any = None
    """The episode's judge session, or None when the plan needs no judge."""
    exec_statuses: list[str] = field(default_factory=list)
    """Per code turn: its exec status (``ok``, ``error``, ``timeout``, ``crashed``, ``no_code``,
    ``skipped``)."""
    prefix_turns: int = 0
    """Policy turns of the row's ``prefix`` (a recovery task); 0 for an ordinary row. Every other
    field covers only the turns after the prefix (``messages`` excepted: the whole conversation)."""
    action_format: str = "tags"
    """How the policy acted: ``tags`` or ``tools`` (``env_config.action_format``); ``answer`` is
    the ``submit_answer`` argument in ``tools``."""
    tool_errors: list[str] = field(default_factory=list)
    """``tools`` format: why each invalid tool call was invalid (any fails the format gate)."""
    policy_turns: list[str] = field(default_factory=list)
    """The policy's own turns, one string each (what ``policy_text`` joins): the format gate
    reads each turn's protocol on its own. Empty: ``policy_text`` is read as one turn."""

    def kwargs_for(self, fn: RewardFunction) -> dict[str, Any]:
        return {name: getattr(self, name) for name in fn.params}


@dataclass
class RewardOutcome:
    """The plan's verdict on one episode; the env copies it into the final step's metadata."""

    reward: float
    components: dict[str, float]
    status: str  # "scored" | "verifier_error"
    format_ok: bool
    gate: str | None
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def _function_refs(reward_spec: Mapping) -> list[str]:
    refs = reward_spec.get("function") or []
    if isinstance(refs, str):
        refs = [refs]
    if not isinstance(refs, list | tuple) or not all(isinstance(r, str) for r in refs):
        raise RewardSpecError(f"reward_spec.function must be a name or a list of names, got {refs!r}")
    return list(refs)


@dataclass
class RewardPlan:
    """A task's reward, built once at env construction from its ``reward_spec``: gate, functions,
    weights — so a bad spec fails before any episode runs."""

    method: Method
    functions: list[RewardFunction]
    weights: dict[str, float]

    @classmethod
    def build(cls, reward_spec: Mapping) -> RewardPlan:
        if not isinstance(reward_spec, Mapping):
            raise RewardSpecError(f"reward_spec must be a mapping, got {type(reward_spec).__name__}")
        if "method" not in reward_spec:
            raise RewardSpecError(
                "reward_spec.method is missing (qa | datatask | openresearch | a registered method)"
            )
        method = get_method(reward_spec["method"])
        functions: list[RewardFunction] = []
        seen_fns = set()
        for ref in [*_function_refs(reward_spec), *method.builtins]:
            fn = resolve(ref)
            if id(fn.fn) in seen_fns:
                continue  # a dataset naming a built-in component again (upstream rows do)
            seen_fns.add(id(fn.fn))
            functions.append(fn)
        names: dict[str, str] = {}
        for fn in functions:
            for comp in fn.component_names:
                if comp == FORMAT_GATE or comp in names:
                    other = names.get(comp, "the format gate")
                    raise RewardSpecError(
                        f"duplicate reward component {comp!r} (from {fn.name!r} and {other!r}); "
                        "rename one of the functions"
                    )
                names[comp] = fn.name
        weights = {comp: float(method.weights.get(comp, 1.0)) for comp in names}
        for comp, weight in (reward_spec.get("weights") or {}).items():
            if comp not in weights:
                raise RewardSpecError(
                    f"reward_spec.weights names unknown component {comp!r}; components: {', '.join(names)}"
                )
            if not isinstance(weight, int | float) or weight < 0 or not math.isfinite(weight):
                raise RewardSpecError(f"reward_spec.weights[{comp!r}] must be a finite number >= 0")
            weights[comp] = float(weight)
        if not any(w > 0 for w in weights.values()):
            raise RewardSpecError("reward_spec.weights leave no component with weight > 0")
        return cls(method, functions, weights)

    @property
    def needs_judge(self) -> list[str]:
        return [fn.name for fn in self.functions if fn.needs_judge]

    def fingerprint(self) -> str:
        """Hash of what determines scoring: method, functions, weights."""
        blob = json.dumps(
            {
                "method": self.method.name,
                "fence_gate": self.method.fence_gate,
                "functions": [f"{fn.name}={fn.fn.__module__}:{fn.fn.__qualname__}" for fn in self.functions],
                "weights": self.weights,
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # ------------------------------------------------------------------ scoring

    def gate(self, ctx: RewardContext) -> tuple[str, str] | None:
        """Which format gate the episode fails and why, or None when it passes. Tags: the
        protocol tags in the policy's text, and Python fences for fence-gated methods. Tools: the
        same in spirit — every call valid, and the episode ended with ``submit_answer`` (code
        goes in a ``code`` argument, so there is no fence to check)."""
        if ctx.action_format == "tools":
            if ctx.tool_errors:
                return "tools", "; ".join(ctx.tool_errors)
            if ctx.answer is None:
                return "tools", "the episode ended without a submit_answer call"
            return None
        missing = protocol.missing_gate_tags(ctx.policy_turns or ctx.policy_text)
        if missing:
            return "tags", f"missing {', '.join(missing)}"
        if self.method.fence_gate and not all(
            protocol.is_python_fenced(block) for block in protocol.code_blocks(ctx.policy_text)
        ):
            return "fence", "a <Code> block is not one ```python fenced block"
        return None

    def score(self, ctx: RewardContext) -> RewardOutcome:
        failed = self.gate(ctx)
        if failed is not None:
            gate, why = failed
            penalty, notes = {FORMAT_GATE: GATE_PENALTY}, {"notes": {FORMAT_GATE: why}}
            return RewardOutcome(GATE_PENALTY, penalty, "scored", False, gate, details=notes)
        components: dict[str, float] = {}
        errors: list[str] = []
        results: dict[str, Any] = {}
        pending = []
        for fn in self.functions:
            if fn.is_async:
                pending.append(fn)
                continue
            try:
                results[fn.name] = fn.fn(**ctx.kwargs_for(fn))
            except Exception as exc:
                errors.append(f"{fn.name}: {type(exc).__name__}: {exc}")
        if pending:
            results.update(self._run_async(pending, ctx, errors))
        notes: dict[str, str] = {}
        for fn in self.functions:
            if fn.name in results:
                value = results[fn.name]
                if isinstance(value, Noted):
                    notes[fn.name] = str(value.note)
                    value = value.value
                self._collect(fn, value, components, errors)
        details = {"notes": notes} if notes else {}
        if errors:
            return RewardOutcome(0.0, components, "verifier_error", True, None, "; ".join(errors), details)
        weight = {c: self.weights.get(c, 1.0) for c in components}
        total = sum(w for w in weight.values() if w > 0)
        if total <= 0:
            return RewardOutcome(
                0.0,
                components,
                "verifier_error",
                True,
                None,
                "no component with weight > 0 applied to this episode",
            )
        reward = sum(weight[c] * v for c, v in components.items() if weight[c] > 0) / total
        return RewardOutcome(reward, components, "scored", True, None, None, details)

    @staticmethod
    def _run_async(fns: list[RewardFunction], ctx: RewardContext, errors: list[str]) -> dict[str, Any]:
        from rewards.aio import run_sync

        async def gather():
            return await asyncio.gather(*(fn.fn(**ctx.kwargs_for(fn)) for fn in fns), return_exceptions=True)

        out: dict[str, Any] = {}
        for fn, value in zip(fns, run_sync(gather()), strict=True):
            if isinstance(value, BaseException):
                errors.append(f"{fn.name}: {type(value).__name__}: {value}")
            else:
                out[fn.name] = value
        return out

    @staticmethod
    def _collect(fn: RewardFunction, value: Any, components: dict[str, float], errors: list[str]) -> None:
        if value is None:
            if not fn.optional:
                errors.append(f"{fn.name}: returned None (a reward that could not be computed)")
            return
        if isinstance(value, Mapping):
            expected = set(fn.component_names) if fn.components is not None else set(value)
            if set(value) != expected:
                errors.append(f"{fn.name}: returned keys {sorted(value)}, declared {sorted(expected)}")
                return
            items = list(value.items())
        else:
            items = [(fn.component_names[0], value)]
        for name, raw in items:
            if name in components or name == FORMAT_GATE:
                errors.append(f"{fn.name}: component {name!r} is produced twice")
                continue
            if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
                errors.append(f"{fn.name}: component {name!r} is not a finite number ({raw!r})")
                continue
            components[name] = float(raw)
