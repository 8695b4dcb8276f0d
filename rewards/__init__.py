"""Reward functions, methods and the plan that scores an episode (docs/design.md §7–8)."""

from __future__ import annotations

from rewards import answers as _answers  # noqa: F401  (answer_match, answer_parts)
from rewards import components as _components  # noqa: F401  (registers the built-ins)
from rewards import files as _files  # noqa: F401  (file_match)
from rewards import recovery as _recovery  # noqa: F401  (recovery)
from rewards.answers import ACCURACY_COMPONENTS, accuracy_component, is_accuracy_component
from rewards.context import CONTEXT_FIELDS, RewardContext
from rewards.methods import Method, get_method, register_method
from rewards.plan import Plan, RewardOutcome, RewardPlan
from rewards.registry import RewardSpecError, register_reward, registered_names, resolve

__all__ = [
    "ACCURACY_COMPONENTS",
    "CONTEXT_FIELDS",
    "Method",
    "Plan",
    "RewardContext",
    "RewardOutcome",
    "RewardPlan",
    "RewardSpecError",
    "accuracy_component",
    "get_method",
    "is_accuracy_component",
    "register_method",
    "register_reward",
    "registered_names",
    "resolve",
]

from rewards import judges as _judges  # noqa: F401  (registers the LLM-judge components)
