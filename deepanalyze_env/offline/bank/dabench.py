"""InfiAgent-DABench → task rows scored by ``answer_parts``.

DABench ships two JSONL files and a folder of CSVs. A question line has ``id``, ``question``,
``concepts``, ``constraints``, ``format`` (the ``@name[value]`` answer format), ``file_name`` and
``level``; a label line has ``id`` and ``common_answers`` as ``[[name, value], …]``. Each
question becomes a task whose prompt holds the question, its constraints and its answer format,
whose workspace is a folder holding its CSV (``<root>/dabench/<csv stem>/``, shared by the
questions on the same file), and whose reward is ``answer_parts`` against the labels. DABench
itself is not shipped (its data licence is CC BY-NC 4.0); point the command at a local copy. A
malformed line (bad JSON, a missing key, an unknown CSV, a question without a label) is
reported with its file and line number and skipped; the rest are converted.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from deepanalyze_env.core.contracts import JsonObject, JsonValue

QUESTION_KEYS = ("id", "question", "concepts", "constraints", "format", "file_name", "level")
DATA_DIR = "dabench"


@dataclass
class Conversion:
    """DABench questions turned into tasks, plus the problems of the lines that were skipped (reported,
    never silently lost)."""

    tasks: list[JsonObject] = field(default_factory=list)  # task-file lines (core.tasks reads them)
    problems: list[str] = field(default_factory=list)


def _lines(path: Path):
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                yield lineno, line


def read_labels(path: Path, problems: list[str]) -> dict[JsonValue, list[list[str]]]:
    """Each question id's answer as [name, value] pairs; bad lines go to ``problems``."""
    labels: dict[JsonValue, list[list[str]]] = {}
    for lineno, line in _lines(path):
        where = f"{path.name}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{where}: not valid JSON ({exc.msg})")
            continue
        answers = obj.get("common_answers") if isinstance(obj, dict) else None
        if not isinstance(obj, dict) or "id" not in obj:
            problems.append(f"{where}: no id")
            continue
        if (
            not isinstance(answers, list)
            or not answers
            or not all(isinstance(a, list) and len(a) == 2 and isinstance(a[0], str) for a in answers)
        ):
            problems.append(f"{where}: common_answers must be a non-empty list of [name, value] pairs")
            continue
        labels[obj["id"]] = [[name, str(value)] for name, value in answers]
    return labels


def workspace_id(file_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(file_name).stem).strip("_") or "table"


def instruction(q: JsonObject) -> str:
    return (
        f"{q['question'].strip()}\n\nConstraints: {str(q['constraints']).strip()}\n\n"
        f"Answer format: {str(q['format']).strip()}\n"
        "Give every part of the final answer as @name[value], exactly as in the answer format."
    )


def convert(questions: Path, labels: Path, tables: Path, root: Path) -> Conversion:
    """Read DABench files, copy each question's CSV into ``root/dabench/<stem>/``, return tasks."""
    result = Conversion()
    answers = read_labels(labels, result.problems)
    copied: dict[str, str] = {}
    for lineno, line in _lines(questions):
        where = f"{questions.name}:{lineno}"
        try:
            q = json.loads(line)
        except json.JSONDecodeError as exc:
            result.problems.append(f"{where}: not valid JSON ({exc.msg})")
            continue
        if not isinstance(q, dict):
            result.problems.append(f"{where}: not a JSON object")
            continue
        missing = [k for k in QUESTION_KEYS if k not in q]
        if missing:
            result.problems.append(f"{where}: missing {', '.join(missing)}")
            continue
        if q["id"] not in answers:
            result.problems.append(f"{where}: question {q['id']} has no label")
            continue
        source = tables / str(q["file_name"])
        if not source.is_file():
            result.problems.append(f"{where}: table {q['file_name']!r} not found in {tables}")
            continue
        ws = workspace_id(q["file_name"])
        if copied.get(ws, str(source)) != str(source):
            result.problems.append(
                f"{where}: {q['file_name']!r} clashes with {copied[ws]!r} as workspace {ws}"
            )
            continue
        if ws not in copied:
            target = root / DATA_DIR / ws
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target / Path(str(q["file_name"])).name)
            copied[ws] = str(source)
        text = instruction(q)
        result.tasks.append(
            {
                "id": f"dabench-{q['id']}",
                "method": "verified",
                "instruction": text,
                "input_seq": text,
                "data": DATA_DIR,
                "workspace_id": ws,
                "reward_spec": {
                    "method": "verified",
                    "ground_truth": answers[q["id"]],
                    "function": ["answer_parts"],
                    "match": "dabench",
                },
                "level": q["level"],
                "concepts": q["concepts"],
            }
        )
    return result
