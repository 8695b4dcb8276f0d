"""An oracle for the answer matchers, the strategies that feed it, and one check per matcher.

Shared by the CI suite (``tests/test_matcher_properties.py``, bounded examples) and the long
run (``benchmarks/matcher_properties.py``, millions of examples): both draw from the strategies
here and call the same ``check_*`` functions, which raise AssertionError on a violation.

The oracle is written from docs/design.md §7 ("Numeric match"), independently of
``rewards/normalize.py`` (nothing here imports it): its own character-by-character number
parser, values as ``fractions.Fraction``, rounding on digit strings. What a number states:

- the exact decimal it writes, after the wrappers (whitespace, quotes, backticks, ``*``, ``$``),
  trailing periods and a trailing ``%`` are peeled; a sign (``+``, ``-``, U+2212), Unicode
  decimal digits, commas only as thousands groups of the integer part (a lead of 1-3 digits that
  does not start with a zero, then groups of three: ``0,042`` is no number), an optional fraction
  and exponent; nothing else;
- more than 15 significant digits and not a plain integer: that decimal rounded half-even to 15
  significant digits;
- nothing at all when no float holds it (``inf``, ``nan``, above the largest float, nonzero
  below the smallest).

Rules checked: without a tolerance a numeric truth matches exactly when the written values are
equal, or the stated ones are and the answer, if it was read at 15 digits, was not read coarser
than the truth's last printed digit; with one, when the stated values are within it; and (the integrity
property) a match without a tolerance means the answer's exact value is within half a unit of
the truth's last printed digit (its 15th significant digit at the finest). A text truth matches
only an answer with the same letters and digits. No input raises.
"""

from __future__ import annotations

import math
import re
import sys
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from rewards.answers import answer_match, answer_parts, dabench_parts
from rewards.components import qa_accuracy, qa_exact
from rewards.files import cell_equal
from rewards.registry import Noted
from rewards.upstream import upstream_exact

# ------------------------------------------------------------------------------------- oracle
WRAPPERS = frozenset("\"'`*$ \t\r\n")
FLOAT_MAX = Fraction(sys.float_info.max)
FLOAT_TINY = Fraction(math.ulp(0.0))
DIGITS = 15
NON_FINITE = {"inf", "infinity", "nan", "snan"}


@dataclass(frozen=True)
class Read:
    """A number as the oracle reads it: its exact value, what it states, and the place of its last
    printed digit (capped at the 15th significant digit) as a power of ten."""

    value: Fraction
    stated: Fraction
    quantum: Fraction
    step: Fraction | None  # the place of the 15th significant digit when it was rounded there


def _strip(text: str, chars: frozenset[str]) -> str:
    start, end = 0, len(text)
    while start < end and text[start] in chars:
        start += 1
    while end > start and text[end - 1] in chars:
        end -= 1
    return text[start:end]


def peel(text: str) -> str:
    """The number's characters: wrappers and trailing periods off, a trailing percent sign off."""
    s = _strip(text.strip(), WRAPPERS)
    while s.endswith("."):
        s = s[:-1]
    s = _strip(s, WRAPPERS)
    if s.endswith("%"):
        s = s[:-1].rstrip()
    return s.replace("\u2212", "-")


def _digit_run(s: str, i: int) -> int:
    while i < len(s) and s[i].isdecimal():
        i += 1
    return i


def _ascii(digits: str) -> str:
    return "".join(str(unicodedata.decimal(ch)) for ch in digits)


def _int(digits: str) -> int:
    """int() of an ASCII digit string of any length (int() refuses past 4300 digits)."""
    value = 0
    for start in range(0, len(digits), 1000):
        chunk = digits[start : start + 1000]
        value = value * 10 ** len(chunk) + int(chunk)
    return value


def parse(text: str) -> tuple[int, str, int, bool] | None:
    """(sign, ASCII coefficient digits, exponent, plain integer?) of a number as written, or None."""
    s = peel(text)
    i, sign = 0, 1
    if s[:1] in ("+", "-"):
        sign, i = (-1 if s[0] == "-" else 1), 1
    # the integer part: digits, or thousands groups (1-3 digits, then ",ddd" groups)
    j = _digit_run(s, i)
    int_digits = s[i:j]
    if j < len(s) and s[j] == "," and 1 <= len(int_digits) <= 3:
        if unicodedata.decimal(int_digits[0]) == 0:
            return None  # "0,042": a decimal comma, or groups after a zero; never 42
        while j < len(s) and s[j] == ",":
            k = _digit_run(s, j + 1)
            if k - (j + 1) != 3:
                return None
            int_digits += s[j + 1 : k]
            j = k
    elif j < len(s) and s[j] == ",":
        return None
    plain = True
    frac_digits = ""
    if j < len(s) and s[j] == ".":
        plain = False
        k = _digit_run(s, j + 1)
        frac_digits, j = s[j + 1 : k], k
    if not int_digits and not frac_digits:
        return None
    exponent = 0
    if j < len(s) and s[j] in "eE":
        plain = False
        j += 1
        exp_sign = 1
        if s[j : j + 1] in ("+", "-"):
            exp_sign, j = (-1 if s[j] == "-" else 1), j + 1
        k = _digit_run(s, j)
        if k == j:
            return None
        exp_text = _ascii(s[j:k]).lstrip("0") or "0"
        exponent = exp_sign * (10**30 if len(exp_text) > 30 else int(exp_text))
        j = k
    if j != len(s):
        return None
    return sign, _ascii(int_digits + frac_digits), exponent - len(frac_digits), plain


def _round15(coef: str, exponent: int) -> tuple[int, int]:
    """coef * 10**exponent rounded half-even to 15 significant digits, as (coefficient, exponent)."""
    head, rest = coef[:DIGITS], coef[DIGITS:]
    number = int(head)
    half = "5" + "0" * (len(rest) - 1)
    if rest > half or (rest == half and number % 2 == 1):
        number += 1
    return number, exponent + len(rest)


def read(value: object) -> Read | str:
    """The oracle's reading, or ``"text"`` / ``"non_finite"`` / ``"out_of_range"``."""
    if isinstance(value, bool):
        return "text"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "non_finite"
        parsed = parse(repr(value))
    elif isinstance(value, int):
        parsed = (1 if value >= 0 else -1, str(abs(value)) if abs(value) < 10**4000 else "1" * 4001, 0, True)
    else:
        parsed = parse(str(value))
        if parsed is None:
            return "non_finite" if peel(str(value)).lstrip("+-").casefold() in NON_FINITE else "text"
    assert parsed is not None
    sign, coef, exponent, plain = parsed
    quantum_place = exponent
    coef = coef.lstrip("0")
    if not coef:  # zero, whatever its exponent ("0e99999999" is 0)
        zero = Fraction(0)
        return Read(zero, zero, Fraction(10) ** max(-400, min(400, quantum_place)), None)
    adjusted = len(coef) - 1 + exponent
    if adjusted > 400 or adjusted < -400:
        return "out_of_range"
    value_ = sign * Fraction(_int(coef)) * Fraction(10) ** exponent
    if abs(value_) > FLOAT_MAX or abs(value_) < FLOAT_TINY:
        return "out_of_range"
    trimmed = coef.rstrip("0")
    t_exp = exponent + len(coef) - len(trimmed)
    step = None
    if plain or len(trimmed) <= DIGITS:
        stated = value_
    else:
        number, e = _round15(trimmed, t_exp)
        stated = sign * Fraction(number) * Fraction(10) ** e
        step = Fraction(10) ** (adjusted - (DIGITS - 1))
    if not plain:
        quantum_place = max(quantum_place, adjusted - (DIGITS - 1))
    return Read(value_, stated, Fraction(10) ** quantum_place, step)


def tolerance_value(tolerance: float | int) -> Fraction:
    """A tolerance as the decimal the task wrote (0.005, not the float nearest it)."""
    return Fraction(repr(tolerance)) if isinstance(tolerance, float) else Fraction(tolerance)


def oracle_numbers(answer: object, truth: Read, tolerance: float | int | None) -> bool:
    a = read(answer)
    if not isinstance(a, Read):
        return False
    if tolerance is None:
        if a.value == truth.value:
            return True
        # the same stated value, where a reading at 15 digits is no coarser than the truth's print
        return a.stated == truth.stated and (a.step is None or a.step <= truth.quantum)
    return abs(a.stated - truth.stated) <= tolerance_value(tolerance)


def letters(text: object) -> str:
    return "".join(ch for ch in str(text).casefold() if ch.isalnum())


def _items(text: object) -> list[str]:
    return [x.strip() for x in _strip(str(text).strip(), frozenset("[]()")).split(",")]


def check_value(got: float, answer: object, truth: object, tolerance, *, lists: bool) -> None:
    """The rules for one answer against one truth, given the matcher's 0/1 verdict."""
    assert got in (0.0, 1.0), got
    g = read(truth)
    if isinstance(g, Read):
        expected = oracle_numbers(answer, g, tolerance)
        assert (got == 1.0) == expected, f"matcher {got}, oracle {expected}: {answer!r} vs {truth!r}"
        if got == 1.0 and tolerance is None:
            a = read(answer)
            assert isinstance(a, Read) and abs(a.value - g.stated) <= g.quantum / 2, (answer, truth)
        return
    if got == 1.0 and letters(answer) != letters(truth):
        # only a list truth may match differently written elements (each by the same rules)
        assert lists and "," in str(truth), (answer, truth)
        a_items, g_items = _items(answer), _items(truth)
        assert len(a_items) == len(g_items), (answer, truth)
        for a_item, g_item in zip(a_items, g_items, strict=True):
            gi = read(g_item)
            if isinstance(gi, Read):
                assert oracle_numbers(a_item, gi, tolerance), (a_item, g_item)
            else:
                assert letters(a_item) == letters(g_item), (a_item, g_item)


# ---------------------------------------------------------------------------- the checks
def _plain(result: object) -> object:
    """A reward function's value; a Noted one must explain a miss in words."""
    if isinstance(result, Noted):
        assert isinstance(result.note, str) and result.note.strip(), result
        value = result.value
        misses = [value] if not isinstance(value, dict) else [value["answer_parts_all"]]
        assert all(m == 0.0 for m in misses), f"a note on a full match: {result}"
        return value
    return result


def check_answer_match(answer: str, truth: object, tolerance: float | int | None) -> None:
    spec = {} if tolerance is None else {"tolerance": tolerance}
    got = _plain(answer_match(answer, truth, spec))
    check_value(got, answer, truth, tolerance, lists=True)


def check_qa_accuracy(answer: str, truth: object) -> None:
    got = _plain(qa_accuracy(answer, truth))
    check_value(got, answer, truth, None, lists=False)


def check_qa_exact(answer: str, truth: object) -> None:
    got = qa_exact(answer, truth)
    assert got == float(answer == str(truth)), (answer, truth)


def check_upstream(history: str, truth: object) -> None:
    got = upstream_exact(history, truth)
    assert got in (0.0, 1.0)
    if got == 1.0:  # raw equality: only a string truth written exactly so
        assert isinstance(truth, str) and "<Answer>" in history and truth in history


def check_cell(cell: str, expected: object, tolerance: float) -> None:
    got = cell_equal(cell, expected, tolerance)
    assert isinstance(got, bool)
    missing = {"", "nan", "none", "null", "na", "n/a"}
    if " ".join(_strip(cell.strip(), WRAPPERS).rstrip(".").casefold().split()) in missing:
        return  # the missing-value markers have their own rule
    g = read(expected)
    if isinstance(g, Read):
        expected_match = oracle_numbers(cell, g, tolerance)
        assert got == expected_match, f"cell_equal {got}, oracle {expected_match}: {cell!r} vs {expected!r}"


def check_answer_parts(given: dict[str, str], order: list[str], truth: dict[str, object], tolerance) -> None:
    """``given``: the parts the answer writes (values hold no brackets), in ``order``."""
    answer = " ".join(f"@{name}[{given[name]}]" for name in order)
    spec = {} if tolerance is None else {"tolerance": tolerance}
    got = _plain(answer_parts(answer, [[k, v] for k, v in truth.items()], spec))
    right = 0
    for name, value in truth.items():
        if name not in given:
            continue
        tol = tolerance.get(name) if isinstance(tolerance, dict) else tolerance
        g = read(str(value))
        if isinstance(g, Read):
            right += oracle_numbers(given[name].strip(), g, tol)
        else:
            matched = _plain(answer_match(given[name].strip(), str(value), {}))
            check_value(matched, given[name].strip(), str(value), None, lists=True)
            right += matched == 1.0
    assert got["answer_parts"] == right / len(truth), (answer, truth, got)
    assert got["answer_parts_all"] == float(right == len(truth)), (answer, truth, got)


def check_dabench(given: dict[str, str], truth: dict[str, str]) -> None:
    """DABench's rule as its evaluation states it (the exact string, or ``abs(float(a) - float(g))
    < 1e-6``), and that a numeric match is within 1e-6 of the truth up to one float rounding."""
    answer = " ".join(f"@{name}[{value}]" for name, value in given.items())
    got = answer_parts(answer, [[k, v] for k, v in truth.items()], {"match": "dabench"})
    right = 0
    for name, label in truth.items():
        response = given.get(name)
        if response is None:
            continue
        if response == label:
            right += 1
            continue
        try:
            a, g = float(response), float(label)
        except ValueError:
            continue
        if math.isfinite(a) and math.isfinite(g) and abs(a - g) < 1e-6:
            right += 1
            slack = Fraction(math.ulp(max(abs(a), abs(g))))
            assert abs(Fraction(a) - Fraction(g)) <= Fraction(1e-6) + slack, (response, label)
    assert got["answer_parts"] == right / len(truth), (answer, truth, got)
    assert got["answer_parts_all"] == float(right == len(truth)), (answer, truth, got)


def check_dabench_parts(text: str) -> None:
    reference = dict(re.findall(r"@(\w+)\[(.*?)\]", text))
    assert dabench_parts(text) == reference, text


# --------------------------------------------------------------------------------- strategies
SCRIPTS = ("0123456789", "٠١٢٣٤٥٦٧٨٩", "０１２３４５６７８９", "०१२३४५६७८९", "𝟎𝟏𝟐𝟑𝟒𝟓𝟔𝟕𝟖𝟗")


@dataclass(frozen=True)
class Dec:
    """A decimal value drawn for a test: sign * coef * 10**exp."""

    sign: int
    coef: int
    exp: int

    @property
    def digits(self) -> str:
        return str(self.coef)


small_exp = st.integers(-20, 20)
edge_exp = st.one_of(st.integers(-345, -300), st.integers(285, 320))
huge_exp = st.one_of(st.integers(10**6, 10**20), st.integers(-(10**20), -(10**6)))
coefs = st.one_of(
    st.integers(0, 10**6),
    st.integers(0, 10**15),
    st.integers(10**14, 10**18),
    st.integers(0, 10**40),
    st.integers(10**300, 10**400),
)
decimals = st.builds(
    Dec,
    st.sampled_from([1, -1]),
    coefs,
    st.one_of(small_exp, small_exp, small_exp, edge_exp, huge_exp),
)
# truths a task would hold: within a float's range, at most 17 significant digits
truth_decimals = st.builds(
    Dec, st.sampled_from([1, -1]), st.one_of(st.integers(0, 10**6), st.integers(0, 10**17)), small_exp
)


def _fixed(d: Dec, extra_zeros: int) -> str | None:
    digits = d.digits
    if d.exp >= 0:
        if d.exp + len(digits) > 450:
            return None
        text = digits + "0" * d.exp + ("." + "0" * extra_zeros if extra_zeros else "")
    else:
        if -d.exp > 450:
            return None
        padded = digits.rjust(-d.exp + 1, "0")
        text = padded[: d.exp] + "." + padded[d.exp :] + "0" * extra_zeros
    return text


def _group(text: str) -> str:
    head, dot, tail = text.partition(".")
    if len(head) <= 3 or head[0] == "0":  # "0,000" (a zero with an exponent) is no number: ambiguous
        return text
    first = len(head) % 3 or 3
    groups = [head[:first]] + [head[i : i + 3] for i in range(first, len(head), 3)]
    return ",".join(groups) + dot + tail


@st.composite
def printings(draw, d: Dec) -> str:
    """``d`` written some way that states exactly its value: fixed or scientific, extra zeros,
    thousands groups, a sign, another digit script, wrappers, a percent sign, a full stop."""
    form = draw(st.sampled_from(["fixed", "fixed", "sci"]))
    text = _fixed(d, draw(st.integers(0, 3))) if form == "fixed" else None
    if text is None:
        digits = d.digits
        point = draw(st.integers(0, len(digits)))
        mantissa = digits[:point] or "0"
        if point < len(digits):
            mantissa += "." + digits[point:]
        exponent = d.exp + len(digits) - point
        e = draw(st.sampled_from(["e", "E"]))
        sign = draw(st.sampled_from(["", "+"])) if exponent >= 0 else ""
        text = f"{mantissa}{e}{sign}{exponent}"
    elif draw(st.booleans()):
        text = _group(text)
    if d.sign < 0 and d.coef:
        text = draw(st.sampled_from(["-", "\u2212"])) + text
    elif draw(st.integers(0, 5)) == 0:
        text = "+" + text
    script = draw(st.sampled_from(SCRIPTS[:1] * 6 + SCRIPTS[1:]))
    if script != SCRIPTS[0]:
        text = text.translate(str.maketrans(SCRIPTS[0], script))
    if draw(st.integers(0, 4)) == 0:
        text += draw(st.sampled_from(["%", " %"]))
    left, right = draw(
        st.sampled_from([("", ""), ("**", "**"), ("$", ""), ("`", "`"), ('"', '"'), (" ", "\n")])
    )
    text = left + text + right
    if draw(st.integers(0, 4)) == 0:
        text += "."
    return text


def nudge(d: Dec, draw) -> Dec:
    """A value near ``d``: one unit off at its last digit, or at a digit past it, or scaled."""
    kind = draw(st.sampled_from(["last", "past", "scale", "digits"]))
    if kind == "last":
        return Dec(d.sign, max(0, d.coef + draw(st.sampled_from([-1, 1]))), d.exp)
    if kind == "past":
        k = draw(st.integers(1, 25))
        return Dec(d.sign, d.coef * 10**k + draw(st.integers(-9, 9)), d.exp - k)
    if kind == "scale":
        return Dec(d.sign, d.coef, d.exp + draw(st.sampled_from([-400, -1, 1, 400, 10**8, -(10**8)])))
    return Dec(d.sign, d.coef * 10 ** draw(st.integers(0, 3)), d.exp - draw(st.integers(0, 3)))


NOISE = [
    "", " ", ".", "-", "+", "e5", "1e", "1e+", "4_2", "0x2a", "1,23", "1,2345", "12,34,567", "1,234.567,890",
    "1 234", "- 3", "3-", "40-44", "40–44", "40 to 44", "42, 43", "[42]", "(42)", "<b>42</b>", "42 (approx)",
    "about 42", "4%2", "%42", "42%%", "∞", "inf", "-inf", "+inf", "Infinity", "-Infinity", "INF", "nan",
    "NaN", "-nan", "sNaN", "snan", "1e99999999", "1e-99999999", "9e999999999999", "-1e99999999",
    "1234567890123456e400", "-1234567890123456e400", "1e308", "1e309", "-1e309", "2e-324", "5e-324", "1e-330",
    "1.7976931348623157e308", "1.7976931348623159e308", "0.30000000000000004", "1" * 400, "9" * 320,
    "0." + "0" * 330 + "1", "1e" + "9" * 60, "1e-" + "9" * 60, "١٢٣", "١,٢٣٤", "42\u200b", "\u202e42",
]  # fmt: skip
noise = st.one_of(
    st.sampled_from(NOISE),
    st.text(max_size=12),
    st.text(alphabet="0123456789.,eE+-% \u2212٤*$`'\"", max_size=14),
)
words = st.sampled_from(
    ["Store B", "store b", "Paris", "B", "yes", "No", "Texas, Ohio", "Ohio, Texas", "N/A"]
)
tolerances = st.one_of(
    st.none(),
    st.just(0),
    st.sampled_from([0.5, 0.05, 0.005, 0.0005, 5e-07, 1e-06, 0.1, 1, 2]),
    st.floats(0, 1e6, allow_nan=False, allow_infinity=False),
)


@st.composite
def truths(draw) -> object:
    """A ground truth as tasks write it: a number as text, a Python int or float, or words."""
    kind = draw(st.sampled_from(["text", "text", "int", "float", "word"]))
    d = draw(truth_decimals)
    if kind == "word":
        return draw(words)
    if kind == "int":
        return d.sign * d.coef
    if kind == "float":
        return float(f"{d.sign * d.coef}e{d.exp}")
    text = _fixed(d, draw(st.integers(0, 2)))
    if draw(st.booleans()):
        text = f"{d.digits}e{d.exp}"
    if d.sign < 0 and d.coef:
        text = "-" + text
    return _group(text) if draw(st.integers(0, 3)) == 0 else text


def _as_dec(truth: object) -> Dec | None:
    r = parse(repr(truth) if isinstance(truth, float) else str(truth))
    if r is None or isinstance(truth, bool):
        return None
    sign, coef, exponent, _ = r
    return Dec(sign, _int(coef or "0"), exponent)


@st.composite
def answers_for(draw, truth: object) -> str:
    """An answer to ``truth``: one of its own printings, a value near it, any number, or noise."""
    d = _as_dec(truth)
    kind = draw(st.sampled_from(["own", "near", "near", "any", "noise", "word"]))
    if kind == "own" and d is not None:
        return draw(printings(d))
    if kind == "near" and d is not None:
        near = nudge(d, draw)
        if draw(st.integers(0, 3)) == 0 and abs(near.exp) < 300:
            return repr(float(f"{near.sign * near.coef}e{near.exp}"))
        return draw(printings(near))
    if kind == "any":
        return draw(printings(draw(decimals)))
    if kind == "word":
        return draw(words)
    return draw(noise)


truth_and_answer = truths().flatmap(lambda t: st.tuples(st.just(t), answers_for(t)))


@st.composite
def parts_cases(draw):
    """(given parts, their order, truth parts, tolerance): a few named parts, some left out."""
    names = draw(
        st.lists(st.sampled_from(["a", "b", "mean", "p_value", "n"]), min_size=1, max_size=4, unique=True)
    )
    truth = {name: str(draw(truths())) for name in names}
    given = {}
    for name in names:
        if draw(st.integers(0, 5)) == 0:
            continue  # left out
        value = draw(answers_for(truth[name]))
        given[name] = value.replace("[", "(").replace("]", ")").replace("@", "a")
    if draw(st.integers(0, 4)) == 0:
        given["extra"] = "1"
    order = draw(st.permutations(list(given)))
    tol_kind = draw(st.sampled_from(["none", "one", "per_part"]))
    if tol_kind == "one":
        tolerance = draw(tolerances)
    elif tol_kind == "per_part":
        tolerance = {n: draw(tolerances) for n in names if draw(st.booleans())}
        tolerance = {n: t for n, t in tolerance.items() if t is not None} or None
    else:
        tolerance = None
    return given, order, truth, tolerance


@st.composite
def dabench_cases(draw):
    names = draw(st.lists(st.sampled_from(["a", "b", "mean", "n"]), min_size=1, max_size=3, unique=True))
    truth = {name: str(draw(truths())) for name in names}
    given = {}
    for name in names:
        if draw(st.integers(0, 5)):
            value = draw(st.one_of(answers_for(truth[name]), st.just(truth[name])))
            given[name] = value.replace("]", ")").replace("\n", " ")
    return given, truth


dabench_texts = st.lists(
    st.sampled_from(["@a[", "@b_2[", "@", "[", "]", "\n", "x", " ", "1.5", "@a[1]", "é", "\r"]), max_size=30
).map("".join)
histories = st.lists(
    st.sampled_from(["<Answer>", "</Answer>", "Answer:", " 42", "42", "1e400", "nan", "\n", "x", "<Code>"]),
    max_size=12,
).map("".join)
cells = st.one_of(truths().flatmap(answers_for), st.sampled_from(["", "NaN", "null", "n/a", "None"]))


def canonical(d: Dec) -> str:
    """``d`` written plainly: ASCII fixed notation, a minus sign when negative."""
    text = _fixed(d, 0)
    assert text is not None
    return ("-" if d.sign < 0 and d.coef else "") + text


def to_dec(value: Fraction) -> Dec:
    """An exact decimal Fraction as a Dec."""
    exp = 0
    while value.denominator != 1:
        value *= 10
        exp -= 1
    return Dec(1 if value >= 0 else -1, abs(value.numerator), exp)


@st.composite
def within_tolerance(draw):
    """(truth, an answer within the tolerance of it, tolerance), both stating exactly what they write."""
    d = draw(truth_decimals)
    tolerance = draw(st.sampled_from([0.5, 0.05, 0.005, 0.0005, 5e-07, 1e-06, 0.1, 1, 2, 1e6]))
    k = draw(st.integers(-100, 100))
    truth = canonical(d)
    value = d.sign * Fraction(d.coef) * Fraction(10) ** d.exp + tolerance_value(tolerance) * k / 100
    answer = draw(printings(to_dec(value)))
    for side in (read(truth), read(answer)):
        assert isinstance(side, Read)
        # written past 15 digits: the rule reads it rounded, by design, so it may fall outside
        assume(side.value == side.stated)
    return truth, answer, tolerance


@st.composite
def tolerance_edges(draw):
    """(truth, answer, tolerance) with the answer at the tolerance's edge: exactly on it, or a unit
    of some digit 1-25 places finer inside or outside it (where a slack that grows with the
    magnitude, or float rounding, would decide differently)."""
    d = draw(truth_decimals)
    tolerance = draw(st.sampled_from([0.5, 0.05, 0.005, 0.0005, 5e-07, 1e-06, 0.1, 1, 2, 1e6, 0]))
    place = draw(st.integers(1, 25))
    step = tolerance_value(tolerance) if tolerance else Fraction(1)
    epsilon = draw(st.sampled_from([-1, 0, 1])) * Fraction(1, 10**place) * step
    side = draw(st.sampled_from([-1, 1]))
    truth = canonical(d)
    value = d.sign * Fraction(d.coef) * Fraction(10) ** d.exp + side * (tolerance_value(tolerance) + epsilon)
    return truth, draw(printings(to_dec(value))), tolerance


# ---------------------------------------------------------------------------- the properties
@dataclass(frozen=True)
class Property:
    """One property: the cases it draws and the check each case must pass (CI and the long run
    both take them from here)."""

    name: str
    cases: st.SearchStrategy
    check: Callable[[Any], None]


def _printing_matches(case: tuple[Dec, str]) -> None:
    d, answer = case
    truth = canonical(d)
    assert answer_match(answer, truth, {}) == 1.0, (answer, truth)
    assert qa_accuracy(answer, truth) == 1.0, (answer, truth)


def _within_matches(case: tuple[str, str, float]) -> None:
    truth, answer, tolerance = case
    assert answer_match(answer, truth, {"tolerance": tolerance}) == 1.0, (answer, truth, tolerance)


PROPERTIES = (
    Property(
        "answer_match",
        st.tuples(truth_and_answer, tolerances),
        lambda c: check_answer_match(c[0][1], c[0][0], c[1]),
    ),
    Property(
        "answer_match_tolerance_edge", tolerance_edges(), lambda c: check_answer_match(c[1], c[0], c[2])
    ),
    Property("qa_accuracy", truth_and_answer, lambda c: check_qa_accuracy(c[1], c[0])),
    Property("qa_exact", truth_and_answer, lambda c: check_qa_exact(c[1], c[0])),
    Property("answer_parts", parts_cases(), lambda c: check_answer_parts(*c)),
    Property("answer_parts_dabench", dabench_cases(), lambda c: check_dabench(*c)),
    Property("dabench_parts_scan", dabench_texts, check_dabench_parts),
    Property(
        "file_match_cells",
        st.tuples(cells, truths(), st.sampled_from([1e-6, 0.0, 0.005, 0.5])),
        lambda c: check_cell(*c),
    ),
    Property("file_match_cells_tolerance_edge", tolerance_edges(), lambda c: check_cell(c[1], c[0], c[2])),
    Property(
        "upstream_exact",
        st.tuples(histories, st.one_of(truths(), st.just("42"))),
        lambda c: check_upstream(*c),
    ),
    Property(
        "printings_match",
        truth_decimals.flatmap(lambda d: st.tuples(st.just(d), printings(d))),
        _printing_matches,
    ),
    Property("within_tolerance_matches", within_tolerance(), _within_matches),
)
