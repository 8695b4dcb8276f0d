"""Fixture cases for judge evaluation: each a question, a reference answer and candidates
labelled ``reference`` > ``perturbed`` > ``wrong``; bad lines are collected, not fatal."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from deepanalyze_env.core.contracts import JsonValue
from rewards.registry import RewardFunction, RewardSpecError, resolve

log = logging.getLogger(__name__)

# Expected order, best first. A pair of candidates with different labels in one case is
# "correctly ordered" when the better label scores strictly higher.
LABELS = ("reference", "perturbed", "wrong")
LABEL_RANK = {label: len(LABELS) - i for i, label in enumerate(LABELS)}

# The context fields judge-eval can build from a fixture line; a judge needing others
# (code_pass, workspace, …) cannot be evaluated offline.
PROVIDED_FIELDS = frozenset(
    {
        "question",
        "trajectory",
        "messages",
        "turns",
        "prefix_turns",
        "answer",
        "policy_text",
        "ground_truth",
        "reward_spec",
        "judge",
    }
)
CASE_KEYS = {"id", "method", "judge", "question", "ground_truth", "candidates", "task_id", "notes"}
REQUIRED_CASE_KEYS = ("id", "method", "judge", "question", "candidates")
CANDIDATE_KEYS = {"label", "text", "kind", "notes"}

# ---------------------------------------------------------------------------------- fixtures


@dataclass(frozen=True)
class Candidate:
    """One answer to a fixture question with its quality label, which the judge's scores must order
    correctly."""

    label: str
    text: str
    kind: str | None = None


@dataclass(frozen=True)
class FixtureCase:
    """A judge-eval case: one question with ranked candidate answers, scored by one judge rubric."""

    id: str
    method: str
    judge: str
    question: str
    ground_truth: JsonValue
    candidates: tuple[Candidate, ...]
    source: str  # "file:line", for messages and cases.jsonl
    task_id: str | None = None


class BadLineInfo(TypedDict):
    """A skipped fixture line as ``report.json`` lists it (:meth:`BadLine.as_dict`)."""

    file: str
    line: int
    error: str


@dataclass(frozen=True)
class BadLine:
    """A fixture line that could not be read, kept with its file and line so the report names it."""

    file: str
    line: int
    error: str

    def as_dict(self) -> BadLineInfo:
        return BadLineInfo(file=self.file, line=self.line, error=self.error)


class FixtureError(ValueError):
    """One fixture line is unusable; the message says why, in terms of the line's fields."""


def judge_function(name: str) -> RewardFunction:
    """The registered judge ``name`` (or ``module:attr``), checked to be evaluable offline."""
    try:
        fn = resolve(name)
    except RewardSpecError as exc:
        raise FixtureError(str(exc))
    if not fn.needs_judge:
        raise FixtureError(f"judge {name!r} is a reward function that does not use a judge")
    missing = sorted(set(fn.params) - PROVIDED_FIELDS)
    if missing:
        raise FixtureError(
            f"judge {name!r} needs context field(s) {', '.join(missing)}, which judge-eval cannot "
            f"build from a fixture (it provides {', '.join(sorted(PROVIDED_FIELDS))})"
        )
    return fn


def parse_case(obj: JsonValue, source: str) -> FixtureCase:
    """Validate one decoded fixture line; raises :class:`FixtureError` naming the bad field."""
    if not isinstance(obj, dict):
        raise FixtureError(f"expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - CASE_KEYS)
    if unknown:
        raise FixtureError(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(CASE_KEYS))})")
    missing = [key for key in REQUIRED_CASE_KEYS if key not in obj]
    if missing:
        raise FixtureError(f"missing key(s) {', '.join(missing)}")
    for key in ("id", "method", "judge", "question"):
        if not isinstance(obj[key], str) or not obj[key].strip():
            raise FixtureError(f"{key!r} must be a non-empty string")
    judge_function(obj["judge"])
    raw = obj["candidates"]
    if not isinstance(raw, list) or not raw:
        raise FixtureError("'candidates' must be a non-empty list")
    candidates = []
    for index, cand in enumerate(raw):
        where = f"candidates[{index}]"
        if not isinstance(cand, dict):
            raise FixtureError(f"{where} must be an object with 'label' and 'text'")
        extra = sorted(set(cand) - CANDIDATE_KEYS)
        if extra:
            raise FixtureError(f"{where}: unknown key(s) {', '.join(extra)}")
        label = cand.get("label")
        if label not in LABEL_RANK:
            raise FixtureError(f"{where}: label must be one of {', '.join(LABELS)}, got {label!r}")
        text = cand.get("text")
        if not isinstance(text, str) or not text.strip():
            raise FixtureError(f"{where}: 'text' must be a non-empty string")
        kind = cand.get("kind")
        candidates.append(Candidate(label, text, str(kind) if kind is not None else None))
    task_id = obj.get("task_id")
    return FixtureCase(
        id=obj["id"],
        method=obj["method"],
        judge=obj["judge"],
        question=obj["question"],
        ground_truth=obj.get("ground_truth", ""),
        candidates=tuple(candidates),
        source=source,
        task_id=str(task_id) if task_id is not None else None,
    )


def fixture_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files named, and the ``*.jsonl`` files of folders named, in a stable order."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(path.glob("*.jsonl"))
            if not found:
                raise FileNotFoundError(f"no *.jsonl fixture files in {path}")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"no such fixture file {path}")
    return list(dict.fromkeys(files))


def load_fixtures(paths: Iterable[str | Path]) -> tuple[list[FixtureCase], list[BadLine]]:
    """All usable cases and one :class:`BadLine` per unusable line (blank lines are skipped)."""
    cases: list[FixtureCase] = []
    bad: list[BadLine] = []
    seen: dict[str, str] = {}
    for path in fixture_files(paths):
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                source = f"{path}:{number}"
                try:
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise FixtureError(f"not valid JSON ({exc.msg} at column {exc.colno})")
                    case = parse_case(obj, source)
                    if case.id in seen:
                        raise FixtureError(f"duplicate case id {case.id!r} (first at {seen[case.id]})")
                except FixtureError as exc:
                    bad.append(BadLine(str(path), number, str(exc)))
                    log.warning("%s: skipped: %s", source, exc)
                    continue
                seen[case.id] = source
                cases.append(case)
    return cases, bad
