"""Answer normalisation and the numeric match rule: the one owner of "are these two answers equal".

Upstream compared raw strings with ``==``, so ``"1,234"`` vs ``1234`` or ``"Store B"`` vs
``"store b"`` scored 0 and taught the policy formatting instead of analysis. We compare
normalised text, and numbers by :func:`numbers_equal`:

- with a stated ``tolerance`` (absolute): ``|a - g| <= tolerance``, give or take a few units in
  the last place of the floats (representation error only — never a slack that grows with the
  magnitude beyond float resolution);
- without one: the two numbers are the same decimal value (``3.140`` equals ``3.14``, ``1e3``
  equals ``1000``). A relative tolerance was used before, and it let large answers that differ at
  their own printed precision pass (``40974.169`` for ``40974.16``); equality of the printed
  decimals never accepts a different value at the answer's precision, whatever the magnitude.
  Only a number written with more than 15 significant digits — past what a float carries, as a
  float computation prints it (``0.30000000000000004``) — is compared as a float, to a few units
  in the last place. Rounding that a task allows is the task's ``tolerance`` to state.

:func:`dabench_equal` is DABench's own evaluation rule (its ``eval_closed_form.py``): the exact
string, or floats whose absolute difference is below 1e-6.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

DABENCH_ABS_TOL = 1e-6
FLOAT_DIGITS = 15  # significant digits a float always round-trips
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_WRAPPERS = "\"'`*$ \t\r\n"


def normalise_text(value: object) -> str:
    text = str(value).strip()
    text = text.strip(_WRAPPERS).rstrip(".").strip(_WRAPPERS)
    text = _THOUSANDS.sub("", text)
    text = text.replace("%", "").strip()
    return " ".join(text.casefold().split())


def as_number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    text = normalise_text(value)
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def as_decimal(value: object) -> Decimal | None:
    """The exact decimal an answer or truth writes (a float by its shortest repr), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    text = repr(value) if isinstance(value, float) else normalise_text(value)
    try:
        number = Decimal(text)
    except (InvalidOperation, ValueError):
        return None
    return number if number.is_finite() else None


def numbers_equal(answer: object, truth: object, tolerance: float | None = None) -> bool | None:
    """The numeric match rule (module docstring); None when either side is not a number."""
    if tolerance is not None:
        a_num, g_num = as_number(answer), as_number(truth)
        if a_num is None or g_num is None:
            return None
        slack = 4 * math.ulp(max(abs(a_num), abs(g_num))) + math.ulp(tolerance)
        return abs(a_num - g_num) <= tolerance + slack
    a_dec, g_dec = as_decimal(answer), as_decimal(truth)
    if a_dec is None or g_dec is None:
        return None
    if a_dec == g_dec:
        return True
    if max(_digits(a_dec), _digits(g_dec)) <= FLOAT_DIGITS:
        return False
    # printed past float precision (0.1 + 0.2 prints 0.30000000000000004): compare as the floats
    # they are, to representation error
    a_num, g_num = float(a_dec), float(g_dec)
    return abs(a_num - g_num) <= 4 * math.ulp(max(abs(a_num), abs(g_num)))


def _digits(number: Decimal) -> int:
    return len(number.normalize().as_tuple().digits)


def dabench_equal(response: str | None, label: object) -> bool:
    """DABench's rule for one ``@name[value]`` part: the exact string, or floats within 1e-6."""
    if response is None:
        return False
    label_text = str(label)
    if response == label_text:
        return True
    try:
        return abs(float(response) - float(label_text)) < DABENCH_ABS_TOL
    except ValueError:
        return False


def answers_match(answer: str | None, ground_truth: object) -> bool:
    """``qa_accuracy``: numbers by :func:`numbers_equal` (no tolerance), else normalised text."""
    if answer is None:
        return False
    numeric = numbers_equal(answer, ground_truth)
    if numeric is not None:
        return numeric
    return normalise_text(answer) == normalise_text(ground_truth)
