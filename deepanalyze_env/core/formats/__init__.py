"""Action formats by ``env_config.action_format`` name: the env, the config check, the reward
gate and the reward-hacking watch look a format up here and delegate to it.

A new format is one :class:`~deepanalyze_env.core.formats.base.ActionFormat` subclass and one
entry in :data:`FORMATS`.
"""

from __future__ import annotations

from deepanalyze_env.core.errors import ConfigError
from deepanalyze_env.core.formats.base import Action, ActionFormat
from deepanalyze_env.core.formats.tags import TagsFormat
from deepanalyze_env.core.formats.tools import ToolsFormat

__all__ = ["FORMATS", "Action", "ActionFormat", "get_format"]

FORMATS: dict[str, ActionFormat] = {fmt.name: fmt for fmt in (TagsFormat(), ToolsFormat())}


def get_format(name: str) -> ActionFormat:
    """The format registered under ``name``; a ``ConfigError`` naming the known ones otherwise."""
    fmt = FORMATS.get(name)
    if fmt is None:
        raise ConfigError(f"env_config.action_format must be one of {', '.join(FORMATS)}, got {name!r}")
    return fmt
