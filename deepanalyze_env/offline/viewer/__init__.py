"""The episode viewer: a run folder as one self-contained, offline HTML page (``deepanalyze-rl view``)."""

from __future__ import annotations

from deepanalyze_env.offline.viewer.build import ViewError, ViewReport, build_view

__all__ = ["ViewError", "ViewReport", "build_view"]
