"""Answer normalisation for ``qa_accuracy``.

Upstream compared raw strings with ``==``, so ``"1,234"`` vs ``1234`` or ``"Store B"`` vs
``"store b"`` scored 0 and taught the policy formatting instead of analysis. We compare
normalised text, and numbers with a relative tolerance.
"""

from __future__ import annotations

import math
import re

REL_TOL = 1e-6
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


def answers_match(answer: str | None, ground_truth: object) -> bool:
    if answer is None:
        return False
    a_num, g_num = as_number(answer), as_number(ground_truth)
    if a_num is not None and g_num is not None:
        return math.isclose(a_num, g_num, rel_tol=REL_TOL, abs_tol=1e-12)
    return normalise_text(answer) == normalise_text(ground_truth)
