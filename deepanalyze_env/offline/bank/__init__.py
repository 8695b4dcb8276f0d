"""The task bank: hundreds of checkable data-analysis tasks over real public tables.

Tables come from packages of the ``kernel`` extra (``statsmodels.datasets``, scikit-learn's
bundled files), so building needs no download. ``deepanalyze-rl bank build`` writes the
workspaces, the task files per split, the reference episodes and a manifest; modules, one per
concern: ``sources`` (tables and their licences), ``workspaces`` (deterministic file writers),
``families`` (task templates), ``quality`` (the gate), ``episodes`` (reference episodes through
the env), ``splits`` (split by table, manifest), ``build`` (the pipeline), ``dabench`` (import).
"""

from __future__ import annotations


class BankError(Exception):
    """A bank build or import problem the user can fix; the message is one line."""
