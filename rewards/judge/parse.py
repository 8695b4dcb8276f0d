"""Reading a verdict out of a judge's reply, strictly: anything doubtful is a parse failure of the
judge — except what the policy's own text caused, which scores 0.

The rubrics ask for the verdict in one place — a final line ``SCORE: N``, or a final JSON object
of five dimensions — and only that place is read, in the reply as folded by
:func:`deepanalyze_env.core.fold.fold` (so ``ＳＣＯＲＥ：５`` or ``SC\u200bORE: 5`` is the verdict line
it folds to). Judges quote the candidate, and a candidate may have written ``SCORE: 5`` (or a
score object) to game the judge, so:

- the verdict is the reply's **last non-empty line** (``SCORE: N``, markdown emphasis, a heading
  mark, ``Final`` and a ``/5`` allowed) or the JSON object that **ends** the reply (a closing
  fence after it allowed); anything after it — a quoted ``SCORE: 5`` included — leaves no verdict;
- verdicts of the same form standing on their own lines elsewhere that disagree with the final
  one make a **conflict**. When a value on either side is one the policy wrote (a ``SCORE: N``
  or a score object anywhere in its folded text), the judge was quoting the episode: the reply
  reads as :class:`FromPolicy`, which the session scores 0 with a note. Otherwise the **lower**
  value counts (per dimension for score objects). A conflict is never an exclusion: a policy
  could choose that. Mentions inside a sentence do not count;
- a reply whose last line is no clean verdict but mentions a ``SCORE: N`` the policy wrote (a
  judge that quoted ``Answer: SCORE: 5`` last, or ended "the candidate claims SCORE: 5") is
  :class:`FromPolicy` too: the policy's verdict took the place of the judge's;
- a verdict the rule reads that is no valid one (out of the rubric's range, an object missing a
  dimension, a ``SCORE:`` without a number) and that the policy wrote (its value, its object, its
  line) is :class:`FromPolicy`: a judge that parroted the episode's ``SCORE: 9`` gave no verdict
  of its own, and the policy's text chose that;
- any other number out of range, a final line with two ``SCORE:``, a JSON object missing a
  dimension, a reply with no verdict raise :class:`JudgeParseError` carrying the raw reply —
  never a guessed number. A reply whose only verdict equals a valid one the policy wrote is read
  as the judge's: no parser can tell agreement from quotation, and calling it none would let the
  policy's text exclude its own episode.

"What the policy wrote" (``policy_text``) is its raw text *and* that text as the prompt showed it
(``rewards.judge.session`` passes both: the renderer breaks up ``<<<`` runs and escapes tags, and a
judge quotes what it was shown), both read folded — and, where they hold HTML entities or JSON
``\\uXXXX`` escapes, decoded and folded as well (:func:`policy_reading`). A reply cut by the
token limit is no verdict; :func:`cut_quoting_policy` says when it was cut while quoting the
policy's verdicts.

``which="first"`` keeps upstream's rule (the first ``SCORE:`` anywhere, in the raw reply) for
the ``upstream`` profile (docs/design.md §8). A reply cut by the token limit never reaches these
functions as a verdict: the client rejects it first (``rewards.judge.client``).
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass

from deepanalyze_env.core.fold import fold
from rewards.judge.errors import JudgeParseError

DIMENSIONS = ("usefulness", "richness", "soundness", "interpretability", "readability")

# "SCORE:" (any case, optional markdown emphasis around it), then the number (maybe emphasised),
# then an optional "/5"-style denominator: upstream's first-match rule. Every run is possessive
# (``*+``): these patterns read policy text, and a backtracking run over 20k spaces is seconds.
_SCORE = re.compile(r"(?<![A-Za-z0-9_])score\s*+\**+\s*+[:：]", re.IGNORECASE)
_NUMBER = re.compile(
    r"\s*+[*_`\"']*+\s*+([-+]?\d++(?:\.\d++)?+)(?![\d.]*\d)\s*+[*_`\"']*+(?:\s*+/\s*+\d++(?:\.\d++)?)?"
)
# A whole line that is a verdict: decoration, optional "Final", "SCORE:", the number, optional
# "/5", decoration or a full stop. Nothing else on the line.
_DECOR = r"[ \t*_`\"']*+"
_VERDICT_LINE = re.compile(
    r"[ \t#*_`]*+(?:final[ \t]++)?score" + _DECOR + r"[:：]" + _DECOR + r"(?P<number>[-+]?\d++(?:\.\d++)?)"
    r"(?:[ \t]*+/[ \t]*+\d++(?:\.\d++)?)?" + _DECOR + r"\.?" + _DECOR,
    re.IGNORECASE,
)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_CLOSING_FENCE = re.compile(r"\n?[ \t]*```[ \t]*\Z")
_MAX_OPENINGS = 64
_MAX_POLICY_OPENINGS = 256  # the most "{" a text is decoded from when looking for score objects
_MAX_OBJECT_DEPTH = 8  # how deep inside a decoded object a score object is still looked for
_WORD_GOES_ON = re.compile(r"[\w.]")
_MIN_CUT_QUOTE = 12  # the least of a policy's verdict line a cut reply must end with to count
_QUOTE_MARKS = ">-*\u2022 \t"  # what a judge puts before a line it quotes (after folding)
_TAG = re.compile(r"<[^<>\n]*>")
_OPENING = re.compile(r"\{|score")
_ESCAPE = re.compile(r"&(?:#[0-9]{1,7}|#x[0-9a-f]{1,6}|[a-z][a-z0-9]{1,30});?|\\u[0-9a-f]{4}", re.IGNORECASE)
_JSON_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})")


@dataclass(frozen=True)
class FromPolicy:
    """A reply whose verdicts conflict, one side being a verdict the policy wrote: the judge quoted
    the episode, so no verdict of its own can be told apart. The rubric scores 0 with ``reason``."""

    reason: str


def policy_reading(policy_text: str) -> str:
    """What the policy wrote, as its verdicts are looked for: its fold, and — when it holds an HTML
    entity or a JSON ``\\uXXXX`` escape — the fold of its decoded text after it, on lines of their
    own. A judge decodes ``SCORE&#58; 5`` or ``SCORE\\u003a 5`` as ``SCORE: 5``, so a claim spelt
    so is the policy's as much as the visible one. Only the policy's side is decoded (the fold
    itself reads code point by code point): decoding can only find more that the policy wrote."""
    folded = fold(policy_text)
    if _ESCAPE.search(policy_text) is None:
        return folded
    decoded = html.unescape(_JSON_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), policy_text))
    return f"{folded}\n{fold(decoded)}"


def _scores_in(folded: str) -> set[float]:
    values = set()
    for match in _SCORE.finditer(folded):
        number = _NUMBER.match(folded, match.end())
        if number is not None:
            values.add(float(number.group(1)))
    return values


def policy_scores(policy_text: str) -> set[float]:
    """Every ``SCORE: N`` value the policy wrote anywhere in its (folded) text."""
    return _scores_in(policy_reading(policy_text))


def _tail(line: str, start: int) -> str:
    """A ``SCORE:`` mention's text from ``SCORE`` to the end of its line, stripped and lowered."""
    end = line.find("\n", start)
    return line[start : len(line) if end < 0 else end].strip().lower()


@dataclass(frozen=True)
class _Written:
    """What the policy wrote, read once: its ``SCORE:`` values, and each of its ``SCORE:`` mentions
    from ``SCORE`` to the end of its line (``score: high``)."""

    scores: frozenset[float]
    tails: frozenset[str]

    @classmethod
    def of(cls, policy_text: str) -> _Written:
        folded = policy_reading(policy_text)
        tails = {_tail(folded, m.start()) for m in _SCORE.finditer(folded)}
        return cls(frozenset(_scores_in(folded)), frozenset(t for t in tails if len(t) > len("score:")))


def _quotes_a_policy_score(line: str, written: _Written) -> bool:
    """``line`` (folded) mentions a ``SCORE:`` the policy wrote — its value, or a mention of its
    whole (``SCORE: high``, followed by the end of the line or a space or punctuation, never by
    more of a word or number): the judge quoted or restated the episode's own verdict where its
    own should stand."""
    match = _SCORE.search(line)
    if match is None or not (written.scores or written.tails):
        return False
    if _scores_in(line) & written.scores:
        return True
    tail = _tail(line, match.start())
    return any(
        tail == t or (tail.startswith(t) and not _WORD_GOES_ON.match(tail, len(t))) for t in written.tails
    )


def _lowered(data: dict) -> dict[str, object]:
    return {str(k).strip().lower(): v for k, v in data.items()}


def _nested_dicts(data: object, depth: int = 0) -> list[dict]:
    """``data`` when a dict, and the dicts inside it down to :data:`_MAX_OBJECT_DEPTH`."""
    if depth > _MAX_OBJECT_DEPTH:
        return []
    values = data.values() if isinstance(data, dict) else data if isinstance(data, list) else ()
    inner = [d for value in values for d in _nested_dicts(value, depth + 1)]
    return [data, *inner] if isinstance(data, dict) else inner


def _objects_in(folded: str) -> list[dict[str, object]]:
    """Every JSON object naming a dimension in ``folded`` (keys lowered): decoded from each ``{``
    (at most :data:`_MAX_POLICY_OPENINGS` of them, so hostile text costs a bounded number of
    decodes), a decoded object's text skipped and the objects nested in it read from the decoded
    value, so a brace inside a string or a nested object hides none. A trailing comma is read
    as the verdict parser reads it (the text is decoded once more with them removed)."""
    found: list[dict[str, object]] = []
    decoder = json.JSONDecoder()
    texts = [folded]
    if _TRAILING_COMMA.search(folded):
        texts.append(_TRAILING_COMMA.sub(r"\1", folded))
    for text in texts:
        position, tried = text.find("{"), 0
        while position >= 0 and tried < _MAX_POLICY_OPENINGS:
            tried += 1
            try:
                data, end = decoder.raw_decode(text, position)
            except (ValueError, RecursionError):  # not JSON, or nested past the decoder's depth
                position = text.find("{", position + 1)
                continue
            for obj in _nested_dicts(data):
                lowered = _lowered(obj)
                if any(d in lowered for d in DIMENSIONS) and lowered not in found:
                    found.append(lowered)
            position = text.find("{", end)
    return found


def policy_score_objects(policy_text: str) -> list[dict[str, object]]:
    """Every JSON object naming a dimension that the policy wrote (keys lowered), flat or not."""
    folded = policy_reading(policy_text)
    if "{" not in folded or not any(d in folded.lower() for d in DIMENSIONS):
        return []
    return _objects_in(folded)


def _snippet(reply: str, limit: int = 80) -> str:
    flat = " ".join(reply.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _first_score(reply: str, low: float, high: float, policy_text: str) -> float | FromPolicy:
    """Upstream's rule: the first ``SCORE:`` anywhere in the reply; one that is no valid verdict
    and that the policy wrote is :class:`FromPolicy`."""
    match = _SCORE.search(reply)
    if match is None:
        raise JudgeParseError(f"no 'SCORE:' line in the reply ({_snippet(reply)!r})", reply)
    line = reply[match.start() :].splitlines()[0]
    number = _NUMBER.match(reply, match.end())
    try:
        if number is None:
            raise JudgeParseError(f"the first 'SCORE:' line has no number ({_snippet(line)!r})", reply)
        return _in_range(number.group(1), low, high, reply)
    except JudgeParseError as exc:
        if _quotes_a_policy_score(fold(line), _Written.of(policy_text)):
            return FromPolicy(
                f"the judge's first SCORE is the episode's own and no valid verdict ({exc}): scored 0"
            )
        raise


def _in_range(text: str, low: float, high: float, reply: str) -> float:
    value = float(text)
    if not low <= value <= high:
        raise JudgeParseError(f"score {text} is outside {low:g}–{high:g}", reply)
    return value


def parse_score(
    reply: str, low: float, high: float, *, which: str = "last", policy_text: str = ""
) -> float | FromPolicy:
    """The verdict of a ``SCORE: N`` reply: its final line (``which="last"``, v1; conflicts as the
    module docstring says, ``policy_text`` being what the policy wrote) or the first ``SCORE:``
    anywhere (``which="first"``, upstream)."""
    if which not in ("last", "first"):
        raise ValueError(f"which must be 'last' or 'first', got {which!r}")
    if which == "first":
        return _first_score(reply, low, high, policy_text)
    folded = fold(reply)
    lines = [(number, line.strip()) for number, line in enumerate(folded.splitlines(), 1) if line.strip()]
    if not lines or _SCORE.search(folded) is None:
        raise JudgeParseError(f"no 'SCORE:' line in the reply ({_snippet(reply)!r})", reply)
    final_number, final = lines[-1]
    verdict = _VERDICT_LINE.fullmatch(final)
    written = _Written.of(policy_text)
    if (verdict is None or len(_SCORE.findall(final)) > 1) and _quotes_a_policy_score(final, written):
        return FromPolicy(
            f"the judge's reply ends with the episode's own verdict ({_snippet(final)!r}) where "
            "the rubric asks for the judge's: scored 0"
        )
    if len(_SCORE.findall(final)) > 1:
        raise JudgeParseError(f"the final line holds more than one verdict ({_snippet(final)!r})", reply)
    if verdict is None:
        raise JudgeParseError(
            f"the final line is not a 'SCORE: N' verdict ({_snippet(final)!r}); "
            "the rubric asks for the verdict there and nothing after it",
            reply,
        )
    value = float(verdict.group("number"))
    others = {}  # value → where it first stands
    for number, line in lines[:-1]:
        other = _VERDICT_LINE.fullmatch(line)
        if other is not None and float(other.group("number")) != value:
            others.setdefault(float(other.group("number")), (number, line))
    if not others:
        try:
            return _in_range(verdict.group("number"), low, high, reply)
        except JudgeParseError as exc:
            if value in written.scores:
                return FromPolicy(
                    f"the judge's only verdict is the episode's own and no valid one ({exc}): scored 0"
                )
            raise
    quoted = sorted(({value} | set(others)) & written.scores)
    if quoted:
        return FromPolicy(
            f"the judge's reply holds conflicting verdicts and SCORE: {quoted[0]:g} is one the "
            f"episode wrote itself (final line {final_number}: {_snippet(final)!r}): scored 0"
        )
    lowest = min(value, *others)
    return _in_range(f"{lowest:g}", low, high, reply)


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


def parse_dimensions(
    reply: str, low: float = 1.0, high: float = 5.0, *, policy_text: str = ""
) -> dict[str, float] | FromPolicy:
    """The five dimension scores from the JSON object that ends the (folded) reply, bare or
    fenced; conflicting score objects standing on their own lines as the module docstring says."""
    folded = fold(reply)
    body = _CLOSING_FENCE.sub("", folded.rstrip()).rstrip()
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
    final = {str(k).strip().lower(): v for k, v in data.items()} if isinstance(data, dict) else None
    conflicting: list[tuple[int, dict[str, object]]] = []
    for offset, other in _standalone_objects(folded, start):
        lowered = {str(k).strip().lower(): v for k, v in other.items()}
        if all(d in lowered for d in DIMENSIONS) and lowered != final:
            conflicting.append((offset, lowered))
    written = policy_score_objects(policy_text) if policy_text else []
    if conflicting:
        quoted = [o for o, obj in [(-1, final), *conflicting] if obj is not None and obj in written]
        if quoted:
            line = folded.count("\n", 0, quoted[0]) + 1
            where = "the final one" if quoted[0] < 0 else f"the one on line {line}"
            return FromPolicy(
                f"the judge's reply holds conflicting score objects and {where} is one the episode "
                "wrote itself: scored 0"
            )
    try:
        scores = _dimension_scores(data, low, high, reply)
    except JudgeParseError as exc:
        if final is not None and final in written:
            return FromPolicy(
                f"the judge's only score object is the episode's own and no valid verdict ({exc}): scored 0"
            )
        raise
    for _, other in conflicting:
        try:  # a conflicting object that is no valid verdict is not one: it cannot lower anything
            theirs = _dimension_scores(other, low, high, reply)
        except JudgeParseError:
            continue
        scores = {dim: min(scores[dim], theirs[dim]) for dim in DIMENSIONS}
    return scores


def cut_quoting_policy(reply: str, policy_text: str) -> FromPolicy | None:
    """:class:`FromPolicy` when ``reply`` — cut by the token limit, so holding no verdict — was cut
    while quoting the policy's verdicts: a line of it, quote and list marks aside, is one of the
    policy's verdict-holding lines verbatim, or mentions a ``SCORE:`` whose value the policy wrote
    on a line that opens with it, tags and decoration aside (``SCORE: 5``, ``<Analyze>SCORE: 5``,
    as a flood has it); or it holds a score object the policy wrote; or it stops inside one
    (its last line, from its start or from a ``{`` or ``score`` in it, holds at least
    :data:`_MIN_CUT_QUOTE` characters that begin a verdict-holding line of the policy's: a score
    object with a 6,000-character note, cut before its end, quoted after ``The candidate wrote:``). A flood of
    verdict lines, or one long one, chooses that cut. A value the policy printed only inside
    other text (``mean score: 4.2`` in a table) does not make a mention of it a quote: an honest
    episode is not the cause of a judge talking past its limit. A cut reply without the policy's
    verdicts stays the judge's failure: None."""
    if not policy_text:
        return None
    folded = fold(reply)
    policy = policy_reading(policy_text)
    verdict_lines = {line.strip().lower() for line in policy.splitlines() if _holds_a_verdict(line)}
    claimed = set()  # the values of the policy's lines that open with a SCORE (tags aside)
    for line in verdict_lines:
        bare = _TAG.sub("", line).lstrip(_QUOTE_MARKS + "#_`\"'").strip()
        opening = _SCORE.match(bare)
        number = _NUMBER.match(bare, opening.end()) if opening is not None else None
        if number is not None:
            claimed.add(float(number.group(1)))
    for line in folded.splitlines():
        quoted = line.strip().lstrip(_QUOTE_MARKS).strip()
        mentions = _scores_in(quoted) if claimed and _SCORE.search(quoted) else set()
        if quoted.lower() in verdict_lines or mentions & claimed:
            return FromPolicy(
                "the judge's reply was cut by the token limit while quoting the episode's own "
                f"verdicts ({_snippet(quoted)!r}): scored 0"
            )
    objects = policy_score_objects(policy_text) if "{" in folded else []
    if objects and any(obj in objects for obj in _objects_in(folded)):
        return FromPolicy(
            "the judge's reply was cut by the token limit while quoting a score object the "
            "episode wrote: scored 0"
        )
    last = folded.rstrip().rsplit("\n", 1)[-1].strip().lower()
    if _begins_a_verdict(last, verdict_lines):
        return FromPolicy(
            "the judge's reply was cut by the token limit inside a verdict the episode wrote "
            f"({_snippet(last)!r}): scored 0"
        )
    return None


def _openings(line: str, most: int) -> list[int]:
    """Where in ``line`` (folded, lowered) a verdict line or object could begin: its start, and
    each ``{`` and each ``score`` (the first ``most`` of them)."""
    found = []
    for match in _OPENING.finditer(line):
        if len(found) >= most:
            break
        found.append(match.start())
    return [0, *found]


def _begins_a_verdict(last: str, verdict_lines: set[str]) -> bool:
    """``last`` — a cut reply's last line, folded and lowered — holds, from its start (quote marks
    aside) or from any ``{`` or ``score`` in it to its end, at least :data:`_MIN_CUT_QUOTE`
    characters that begin one of the policy's verdict lines (from that line's start, quote marks
    aside, or from a ``{`` or ``score`` in it): a judge cut while quoting the policy's verdict,
    whatever it wrote before the quote on that line (``The candidate wrote: {…``, ``"``, ``1.``)."""
    tails = {last[at:].lstrip(_QUOTE_MARKS) for at in _openings(last, _MAX_OPENINGS)}
    tails = {t for t in tails if len(t) >= _MIN_CUT_QUOTE}
    if not tails:
        return False
    heads = {line[at:].lstrip(_QUOTE_MARKS) for line in verdict_lines for at in _openings(line, 8)}
    return any(len(head) > len(tail) and head.startswith(tail) for tail in tails for head in heads)


def _holds_a_verdict(line: str) -> bool:
    """A line (folded) that holds a ``SCORE:`` or the opening of a score object."""
    if _SCORE.search(line):
        return True
    lowered = line.lower()
    return "{" in line and any(d in lowered for d in DIMENSIONS)
