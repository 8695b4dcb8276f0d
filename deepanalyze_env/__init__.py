"""deepanalyze-env: the DeepAnalyze data-analysis environment for RL trainers.

Importing the package registers env id ``"deepanalyze"`` in the skyrl_gym registry
(idempotently). The entry point is a string, so the env module loads only when an env is made.
Where skyrl_gym is not installed (a kernel interpreter, a judge-only tool) the package still
imports — ``core.protocol`` and ``core.errors`` need nothing — and registration is skipped.

Layout (``docs/design.md``): ``core/`` the env and its contracts, ``trainers/`` the TRL and
SkyRL adapters, ``offline/`` rollout/stats/rescore/judge-eval, ``cli/`` the commands.
"""

from __future__ import annotations

from typing import Any

ENV_ID = "deepanalyze"
ENTRY_POINT = "deepanalyze_env.core.env:DeepAnalyzeEnv"

__all__ = ["ENV_ID", "DeepAnalyzeEnv", "register"]


def register() -> None:
    """Register the env with skyrl_gym; safe to call any number of times, in any process."""
    from skyrl_gym.envs.registration import register as _register
    from skyrl_gym.envs.registration import registry

    existing = registry.get(ENV_ID)
    if existing is not None:
        if existing.entry_point in (ENTRY_POINT, _env_class_if_loaded()):
            return
        raise RuntimeError(f"skyrl_gym env id {ENV_ID!r} is already registered to {existing.entry_point!r}")
    _register(id=ENV_ID, entry_point=ENTRY_POINT)


def _env_class_if_loaded():
    import sys

    module = sys.modules.get("deepanalyze_env.core.env")
    return getattr(module, "DeepAnalyzeEnv", None)


def __getattr__(name: str) -> Any:
    if name == "DeepAnalyzeEnv":
        from deepanalyze_env.core.env import DeepAnalyzeEnv

        return DeepAnalyzeEnv
    raise AttributeError(name)


def _register_if_available() -> None:
    import importlib.util

    if importlib.util.find_spec("skyrl_gym") is not None:
        register()


from deepanalyze_env.top_level import check_top_level  # noqa: E402

check_top_level()
_register_if_available()
