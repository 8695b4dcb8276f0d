"""The DeepAnalyze action protocol: truncation, done detection, code and answer extraction.

Pure functions over text, so trainers, the env and offline tools agree on what a turn means.
Format checks in ``v1`` read only what the policy wrote (assistant turns), never execution
output: a cell that prints ``<Answer>`` must not satisfy the gate.

They also read the protocol, not its text (:func:`read_turn`, docs/design.md §6): a tag
counts only in the policy's *prose*. A ``# <Analyze>…</Analyze>`` comment in a code block, a
tag inside a fenced block, or one inside ``<Execute>`` text the policy quoted itself is
something the policy wrote *about* the protocol, not a use of it, so it neither satisfies the
format gate nor ends the episode with an answer.

Every tag, fence and ``Answer:`` marker is looked for in the turn's *fold* (``core/fold.py``,
docs/design.md §6 "One reading of policy text"): ``＜Answer＞``, ``<`` + ZERO WIDTH SPACE +
``Code>`` or a Cyrillic ``С`` in ``<Сode>`` read as the tags they imitate, here as in the judge
transcript and the reward-hacking watch. What is returned as the policy's (code to run, an
answer body) is its text as typed, cut where the fold's tags stand (``fold.Folded``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from deepanalyze_env.core.fold import Folded, fold

CODE_CLOSE = "</Code>"
ANSWER_OPEN = "<Answer>"
ANSWER_CLOSE = "</Answer>"
STOP_TAGS = (CODE_CLOSE, ANSWER_CLOSE)
GATE_TAGS = ("<Analyze>", "</Analyze>", ANSWER_OPEN, ANSWER_CLOSE)

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
CODE_OPEN = "<Code>"
FENCE = "```"
EXECUTE_OPEN = "<Execute>"
EXECUTE_CLOSE = "</Execute>"
# An observation tag as a policy might type it into its own text, read in the fold
# (core/fold.py): opening or closing, any case, whitespace allowed inside (``<Execute >``,
# ``<\nExecute>``, ``< / execute>``); group 1 the tag's inside, group 2 its ``>`` when closed.
# The judge transcript escapes what it matches and the reward-hacking watch flags it. Possessive
# and unambiguous (``\s*+(?:/\s*+)?``, not ``\s*/?\s*``, whose two runs can split one stretch of
# whitespace every way): linear in a ``<`` followed by a megabyte of spaces, not quadratic.
OBSERVATION_TAG = re.compile(r"<(\s*+(?:/\s*+)?(?:execute|tool_response)\b[^<>]{0,200})(>?)", re.IGNORECASE)
# A fenced block: optional language word on the opening line, body, closing fence. The word and
# the blanks around it possessive (giving them back to the body never finds another fence), so
# a fence never closed after a megabyte-long word is read in linear time, not quadratic.
_FENCE = re.compile(r"```[ \t]*+([A-Za-z0-9_+-]*+)[ \t]*+\r?\n?(.*?)```", re.DOTALL)
PYTHON_FENCE_LANGS = frozenset({"python", "py", "python3"})


def truncate_action(action: str) -> str:
    """Cut after the earliest ``</Code>`` or ``</Answer>`` (read in the fold) — what stop
    sequences would do. The v1 profile's rule: the tag format's ``cut`` (``core/formats``)."""
    return Folded.of(action).cut_after(STOP_TAGS)


def strip_think(text: str) -> str:
    """Remove ``<think>…</think>`` spans, read in the fold (an unclosed one runs to the end)."""
    folded = Folded.of(text)
    if folded.folded is text:
        return _THINK.sub("", text)
    pieces, pos = [], 0
    for m in _THINK.finditer(folded.folded):
        pieces.append(text[pos : folded.raw_index(m.start())])
        pos = folded.raw_index(m.end(), after=True)
    return "".join([*pieces, text[pos:]])


def blocks(text: str, open_tag: str, close_tag: str) -> Iterator[str]:
    """Inner texts of ``open…close`` blocks, left to right, in linear time.

    Equivalent to ``re.finditer(open(.*?)close, DOTALL)`` but without its quadratic cost on
    text with many opening tags and no closing one (a policy can write a megabyte of
    ``<Code>``): once an opening tag has no closing tag after it, no later one can.
    """
    pos = 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            return
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            return
        yield text[start + len(open_tag) : end]
        pos = end + len(close_tag)


@dataclass(frozen=True)
class TurnReading:
    """One turn as the protocol reads it: its prose and the answers written in it.

    ``prose`` holds the pieces of the turn's visible text (``<think>`` removed) that are the
    policy's own words: everything but the inside of code blocks, fenced blocks, quoted
    ``<Execute>`` text and answer bodies (a complete answer's tags themselves are prose; an
    unclosed ``<Answer>`` is not, and a stray ``</Answer>`` counts for nothing). ``answers``
    are the bodies of the complete ``<Answer>…</Answer>`` blocks opened in prose, raw (a fence
    in a report is part of the report).
    """

    prose: tuple[str, ...]
    answers: tuple[str, ...]

    def prose_text(self) -> str:
        """The prose pieces joined by newlines (no tag can span two pieces: tags hold no space)."""
        return "\n".join(self.prose)


def read_turn(turn: str) -> TurnReading:
    """Read one policy turn the way the env acts on it (docs/design.md §6, "The protocol, read").

    1. ``<think>…</think>`` is removed (an unclosed one runs to the end), as for code extraction.
    2. Code blocks are found exactly as :func:`extract_code_block` finds them: a ``<Code>``
       anywhere opens one, which runs to the first ``</Code>`` after it — or, never closed, to
       the end of the turn (generation stopped at another stop tag, such as a ``</Answer>``
       written in a comment, while the policy was still writing code). Nothing inside counts.
    3. In the text between code blocks, the earliest of these opens a region that runs to its
       own closing mark, or to the end of that text when it has none: a fence (``` to the next
       ```; any language), a quoted ``<Execute>`` (to ``</Execute>``), an answer (``<Answer>``
       to the first ``</Answer>``, which is also where truncation stops a turn). Fences and
       quotes are hidden; an answer's tags are prose and its body is the answer.

    Every mark is found in the turn's fold (module docstring): ``prose`` is folded text, and
    each answer is the policy's text as typed between its (folded) tags.

    Linear in the turn's length, whatever the policy wrote (a megabyte of openers included).
    """
    reading = Folded.of(strip_think(turn))
    text = reading.folded
    prose: list[str] = []
    answers: list[tuple[int, int]] = []
    pos = 0
    while pos <= len(text):
        start = text.find(CODE_OPEN, pos)
        stop = len(text) if start < 0 else start
        _read_prose(text, pos, stop, prose, answers)
        if start < 0:
            break
        end = text.find(CODE_CLOSE, start + len(CODE_OPEN))
        if end < 0:
            break
        pos = end + len(CODE_CLOSE)
    return TurnReading(tuple(prose), tuple(reading.raw_slice(b, e) for b, e in answers))


# region opener -> its closing mark; an answer's body is kept, the others are hidden
_REGIONS = {FENCE: FENCE, EXECUTE_OPEN: EXECUTE_CLOSE, ANSWER_OPEN: ANSWER_CLOSE}


def _read_prose(text: str, pos: int, stop: int, prose: list[str], answers: list[tuple[int, int]]) -> None:
    """Step 3 of :func:`read_turn` over ``text[pos:stop]`` (folded text outside code blocks);
    ``answers`` gets each answer body's span."""
    nxt = {opener: text.find(opener, pos, stop) for opener in _REGIONS}  # cached: linear overall
    while pos < stop:
        for opener, at in nxt.items():
            if 0 <= at < pos:
                nxt[opener] = at = text.find(opener, pos, stop)
        found = [(at, opener) for opener, at in nxt.items() if at >= 0]
        if not found:
            prose.append(text[pos:stop])
            return
        at, opener = min(found)
        prose.append(text[pos:at])
        body = at + len(opener)
        close = text.find(_REGIONS[opener], body, stop)
        if opener == ANSWER_OPEN:
            if close < 0:
                return  # an answer never closed: no answer (nor its tag), and hides what follows
            answers.append((body, close))
            prose += [ANSWER_OPEN, ANSWER_CLOSE]
        elif close < 0:
            return
        pos = close + len(_REGIONS[opener])


def has_answer(action: str) -> bool:
    """True when the turn holds a complete ``<Answer>`` block opened in prose (:func:`read_turn`)."""
    return bool(read_turn(action).answers)


def _code_blocks(text: str) -> Iterator[str]:
    """The inner texts of ``text``'s ``<Code>…</Code>`` blocks as typed, found in its fold."""
    reading = Folded.of(strip_think(text))
    pos = 0
    while (start := reading.folded.find(CODE_OPEN, pos)) >= 0:
        body = start + len(CODE_OPEN)
        end = reading.folded.find(CODE_CLOSE, body)
        if end < 0:
            return
        yield reading.raw_slice(body, end)
        pos = end + len(CODE_CLOSE)


def extract_code_block(action: str) -> str | None:
    """Inner text of the first ``<Code>…</Code>`` block (tags read in the fold, the text as
    typed), or None when there is none."""
    return next(_code_blocks(action), None)


def extract_code(action: str) -> str | None:
    """Python source of the turn, as typed: the fenced body if fenced (``python``/``py``/none;
    the fence read in the fold), else the whole block.

    Returns None when the turn holds no ``<Code>`` block or the block is blank.
    """
    block = extract_code_block(action)
    if block is None:
        return None
    reading = Folded.of(block)
    fence = _FENCE.search(reading.folded)
    code = reading.raw_slice(fence.start(2), fence.end(2)) if fence else block
    code = code.strip("\n")
    return code if code.strip() else None


def code_blocks(policy_text: str) -> list[str]:
    return list(_code_blocks(policy_text))


def is_python_fenced(block: str) -> bool:
    """True when the whole block (read in the fold) is one fenced block tagged as Python. A
    fence inside the body (```python A ``` B ```) makes it two pieces, of which
    :func:`extract_code` runs only the first: not one fenced block."""
    stripped = fold(block).strip()
    fence = _FENCE.fullmatch(stripped)
    return fence is not None and fence.group(1).lower() in PYTHON_FENCE_LANGS and FENCE not in fence.group(2)


def extract_answer(policy_turns: Iterable[str]) -> str | None:
    """Final answer: the policy's last ``<Answer>`` block opened in prose (:func:`read_turn`),
    text after its last ``Answer:``."""
    last = None
    for turn in policy_turns:
        answers = read_turn(turn).answers
        if answers:
            last = answers[-1]
    return answer_value(last)


def answer_value(text: str | None) -> str | None:
    """The answer an answer text gives: after its last ``Answer:``, stripped (both action
    formats read a final answer by this rule)."""
    if text is None:
        return None
    text = text.strip()
    reading = Folded.of(text)
    marker = reading.folded.rfind("Answer:")
    if marker >= 0:
        text = text[reading.raw_index(marker + len("Answer:"), after=True) :].strip()
    return text


def missing_gate_tags(policy_turns: Sequence[str] | str) -> list[str]:
    """The gate tags that appear in the prose of none of the policy's turns, in
    :data:`GATE_TAGS` order. Each turn is read on its own (:func:`read_turn`), as the env read
    it when it was played: a code block left open in one turn does not run into the next. The
    answer's two tags count only as a complete ``<Answer>…</Answer>`` block within one turn
    (an answer the env could have acted on): an opener never closed and a stray closer in
    another turn are no answer. A single string is read as one turn."""
    turns = [policy_turns] if isinstance(policy_turns, str) else policy_turns
    readings = [read_turn(turn) for turn in turns]
    prose = "\n".join(reading.prose_text() for reading in readings)
    answered = any(reading.answers for reading in readings)
    present = {tag: (answered if tag in (ANSWER_OPEN, ANSWER_CLOSE) else tag in prose) for tag in GATE_TAGS}
    return [tag for tag in GATE_TAGS if not present[tag]]


NO_CODE_MESSAGE = (
    "[Error]:\nNo code was found in this turn. Put Python code in a fenced block inside "
    "<Code>...</Code>, or give the final answer inside <Answer>...</Answer>."
)
"""The observation of a turn without a ``<Code>`` block (it counts as a ``no_code`` turn)."""


def render_observation(output: str) -> str:
    return f"\n<Execute>\n{output}\n</Execute>\n"
