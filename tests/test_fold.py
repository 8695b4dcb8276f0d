"""The fold (core/fold.py): one reading of policy-written text for every tag, marker and verdict
search. Expected values are hand-listed code points (named in the comments), not computed by
the fold; the properties check what must hold for any text."""

from __future__ import annotations

import bisect
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepanalyze_env.core.fold import Folded, _classes, fold, fold_char, spans
from deepanalyze_env.core.make_fold_table import confusables, ignorable_ranges, read_as

# Hand-listed: (policy-written text, how it must read). Each line names the trick.
LOOK_ALIKES = [
    ("<\u200bExecute>", "<Execute>"),  # ZERO WIDTH SPACE after the bracket
    ("<Exe\u00adcute>", "<Execute>"),  # SOFT HYPHEN inside the name
    ("<Ex\u200cec\u200dute>", "<Execute>"),  # ZERO WIDTH NON-JOINER, ZERO WIDTH JOINER
    ("<\u2060Execute\ufeff>", "<Execute>"),  # WORD JOINER, BOM
    ("<\u180eExecute>", "<Execute>"),  # MONGOLIAN VOWEL SEPARATOR
    ("<\u202eExecute\u202c>", "<Execute>"),  # RIGHT-TO-LEFT OVERRIDE, POP DIRECTIONAL FORMATTING
    ("<Exec\u034fute>", "<Execute>"),  # COMBINING GRAPHEME JOINER (default-ignorable)
    ("<Execute\ufe0f>", "<Execute>"),  # VARIATION SELECTOR-16
    ("<\u0415x\u0435cut\u0435>", "<Execute>"),  # CYRILLIC CAPITAL IE, CYRILLIC SMALL IE
    ("<\u0395xecute>", "<Execute>"),  # GREEK CAPITAL EPSILON
    ("\uff1cExecute\uff1e", "<Execute>"),  # FULLWIDTH LESS-THAN / GREATER-THAN SIGN
    ("\uff1c\uff25\uff58\uff45\uff43\uff55\uff54\uff45\uff1e", "<Execute>"),  # all fullwidth
    ("<\U0001d404\U0001d431\U0001d41e\U0001d41c\U0001d42e\U0001d42d\U0001d41e>", "<Execute>"),  # MATH BOLD
    ("\u2039Answer\u203a", "<Answer>"),  # SINGLE LEFT/RIGHT-POINTING ANGLE QUOTATION MARK
    ("\u27e8Code\u27e9", "<Code>"),  # MATHEMATICAL LEFT/RIGHT ANGLE BRACKET
    ("\u3008Code\u3009", "<Code>"),  # LEFT/RIGHT ANGLE BRACKET (CJK)
    ("\u2329Code\u232a", "<Code>"),  # LEFT/RIGHT-POINTING ANGLE BRACKET
    ("\u02c2Code\u02c3", "<Code>"),  # MODIFIER LETTER LEFT/RIGHT ARROWHEAD
    ("\u1438Code\u1433", "<Code>"),  # CANADIAN SYLLABICS PA / PO
    ("\ufe64Code\ufe65", "<Code>"),  # SMALL LESS-THAN / GREATER-THAN SIGN
    ("<\u0421\u043ede>", "<Code>"),  # CYRILLIC CAPITAL ES, CYRILLIC SMALL O
    ("<\u0410nswer>", "<Answer>"),  # CYRILLIC CAPITAL A
    ("<Ana\u01c0yze>", "<Analyze>"),  # LATIN LETTER DENTAL CLICK reads as l
    ("<t\u043e\u043el_resp\u043ense>", "<tool_response>"),  # CYRILLIC SMALL O
    ("SC\u041eRE: 5", "SCORE: 5"),  # CYRILLIC CAPITAL O
    ("\u0405CORE: 5", "SCORE: 5"),  # CYRILLIC CAPITAL DZE
    ("ENV\u0406RONMENT", "ENVIRONMENT"),  # CYRILLIC CAPITAL BYELORUSSIAN-UKRAINIAN I reads as I
    ("ENV\u0399RONMENT", "ENVIRONMENT"),  # GREEK CAPITAL IOTA reads as I
    ("\u2039\u2039\u2039END", "<<<END"),  # three single angle quotation marks
    ("\u00ab<END x\u00bb>", "<<<END x>>>"),  # LEFT/RIGHT-POINTING DOUBLE ANGLE QUOTATION MARK
    ("\u22d8END\u22d9", "<<<END>>>"),  # VERY MUCH LESS-THAN / GREATER-THAN
    ("\u226a<END>\u226b", "<<<END>>>"),  # MUCH LESS-THAN / GREATER-THAN
    ("\u300a<END\u300b>", "<<<END>>>"),  # LEFT/RIGHT DOUBLE ANGLE BRACKET
    ("<\u2009Execute >", "< Execute >"),  # THIN SPACE reads as a space (NFKC)
    ("SCORE\uff1a\uff15", "SCORE:5"),  # FULLWIDTH COLON, FULLWIDTH DIGIT FIVE
    ("<\u1d07xecute>", "<execute>"),  # LATIN LETTER SMALL CAPITAL E (a hand-listed adjustment)
    # red team, round 2: glyphs read as chevrons, blanks, low lines and TAG characters
    ("\u2af7END x\u2af8", "<<<END x>>>"),  # TRIPLE NESTED LESS-THAN / GREATER-THAN
    ("\u2aa1<END\u2aa2>", "<<<END>>>"),  # DOUBLE NESTED LESS-THAN / GREATER-THAN
    ("\u2abb<END>\u2abc", "<<<END>>>"),  # DOUBLE PRECEDES / SUCCEEDS
    ("\u227a\u22d6\u2a79END\u227b\u22d7\u2a7a", "<<<END>>>"),  # PRECEDES, WITH DOT, WITH CIRCLE INSIDE
    ("<\u2800Execute>", "< Execute>"),  # BRAILLE PATTERN BLANK reads as a space
    ("<tool\u02cdresponse>", "<tool_response>"),  # MODIFIER LETTER LOW MACRON
    ("<tool\u2017response>", "<tool_response>"),  # DOUBLE LOW LINE
    (
        "\U000e0053\U000e0043\U000e004f\U000e0052\U000e0045\U000e003a\U000e0020\U000e0035",
        "SCORE: 5",
    ),  # TAG LATIN CAPITAL LETTER S, C, O, R, E, TAG COLON, TAG SPACE, TAG DIGIT FIVE
    ("\U000e003c\U000e003c\U000e003cEND", "<<<END"),  # TAG LESS-THAN SIGN
    ("\U000e0001x\U000e007f", "x"),  # LANGUAGE TAG and CANCEL TAG stay removed
    # red team, round 3: combining marks, more chevrons and low lines, a colon, enclosed digits
    ("SC\u1eccRE: 5", "SCORE: 5"),  # LATIN CAPITAL LETTER O WITH DOT BELOW (precomposed)
    ("SCO\u0323RE: 5", "SCORE: 5"),  # COMBINING DOT BELOW after the O
    ("\u015aCORE: 5", "SCORE: 5"),  # LATIN CAPITAL LETTER S WITH ACUTE
    ("<E\u0301xecute>", "<Execute>"),  # COMBINING ACUTE ACCENT inside the name
    ("<\u0323Execute>", "<Execute>"),  # COMBINING DOT BELOW right after the bracket
    ("<\u0338Execute>", "<Execute>"),  # COMBINING LONG SOLIDUS OVERLAY (shows as a not-less-than)
    ("\u226eExecute>", "<Execute>"),  # NOT LESS-THAN (decomposes to < and the overlay)
    ("<Code\u20dd>", "<Code>"),  # COMBINING ENCLOSING CIRCLE (an enclosing mark, Me)
    ("SCORE\u2982 5", "SCORE: 5"),  # Z NOTATION TYPE COLON
    ("SCORE: \u278e", "SCORE: 5"),  # DINGBAT NEGATIVE CIRCLED SANS-SERIF DIGIT FIVE
    ("SCORE: \u2478", "SCORE: 5"),  # PARENTHESIZED DIGIT FIVE (NFKC: "(5)")
    ("SCORE: \u24f9", "SCORE: 5"),  # DOUBLE CIRCLED DIGIT FIVE
    ("\u22b2Execute\u22b3", "<Execute>"),  # NORMAL SUBGROUP OF / CONTAINS AS NORMAL SUBGROUP
    ("\u25c1Execute\u25b7", "<Execute>"),  # WHITE LEFT/RIGHT-POINTING TRIANGLE
    ("\u02f1Execute\u02f2", "<Execute>"),  # MODIFIER LETTER LOW LEFT/RIGHT ARROWHEAD
    ("\u2aa6Execute\u2aa7", "<Execute>"),  # LESS-THAN / GREATER-THAN CLOSED BY CURVE
    ("\u140aExecute\u1405", "<Execute>"),  # CANADIAN SYLLABICS A / O
    ("<tool\u2581response>", "<tool_response>"),  # LOWER ONE EIGHTH BLOCK
    ("<tool\u23bdresponse>", "<tool_response>"),  # HORIZONTAL SCAN LINE-9
]


@pytest.mark.parametrize(("text", "expected"), LOOK_ALIKES)
def test_look_alikes_fold_to_the_tag_they_imitate(text, expected):
    assert fold(text) == expected


def test_ascii_text_is_its_own_fold():
    text = "<Code>\n```python\nprint(1 < 2, 0, 1, 'I|l', `x`)\n```\n</Code>"
    assert fold(text) is text


def test_non_latin_prose_keeps_its_letters_that_look_like_no_ascii():
    # Russian "answer": О, е read as Latin; т, в have no ASCII prototype and stay.
    assert fold("\u041e\u0442\u0432\u0435\u0442") == "O\u0442\u0432e\u0442"


def test_accented_letters_are_read_without_their_accents():
    """The fold is for finding: a mark over a letter must not hide a tag or a verdict (``ŚCORE``),
    so é (precomposed) reads as e; the text as typed is what is kept."""
    assert fold("caf\u00e9") == "cafe"


def test_a_hangul_syllable_is_kept_whole():
    assert fold("\ud55c\uad6d\uc5b4") == "\ud55c\uad6d\uc5b4"  # its decomposition holds no mark


def test_a_visible_letter_is_never_removed():
    assert fold("\u4e2d\u6587") == "\u4e2d\u6587"  # CJK text is kept


# Format characters, listed by hand from Unicode's Cf category (not read from unicodedata).
FORMAT_CHARACTERS = [
    "\u00ad", "\u061c", "\u180e", "\u200b", "\u200c", "\u200d", "\u200e", "\u200f",
    "\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2060", "\u2061", "\u2062",
    "\u2063", "\u2064", "\u2066", "\u2067", "\u2068", "\u2069", "\ufeff", "\ufff9",
    "\U000110bd", "\U0001d173", "\U000e0001", "\U000e007f",
]  # fmt: skip


@given(
    st.text(alphabet=string.printable, max_size=40),
    st.lists(st.tuples(st.integers(0, 40), st.sampled_from(FORMAT_CHARACTERS)), max_size=6),
)
def test_format_characters_anywhere_in_ascii_text_fold_away(text, inserts):
    typed = text
    for at, char in sorted(inserts, reverse=True):
        typed = typed[:at] + char + typed[at:]
    assert fold(typed) == text


_ANY_TEXT = st.text(st.characters(codec="utf-8"), max_size=30)


@given(_ANY_TEXT, _ANY_TEXT)
def test_fold_reads_each_code_point_on_its_own(a, b):
    assert fold(a + b) == fold(a) + fold(b)


@given(_ANY_TEXT)
def test_folding_twice_reads_the_same_as_once(text):
    assert fold(fold(text)) == fold(text)


@settings(max_examples=200)
@given(_ANY_TEXT, st.data())
def test_spans_map_a_folded_piece_back_to_the_characters_typed(text, data):
    starts = spans(text)
    assert len(starts) == len(text) + 1 and starts[-1] == len(fold(text))
    i = data.draw(st.integers(0, len(text)))
    j = data.draw(st.integers(i, len(text)))
    assert fold(text)[starts[i] : starts[j]] == fold(text[i:j])


def test_covering_holds_an_invisible_character_inside_a_match():
    text = "ab<\u200bExecute>cd"
    folded = fold(text)
    begin, end = folded.index("<Execute>"), folded.index("<Execute>") + len("<Execute>")
    first, last = Folded.of(text).covering(begin, end)
    assert text[first:last] == "<\u200bExecute>"


def test_covering_of_a_character_that_folds_to_two():
    text = "x\u00abEND"  # « reads as <<
    first, last = Folded.of(text).covering(2, 3)  # the second '<' of the fold
    assert text[first:last] == "\u00ab"


# --- the table generator, on a hand-written excerpt of Unicode's files -------------------------

CONFUSABLES_EXCERPT = """\
# confusables.txt
# Version: 99.0.0
0415 ;\t0045 ;\tMA\t# ( Е → E ) CYRILLIC CAPITAL LETTER IE → LATIN CAPITAL LETTER E
0406 ;\t006C ;\tMA\t# ( І → l ) CYRILLIC CAPITAL BYELORUSSIAN-UKRAINIAN I → LATIN SMALL LETTER L
01C0 ;\t006C ;\tMA\t# ( ǀ → l ) LATIN LETTER DENTAL CLICK → LATIN SMALL LETTER L
0031 ;\t006C ;\tMA\t# ( 1 → l ) DIGIT ONE → LATIN SMALL LETTER L
3008 ;\t276C ;\tMA\t#* ( 〈 → ❬ ) LEFT ANGLE BRACKET → MEDIUM LEFT-POINTING ANGLE BRACKET ORNAMENT
22D8 ;\t003C 003C 003C ;\tMA\t#* ( ⋘ → <<< ) VERY MUCH LESS-THAN → LESS-THAN SIGN ×3
05AD ;\t0596 ;\tMA\t# ( ֭ → ֖ ) HEBREW ACCENT DEHI → HEBREW ACCENT TIPEHA
0072 0006E ;\t006D ;\tMA\t# ( rn → m )
"""


def test_generator_keeps_non_ascii_look_alikes_of_printable_ascii():
    table = confusables(CONFUSABLES_EXCERPT)
    assert table["\u0415"] == "E"
    assert table["\u22d8"] == "<<<"
    assert table["\u01c0"] == "l"  # not an uppercase letter: kept as l


def test_generator_reads_an_uppercase_l_look_alike_as_capital_i():
    assert confusables(CONFUSABLES_EXCERPT)["\u0406"] == "I"


def test_generator_maps_the_angle_bracket_class_to_ascii_brackets():
    assert confusables(CONFUSABLES_EXCERPT)["\u3008"] == "<"


def test_generator_reads_a_small_capital_without_a_prototype_as_its_letter():
    assert confusables(CONFUSABLES_EXCERPT)["\u1d07"] == "e"  # LATIN LETTER SMALL CAPITAL E


def test_generator_drops_ascii_sources_non_ascii_prototypes_and_sequences():
    table = confusables(CONFUSABLES_EXCERPT)
    assert "1" not in table and "\u05ad" not in table and "rn" not in table


def test_generator_reads_tag_characters_as_the_ascii_they_shadow():
    table = read_as()
    assert table["\U000e0020"] == " " and table["\U000e003c"] == "<" and table["\U000e007e"] == "~"
    assert "\U000e0001" not in table and "\U000e007f" not in table  # LANGUAGE TAG, CANCEL TAG
    assert table["\u2af7"] == "<<<" and table["\u2800"] == " "  # hand-listed glyphs too


def test_a_hand_listed_reading_wins_over_nfkc():
    assert fold_char("\u2017") == "_"  # DOUBLE LOW LINE, whose NFKC is a space and U+0333


def test_generator_merges_default_ignorable_ranges():
    derived = (
        "00AD          ; Default_Ignorable_Code_Point # Cf       SOFT HYPHEN\n"
        "200B..200F    ; Default_Ignorable_Code_Point # Cf   [5] ZERO WIDTH SPACE..\n"
        "2010          ; Other_Property # not this one\n"
        "2060..2064    ; Default_Ignorable_Code_Point # Cf   [5] WORD JOINER..\n"
        "2065          ; Default_Ignorable_Code_Point # Cn       <reserved-2065>\n"
    )
    assert ignorable_ranges(derived) == [(0x00AD, 0x00AD), (0x200B, 0x200F), (0x2060, 0x2065)]


# --- Folded: cutting the text as typed where the fold's marks stand ------------------------------


def test_an_ascii_text_is_its_own_reading():
    reading = Folded.of("<Answer>B</Answer>")
    assert reading.folded is reading.raw and reading.raw_slice(8, 9) == "B"


def test_a_slice_between_look_alike_tags_is_the_text_as_typed():
    text = "\uff1cAnswer\uff1e\uff22\uff1c/Answer\uff1e"  # all fullwidth: the fold is <Answer>B</Answer>
    assert Folded.of(text).raw_slice(8, 9) == "\uff22"


def test_a_cut_after_a_folded_position_keeps_a_tags_invisible_characters():
    text = "<Code>x</Co\u200bde>rest"
    reading = Folded.of(text)
    assert reading.folded == "<Code>x</Code>rest"
    assert text[: reading.raw_index(len("<Code>x</Code>"), after=True)] == "<Code>x</Co\u200bde>"


@given(_ANY_TEXT, st.data())
def test_a_slice_of_the_fold_maps_to_raw_text_that_folds_back_to_it(text, data):
    reading = Folded.of(text)
    starts = spans(text)
    # slice at the fold positions where raw characters begin: it must fold to exactly that piece
    i = data.draw(st.integers(0, len(text)))
    j = data.draw(st.integers(i, len(text)))
    assert fold(reading.raw_slice(starts[i], starts[j])) == reading.folded[starts[i] : starts[j]]


def test_every_code_point_reads_as_its_own_fold_through_the_fast_path():
    """Exhaustive: the regexes that let most text skip the table (``_classes``) miss no code
    point whose fold differs from it or is not one character long (and below U+10000 match
    no other)."""
    changed, resized = _classes()
    for code in range(0x80, 0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        char = chr(code)
        folded = fold_char(char)
        if folded != char:
            assert changed.match(char), hex(code)
        if len(folded) != 1:
            assert resized.match(char), hex(code)
        if code <= 0xFFFF:
            assert (changed.match(char) is not None) == (folded != char), hex(code)
            assert (resized.match(char) is not None) == (len(folded) != 1), hex(code)


@settings(max_examples=300)
@given(_ANY_TEXT, st.integers(0, 60))
def test_the_sparse_map_agrees_with_the_dense_one(text, at):
    reading, starts = Folded.of(text), spans(text)
    at = min(at, len(reading.folded))
    assert reading.raw_index(at) == bisect.bisect_left(starts, at)
    assert reading.raw_index(at, after=True) == bisect.bisect_right(starts, at - 1)
    end = min(at + 3, len(reading.folded))
    first, last = bisect.bisect_left(starts, at), bisect.bisect_right(starts, end) - 1
    assert reading.raw_slice(at, end) == text[first : max(first, last)]
    if end > at:
        assert reading.covering(at, end) == (
            bisect.bisect_right(starts, at) - 1,
            bisect.bisect_right(starts, end - 1),
        )


@settings(max_examples=200)
@given(st.lists(st.one_of(st.text(string.printable, max_size=80), _ANY_TEXT), max_size=12))
def test_a_long_text_folds_as_its_characters_do(pieces):
    """Both of the fold's paths (a few runs translated, or the whole text) read every character
    as :func:`fold_char` reads it alone."""
    text = "".join(pieces)
    assert fold(text) == "".join(char if char.isascii() else fold_char(char) for char in text)
