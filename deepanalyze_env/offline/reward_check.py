"""``deepanalyze-rl rewards --check``: build every task's reward plan and report every problem at once.

The env builds a task's plan when it is constructed, so a misspelt function name, an argument
of the wrong type or two components with one name surface at the first episode of that task —
in a trainer, hours in. This builds each plan the same way (the profile's ``build_plan``, with
plugins loaded exactly as any process loads them) without starting anything: no workspace is
copied and no judge is called, so it runs wherever the task files are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.contracts import JsonObject, JsonValue
from deepanalyze_env.core.profiles import PROFILES
from deepanalyze_env.core.tasks import read_task_file
from rewards import RewardSpecError


@dataclass(frozen=True)
class TaskProblem:
    """One task whose plan cannot be built (or a file that cannot be read: ``index`` -1)."""

    source: str
    index: int
    task_id: str | None
    problem: str

    def __str__(self) -> str:
        if self.index < 0:
            return f"{self.source}: {self.problem}"
        task = f" task {self.task_id!r}" if self.task_id is not None else ""
        return f"{self.source}:{self.index}{task}: {self.problem}"


class CheckSummary(TypedDict):
    """``--check``'s result as JSON (:meth:`CheckResult.as_dict`)."""

    tasks: int
    built: int
    problems: list[str]
    judge_functions: dict[str, int]


@dataclass
class CheckResult:
    """What ``--check`` found: tasks read, plans built, problems, and the judge functions needed."""

    tasks: int = 0
    built: int = 0
    problems: list[TaskProblem] = field(default_factory=list)
    judge_functions: dict[str, int] = field(default_factory=dict)  # name -> tasks using it

    def as_dict(self) -> CheckSummary:
        return {
            "tasks": self.tasks,
            "built": self.built,
            "problems": [str(p) for p in self.problems],
            "judge_functions": dict(sorted(self.judge_functions.items())),
        }


def _task_id(obj: JsonObject) -> str | None:
    info = obj.get("extra_info") if isinstance(obj.get("extra_info"), dict) else {}
    found = obj.get("id") or obj.get("task_id") or info.get("task_id")
    return None if found is None else str(found)


def _spec(obj: JsonObject) -> JsonValue:
    spec = obj.get("reward_spec")
    if isinstance(spec, str):  # parquet rows may carry it as JSON text
        try:
            return json.loads(spec)
        except json.JSONDecodeError as exc:
            raise RewardSpecError(f"reward_spec is a string but not JSON: {exc.msg}")
    if spec is None:
        raise RewardSpecError("no reward_spec")
    return spec


def check_task_files(paths: Iterable[str | Path], profile: str = "v1") -> CheckResult:
    """Build the plan of every task (or dataset row) in ``paths`` under ``profile``."""
    build = PROFILES[profile].build_plan
    result = CheckResult()
    for path in paths:
        try:
            objects = read_task_file(path)
        except ConfigError as exc:
            result.problems.append(TaskProblem(str(path), -1, None, str(exc)))
            continue
        for index, obj in enumerate(objects):
            result.tasks += 1
            try:
                plan = build(_spec(obj))
            except RewardSpecError as exc:
                result.problems.append(TaskProblem(str(path), index, _task_id(obj), str(exc)))
                continue
            result.built += 1
            for name in plan.needs_judge:
                result.judge_functions[name] = result.judge_functions.get(name, 0) + 1
    return result
