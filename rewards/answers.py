"""Checkable answers without a judge: tolerance-aware match and DABench's ``@name[value]`` parts.

Both read the task's ``reward_spec``: ``tolerance`` is an absolute tolerance for numeric answers
(a number, or for ``answer_parts`` a mapping part name → number); without it numbers must be the
same decimal value, as for ``qa_accuracy`` (``rewards.normalize.numbers_equal`` owns the rule).
``reward_spec["match"] == "dabench"`` (what ``prepare-data --from dabench`` writes) scores
``answer_parts`` exactly as DABench's own evaluation does: its ``@name[value]`` pattern, values
as written, the exact string or an absolute difference below 1e-6 (``dabench_equal``).

A question that says "round to 2 decimals" sets ``tolerance: 0.005``, so ``3.14``, ``3.140`` and
an unrounded ``3.1412`` are right and ``3.2`` or a mis-rounded ``3.15`` (truth 3.1412) are wrong.
A malformed answer (no ``@name[value]`` parts, no answer at all, a value that is not a number
or one no float holds where the truth is a number) scores 0 — that is the policy's mistake — and
says why in the episode's ``reward_notes`` (``rewards.registry.Noted``); nothing an answer holds
raises here. A malformed ground truth or tolerance raises, which the plan turns into
``verifier_error``: that status means the verifier could not run, never that the answer was odd.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from deepanalyze_env.core.contracts import JsonValue
from rewards.normalize import Number, Verdict, compare, dabench_equal, read_number
from rewards.registry import Noted, register_reward, with_notes

# @name[value]; a value may hold one level of brackets (a list written as [a, b]).
PART = re.compile(r"@([A-Za-z_][A-Za-z0-9_]*)\[((?:[^\[\]]|\[[^\[\]]*\])*)\]")
# DABench's own pattern (lazy, no nesting), used with ``match: dabench``: ``re.findall`` with it
# takes time quadratic in the answer ("@a[" * 30000 took 3 s, * 100000 38 s), so
# :func:`dabench_parts` finds the same matches in one pass; the pattern stays as the reference.
DABENCH_PART = re.compile(r"@(\w+)\[(.*?)\]")
_DABENCH_OPEN = re.compile(r"@(\w+)\[")
MATCH_RULES = ("default", "dabench")


def _tolerance(value: JsonValue, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"reward_spec.{where} must be a finite number >= 0, got {value!r}")
    return float(value)


def values_match(answer: JsonValue, truth: JsonValue, tolerance: float | None = None) -> Verdict:
    """Numbers by ``numbers_equal`` (within ``tolerance``, else the same decimal); text after
    normalisation (``rewards.normalize.compare``).

    A comma-separated text truth (an ordered list such as ``"Texas, Ohio"``) matches element by
    element, so spacing after the commas does not matter but order and every element do. A truth
    that reads as one number (``1,234``) is that number, never a list.
    """
    verdict = compare(answer, truth, tolerance)
    if verdict.match or "," not in str(truth) or isinstance(read_number(truth), Number):
        return verdict
    a_items = [x.strip() for x in str(answer).strip().strip("[]()").split(",")]
    g_items = [x.strip() for x in str(truth).strip().strip("[]()").split(",")]
    if len(a_items) != len(g_items):
        return Verdict(False)
    for a, g in zip(a_items, g_items, strict=True):
        item = compare(a, g, tolerance)
        if not item.match:
            return Verdict(False, item.note)
    return Verdict(True)


# Components that say whether the answer is right (1 = right), beyond any component whose name
# ends in ``accuracy`` (the QA plan's ``qa_accuracy``, datatask's ``judge_accuracy``): the eval
# report's accuracy / pass@k and the curriculum's success both read them through
# :func:`accuracy_component`.
ACCURACY_COMPONENTS = ("answer_match", "answer_parts_all", "qa_accuracy")


def is_accuracy_component(name: str) -> bool:
    """True for a component that says whether the answer is right (the one rule)."""
    return name in ACCURACY_COMPONENTS or name.endswith("accuracy")


def accuracy_component(names: Iterable[str]) -> str | None:
    """The component read as accuracy among ``names`` (a plan's components, in plan order): the
    first that :func:`is_accuracy_component` accepts, or None when the plan has none."""
    return next((n for n in names if is_accuracy_component(n)), None)


@register_reward("answer_match")
def answer_match(answer: str | None, ground_truth, reward_spec: dict) -> float | Noted:
    """1.0 when the final answer equals the ground truth (numbers within ``tolerance``), else 0.0."""
    if ground_truth is None or (isinstance(ground_truth, str) and not ground_truth.strip()):
        raise ValueError("answer_match needs a non-empty ground_truth")
    tolerance = _tolerance(reward_spec.get("tolerance"), "tolerance")
    if answer is None:
        return 0.0
    verdict = values_match(answer, ground_truth, tolerance)
    return with_notes(float(verdict.match), verdict.note)


def parse_parts(text: str | None) -> dict[str, str]:
    """``@name[value]`` pairs of an answer; a name given twice keeps its last value."""
    if not text:
        return {}
    return {name: value.strip() for name, value in PART.findall(text)}


def dabench_parts(text: str) -> dict[str, str]:
    """``dict(DABENCH_PART.findall(text))`` in time linear in ``text``: each ``@name[`` takes the
    text up to the first ``]`` on its line (``.`` stops at a newline); when no ``]`` closes it
    there, no later ``@name[`` on that line can close either, so the scan moves to the next line."""
    parts: dict[str, str] = {}
    pos = 0
    while (at := text.find("@", pos)) >= 0:
        opened = _DABENCH_OPEN.match(text, at)
        if opened is None:
            pos = at + 1
            continue
        start = opened.end()
        line_end = text.find("\n", start)
        line_end = len(text) if line_end < 0 else line_end
        close = text.find("]", start, line_end)
        if close < 0:
            pos = line_end
            continue
        parts[opened.group(1)] = text[start:close]
        pos = close + 1
    return parts


def expected_parts(ground_truth: JsonValue) -> dict[str, str]:
    """DABench's ``[[name, value], …]``, a ``{name: value}`` mapping, or ``"@a[1] @b[2]"`` text."""
    if isinstance(ground_truth, Mapping):
        parts = {str(k): v for k, v in ground_truth.items()}
    elif isinstance(ground_truth, list | tuple):
        parts = {}
        for item in ground_truth:
            if not isinstance(item, list | tuple) or len(item) != 2:
                raise ValueError(
                    f"answer_parts: ground_truth items must be [name, value] pairs, got {item!r}"
                )
            parts[str(item[0])] = item[1]
    elif isinstance(ground_truth, str):
        parts = parse_parts(ground_truth)
    else:
        raise ValueError(
            f"answer_parts: ground_truth must be a list of pairs, got {type(ground_truth).__name__}"
        )
    if not parts:
        raise ValueError("answer_parts: ground_truth holds no parts")
    return {name: str(value) for name, value in parts.items()}


def _match_rule(reward_spec: Mapping[str, JsonValue]) -> str:
    rule = reward_spec.get("match", "default")
    if rule not in MATCH_RULES:
        raise ValueError(f"reward_spec.match must be one of {', '.join(MATCH_RULES)}, got {rule!r}")
    return str(rule)


@register_reward("answer_parts", components=("answer_parts", "answer_parts_all"))
def answer_parts(answer: str | None, ground_truth, reward_spec: dict) -> dict[str, float] | Noted:
    """Fraction of ``@name[value]`` parts answered correctly, and 1.0 only when all are."""
    expected = expected_parts(ground_truth)
    if _match_rule(reward_spec) == "dabench":
        if reward_spec.get("tolerance") is not None:
            raise ValueError("reward_spec.match 'dabench' has its own rule; drop reward_spec.tolerance")
        given_raw = dabench_parts(answer or "")
        right = sum(1 for name, truth in expected.items() if dabench_equal(given_raw.get(name), truth))
        return {"answer_parts": right / len(expected), "answer_parts_all": float(right == len(expected))}
    raw_tol = reward_spec.get("tolerance")
    if isinstance(raw_tol, Mapping):
        unknown = set(raw_tol) - set(expected)
        if unknown:
            raise ValueError(f"reward_spec.tolerance names parts the ground truth lacks: {sorted(unknown)}")
        tolerances = {name: _tolerance(raw_tol.get(name), f"tolerance.{name}") for name in expected}
    else:
        tol = _tolerance(raw_tol, "tolerance")
        tolerances = dict.fromkeys(expected, tol)
    given = parse_parts(answer)
    right, notes = 0, []
    for name, truth in expected.items():
        if name not in given:
            notes.append(f"no @{name}[...] part")
            continue
        verdict = values_match(given[name], truth, tolerances[name])
        right += verdict.match
        if verdict.note:
            notes.append(f"@{name}: {verdict.note}")
    fraction = right / len(expected)
    return with_notes({"answer_parts": fraction, "answer_parts_all": float(right == len(expected))}, *notes)
