"""Reading a verdict out of a judge's reply, strictly: anything doubtful is a parse failure.

Judges often quote the candidate, and a candidate may have written ``SCORE: 5`` to game the
judge; the judge's own verdict comes last, so the **last** ``SCORE:`` wins (``which="first"``
reproduces upstream's first-match rule for the ``upstream`` profile). A verdict out of range,
a ``SCORE:`` without a number, or a JSON object missing a dimension raises
:class:`JudgeParseError` carrying the raw reply — never a guessed number.
"""

from __future__ import annotations

import json
import re

from rewards.judge.errors import JudgeParseError

DIMENSIONS = ("usefulness", "richness", "soundness", "interpretability", "readability")

# "SCORE:" (any case, optional markdown emphasis around it), then the number (maybe emphasised),
# then an optional "/5"-style denominator.
_SCORE = re.compile(r"(?<![A-Za-z0-9_])score\s*\**\s*[:：]", re.IGNORECASE)
_NUMBER = re.compile(r"\s*[*_`\"']*\s*([-+]?\d+(?:\.\d+)?)(?![\d.]*\d)\s*[*_`\"']*(?:\s*/\s*\d+(?:\.\d+)?)?")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\r?\n(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


def _snippet(reply: str, limit: int = 80) -> str:
    flat = " ".join(reply.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def parse_score(reply: str, low: float, high: float, *, which: str = "last") -> float:
    """The verdict of a ``SCORE: N`` reply; ``which`` is ``"last"`` (v1) or ``"first"`` (upstream)."""
    if which not in ("last", "first"):
        raise ValueError(f"which must be 'last' or 'first', got {which!r}")
    matches = list(_SCORE.finditer(reply))
    if not matches:
        raise JudgeParseError(f"no 'SCORE:' line in the reply ({_snippet(reply)!r})", reply)
    chosen = matches[-1] if which == "last" else matches[0]
    number = _NUMBER.match(reply, chosen.end())
    if number is None:
        line = reply[chosen.start() :].splitlines()[0]
        raise JudgeParseError(f"the {which} 'SCORE:' line has no number ({_snippet(line)!r})", reply)
    value = float(number.group(1))
    if not low <= value <= high:
        raise JudgeParseError(f"score {number.group(1)} is outside {low:g}–{high:g}", reply)
    return value


def _json_objects(text: str) -> list[str]:
    """Top-level ``{…}`` spans of ``text`` in order, matching braces outside JSON strings."""
    spans, depth, start, in_string, escaped = [], 0, -1, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"' and depth > 0:
            in_string = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append(text[start : i + 1])
    return spans


def _load_lenient(blob: str) -> object:
    try:
        return json.loads(blob)
    except json.JSONDecodeError:
        return json.loads(_TRAILING_COMMA.sub(r"\1", blob))


def parse_dimensions(reply: str, low: float = 1.0, high: float = 5.0) -> dict[str, float]:
    """The five dimension scores from the reply's last JSON object (bare or in a fence)."""
    fenced = [body for _, body in _FENCE.findall(reply) if "{" in body]
    candidates = _json_objects(fenced[-1]) if fenced else _json_objects(reply)
    if not candidates:
        raise JudgeParseError(f"no JSON object in the reply ({_snippet(reply)!r})", reply)
    try:
        data = _load_lenient(candidates[-1])
    except json.JSONDecodeError as exc:
        raise JudgeParseError(f"the last JSON object is not valid JSON ({exc.msg})", reply)
    if not isinstance(data, dict):
        raise JudgeParseError("the verdict is not a JSON object", reply)
    lowered = {str(k).strip().lower(): v for k, v in data.items()}
    missing = [d for d in DIMENSIONS if d not in lowered]
    if missing:
        raise JudgeParseError(f"the verdict lacks dimension(s) {', '.join(missing)}", reply)
    scores: dict[str, float] = {}
    for dim in DIMENSIONS:
        raw = lowered[dim]
        if isinstance(raw, bool):
            raise JudgeParseError(f"{dim} is not a number ({raw!r})", reply)
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise JudgeParseError(f"{dim} is not a number ({raw!r})", reply)
        if not low <= value <= high:
            raise JudgeParseError(f"{dim} = {raw!r} is outside {low:g}–{high:g}", reply)
        scores[dim] = value
    return scores
