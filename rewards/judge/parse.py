"""Reading a verdict out of a judge's reply, strictly: anything doubtful is a parse failure.

The rubrics ask for the verdict in one place — a final line ``SCORE: N``, or a final JSON object
of five dimensions — and only that place is read. Judges quote the candidate, and a candidate may
have written ``SCORE: 5`` (or a score object) to game the judge, so:

- the verdict is the reply's **last non-empty line** (``SCORE: N``, markdown emphasis, a heading
  mark, ``Final`` and a ``/5`` allowed) or the JSON object that **ends** the reply (a closing
  fence after it allowed); anything after it — a quoted ``SCORE: 5`` included — leaves no verdict;
- a verdict of the same form standing on its own line elsewhere that disagrees with the final one
  makes the reply ambiguous: a judge that gave its verdict and then quoted the candidate's (or
  changed its mind) is not read at all. Mentions inside a sentence do not count;
- a number out of range, a final line with two ``SCORE:``, a JSON object missing a dimension
  raise :class:`JudgeParseError` carrying the raw reply — never a guessed number.

``which="first"`` keeps upstream's rule (the first ``SCORE:`` anywhere) for the ``upstream``
profile (docs/design.md §8). A reply cut by the token limit never reaches these functions as a
verdict: the client rejects it first (``rewards.judge.client``).
"""

from __future__ import annotations

import json
import re

from rewards.judge.errors import JudgeParseError

DIMENSIONS = ("usefulness", "richness", "soundness", "interpretability", "readability")

# "SCORE:" (any case, optional markdown emphasis around it), then the number (maybe emphasised),
# then an optional "/5"-style denominator: upstream's first-match rule.
_SCORE = re.compile(r"(?<![A-Za-z0-9_])score\s*\**\s*[:：]", re.IGNORECASE)
_NUMBER = re.compile(r"\s*[*_`\"']*\s*([-+]?\d+(?:\.\d+)?)(?![\d.]*\d)\s*[*_`\"']*(?:\s*/\s*\d+(?:\.\d+)?)?")
# A whole line that is a verdict: decoration, optional "Final", "SCORE:", the number, optional
# "/5", decoration or a full stop. Nothing else on the line.
_DECOR = r"[ \t*_`\"']*"
_VERDICT_LINE = re.compile(
    r"[ \t#*_`]*(?:final[ \t]+)?score" + _DECOR + r"[:：]" + _DECOR + r"(?P<number>[-+]?\d+(?:\.\d+)?)"
    r"(?:[ \t]*/[ \t]*\d+(?:\.\d+)?)?" + _DECOR + r"\.?" + _DECOR,
    re.IGNORECASE,
)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_CLOSING_FENCE = re.compile(r"\n?[ \t]*```[ \t]*\Z")
_MAX_OPENINGS = 64


def _snippet(reply: str, limit: int = 80) -> str:
    flat = " ".join(reply.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _first_score(reply: str, low: float, high: float) -> float:
    """Upstream's rule: the first ``SCORE:`` anywhere in the reply."""
    match = _SCORE.search(reply)
    if match is None:
        raise JudgeParseError(f"no 'SCORE:' line in the reply ({_snippet(reply)!r})", reply)
    number = _NUMBER.match(reply, match.end())
    if number is None:
        line = reply[match.start() :].splitlines()[0]
        raise JudgeParseError(f"the first 'SCORE:' line has no number ({_snippet(line)!r})", reply)
    return _in_range(number.group(1), low, high, reply)


def _in_range(text: str, low: float, high: float, reply: str) -> float:
    value = float(text)
    if not low <= value <= high:
        raise JudgeParseError(f"score {text} is outside {low:g}–{high:g}", reply)
    return value


def parse_score(reply: str, low: float, high: float, *, which: str = "last") -> float:
    """The verdict of a ``SCORE: N`` reply: its final line (``which="last"``, v1) or the first
    ``SCORE:`` anywhere (``which="first"``, upstream)."""
    if which not in ("last", "first"):
        raise ValueError(f"which must be 'last' or 'first', got {which!r}")
    if which == "first":
        return _first_score(reply, low, high)
    lines = [(number, line.strip()) for number, line in enumerate(reply.splitlines(), 1) if line.strip()]
    if not lines or _SCORE.search(reply) is None:
        raise JudgeParseError(f"no 'SCORE:' line in the reply ({_snippet(reply)!r})", reply)
    final_number, final = lines[-1]
    if len(_SCORE.findall(final)) > 1:
        raise JudgeParseError(f"the final line holds more than one verdict ({_snippet(final)!r})", reply)
    verdict = _VERDICT_LINE.fullmatch(final)
    if verdict is None:
        raise JudgeParseError(
            f"the final line is not a 'SCORE: N' verdict ({_snippet(final)!r}); "
            "the rubric asks for the verdict there and nothing after it",
            reply,
        )
    value = float(verdict.group("number"))
    for number, line in lines[:-1]:
        other = _VERDICT_LINE.fullmatch(line)
        if other is not None and float(other.group("number")) != value:
            raise JudgeParseError(
                f"conflicting verdicts: {_snippet(line)!r} on line {number} and {_snippet(final)!r} "
                f"on the final line {final_number}",
                reply,
            )
    return _in_range(verdict.group("number"), low, high, reply)


def _load_lenient(blob: str) -> object:
    try:
        return json.loads(blob)
    except json.JSONDecodeError:
        return json.loads(_TRAILING_COMMA.sub(r"\1", blob))


def _dimension_scores(data: object, low: float, high: float, reply: str) -> dict[str, float]:
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


def _standalone_objects(reply: str, before: int) -> list[tuple[int, dict]]:
    """JSON objects that start a line (fenced or bare) and begin before offset ``before``."""
    decoder = json.JSONDecoder()
    found = []
    for match in re.finditer(r"(?m)^[ \t]*\{", reply[:before]):
        start = match.end() - 1
        try:
            data, _ = decoder.raw_decode(reply, start)
        except (ValueError, RecursionError):  # not JSON, or nested past the decoder's depth
            continue
        if isinstance(data, dict):
            found.append((start, data))
    return found


def parse_dimensions(reply: str, low: float = 1.0, high: float = 5.0) -> dict[str, float]:
    """The five dimension scores from the JSON object that ends the reply (bare or fenced)."""
    body = _CLOSING_FENCE.sub("", reply.rstrip()).rstrip()
    if "{" not in body:
        raise JudgeParseError(f"no JSON object in the reply ({_snippet(reply)!r})", reply)
    if not body.endswith("}"):
        tail = body.splitlines()[-1] if body.splitlines() else body
        raise JudgeParseError(
            f"the reply does not end with the JSON verdict (it ends {_snippet(tail)!r})", reply
        )
    start, data, error = -1, None, None
    # The verdict opens at one of the last few "{" (its own and any nested note's); trying each
    # earlier one would cost a JSON parse per brace of a long reply.
    openings = [m.start() for m in re.finditer(r"\{", body)][-_MAX_OPENINGS:]
    for position in reversed(openings):
        try:  # json.loads: the object must run to the very end of the reply
            data = _load_lenient(body[position:])
        except json.JSONDecodeError as exc:
            error = error or exc
            continue
        except RecursionError:  # nested past the decoder's depth: no verdict
            continue
        start = position
        break
    if start < 0:
        msg = error.msg if error is not None else "unbalanced braces"
        raise JudgeParseError(f"the JSON object at the end of the reply is not valid JSON ({msg})", reply)
    scores = _dimension_scores(data, low, high, reply)
    for offset, other in _standalone_objects(reply, start):
        lowered = {str(k).strip().lower(): v for k, v in other.items()}
        if not all(d in lowered for d in DIMENSIONS):
            continue
        try:
            theirs = _dimension_scores(other, float("-inf"), float("inf"), reply)
        except JudgeParseError:
            theirs = None
        if theirs != scores:
            line = reply.count("\n", 0, offset) + 1
            raise JudgeParseError(
                f"conflicting verdicts: a score object on line {line} differs from the final one", reply
            )
    return scores
