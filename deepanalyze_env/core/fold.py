"""One reading of policy-written text: the fold every tag, marker and verdict search reads.

A policy can write ``<`` + ZERO WIDTH SPACE + ``Execute>``, a Cyrillic ``Е``, a fullwidth
``＜Execute＞`` or ``‹‹‹`` for a section marker: text a reader (the judge, a person) takes for the
real thing, yet no literal search finds. Every component that looks for a tag, a marker or a
verdict line in text a policy wrote folds it first, by :func:`fold`, so they all read one text
(docs/design.md §6, "One reading of policy text").

:func:`fold` maps each code point on its own, by one ``str.translate`` table (filled as code
points are first seen), applied only where it changes something: ASCII text, and text holding no
character that folds (one regex scan in C), are returned as they are:

0. a hand-listed reading, when the code point has one, is its fold (``READ_AS``: ``⫷`` →
   ``<<<``, ``⠀`` BRAILLE PATTERN BLANK → a space, ``ˍ`` → ``_``, and Unicode TAG characters →
   the ASCII they shadow, since a model decodes those invisible characters);
1. else Unicode NFKC of the code point (fullwidth ``＜`` → ``<``, ``𝐄`` → ``E``, ``ﬁ`` → ``fi``);
2. each resulting character that is a format character (general category ``Cf``: zero-width
   space and joiners, soft hyphen, word joiner, BOM, bidi controls) or default-ignorable
   (variation selectors, Hangul fillers, …) is removed, and so is every combining mark (general
   category ``Mn``/``Me``, after canonical decomposition: ``Ś`` → ``S``, ``SC`` + ``O`` + COMBINING
   DOT BELOW → ``SCO``, ``<`` + a mark → ``<``) — a reader sees the letter under the mark, and a
   mark inside a tag or verdict must not hide it (a base that decomposition reveals is then read
   as rules 0 and 3 read it: ``≮`` → ``<``);
3. each remaining non-ASCII character that Unicode's ``confusables.txt`` reads as printable
   ASCII is replaced by it (Cyrillic ``Е`` → ``E``, ``‹`` → ``<``, ``〈`` → ``<``); the table is
   generated once by ``core/make_fold_table.py`` into ``core/fold_table.py``.

Per code point, so ``fold(a + b) == fold(a) + fold(b)``: a match found in the fold maps back to
the characters the policy typed (:class:`Folded`; :func:`spans` is the same map kept dense,
the tests' oracle), which is what lets the judge transcript escape a look-alike tag where it
stands. (Whole-string NFKC would also compose
combining sequences; a composition never yields ASCII, so no tag is found or missed by the
difference.)

The fold is for *finding*. What the policy wrote is kept: code runs as typed, answers are
compared as typed (the matcher has its own normalisation).
"""

from __future__ import annotations

import bisect
import functools
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from deepanalyze_env.core.fold_table import CONFUSABLES, IGNORABLE, READ_AS

_IGNORABLE_LOW = [low for low, _ in IGNORABLE]


def _ignorable(char: str) -> bool:
    if unicodedata.category(char) == "Cf":
        return True
    code = ord(char)
    at = bisect.bisect_right(_IGNORABLE_LOW, code) - 1
    return at >= 0 and code <= IGNORABLE[at][1]


_MARKS = ("Mn", "Me")


def _unmarked(char: str) -> str:
    """``char`` without its combining marks (``Ś`` → ``S``, ``ọ`` → ``o``), a lone mark → ``""``;
    ``char`` itself when its canonical decomposition holds none (Hangul stays a syllable)."""
    if unicodedata.category(char) in _MARKS:
        return ""
    parts = unicodedata.normalize("NFD", char)
    if len(parts) == 1 or not any(unicodedata.category(c) in _MARKS for c in parts):
        return char
    return "".join(c for c in parts if unicodedata.category(c) not in _MARKS)


def fold_char(char: str) -> str:
    """The fold of one code point (its hand-listed reading, else NFKC, ignorables and combining
    marks removed, look-alikes read as ASCII)."""
    read = READ_AS.get(char)
    if read is not None:
        return read
    bases = "".join(_unmarked(c) for c in unicodedata.normalize("NFKC", char) if not _ignorable(c))
    return "".join(READ_AS.get(c) or CONFUSABLES.get(c, c) for c in bases)


class _Table(dict[int, str]):
    """``str.translate``'s table, filled as code points are first seen (one NFKC call each)."""

    def __missing__(self, code: int) -> str:
        value = fold_char(chr(code))
        self[code] = value
        return value


_TABLE = _Table()
_NON_ASCII_RUN = re.compile(r"[^\x00-\x7f]+")


def _char_class(codes: list[int]) -> re.Pattern[str]:
    """A regex matching one of ``codes`` (sorted) below U+10000, or any code point above it.
    Python's regex engine tests a class of BMP ranges by a table lookup, in C, but walks a list
    for astral ones; all astral code points are therefore candidates (rare in text), and the
    caller's table decides."""
    ranges: list[list[int]] = []
    for code in codes:
        if code > 0xFFFF:
            break
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1][1] = code
        else:
            ranges.append([code, code])
    bmp = "".join(f"\\u{low:04x}-\\u{high:04x}" for low, high in ranges)
    return re.compile(f"[{bmp}\\U00010000-\\U0010ffff]")


@functools.cache
def _classes() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(changed, resized): regexes of the non-ASCII code points whose fold may not be themselves,
    and of those whose fold may not be one character long (removed or expanded); exact below
    U+10000, every astral code point a candidate (:func:`_char_class`). One pass over Unicode,
    once per process and only once a text is not ASCII (about half a second), so that a text
    without such a character is recognised by one regex scan in C, and a mapping back visits
    only the resized."""
    normalized, category = unicodedata.is_normalized, unicodedata.category
    candidates = {code for low, high in IGNORABLE for code in range(low, high + 1)}
    candidates |= {ord(char) for char in (*CONFUSABLES, *READ_AS)}
    for code in range(0x80, 0x110000):
        if not 0xD800 <= code <= 0xDFFF and (
            not normalized("NFKC", chr(code))
            or not normalized("NFD", chr(code))
            or category(chr(code)) in ("Cf", "Mn", "Me")
        ):
            candidates.add(code)
    changed, resized = [], []
    for code in sorted(candidates):
        folded = fold_char(chr(code))
        if folded != chr(code):
            changed.append(code)
        if len(folded) != 1:
            resized.append(code)
    return _char_class(changed), _char_class(resized)


def fold(text: str) -> str:
    """``text`` as every tag, marker and verdict search reads it (module docstring); ``text``
    itself (the same object) when nothing in it folds."""
    if text.isascii() or _classes()[0].search(text) is None:
        return text
    # Mostly ASCII with a few runs of other characters (the common case): translate the runs
    # only; text dense in other scripts: translate it whole.
    pieces, pos, most = [], 0, len(text) // 64 + 1
    for count, run in enumerate(_NON_ASCII_RUN.finditer(text)):
        if count > most:
            return text.translate(_TABLE)
        pieces += [text[pos : run.start()], run.group().translate(_TABLE)]
        pos = run.end()
    return "".join([*pieces, text[pos:]])


def spans(text: str) -> list[int]:
    """``starts[i]``: where ``text[i]``'s fold begins in ``fold(text)``; one more entry, the
    fold's length, closes the list. A folded position ``p`` lies in the fold of ``text[i]``
    for the ``i`` with ``starts[i] <= p < starts[i + 1]``."""
    starts, at = [], 0
    for char in text:
        starts.append(at)
        at += 1 if char.isascii() else len(_TABLE[ord(char)])
    starts.append(at)
    return starts


@dataclass(frozen=True)
class Folded:
    """A policy text and its fold: tags are found in ``folded``, and what the policy wrote is cut
    out of ``raw`` where they stand (the tag readers in ``core/protocol.py`` and
    ``core/tool_calls.py``).

    Most characters fold to exactly one, so the map is kept sparse: ``resized`` holds the raw
    index of each character whose fold is not one character long, ``extra[j]`` the length the
    first ``j`` of them add (``len(fold) - 1`` each). Raw character ``i`` then starts at folded
    position ``i + extra[number of resized before i]`` (:meth:`start`)."""

    raw: str
    folded: str
    resized: tuple[int, ...] = ()
    extra: tuple[int, ...] = (0,)

    @classmethod
    def of(cls, raw: str) -> Folded:
        """``raw`` read; the last few readings are kept, as one turn is read by several rules."""
        return _reading(raw)

    def start(self, i: int) -> int:
        """Where raw character ``i`` begins in the fold (``i == len(raw)``: the fold's length)."""
        return i + self.extra[bisect.bisect_left(self.resized, i)]

    def _first(self, at: int, *, past: bool) -> int:
        """The first raw index ``i`` (up to ``len(raw) + 1``) whose :meth:`start` is at least
        ``at`` (``past``: greater than ``at``)."""
        if not self.resized:
            return min(max(at + past, 0), len(self.raw) + 1)
        low, high = 0, len(self.raw) + 1
        while low < high:
            mid = (low + high) // 2
            start = self.start(mid)
            if start > at or (start == at and not past):
                high = mid
            else:
                low = mid + 1
        return low

    def raw_index(self, at: int, *, after: bool = False) -> int:
        """The raw index of folded position ``at``: the first raw character whose fold starts
        there or later; ``after``: the index just past the character that holds ``at - 1``
        (where a cut after a tag ending at ``at`` falls)."""
        return self._first(at - 1, past=True) if after else self._first(at, past=False)

    def covering(self, begin: int, end: int) -> tuple[int, int]:
        """The raw characters whose folds cover ``folded[begin:end]`` (``end > begin``), as
        ``(i, j)`` for ``raw[i:j]``: a character that is part of the range (``«`` read as ``<<``)
        is in it whole, and characters that fold to nothing are in it inside the range but not
        at its edges — what a look-alike tag spans where the policy typed it."""
        return self._first(begin, past=True) - 1, self._first(end - 1, past=True)

    def raw_slice(self, begin: int, end: int) -> str:
        """The raw characters whose folds lie within ``folded[begin:end]``: a character that is
        part tag (``«`` read as ``<<``) stays with the tag, and invisible characters at either
        edge (they fold to nothing) stay with the text between the tags."""
        first = self._first(begin, past=False)
        last = self._first(end, past=True) - 1
        return self.raw[first : max(first, last)]

    def cut_after(self, stops: Iterable[str]) -> str:
        """The raw text up to and including the earliest of ``stops`` found in the fold (a
        look-alike stop is the stop) — what a sampler stopped there leaves — or all of it when
        none is there. The one text cut: ``ActionFormat.cut`` applies it with a format's stop
        strings."""
        cut = -1
        for stop in stops:
            pos = self.folded.find(stop)
            if pos >= 0 and (cut < 0 or pos + len(stop) < cut):
                cut = pos + len(stop)
        return self.raw if cut < 0 else self.raw[: self.raw_index(cut, after=True)]


@functools.lru_cache(maxsize=32)
def _reading(raw: str) -> Folded:
    folded = fold(raw)
    if folded is raw:
        return Folded(raw, folded)
    resized, extra = [], [0]
    for m in _classes()[1].finditer(raw):
        grown = len(_TABLE[ord(m.group())]) - 1
        if grown:
            resized.append(m.start())
            extra.append(extra[-1] + grown)
    return Folded(raw, folded, tuple(resized), tuple(extra))
