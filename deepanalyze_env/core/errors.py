"""The error type for bad input, importable without skyrl_gym, the kernel stack or a trainer.

Anything a user can get wrong — an ``env_config`` key, a task row, a reward spec, a recipe —
raises :class:`ConfigError` with a one-line message that says what to fix; the command line
prints it as ``error: …`` and exits 2. ``rewards`` and ``tools`` use it too, so it lives in a
module with no dependencies.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting in env_config, extras, reward_spec, a task file or a recipe is wrong; the
    message says which."""
