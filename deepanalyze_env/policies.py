"""Policies that drive episodes outside a trainer (``deepanalyze-rl rollout``).

A policy maps the conversation so far to the next assistant action. ``scripted`` replays the
reference trajectories shipped with the tasks, for smoke tests and demos without a model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from deepanalyze_env.config import ConfigError
from deepanalyze_env.tasks import read_jsonl


class Policy(Protocol):
    name: str

    def act(self, task_id: str, label: str | None, turn: int, messages: list[dict[str, str]]) -> str: ...


@dataclass
class ScriptedPolicy:
    """Replays ``trajectories.jsonl`` lines ``{"task_id", "label", "turns": [...]}``."""

    scripts: dict[tuple[str, str], list[str]]
    name: str = "scripted"

    @classmethod
    def from_files(cls, paths: Iterable[str | Path]) -> ScriptedPolicy:
        scripts: dict[tuple[str, str], list[str]] = {}
        for path in paths:
            for line in read_jsonl(path):
                scripts[(line["task_id"], line.get("label", "good"))] = list(line["turns"])
        if not scripts:
            raise ConfigError("no scripted trajectories found")
        return cls(scripts)

    def labels_for(self, task_id: str) -> list[str]:
        return sorted(label for (tid, label) in self.scripts if tid == task_id)

    def act(self, task_id: str, label: str | None, turn: int, messages: list[dict[str, str]]) -> str:
        script = self.scripts.get((task_id, label or "good"))
        if script is None:
            raise ConfigError(f"no scripted trajectory for task {task_id!r} label {label!r}")
        # Past the end of its script the policy says nothing; the env's max_turns ends it.
        return script[turn] if turn < len(script) else ""
