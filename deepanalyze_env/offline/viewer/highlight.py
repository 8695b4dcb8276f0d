"""Server-side syntax highlighting of ``<Code>`` cells with pygments, shipped as run lengths.

The viewer must never turn policy text into markup, so highlighting does not ship HTML: pygments
lexes the cell here and the page receives ``[class, length, class, length, …]`` over the cell's
own text, which the browser cuts into ``<span>`` elements filled with ``textContent``. Lengths
are UTF-16 code units (what JavaScript's ``String.slice`` counts), and only the token classes
the page colours are kept — neighbouring plain tokens merge — so the run list stays a fraction
of the code's own size (the page's size per episode stays near the record's).
"""

from __future__ import annotations

import re
from functools import lru_cache

from pygments.lexers import PythonLexer
from pygments.token import Comment, Keyword, Name, Number, String, _TokenType

# Index in this tuple = the class number the page receives (0 = plain); viewer.css colours them.
CLASSES = ("", "kw", "str", "num", "com", "bi", "def", "dec")
_RULES: tuple[tuple[_TokenType, int], ...] = (
    (Comment, 4),
    (String, 2),
    (Number, 3),
    (Keyword, 1),
    (Name.Builtin, 5),
    (Name.Function, 6),
    (Name.Class, 6),
    (Name.Decorator, 7),
)
# A fenced block inside <Code>: the fence lines stay plain, only the body is lexed as Python.
_FENCE = re.compile(r"\A(\s*```[A-Za-z0-9_+.-]*[^\S\n]*\n)(.*?)(\n[^\S\n]*```\s*)?\Z", re.DOTALL)


@lru_cache(maxsize=1)
def _lexer() -> PythonLexer:
    return PythonLexer(ensurenl=False, stripnl=False, stripall=False)


def _class_of(ttype: _TokenType) -> int:
    for parent, index in _RULES:
        if ttype in parent:
            return index
    return 0


def _units(text: str) -> int:
    """Length in UTF-16 code units (astral characters count two, as in JavaScript)."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def _append(runs: list[int], cls: int, length: int) -> None:
    if length <= 0:
        return
    if runs and runs[-2] == cls:
        runs[-1] += length
    else:
        runs.extend((cls, length))


def python_runs(code: str) -> list[int]:
    """``[class, length, …]`` covering ``code`` exactly; ``[]`` when lexing does not reproduce it."""
    runs: list[int] = []
    seen = []
    for ttype, value in _lexer().get_tokens(code):
        seen.append(value)
        _append(runs, _class_of(ttype), _units(value))
    if "".join(seen) != code:  # pygments normalises some inputs (tabs, \r); then show it plain
        return []
    return runs


def code_runs(cell: str) -> list[int]:
    """Runs for the inside of a ``<Code>`` tag: fence lines plain, the fenced body as Python."""
    match = _FENCE.match(cell)
    if not match:
        return python_runs(cell)
    head, body, tail = match.group(1), match.group(2), match.group(3) or ""
    body_runs = python_runs(body)
    if not body_runs and body:
        return []
    runs: list[int] = []
    _append(runs, 0, _units(head))
    for i in range(0, len(body_runs), 2):
        _append(runs, body_runs[i], body_runs[i + 1])
    _append(runs, 0, _units(tail))
    return runs
