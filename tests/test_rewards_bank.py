"""The bank's reward functions on hand-written cases: answer_match, answer_parts, file_match.

Expected scores are worked out by hand in each test. Scoring goes through a real RewardPlan
(the ``verified`` and ``datatask`` methods), so the statuses are what an episode would get.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rewards import RewardContext, RewardPlan, RewardSpecError
from rewards.answers import answer_match, answer_parts, parse_parts
from rewards.components import qa_accuracy
from rewards.files import compare_table, file_match
from rewards.registry import Noted

GATE_OK = "<Analyze>a</Analyze><Answer>x</Answer>"


def score(spec: dict, answer: str | None, workspace: Path | None = None):
    plan = RewardPlan.build(spec)
    ctx = RewardContext(
        answer=answer,
        policy_text=GATE_OK,
        trajectory=GATE_OK,
        messages=[],
        ground_truth=spec.get("ground_truth"),
        question="q",
        code_pass=[1],
        turns=2,
        workspace=workspace,
        reward_spec=spec,
    )
    return plan.score(ctx)


# ------------------------------------------------------------------------------ answer_match
@pytest.mark.parametrize(
    ("answer", "expected"),
    [("3.14", 1.0), ("3.140", 1.0), ("3.1412", 1.0), ("3.2", 0.0), ("3.15", 0.0)],
)
def test_answer_match_uses_the_tasks_tolerance(answer, expected):
    # truth 3.14 stated to 2 decimals -> tolerance 0.005: 3.1412 is within, 3.15 (off by 0.01) is not
    assert answer_match(answer, "3.14", {"tolerance": 0.005}) == expected


def test_a_text_answer_to_a_number_is_a_miss_that_says_why():
    assert answer_match("about pi", "3.14", {"tolerance": 0.005}) == Noted(
        0.0, "the answer 'about pi' is not a number (the ground truth is one)"
    )


def test_answer_match_without_tolerance_is_the_same_decimal_value():
    assert answer_match("1,234", 1234, {}) == 1.0
    assert answer_match("1234.01", 1234, {}) == 0.0
    assert answer_match("3.140", "3.14", {}) == 1.0
    assert answer_match("1e3", 1000, {}) == 1.0


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        # a relative 1e-6 accepted these (real DABench dev labels, perturbed at the answer's precision)
        ("40974.169", "40974.16"),
        ("22756785531.299", "22756785531.29"),
        ("1000000.4", 1000000),
        # and an absolute 1e-12 floor accepted these tiny ones
        ("1e-13", "2e-13"),
        ("0.0000000000003", "0.0000000000004"),
    ],
)
def test_answer_match_without_tolerance_rejects_a_different_value_at_any_magnitude(answer, truth):
    assert answer_match(answer, truth, {}) == 0.0
    assert qa_accuracy(answer, truth) == 0.0


def test_a_stated_tolerance_does_not_grow_with_the_magnitude():
    # 0.009 off with a tolerance of 0.005: wrong, however large the value (a 1e-9 relative slack
    # used to add 22.7 here)
    assert answer_match("22756785531.299", "22756785531.29", {"tolerance": 0.005}) == 0.0
    assert answer_match("22756785531.294", "22756785531.29", {"tolerance": 0.005}) == 1.0
    assert answer_match("3.145", "3.14", {"tolerance": 0.005}) == 1.0  # the edge, float noise aside


@pytest.mark.parametrize(
    ("answer", "fraction"),
    [
        ("@n[40] @city[Paris]", 1.0),
        ("@n[40.0000001] @city[Paris]", 1.0),  # floats within 1e-6
        ("@n[40.000002] @city[Paris]", 0.5),  # 2e-6 off
        ("@n[40] @city[paris]", 0.5),  # text is the exact string
        ("@n[40] @city[ Paris]", 0.5),  # values as written (no strip)
        ("@n[ 40] @city[Paris]", 1.0),  # float(' 40') == 40, as DABench reads it
    ],
)
def test_dabench_rows_score_as_dabenchs_own_evaluation(answer, fraction):
    spec = {"method": "verified", "ground_truth": [["n", "40"], ["city", "Paris"]], "match": "dabench"}
    assert answer_parts(answer, spec["ground_truth"], spec)["answer_parts"] == fraction


def test_dabench_rule_on_large_and_small_magnitudes():
    spec = {"match": "dabench"}
    assert answer_parts("@v[22756785531.299]", [["v", "22756785531.29"]], spec)["answer_parts"] == 0.0
    assert answer_parts("@v[40974.169]", [["v", "40974.16"]], spec)["answer_parts"] == 0.0
    assert answer_parts("@v[0.0000005]", [["v", "0.0000001"]], spec)["answer_parts"] == 1.0  # 4e-7 < 1e-6


def test_dabench_rule_refuses_a_tolerance_and_an_unknown_rule_is_a_verifier_error():
    base = {"method": "verified", "ground_truth": [["n", "1"]], "function": ["answer_parts"]}
    outcome = score({**base, "match": "dabench", "tolerance": 0.1}, "@n[1]")
    assert outcome.status == "verifier_error" and "tolerance" in outcome.error
    outcome = score({**base, "match": "fuzzy"}, "@n[1]")
    assert outcome.status == "verifier_error" and "reward_spec.match" in outcome.error


def test_answer_match_compares_lists_in_order():
    assert answer_match("Texas,Ohio, Utah", "Texas, Ohio, Utah", {}) == 1.0
    assert answer_match("Ohio, Texas, Utah", "Texas, Ohio, Utah", {}) == 0.0
    assert answer_match("Texas, Ohio", "Texas, Ohio, Utah", {}) == 0.0


def test_verified_plan_scores_a_missing_answer_zero_not_error():
    outcome = score({"method": "verified", "ground_truth": "7", "function": ["answer_match"]}, None)
    assert outcome.status == "scored" and outcome.components == {"answer_match": 0.0}


def test_a_bad_tolerance_is_a_verifier_error_not_a_zero():
    outcome = score(
        {"method": "verified", "ground_truth": "7", "function": ["answer_match"], "tolerance": -1}, "7"
    )
    assert outcome.status == "verifier_error" and "tolerance" in outcome.error


def test_verified_method_without_a_function_fails_when_built():
    with pytest.raises(RewardSpecError):
        RewardPlan.build({"method": "verified", "ground_truth": "7"})


# ------------------------------------------------------------------------------ answer_parts
PARTS = [["mean_yield", "53.69"], ["variety", "Bramley"], ["tree_count", "3"]]
PARTS_SPEC = {"method": "verified", "ground_truth": PARTS, "function": ["answer_parts"]}


def test_parse_parts_reads_names_and_values():
    assert parse_parts("@a[1.5], then @b_2[Red Delicious] and @c[[1, 2]]") == {
        "a": "1.5",
        "b_2": "Red Delicious",
        "c": "[1, 2]",
    }


@pytest.mark.parametrize(
    ("answer", "fraction", "all_right"),
    [
        ("@mean_yield[53.69] @variety[Bramley] @tree_count[3]", 1.0, 1.0),
        ("@tree_count[3.0] @variety[bramley] @mean_yield[53.690]", 1.0, 1.0),  # order/format free
        ("@mean_yield[53.69] @variety[Gala] @tree_count[3]", 2 / 3, 0.0),
        ("@mean_yield[53.69]", 1 / 3, 0.0),  # a part left out counts as wrong
        ("@mean_yield[50] @variety[Fuji] @tree_count[4]", 0.0, 0.0),
        ("mean 53.69, Bramley, 3 trees", 0.0, 0.0),  # malformed: no @name[value] parts
    ],
)
def test_answer_parts_fraction_and_all_correct(answer, fraction, all_right):
    outcome = score(PARTS_SPEC, answer)
    assert outcome.status == "scored"
    assert outcome.components["answer_parts"] == pytest.approx(fraction)
    assert outcome.components["answer_parts_all"] == all_right
    assert outcome.reward == pytest.approx((fraction + all_right) / 2)


def test_answer_parts_tolerance_per_part():
    spec = {"ground_truth": [["r", "0.512"], ["n", "40"]], "tolerance": {"r": 0.0005}}
    assert answer_parts("@r[0.5123] @n[40]", spec["ground_truth"], spec) == {
        "answer_parts": 1.0,
        "answer_parts_all": 1.0,
    }
    assert answer_parts("@r[0.513] @n[40]", spec["ground_truth"], spec) == {
        "answer_parts": 0.5,
        "answer_parts_all": 0.0,
    }


def test_answer_parts_accepts_text_and_mapping_truths():
    assert answer_parts("@a[1] @b[x]", "@a[1.0] @b[X]", {}) == {"answer_parts": 1.0, "answer_parts_all": 1.0}
    assert answer_parts("@a[2]", {"a": 1}, {})["answer_parts"] == 0.0


@pytest.mark.parametrize("truth", [[["only-one-item"]], "no parts here", 42, []])
def test_a_malformed_ground_truth_is_a_verifier_error(truth):
    outcome = score({**PARTS_SPEC, "ground_truth": truth}, "@a[1]")
    assert outcome.status == "verifier_error" and "answer_parts" in outcome.error


# -------------------------------------------------------------------------------- file_match
EXPECTED = {
    "name": "clean.csv",
    "columns": ["id", "city", "temp"],
    "rows": [[1, "Oslo", 3.5], [2, "Lima", 19.25], [3, "Pune", None]],
    "tolerance": 1e-6,
}
FILE_SPEC = {"method": "datatask", "ground_truth": "3", "function": ["file_match"], "expected_file": EXPECTED}


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "clean.csv").write_text(text, encoding="utf-8")
    return tmp_path


def test_file_match_identical_file_scores_full(tmp_path):
    ws = write(tmp_path, "id,city,temp\n1,Oslo,3.5\n2,Lima,19.250000\n3,Pune,\n")
    assert file_match(ws, FILE_SPEC) == {"file_schema": 1.0, "file_rows": 1.0, "file_values": 1.0}


def test_file_match_accepts_the_same_rows_in_another_order(tmp_path):
    ws = write(tmp_path, "temp,id,city\n19.25,2,Lima\n3.5,1,Oslo\n,3,Pune\n")
    assert file_match(ws, FILE_SPEC) == {"file_schema": 1.0, "file_rows": 1.0, "file_values": 1.0}


def test_file_match_says_an_index_column_was_written(tmp_path):
    ws = write(tmp_path, ",id,city,temp\n0,1,Oslo,3.5\n1,2,Lima,19.25\n2,3,Pune,\n")
    diff = compare_table(ws / "clean.csv", EXPECTED)
    # shared 3 of 4 distinct column names; every shared cell agrees
    assert (diff.schema, diff.rows, diff.values) == (0.75, 1.0, 1.0)
    assert diff.problems == ["unexpected columns: (unnamed: an index column?)"]


def test_file_match_partly_right_counts_rows_and_cells(tmp_path):
    ws = write(tmp_path, "id,city,temp\n1,Oslo,3.5\n2,Lima,21.0\n")
    diff = compare_table(ws / "clean.csv", EXPECTED)
    # 2 rows of 3; cells compared over 3 rows x 3 columns = 9: row 3 missing (3) and 21.0 != 19.25 (1)
    assert diff.rows == pytest.approx(2 / 3)
    assert diff.values == pytest.approx(5 / 9)
    assert "2 rows, expected 3" in diff.problems


def test_file_match_missing_file_scores_zero_and_says_so(tmp_path):
    assert file_match(tmp_path, FILE_SPEC) == Noted(
        {"file_schema": 0.0, "file_rows": 0.0, "file_values": 0.0}, "clean.csv was not written"
    )
    assert compare_table(tmp_path / "clean.csv", EXPECTED).problems == ["clean.csv was not written"]


def test_file_match_without_expected_file_is_a_verifier_error(tmp_path):
    outcome = score({"method": "datatask", "ground_truth": "3", "function": ["file_match"]}, "3", tmp_path)
    assert outcome.status == "verifier_error" and "expected_file" in outcome.error
