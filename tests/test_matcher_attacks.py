"""The red team's attacks on the answer matchers (issue 39), each as a test.

1. One answer matched every numeric truth: ``1234567890123456e400`` has more than 15 significant
   digits, so it was compared as a float — ``inf`` — and ``|inf - g| <= 4 * ulp(inf)`` held for
   every ``g``. A number no float holds is now never read as a number.
2. An answer could take its own episode out of the gradient: ``1e99999999`` raised
   ``decimal.Overflow`` in the matcher, the episode became ``verifier_error``, and training skips
   those. Nothing an answer holds raises now; the miss says why in ``reward_notes``.

Expected values are worked out by hand: every truth here is an ordinary number and every answer
is either not a number or one no float holds, so every score is 0.
"""

from __future__ import annotations

import time

import pytest
import skyrl_gym

from rewards.answers import answer_match, answer_parts
from rewards.components import qa_accuracy
from rewards.files import compare_file, file_match
from rewards.registry import Noted
from rewards.upstream import upstream_exact
from tests.conftest import qa_extras
from tests.test_rewards_bank import score  # one way to score a spec on an answer

HUGE = "1234567890123456e400"
TRUTHS = [42, 135.55, -3, 0, "42", "135.55", "-3", "0"]
# numbers no float holds, non-finite words, and digit strings past any float
UNREADABLE = {
    "1e99999999": "beyond a float's range",
    "1e-99999999": "beyond a float's range",
    "9e999999999999": "beyond a float's range",
    "-1e99999999": "beyond a float's range",
    HUGE: "beyond a float's range",
    "-" + HUGE: "beyond a float's range",
    "1" * 5000: "beyond a float's range",
    "0." + "0" * 400 + "1": "beyond a float's range",
    "1e" + "9" * 100_000: "beyond a float's range",
    "NaN": "not a finite number",
    "-inf": "not a finite number",
    "sNaN": "not a finite number",
    "Infinity": "not a finite number",
    "-Infinity": "not a finite number",
}


def value(result):
    return result.value if isinstance(result, Noted) else result


def note(result) -> str:
    assert isinstance(result, Noted), f"a miss without a reason: {result!r}"
    return result.note


# ------------------------------------------------------------------ attack 1: one answer for all
@pytest.mark.parametrize("truth", TRUTHS, ids=repr)
def test_a_number_past_float_range_matches_no_truth_in_answer_match(truth):
    assert value(answer_match(HUGE, truth, {})) == 0.0
    assert "beyond a float's range" in note(answer_match(HUGE, truth, {}))


@pytest.mark.parametrize("truth", TRUTHS, ids=repr)
def test_a_number_past_float_range_matches_no_truth_in_qa_accuracy(truth):
    assert value(qa_accuracy(HUGE, truth)) == 0.0
    assert "beyond a float's range" in note(qa_accuracy(HUGE, truth))


def test_a_number_past_float_range_fills_no_part_of_answer_parts():
    truth = [["a", "42"], ["b", "135.55"], ["c", "-3"], ["d", "0"]]
    result = answer_parts(" ".join(f"@{name}[{HUGE}]" for name, _ in truth), truth, {})
    assert value(result) == {"answer_parts": 0.0, "answer_parts_all": 0.0}
    assert note(result).count("beyond a float's range") == 4


def test_a_long_digit_string_is_not_a_float_that_matches_everything():
    # 5000 ones: once float('111...') == inf, which matched every truth like HUGE did
    assert value(answer_match("1" * 5000, 42, {})) == 0.0
    assert value(qa_accuracy("1" * 5000, 0)) == 0.0


def test_a_large_value_is_not_within_a_tolerance_it_is_outside_in_file_match(tmp_path):
    # expected 1e12 with tolerance 1e-6: a cell 500 off used to pass on a 1e-9 relative slack
    (tmp_path / "out.csv").write_text("v\n1000000000500\n")
    expected = {"name": "out.csv", "columns": ["v"], "rows": [[1e12]], "tolerance": 1e-6}
    assert compare_file(tmp_path, "out.csv", expected).values == 0.0
    (tmp_path / "out.csv").write_text("v\n1000000000000.0000000001\n")
    assert compare_file(tmp_path, "out.csv", expected).values == 1.0  # inside by 1e-10


# ---------------------------------------------------------- attack 2: an answer that raises
@pytest.mark.parametrize("answer", list(UNREADABLE), ids=lambda a: a[:24])
def test_an_unreadable_number_never_raises_never_matches_and_says_why(answer):
    why = UNREADABLE[answer]
    for result in (
        answer_match(answer, 42, {}),
        answer_match(answer, 42, {"tolerance": 1e300}),
        answer_match(answer, "0", {"tolerance": 0.5}),
        qa_accuracy(answer, 0),
        qa_accuracy(answer, 135.55),
    ):
        assert value(result) == 0.0 and why in note(result)
    parts = answer_parts(f"@a[{answer}] @b[7]", [["a", "0"], ["b", "7"]], {"tolerance": {"a": 1e9}})
    assert value(parts) == {"answer_parts": 0.5, "answer_parts_all": 0.0} and why in note(parts)
    # (DABench's own rule reads 1e-99999999 as the float 0.0, within 1e-6 of a truth 0: so 42 here)
    dabench = answer_parts(f"@a[{answer}]", [["a", "42"]], {"match": "dabench"})
    assert dabench == {"answer_parts": 0.0, "answer_parts_all": 0.0}
    assert upstream_exact(f"<Answer>Answer: {answer}</Answer>", "42") == 0.0


@pytest.mark.parametrize("answer", ["1e99999999", "9e999999999999", "sNaN", HUGE])
@pytest.mark.parametrize(
    "spec",
    [
        {"method": "qa_plain", "ground_truth": "42"},
        {"method": "verified", "ground_truth": "42", "function": ["answer_match"]},
        {"method": "verified", "ground_truth": "42", "function": ["answer_match"], "tolerance": 0.5},
        {"method": "verified", "ground_truth": [["n", "42"]], "function": ["answer_parts"]},
    ],
    ids=["qa_accuracy", "answer_match", "answer_match_tolerance", "answer_parts"],
)
def test_an_unreadable_answer_is_scored_zero_not_a_verifier_error(spec, answer):
    written = f"@n[{answer}]" if "answer_parts" in spec.get("function", []) else answer
    outcome = score(spec, written)
    assert outcome.status == "scored", outcome.error
    accuracy = {"qa_plain": "qa_accuracy"}.get(spec["method"]) or spec["function"][0]
    name = "answer_parts_all" if accuracy == "answer_parts" else accuracy
    assert outcome.components[name] == 0.0
    assert outcome.details["notes"][accuracy]


def test_file_match_cells_no_float_holds_score_zero_and_do_not_raise(tmp_path):
    (tmp_path / "out.csv").write_text(f"a,b,c,d\ninf,1e99999999,{HUGE},sNaN\n")
    spec = {
        "method": "datatask",
        "ground_truth": "x",
        "function": ["file_match"],
        "expected_file": {"name": "out.csv", "columns": ["a", "b", "c", "d"], "rows": [[1, 2, 3, 4]]},
    }
    outcome = score(spec, "x", tmp_path)
    assert outcome.status == "scored"
    assert outcome.components["file_values"] == 0.0 and outcome.components["file_schema"] == 1.0
    assert value(file_match(tmp_path, spec))["file_values"] == 0.0


@pytest.mark.parametrize(
    "truth", [float("nan"), float("inf"), "1e400", 10**400], ids=["nan", "inf", "str-1e400", "int-10**400"]
)
def test_a_truth_no_float_holds_is_the_verifier_error_not_the_answer(truth):
    # the task is malformed: the verifier cannot run, so it says so instead of scoring
    outcome = score({"method": "verified", "ground_truth": truth, "function": ["answer_match"]}, "42")
    assert outcome.status == "verifier_error" and "ground truth" in outcome.error


def test_dabench_parts_stay_linear_on_an_answer_of_unclosed_parts():
    # DABench's lazy pattern through re.findall took 38 s on this (quadratic): every "@a[" scans to
    # the line's end for a "]"; the scan is linear. (Its parts stop at a newline, as DABench's do.)
    answer = "@a[" * 35_000 + "\n@a[1]"
    start = time.monotonic()
    result = answer_parts(answer, [["a", "1"]], {"match": "dabench"})
    assert result == {"answer_parts": 1.0, "answer_parts_all": 1.0}
    assert time.monotonic() - start < 10.0  # milliseconds when linear, minutes when not


# ---------------------------------------------------------------- through the real env
@pytest.mark.parametrize(
    ("reward_spec", "component"),
    [
        ({"method": "qa_plain", "ground_truth": "42"}, "qa_accuracy"),
        ({"method": "verified", "ground_truth": "42", "function": ["answer_match"]}, "answer_match"),
    ],
)
def test_an_episode_answering_1e99999999_is_scored_zero_with_the_reason(
    workspace_root, reward_spec, component
):
    env = skyrl_gym.make(
        "deepanalyze",
        env_config={"workspace_root": str(workspace_root), "executor": {"timeout_s": 5}},
        extras=qa_extras(reward_spec=reward_spec),
    )
    env.init([{"role": "user", "content": "How much revenue did store B make?"}])
    try:
        out = env.step("<Analyze>It is large.</Analyze>\n<Answer>\nAnswer: 1e99999999\n</Answer>")
    finally:
        env.close()
    meta = out["metadata"]
    assert out["done"] is True
    assert meta["reward_status"] == "scored", meta.get("error")
    assert meta["reward_components"][component] == 0.0 and out["reward"] == 0.0
    assert "'1e99999999' is beyond a float's range" in meta["reward_notes"][component]


# ------------------------------------------------ found by the long run (benchmarks/matcher_properties.py)
@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("\u221220000000000000000001.0", "-20000000000000000000"),
        ("27,799,999,999,999,999.000", "27,800,000,000,000,000"),
        ("99999999999999.999E+3", 100000000000000000),
    ],
)
def test_an_answer_read_at_15_digits_does_not_match_a_longer_plain_integer(answer, truth):
    # the answer rounds to the truth at 15 digits, but the truth is an integer exact to the unit,
    # and the answer says another unit: not the truth's value at its printed precision
    assert value(answer_match(answer, truth, {})) == 0.0
    assert value(qa_accuracy(answer, truth)) == 0.0


def test_an_answer_read_at_15_digits_still_matches_a_truth_printed_no_finer():
    # float noise past the 15th digit, as a float computation prints it
    assert answer_match("0.30000000000000004", "0.3", {}) == 1.0
    assert answer_match("1.2345678901234567e16", "1.23456789012346e16", {}) == 1.0
    assert answer_match("0.3", 0.30000000000000004, {}) == 1.0  # the truth itself carries the noise


def test_zero_with_an_exponent_past_any_decimal_context_is_zero():
    assert answer_match("0.0E100000000000000000001", 0, {}) == 1.0
    assert qa_accuracy("0e-100000000000000000001", "0.0") == 1.0


# ---------------------------------------- issue 52: a decimal comma read through the thousands grammar
# A comma is a thousands separator only between groups of three after a lead that does not start
# with zero. "0,042" means 0.042 where the comma is decimal and nothing at all where it is not; it
# was read as 42. It now states no number (design.md §7, "Numeric match").
AMBIGUOUS = [
    "0,042",
    "-0,042",
    "+0,042",
    "00,042",
    "012,345",
    "0,000",
    "0,042%",
    "`0,042`",
    "0,042e3",
    "٠,٠٤٢",
]


@pytest.mark.parametrize("answer", AMBIGUOUS)
@pytest.mark.parametrize("truth", [42, "42", 0.042, "0.042", 12345, 0, "-42"], ids=repr)
def test_a_comma_after_a_zero_lead_matches_neither_reading(answer, truth):
    for result in (answer_match(answer, truth, {}), qa_accuracy(answer, truth)):
        assert value(result) == 0.0 and "ambiguous" in note(result)
    assert value(answer_match(answer, truth, {"tolerance": 1e300})) == 0.0  # no value to be near


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("1,234", 1234),
        ("-1,234", -1234),
        ("12,345,678.5", 12345678.5),
        ("١,٢٣٤", 1234),  # Arabic-Indic digits, a non-zero lead
        ("100,000", "100000"),
        ("1,234%", "1234"),
    ],
)
def test_thousands_groups_after_a_non_zero_lead_still_read_as_thousands(answer, truth):
    assert answer_match(answer, truth, {}) == 1.0


@pytest.mark.parametrize("answer", ["1,234", "12,345"])
def test_a_thousands_group_is_never_read_as_a_decimal_comma(answer):
    # the other reading of "1,234" (1.234) is not the answer's value
    assert value(answer_match(answer, float(answer.replace(",", ".")), {})) == 0.0


def test_a_decimal_comma_answer_is_scored_zero_not_a_verifier_error():
    outcome = score({"method": "verified", "ground_truth": "42", "function": ["answer_match"]}, "0,042")
    assert outcome.status == "scored" and outcome.components["answer_match"] == 0.0
    assert "ambiguous" in outcome.details["notes"]["answer_match"]


def test_an_ambiguous_truth_is_a_malformed_task_the_verifier_error():
    outcome = score({"method": "verified", "ground_truth": "0,042", "function": ["answer_match"]}, "0.042")
    assert outcome.status == "verifier_error" and "ground truth" in outcome.error
