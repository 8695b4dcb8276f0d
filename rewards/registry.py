"""Reward-function registry (docs/design.md §7).

A reward function is a plain function whose keyword parameters name the context fields it
needs; the env passes only those. Registration records that signature, so unknown parameters
are caught when a reward plan is built, before any rollout.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

CONTEXT_FIELDS = frozenset(
    {
        "answer",
        "policy_text",
        "trajectory",
        "messages",
        "ground_truth",
        "question",
        "code_pass",
        "turns",
        "workspace",
        "reward_spec",
        "judge",
        "exec_statuses",
        "prefix_turns",
    }
)


@dataclass(frozen=True)
class Noted:
    """A reward function's value with why it is what it is, in a sentence (``file_match``: "out.csv
    is a symbolic link..."): the plan scores ``value`` and the env puts ``note`` under the final
    step's ``metadata["reward_notes"][function name]``, so a 0 that is the policy's failure says so."""

    value: Any
    note: str


class RewardSpecError(ValueError):
    """A reward_spec / reward function problem found while building a plan."""


@dataclass(frozen=True)
class RewardFunction:
    """A registered reward function with what the plan needs to call it: the context fields it asks for,
    its component names, whether it needs the judge or is async."""

    name: str
    fn: Callable
    params: tuple[str, ...]
    components: tuple[str, ...] | None  # declared keys of a dict-returning function
    needs_judge: bool
    is_async: bool
    optional: bool = False

    @property
    def component_names(self) -> tuple[str, ...]:
        return self.components if self.components is not None else (self.name,)


_REGISTRY: dict[str, RewardFunction] = {}


def _describe(
    fn: Callable, name: str, components: Sequence[str] | None, needs_judge: bool, optional: bool
) -> RewardFunction:
    params = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise RewardSpecError(
                f"reward function {name!r} must name its context fields; *args/**kwargs not allowed"
            )
        if param.name not in CONTEXT_FIELDS:
            if param.default is not inspect.Parameter.empty:
                continue  # an optional parameter of the user's own; the env never passes it
            raise RewardSpecError(
                f"reward function {name!r} takes unknown parameter {param.name!r}; "
                f"allowed: {', '.join(sorted(CONTEXT_FIELDS))}"
            )
        params.append(param.name)
    return RewardFunction(
        name=name,
        fn=fn,
        params=tuple(params),
        components=tuple(components) if components is not None else None,
        needs_judge=needs_judge or "judge" in params,
        is_async=inspect.iscoroutinefunction(fn),
        optional=optional,
    )


def register_reward(
    name: str,
    *,
    components: Sequence[str] | None = None,
    needs_judge: bool = False,
    aliases: Sequence[str] = (),
    optional: bool = False,
    replace: bool = False,
) -> Callable[[Callable], Callable]:
    """Register ``fn`` under ``name`` (and ``aliases``).

    A dict-returning function declares its ``components`` so duplicate component names are
    caught at plan construction; a float-returning one may declare a single component name
    that differs from its registered name. ``optional`` functions may return None, meaning
    "does not apply to this episode" (the component is then absent); for any other function
    None is a failure to compute, never a silent 0. Re-registering the same function is a no-op (modules get
    imported twice under different runners); a different function under a taken name is an
    error unless ``replace=True``.
    """

    def decorator(fn: Callable) -> Callable:
        for key in (name, *aliases):
            existing = _REGISTRY.get(key)
            if existing is not None and not replace and not _same_function(existing.fn, fn):
                raise RewardSpecError(f"reward name {key!r} is already registered to {existing.fn!r}")
            _REGISTRY[key] = _describe(fn, key, components, needs_judge, optional)
        return fn

    return decorator


def _same_function(a: Callable, b: Callable) -> bool:
    """The same function object, or the same definition imported twice (e.g. by a runner)."""
    return a is b or (
        getattr(a, "__module__", None) == getattr(b, "__module__", None)
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
    )


def registered_names() -> list[str]:
    return sorted(_REGISTRY)


def resolve(ref: str) -> RewardFunction:
    """A registered name, or a ``package.module:attr`` path (imported on demand)."""
    if not isinstance(ref, str) or not ref:
        raise RewardSpecError(f"reward function reference must be a non-empty string, got {ref!r}")
    if ref in _REGISTRY:
        return _REGISTRY[ref]
    if ":" in ref:
        module_name, _, attr = ref.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise RewardSpecError(f"cannot import reward module {module_name!r} for {ref!r}: {exc}")
        fn = getattr(module, attr, None)
        if fn is None or not callable(fn):
            raise RewardSpecError(f"{ref!r}: module {module_name!r} has no callable {attr!r}")
        if ref in _REGISTRY:  # the import registered it under its path
            return _REGISTRY[ref]
        for described in _REGISTRY.values():
            if described.fn is fn:
                return described
        return _describe(fn, attr, None, False, False)
    raise RewardSpecError(
        f"unknown reward function {ref!r}; registered: {', '.join(registered_names())} "
        "(or give a 'package.module:attr' path)"
    )
