"""Ground truth from the real kernel, and the quality gate that drops ambiguous tasks.

Each draft's reference program runs in a kernel worker (the same fork server and sandbox the
env uses) in a scratch copy of its workspace and prints one ``__GATE__{json}`` line: the answer
and what the gate needs (rows behind it, the margin of an argmax, a p-value's distance from the
0.05 level). A task is dropped, with the reason counted, when:

* ``error`` — the program failed or printed no gate line;
* ``nan`` — the answer (or a part) is missing, NaN or infinite;
* ``empty`` — no rows behind the answer (an empty filter, an empty group, a count of 0);
* ``tie`` — the winner of an argmax/top-k is not unique (margin within float noise), or a sign is ~0;
* ``rounding`` — the value sits so close to a rounding boundary at the stated decimals that float
  noise could change the printed digits;
* ``near_alpha`` — a p-value within 0.001 of 0.05, so the decision hinges on noise;
* ``duplicate`` — the same question on the same workspace as an earlier task.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

from deepanalyze_env.core.contracts import JsonObject, JsonValue
from deepanalyze_env.offline.bank.families.base import GATE_MARK, AnswerFormat, Draft

REASONS = ("error", "nan", "empty", "tie", "rounding", "near_alpha", "duplicate")
TIE_REL = 1e-9
TIE_ABS = 1e-8  # margins below this are float noise, not a winner
MIN_SIGN = 1e-3  # |r| below this makes "positive or negative" ambiguous
ALPHA_BAND = 1e-3
GATE_OUTPUT_CHARS = 20_000_000


GroundTruth = str | list[list[str]]  # the answer, or [part name, answer] pairs
Tolerance = float | dict[str, float] | None  # absolute; per part for a parts answer


class ExpectedFile(TypedDict):
    """The table a datatask must save (``reward_spec.expected_file``; :mod:`rewards.files`)."""

    name: str
    columns: JsonValue  # as the reference program printed them
    rows: JsonValue
    tolerance: float


class BankRewardSpec(TypedDict):
    """The ``reward_spec`` of a bank task (:func:`reward_spec`)."""

    method: str
    ground_truth: GroundTruth
    function: list[str]
    expected_file: NotRequired[ExpectedFile]
    tolerance: NotRequired[float | dict[str, float]]


@dataclass
class Truth:
    """A draft's ground truth as the reference program printed it in the kernel, with the tolerance its
    stated decimals allow and the gate record."""

    ground_truth: GroundTruth
    tolerance: Tolerance
    gate: JsonObject  # the reference program's gate line, as printed


def parse_gate(output: str) -> JsonObject | None:
    for line in reversed(output.splitlines()):
        if line.startswith(GATE_MARK):
            try:
                return json.loads(line[len(GATE_MARK) :])
            except json.JSONDecodeError:
                return None
    return None


def run_programs(drafts: list[Draft], workspace_root: Path, timeout_s: float = 60.0) -> list[tuple[str, str]]:
    """(status, output) of every draft's reference program, one kernel worker per workspace."""
    from tools.kernel import Kernel
    from tools.workspace import Workspace

    results: list[tuple[str, str] | None] = [None] * len(drafts)
    by_ws: dict[str, list[int]] = {}
    for i, d in enumerate(drafts):
        by_ws.setdefault(d.workspace.id, []).append(i)
    for ws_id, indexes in by_ws.items():
        scratch = Workspace(workspace_root / "workspaces" / ws_id)
        kernel = None
        try:
            # the gate line of a cleaning task carries the whole reference table: no output cap
            kernel = Kernel(
                scratch.path, timeout_s=timeout_s, memory_mb=4096, max_output_chars=GATE_OUTPUT_CHARS
            )
            for i in indexes:
                res = kernel.run(drafts[i].program)
                results[i] = (res.status, res.output)
        finally:  # a worker that failed to start must not leave the scratch copy behind
            if kernel is not None:
                kernel.close()
            scratch.remove()
    return [r if r is not None else ("error", "") for r in results]


def _finite(value: JsonValue) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _near_rounding(value: float, decimals: int) -> bool:
    """True when float noise around ``value`` could print other digits ("-0.00" counts as "0.00")."""
    eps = TIE_REL * max(1.0, abs(value)) + 1e-12

    def shown(x: float) -> str:
        text = f"{x:.{decimals}f}"
        return text[1:] if text.startswith("-") and float(text) == 0 else text

    return shown(value - eps) != shown(value + eps)


def _format(value: JsonValue, kind: str, decimals: int | None) -> str:
    if kind == "integer":
        return str(round(value))
    if kind == "number":
        return f"{value:.{decimals}f}"
    return str(value)


def judge(draft: Draft, status: str, output: str) -> tuple[Truth | None, str | None]:
    """The task's ground truth, or the reason it is dropped."""
    gate = parse_gate(output)
    if status != "ok" or gate is None:
        return None, "error"
    fmt: AnswerFormat = draft.answer
    n = gate.get("n")
    if n is not None and (not _finite(n) or n <= 0):
        return None, "empty"
    margin = gate.get("margin")
    if margin is not None and (not _finite(margin) or margin <= TIE_ABS):
        return None, "tie"
    if gate.get("alpha_gap") is not None and gate["alpha_gap"] < ALPHA_BAND:
        return None, "near_alpha"
    value = gate.get("answer")
    if fmt.kind == "report":
        return Truth("", None, gate), None
    if fmt.kind == "parts":
        if not isinstance(value, dict):
            return None, "error"
        truth, tolerance = [], {}
        for part in fmt.parts:
            v = value.get(part.name)
            if part.kind == "text":
                if v in (None, "") or (isinstance(v, float) and not math.isfinite(v)):
                    return None, "nan"
                truth.append([part.name, str(v)])
                continue
            if not _finite(v):
                return None, "nan"
            if part.kind == "number" and _near_rounding(float(v), part.decimals or 0):
                return None, "rounding"
            if part.name == "correlation" and abs(v) < MIN_SIGN:
                return None, "tie"
            truth.append([part.name, _format(v, part.kind, part.decimals)])
            if part.kind == "number":
                tolerance[part.name] = 0.5 * 10 ** -(part.decimals or 0)
        return Truth(truth, tolerance or None, gate), None
    if fmt.kind == "text":
        if value in (None, "") or (isinstance(value, float) and not math.isfinite(value)):
            return None, "nan"
        return Truth(str(value), None, gate), None
    if not _finite(value):
        return None, "nan"
    if fmt.kind == "integer":
        if float(value) != int(value):
            return None, "error"
        if fmt.file is None and value == 0:
            return None, "empty"
        return Truth(str(int(value)), None, gate), None
    if _near_rounding(float(value), fmt.decimals or 0):
        return None, "rounding"
    return Truth(_format(value, "number", fmt.decimals), 0.5 * 10 ** -(fmt.decimals or 0), gate), None


def reward_spec(draft: Draft, truth: Truth) -> BankRewardSpec:
    fmt = draft.answer
    if fmt.kind == "report":
        return {"method": "openresearch", "ground_truth": "", "function": ["judge_opendomain"]}
    if fmt.file is not None:
        file = truth.gate["file"]
        return {
            "method": "datatask",
            "ground_truth": truth.ground_truth,
            "function": ["file_match", "answer_match"],
            "expected_file": {
                "name": file["name"],
                "columns": file["columns"],
                "rows": file["rows"],
                "tolerance": 1e-6,
            },
        }
    spec: BankRewardSpec = {
        "method": "verified",
        "ground_truth": truth.ground_truth,
        "function": ["answer_parts" if fmt.kind == "parts" else "answer_match"],
    }
    if truth.tolerance is not None:
        spec["tolerance"] = truth.tolerance
    return spec


def summarise(reasons: Counter[str]) -> dict[str, int]:
    return {r: int(reasons.get(r, 0)) for r in REASONS}
