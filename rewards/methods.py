"""Reward methods declared as data: which components a ``reward_spec["method"]`` scores.

A method is a list of built-in component functions, whether ``reward_spec["function"]``
entries are added, whether the fenced-code gate applies, and default weights. Users register
their own with ``register_method``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from rewards.registry import RewardSpecError


@dataclass(frozen=True)
class Method:
    """A reward method (qa, datatask, openresearch, verified or a user's): the functions it always
    scores, its gate and default weights."""

    name: str
    builtins: tuple[str, ...]  # registered function names always scored
    fence_gate: bool = False  # every <Code> block must be a ```python fence
    weights: Mapping[str, float] = field(default_factory=dict)  # default weight 1.0


_METHODS: dict[str, Method] = {}


def register_method(method: Method, *, replace: bool = False) -> Method:
    if method.name in _METHODS and not replace and _METHODS[method.name] != method:
        raise RewardSpecError(f"reward method {method.name!r} is already registered")
    _METHODS[method.name] = Method(
        method.name, tuple(method.builtins), method.fence_gate, MappingProxyType(dict(method.weights))
    )
    return _METHODS[method.name]


def get_method(name: str) -> Method:
    try:
        return _METHODS[name]
    except KeyError:
        raise RewardSpecError(
            f"unknown reward_spec.method {name!r}; registered methods: {', '.join(sorted(_METHODS))}"
        )


register_method(Method("qa", ("qa_accuracy", "judge_analysis", "qa_exact"), weights={"qa_exact": 0.0}))
# Functions named in reward_spec["function"] come first, as upstream lists them.
register_method(Method("datatask", ("datatask_code",), fence_gate=True))
register_method(Method("openresearch", ("openresearch_code", "openresearch_turns"), fence_gate=True))
# Checkable answers without a judge (the task bank): the scorers come from reward_spec["function"]
# (answer_match, answer_parts, …); a "verified" task that names none fails when the plan is built.
register_method(Method("verified", ()))
