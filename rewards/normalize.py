"""Answer normalisation and the numeric match rule: the one owner of "are these two answers equal".

Upstream compared raw strings with ``==``, so ``"1,234"`` vs ``1234`` or ``"Store B"`` vs
``"store b"`` scored 0 and taught the policy formatting instead of analysis. We compare
normalised text, and numbers by :func:`numbers_equal` on what each side *states*
(:func:`read_number`):

- a number is read as the exact decimal it writes (``3.140`` states 3.14, ``1e3`` states 1000,
  ``1,234`` states 1234, ``12%`` states 12). A comma is only a thousands separator, and only
  between groups of three digits after a lead that does not start with zero: ``12,5`` and
  ``1,2345`` are not numbers, and ``0,042`` — 0.042 with a decimal comma, or no number at all,
  never 42 — is *ambiguous*: it states nothing, so it matches no numeric truth (and a truth
  written so is a malformed task). Reading it as the decimal would give one comma two meanings
  decided by the digit before it, a rule an optimiser can probe; failing closed costs a
  decimal-comma answer its point, with a note that says why; written with more than 15 significant digits —
  past what a float carries, as a float computation prints it (``0.30000000000000004``) — it
  states that decimal rounded to 15 significant digits, unless it is a plain integer (digits
  only: integer arithmetic prints no representation noise, so every digit counts);
- a number no float holds (``inf``, ``nan``, above the largest float ≈ 1.8e308, or nonzero below
  the smallest ≈ 4.9e-324) is not read at all: it never matches, and the matcher says why. An
  answer like ``1234567890123456e400`` once became ``inf`` as a float and matched every truth;
- with a stated ``tolerance`` (absolute): ``|answer − truth| ≤ tolerance`` on the stated values,
  computed exactly (never a slack that grows with the magnitude);
- without one: the same decimal value as written, or the same value stated — an answer read at
  15 significant digits only matching a truth printed no finer than its 15th digit (a relative
  tolerance let large answers that differ at their own printed precision pass: ``40974.169`` for
  ``40974.16``).
  Rounding that a task allows is the task's ``tolerance`` to state.

Every step is exact decimal arithmetic in :data:`EXACT`, a context that traps nothing, on values
bounded by a float's range, so no text a policy writes can raise out of a matcher or make it
slow; what could not be read comes back as a :class:`Verdict` note, never as an exception (a
raise here would make the episode ``verifier_error``, which training skips — a policy could
hide its failures behind it).

:func:`dabench_equal` is DABench's own evaluation rule (its ``eval_closed_form.py``): the exact
string, or floats whose absolute difference is below 1e-6.
"""

from __future__ import annotations

import math
import re
import sys
import unicodedata
from dataclasses import dataclass
from decimal import MAX_EMAX, MIN_EMIN, ROUND_HALF_EVEN, Context, Decimal, localcontext
from typing import Literal

DABENCH_ABS_TOL = 1e-6
FLOAT_DIGITS = 15  # significant digits a float always round-trips
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_WRAPPERS = "\"'`*$ \t\r\n"
# A number as an answer writes it, after the wrappers are stripped: sign (ASCII or U+2212),
# digits (any Unicode decimal digits; commas only as thousands groups of the integer part), an
# optional fraction and exponent, an optional trailing percent sign. Nothing else: no
# underscores, inner spaces, hex, or the words float() also takes (inf, nan, infinity).
_NUMBER = re.compile(r"[+-]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_PLAIN_INTEGER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)")
_NON_FINITE = re.compile(r"[+-]?(?:inf|infinity|s?nan)", re.IGNORECASE)
_PERCENT = re.compile(r"\s*%\Z")

EXACT = Context(prec=1000, rounding=ROUND_HALF_EVEN, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[])
"""The context of every decimal step: traps nothing (a bad value is a NaN we check, not a raise).
Its precision holds the exact difference of any two readable numbers (a float's range spans
~633 decimal places) and a tolerance, so the tolerance comparison never rounds."""
_STATED = Context(prec=FLOAT_DIGITS, rounding=ROUND_HALF_EVEN, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[])
FLOAT_MAX = Decimal(sys.float_info.max)  # exact binary values, so the range test is exact
FLOAT_TINY = Decimal(math.ulp(0.0))


@dataclass(frozen=True)
class Number:
    """A number an answer or truth writes: ``written`` exactly, and the value it ``states``
    (``written``, or rounded to 15 significant digits when written past a float's precision)."""

    written: Decimal
    stated: Decimal
    plain: bool  # digits only: exact to the unit however many there are

    @property
    def rounded(self) -> bool:
        """True when what it states is not what it writes (digits past the 15th were dropped)."""
        return self.stated != self.written

    def printed_exponent(self) -> int:
        """The place of its last printed digit (``3.140`` → -3, ``2e19`` → 19), no finer than its
        15th significant digit unless it is a plain integer. Reads every digit: call it on a truth."""
        exponent = self.written.as_tuple().exponent
        assert isinstance(exponent, int)  # finite: read_number never returns a NaN or infinity
        return exponent if self.plain else max(exponent, self.written.adjusted() - (FLOAT_DIGITS - 1))


@dataclass(frozen=True)
class Unreadable:
    """A value that is not a readable number, and ``why`` (for a note): ``text`` (not a number at
    all), ``non_finite`` (``inf``, ``nan``: a word float() takes), ``out_of_range`` (a number no
    float holds: ``1e99999999``, ``1e-400``) or ``ambiguous`` (``0,042``: a decimal comma, or
    thousands groups after a lead that starts with zero)."""

    why: str
    kind: Literal["text", "non_finite", "out_of_range", "ambiguous"]


@dataclass(frozen=True)
class Verdict:
    """Whether an answer matches its truth, and — when the answer could not be compared the way
    the truth asks (not a number, or a number no float holds) — why, as a reward note."""

    match: bool
    note: str | None = None


def normalise_text(value: object) -> str:
    text = str(value).strip()
    text = text.strip(_WRAPPERS).rstrip(".").strip(_WRAPPERS)
    text = _THOUSANDS.sub("", text)
    text = text.replace("%", "").strip()
    return " ".join(text.casefold().split())


def shown(text: object, limit: int = 60) -> str:
    """``text`` quoted for a note, cut to ``limit`` characters (notes are kept in every record)."""
    try:
        text = str(text)
    except ValueError:  # an int past Python's 4300-digit str() limit
        text = "an integer of more than 4300 digits"
    return repr(text if len(text) <= limit else text[:limit] + "…")


def read_number(value: object) -> Number | Unreadable:
    """What ``value`` states as a number (module docstring), or why it does not; never raises."""
    plain = True
    if isinstance(value, bool):
        return Unreadable(f"{value!r} is not a number", "text")
    if isinstance(value, int):
        with localcontext(EXACT):
            written = Decimal(value)
    else:
        if isinstance(value, float):
            if not math.isfinite(value):
                return Unreadable(f"{value!r} is not a finite number", "non_finite")
            text, plain = repr(value), False
        else:
            text = str(value).strip().strip(_WRAPPERS).rstrip(".").strip(_WRAPPERS)
            text = _PERCENT.sub("", text).replace("\u2212", "-")
            if _NUMBER.fullmatch(text) is None:
                if _NON_FINITE.fullmatch(text):
                    return Unreadable(f"{shown(value)} is not a finite number", "non_finite")
                return Unreadable(f"{shown(value)} is not a number", "text")
            if "," in text and unicodedata.decimal(text.lstrip("+-")[0]) == 0:
                why = f"{shown(value)} is ambiguous (a decimal comma, or thousands groups after a zero)"
                return Unreadable(why, "ambiguous")
            plain = _PLAIN_INTEGER.fullmatch(text) is not None
            text = text.replace(",", "")
        with localcontext(EXACT):
            written = Decimal(text)  # exact whatever its length; an exponent past any context is NaN
            if written.is_nan() and Decimal(re.split("[eE]", text, maxsplit=1)[0]).is_zero():
                written = Decimal(0)  # "0.0e100000000000000000001": zero, whatever the exponent
    magnitude = written.copy_abs()
    if not written.is_finite() or magnitude > FLOAT_MAX or (written and magnitude < FLOAT_TINY):
        return Unreadable(f"{shown(value)} is beyond a float's range (no float holds it)", "out_of_range")
    return Number(written, written if plain else _STATED.plus(written), plain)


def as_number(value: object) -> float | None:
    """The float a value states, for ordering (``file_match`` sorts rows by it); None when it is not
    a readable number."""
    number = read_number(value)
    return float(number.stated) if isinstance(number, Number) else None


def numbers_equal(answer: Number, truth: Number, tolerance: Decimal | None = None) -> bool:
    """The numeric match rule (module docstring), exact: within ``tolerance`` on the stated values;
    without one the same decimal as written, or the same value stated — where an answer read at 15
    significant digits only matches a truth printed no finer than that (``20000000000000000001.0``
    states 2.00000000000000e19, which does not say the plain integer ``20000000000000000000``)."""
    if tolerance is None:
        if answer.written == truth.written:
            return True
        if answer.stated != truth.stated:
            return False
        reading_step = answer.written.adjusted() - (FLOAT_DIGITS - 1)  # where it was rounded
        return not answer.rounded or reading_step <= truth.printed_exponent()
    return EXACT.subtract(answer.stated, truth.stated).copy_abs() <= tolerance


def as_tolerance(tolerance: float | int | None) -> Decimal | None:
    """A task's tolerance as the decimal it writes (0.005, not the float nearest it); the caller
    has checked it is a finite number >= 0."""
    if tolerance is None:
        return None
    return Decimal(repr(tolerance)) if isinstance(tolerance, float) else Decimal(int(tolerance))


def compare(answer: object, truth: object, tolerance: float | None = None) -> Verdict:
    """One answer against one truth. A truth that reads as a number needs an answer that reads as
    one (:func:`numbers_equal`; anything else is a miss with its reason as the note); any other
    truth is compared as normalised text (a truth that says ``inf`` or ``nan`` is a word here).
    Raises ValueError only for a truth that is a number no float holds (``float('nan')``,
    ``1e400``) or an ambiguous one (``0,042``): the task is malformed, not the answer."""
    g = read_number(truth)
    if isinstance(g, Unreadable):
        if g.kind in ("out_of_range", "ambiguous") or (g.kind == "non_finite" and not isinstance(truth, str)):
            raise ValueError(f"ground truth {g.why}")
        return Verdict(normalise_text(answer) == normalise_text(truth))
    a = read_number(answer)
    if isinstance(a, Unreadable):
        why = f"{a.why} (the ground truth is one)" if a.kind == "text" else a.why
        return Verdict(False, f"the answer {why}")
    return Verdict(numbers_equal(a, g, as_tolerance(tolerance)))


def dabench_equal(response: str | None, label: object) -> bool:
    """DABench's rule for one ``@name[value]`` part: the exact string, or floats within 1e-6
    (finite ones: ``inf - inf`` is nan, and no comparison with nan holds, but say so plainly)."""
    if response is None:
        return False
    label_text = str(label)
    if response == label_text:
        return True
    try:
        a, g = float(response), float(label_text)
    except ValueError:
        return False
    return math.isfinite(a) and math.isfinite(g) and abs(a - g) < DABENCH_ABS_TOL


def answers_match(answer: str | None, ground_truth: object) -> Verdict:
    """``qa_accuracy``: :func:`compare` without a tolerance; no answer is a miss."""
    if answer is None:
        return Verdict(False)
    return compare(answer, ground_truth)
