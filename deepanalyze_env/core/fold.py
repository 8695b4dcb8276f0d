"""One reading of policy-written text: the fold every tag, marker and verdict search reads.

A policy can write ``<`` + ZERO WIDTH SPACE + ``Execute>``, a Cyrillic ``Е``, a fullwidth
``＜Execute＞`` or ``‹‹‹`` for a section marker: text a reader (the judge, a person) takes for the
real thing, yet no literal search finds. Every component that looks for a tag, a marker or a
verdict line in text a policy wrote folds it first, by :func:`fold`, so they all read one text
(docs/design.md §6, "One reading of policy text").

:func:`fold` maps each code point on its own, by one ``str.translate`` table:

1. Unicode NFKC of the code point (fullwidth ``＜`` → ``<``, ``𝐄`` → ``E``, ``ﬁ`` → ``fi``);
2. each resulting character that is a format character (general category ``Cf``: zero-width
   space and joiners, soft hyphen, word joiner, BOM, bidi controls) or default-ignorable
   (variation selectors, Hangul fillers, …) is removed;
3. each remaining non-ASCII character that Unicode's ``confusables.txt`` reads as printable
   ASCII is replaced by it (Cyrillic ``Е`` → ``E``, ``‹`` → ``<``, ``〈`` → ``<``); the table is
   generated once by ``core/make_fold_table.py`` into ``core/fold_table.py``.

Per code point, so ``fold(a + b) == fold(a) + fold(b)``: a match found in the fold maps back to
the characters the policy typed (:func:`spans`), which is what lets the judge transcript escape a
look-alike tag where it stands. (Whole-string NFKC would also compose combining sequences; a
composition never yields ASCII, so no tag is found or missed by the difference.) ASCII text is
its own fold, and is returned as is without a pass over it.

The fold is for *finding*. What the policy wrote is kept: code runs as typed, answers are
compared as typed (the matcher has its own normalisation).
"""

from __future__ import annotations

import bisect
import unicodedata
from dataclasses import dataclass

from deepanalyze_env.core.fold_table import CONFUSABLES, IGNORABLE

_IGNORABLE_LOW = [low for low, _ in IGNORABLE]


def _ignorable(char: str) -> bool:
    if unicodedata.category(char) == "Cf":
        return True
    code = ord(char)
    at = bisect.bisect_right(_IGNORABLE_LOW, code) - 1
    return at >= 0 and code <= IGNORABLE[at][1]


def fold_char(char: str) -> str:
    """The fold of one code point (NFKC, ignorables removed, look-alikes read as ASCII)."""
    return "".join(CONFUSABLES.get(c, c) for c in unicodedata.normalize("NFKC", char) if not _ignorable(c))


class _Table(dict[int, str]):
    """``str.translate``'s table, filled as code points are first seen (one NFKC call each,
    ever, instead of 1.1 million at import)."""

    def __missing__(self, code: int) -> str:
        value = fold_char(chr(code))
        self[code] = value
        return value


_TABLE = _Table()


def fold(text: str) -> str:
    """``text`` as every tag, marker and verdict search reads it (module docstring)."""
    if text.isascii():
        return text
    return text.translate(_TABLE)


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


def original_range(starts: list[int], begin: int, end: int) -> tuple[int, int]:
    """The characters of the original text whose folds cover ``fold(text)[begin:end]``
    (``end > begin``), with ``starts`` from :func:`spans`: ``text[i:j]``. Characters that fold to
    nothing inside the range are in it; those at its edges are not."""
    first = bisect.bisect_right(starts, begin) - 1
    last = bisect.bisect_right(starts, end - 1) - 1
    return first, last + 1


@dataclass(frozen=True)
class Folded:
    """A policy text and its fold: tags are found in ``folded``, and what the policy wrote is cut
    out of ``raw`` where they stand (the tag readers in ``core/protocol.py`` and
    ``core/tool_calls.py``). ``starts`` (:func:`spans`) places every raw character in the fold;
    None when the text is ASCII and the two are one."""

    raw: str
    folded: str
    starts: list[int] | None

    @classmethod
    def of(cls, raw: str) -> Folded:
        folded = fold(raw)
        return cls(raw, folded, None if folded is raw else spans(raw))

    def raw_index(self, at: int, *, after: bool = False) -> int:
        """The raw index of folded position ``at``: the first raw character whose fold starts
        there or later; ``after``: the index just past the character that holds ``at - 1``
        (where a cut after a tag ending at ``at`` falls)."""
        if self.starts is None:
            return at
        if after:
            return bisect.bisect_right(self.starts, at - 1)
        return bisect.bisect_left(self.starts, at)

    def raw_slice(self, begin: int, end: int) -> str:
        """The raw characters whose folds lie within ``folded[begin:end]``: a character that is
        part tag (``«`` read as ``<<``) stays with the tag, and invisible characters at either
        edge (they fold to nothing) stay with the text between the tags."""
        if self.starts is None:
            return self.raw[begin:end]
        first = bisect.bisect_left(self.starts, begin)
        last = bisect.bisect_right(self.starts, end) - 1
        return self.raw[first : max(first, last)]
