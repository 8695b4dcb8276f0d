"""Task families, registered by name (``FAMILIES``); each module adds its families on import."""

from __future__ import annotations

from deepanalyze_env.offline.bank.families import basic, stats, structure, tasks  # noqa: F401  (register)
from deepanalyze_env.offline.bank.families.base import FAMILIES, Draft, Family, FamilyContext

__all__ = ["FAMILIES", "Draft", "Family", "FamilyContext"]
