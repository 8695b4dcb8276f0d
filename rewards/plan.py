"""A reward plan: the method's components for one task, built and checked at env construction.

Scoring order: format gate (tags over policy text; the fence gate for code methods) → every
component → weighted mean (:func:`weighted_mean`, which ``rescore`` uses too). A component that
raises, returns a non-number, or a None it may not return makes the episode ``verifier_error``
with the reason named in ``error`` and its kind in ``cause`` (:func:`exception_cause`; the first
failing function's, in plan order); it is never scored 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict, runtime_checkable

from deepanalyze_env.core.contracts import (
    VERIFIER_ERROR_CAUSES,
    Gate,
    JsonValue,
    RewardStatus,
    VerifierErrorCause,
)
from deepanalyze_env.core.formats import get_format
from rewards.answers import accuracy_component
from rewards.context import RewardContext
from rewards.methods import Method, get_method
from rewards.registry import Noted, RewardFunction, RewardSpecError, check_args, resolve

__all__ = [
    "FORMAT_GATE",
    "GATE_PENALTY",
    "NO_POSITIVE_WEIGHT",
    "Plan",
    "RewardContext",
    "RewardOutcome",
    "RewardPlan",
    "Scorer",
    "exception_cause",
    "spec_accuracy_component",
    "weighted_mean",
]

log = logging.getLogger(__name__)

FORMAT_GATE = "format_gate"
GATE_PENALTY = -1.0
NO_POSITIVE_WEIGHT = "no component with weight > 0 applied to this episode"


def exception_cause(exc: BaseException) -> VerifierErrorCause:
    """Why a reward function's exception excludes the episode: the ``verifier_cause`` its class
    names (the judge's errors: ``rewards/judge/errors.py``), else ``reward_raised`` — also for a
    value this version does not know, so a cause is always one of ``VERIFIER_ERROR_CAUSES``."""
    cause = getattr(exc, "verifier_cause", "reward_raised")
    return cause if cause in VERIFIER_ERROR_CAUSES else "reward_raised"


def weighted_mean(components: Mapping[str, float], weights: Mapping[str, float]) -> float | None:
    """An episode's reward from its components: their mean weighted by ``weights`` (1.0 for a
    component it does not name) over the components with weight > 0; None when none has one
    (the caller makes that ``verifier_error`` with :data:`NO_POSITIVE_WEIGHT`). The one rule for
    the aggregate, so a live score and a ``rescore`` of the same components agree."""
    weight = {c: weights.get(c, 1.0) for c in components}
    total = sum(w for w in weight.values() if w > 0)
    if total <= 0:
        return None
    return sum(weight[c] * v for c, v in components.items() if weight[c] > 0) / total


class OutcomeDetails(TypedDict, total=False):
    """What an outcome says beyond its numbers (the env copies ``notes`` to ``reward_notes``)."""

    notes: dict[str, str]  # function name (or format_gate) → why it scored what it did


@dataclass
class RewardOutcome:
    """The plan's verdict on one episode; the env copies it into the final step's metadata."""

    reward: float
    components: dict[str, float]
    status: RewardStatus  # a plan gives "scored" or "verifier_error"; "environment_error" is the env's
    format_ok: bool
    gate: Gate | None
    error: str | None = None
    details: OutcomeDetails = field(default_factory=OutcomeDetails)
    cause: VerifierErrorCause | None = (
        None  # why it is "verifier_error" (the env reads a None there as reward_raised)
    )


@dataclass(frozen=True)
class Failure:
    """One reward function's failure: the ``error`` text and its cause."""

    message: str  # "{function}: {ExcType}: {message}", or what was wrong with its value
    cause: VerifierErrorCause

    @classmethod
    def raised(cls, function: str, exc: BaseException) -> Failure:
        """``function`` (its name, or its ``as`` name) raised ``exc``."""
        return cls(f"{function}: {type(exc).__name__}: {exc}", exception_cause(exc))


@dataclass(frozen=True)
class FunctionRef:
    """One ``reward_spec["function"]`` item, parsed: a name, or ``{"name", "args", "as"}``."""

    name: str
    args: Mapping[str, JsonValue]
    alias: str | None  # "as": the component name (a prefix for a multi-component function)
    where: str  # "reward_spec.function[1]", for errors


FUNCTION_KEYS = ("name", "args", "as")


def function_refs(reward_spec: Mapping) -> list[FunctionRef]:
    """The items of ``reward_spec["function"]``: a name, an object, or a list of either."""
    raw = reward_spec.get("function") or []
    items = [raw] if isinstance(raw, str | Mapping) else raw
    if not isinstance(items, list | tuple):
        raise RewardSpecError(
            f"reward_spec.function must be a name, an object or a list of them, got {raw!r}"
        )
    refs = []
    for index, item in enumerate(items):
        where = f"reward_spec.function[{index}]"
        if isinstance(item, str):
            refs.append(FunctionRef(item, {}, None, where))
            continue
        if not isinstance(item, Mapping):
            raise RewardSpecError(f'{where}: expected a name or {{"name", "args", "as"}}, got {item!r}')
        unknown = sorted(set(item) - set(FUNCTION_KEYS))
        if unknown:
            raise RewardSpecError(f"{where}: unknown key(s) {', '.join(unknown)} (known: name, args, as)")
        name, alias = item.get("name"), item.get("as")
        if not isinstance(name, str) or not name:
            raise RewardSpecError(f"{where}: 'name' must be a reward function name")
        if alias is not None and (not isinstance(alias, str) or not alias or alias == FORMAT_GATE):
            raise RewardSpecError(f"{where}: 'as' must be a component name other than {FORMAT_GATE!r}")
        args = item.get("args")
        refs.append(FunctionRef(name, args if args is not None else {}, alias, where))
    return refs


def spec_accuracy_component(reward_spec: Mapping[str, object] | None) -> str | None:
    """The component of ``reward_spec``'s plan that says whether the answer is right
    (:func:`rewards.accuracy_component` over the method's built-ins and the spec's functions),
    read leniently: a spec that no longer builds still names what it can (eval reports read it
    from old records)."""
    spec = reward_spec or {}
    try:
        names = list(get_method(str(spec.get("method"))).builtins)
    except RewardSpecError:
        names = []
    try:
        refs = function_refs(spec)
    except RewardSpecError:
        refs = []
    for ref in refs:
        try:
            names += list(Scorer(resolve(ref.name), ref.args, ref.alias).component_names)
        except (RewardSpecError, ImportError):
            names.append(ref.alias or ref.name.rsplit(":", 1)[-1])
    return accuracy_component(names)


@dataclass(frozen=True)
class Scorer:
    """A reward function as one plan calls it: its per-task arguments, and the component name(s)
    it produces (``as`` renames them, so one function can appear twice with different arguments)."""

    fn: RewardFunction
    args: Mapping[str, JsonValue]  # checked against its signature (``registry.check_args``)
    alias: str | None = None

    @property
    def name(self) -> str:
        """The label its errors, notes and fingerprint use: ``as`` when given, else the function's name."""
        return self.alias or self.fn.name

    @property
    def component_names(self) -> tuple[str, ...]:
        return tuple(self.component(c) for c in self.fn.component_names)

    def component(self, key: str) -> str:
        """The plan's name for component ``key`` of the function's result."""
        if self.alias is None:
            return key
        declared = self.fn.components
        if (declared is not None and len(declared) > 1) or (declared is None and key != self.fn.name):
            return f"{self.alias}.{key}"
        return self.alias

    def call(self, ctx: RewardContext) -> Any:
        return self.fn.fn(**ctx.kwargs_for(self.fn), **self.args)

    def identity(self) -> str:
        """What the fingerprint records: the function, and its arguments and name when given."""
        text = f"{self.fn.name}={self.fn.target}"
        if self.args:
            text += json.dumps(dict(self.args), sort_keys=True, default=repr)
        return text + (f" as {self.alias}" if self.alias else "")


@runtime_checkable
class Plan(Protocol):
    """What the env, ``rescore`` and the viewer use of a reward plan, whichever profile built it
    (:class:`RewardPlan` for ``v1``, ``rewards.upstream.UpstreamPlan`` for ``upstream``)."""

    @property
    def needs_judge(self) -> list[str]:
        """Registered names of the judge functions it calls (their rubrics must exist)."""
        ...

    @property
    def needs_prefix(self) -> list[str]:
        """Components only a row with a prefix (a recovery task) can score; the env refuses a row
        without one for them."""
        ...

    @property
    def weights(self) -> Mapping[str, float] | None:
        """Weight per component; None: a plain mean of whatever components it produces."""
        ...

    def fingerprint(self) -> str:
        """A hash of everything that decides the score (recorded as ``versions.reward_plan``)."""
        ...

    def score(self, ctx: RewardContext) -> RewardOutcome:
        """The episode's verdict; raises only on a bug (the env makes that ``verifier_error``)."""
        ...


@dataclass
class RewardPlan:
    """A task's reward, built once at env construction from its ``reward_spec``: gate, functions
    with their arguments, weights — so a bad spec fails before any episode runs."""

    method: Method
    functions: list[Scorer]
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
        refs = function_refs(reward_spec)
        refs += [FunctionRef(name, {}, None, f"method {method.name}") for name in method.builtins]
        functions: list[Scorer] = []
        seen = set()
        for ref in refs:
            try:
                fn = resolve(ref.name)
            except RewardSpecError as exc:
                raise RewardSpecError(f"{ref.where}: {exc}") from None
            scorer = Scorer(fn, check_args(fn, ref.args, f"{ref.where} ({ref.name})"), ref.alias)
            key = (id(fn.fn), json.dumps(dict(scorer.args), sort_keys=True, default=repr), ref.alias)
            if key in seen:
                continue  # a dataset naming a built-in component again (upstream rows do)
            seen.add(key)
            functions.append(scorer)
        names: dict[str, str] = {}
        for scorer in functions:
            for comp in scorer.component_names:
                if comp == FORMAT_GATE or comp in names:
                    other = names.get(comp, "the format gate")
                    raise RewardSpecError(
                        f"duplicate reward component {comp!r} (from {scorer.name!r} and {other!r}); "
                        'rename one of the functions, or give one an "as" name in reward_spec.function'
                    )
                names[comp] = scorer.name
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
        return list(dict.fromkeys(s.fn.name for s in self.functions if s.fn.needs_judge))

    @property
    def needs_prefix(self) -> list[str]:
        return [c for s in self.functions if s.fn.needs_prefix for c in s.component_names]

    def fingerprint(self) -> str:
        """Hash of what determines scoring: method, functions (with their arguments), weights."""
        blob = json.dumps(
            {
                "method": self.method.name,
                "fence_gate": self.method.fence_gate,
                "functions": [s.identity() for s in self.functions],
                "weights": self.weights,
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # ------------------------------------------------------------------ scoring

    def gate(self, ctx: RewardContext) -> tuple[Gate, str] | None:
        """Which format gate the episode fails and why, or None when it passes: the action
        format's gate (``core/formats``: the protocol tags, or every tool call valid and a
        ``submit_answer``), with Python fences for fence-gated methods where the format has them."""
        return get_format(ctx.action_format).gate(ctx, self.method.fence_gate)

    def score(self, ctx: RewardContext) -> RewardOutcome:
        failed = self.gate(ctx)
        if failed is not None:
            gate, why = failed
            penalty = {FORMAT_GATE: GATE_PENALTY}
            details = OutcomeDetails(notes={FORMAT_GATE: why})
            return RewardOutcome(GATE_PENALTY, penalty, "scored", False, gate, details=details)
        components: dict[str, float] = {}
        failures: dict[int, Failure] = {}  # function index → what went wrong
        results: dict[int, Any] = {}
        pending: list[int] = []
        for index, scorer in enumerate(self.functions):
            if scorer.fn.is_async:
                pending.append(index)
                continue
            try:
                results[index] = scorer.call(ctx)
            except Exception as exc:
                failures[index] = Failure.raised(scorer.name, exc)
        if pending:
            results.update(self._run_async([(i, self.functions[i]) for i in pending], ctx, failures))
        notes: dict[str, str] = {}
        for index, scorer in enumerate(self.functions):
            if index in results:
                value = results[index]
                if isinstance(value, Noted):
                    notes[scorer.name] = str(value.note)
                    value = value.value
                errors: list[str] = []
                self._collect(scorer, value, components, errors)
                if errors:
                    failures[index] = Failure("; ".join(errors), "reward_raised")
        details = OutcomeDetails(notes=notes) if notes else OutcomeDetails()
        if failures:
            ordered = [failures[i] for i in sorted(failures)]
            error = "; ".join(f.message for f in ordered)
            return RewardOutcome(
                0.0, components, "verifier_error", True, None, error, details, cause=ordered[0].cause
            )
        reward = weighted_mean(components, self.weights)
        if reward is None:
            return RewardOutcome(
                0.0, components, "verifier_error", True, None, NO_POSITIVE_WEIGHT, cause="reward_raised"
            )
        return RewardOutcome(reward, components, "scored", True, None, None, details)

    @staticmethod
    def _run_async(
        scorers: list[tuple[int, Scorer]], ctx: RewardContext, failures: dict[int, Failure]
    ) -> dict[int, Any]:
        from rewards.aio import run_sync

        async def gather():
            return await asyncio.gather(*(s.call(ctx) for _, s in scorers), return_exceptions=True)

        out: dict[int, Any] = {}
        for (index, scorer), value in zip(scorers, run_sync(gather()), strict=True):
            if isinstance(value, BaseException):
                failures[index] = Failure.raised(scorer.name, value)
            else:
                out[index] = value
        return out

    @staticmethod
    def _collect(scorer: Scorer, value: Any, components: dict[str, float], errors: list[str]) -> None:
        fn, label = scorer.fn, scorer.name
        if value is None:
            if not fn.optional:
                errors.append(f"{label}: returned None (a reward that could not be computed)")
            return
        if isinstance(value, Mapping):
            expected = set(fn.component_names) if fn.components is not None else set(value)
            if set(value) != expected:
                errors.append(f"{label}: returned keys {sorted(value)}, declared {sorted(expected)}")
                return
            items = [(scorer.component(str(k)), v) for k, v in value.items()]
        else:
            items = [(scorer.component_names[0], value)]
        for name, raw in items:
            if name in components or name == FORMAT_GATE:
                errors.append(f"{label}: component {name!r} is produced twice")
                continue
            if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
                errors.append(f"{label}: component {name!r} is not a finite number ({raw!r})")
                continue
            components[name] = float(raw)
