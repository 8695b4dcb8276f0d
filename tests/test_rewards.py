"""Reward registry, plans, deterministic components and aggregation."""

from __future__ import annotations

import re
from typing import Literal

import pytest

from rewards import RewardContext, RewardPlan, RewardSpecError, register_reward
from rewards.normalize import answers_match

GOOD_POLICY = "<Analyze>a</Analyze>\n<Code>\n```python\nprint(1)\n```\n</Code>\n<Answer>Answer: 5</Answer>"


def ctx(**over) -> RewardContext:
    base = dict(
        answer="5",
        policy_text=GOOD_POLICY,
        trajectory=GOOD_POLICY,
        messages=[],
        ground_truth="5",
        question="q",
        code_pass=[1, 0],
        turns=3,
        workspace=None,
        reward_spec={},
    )
    base.update(over)
    return RewardContext(**base)


@register_reward("test_len_ok")
def _len_ok(answer: str | None) -> float:
    return float(answer is not None and len(answer) < 3)


@register_reward("test_two_parts", components=("part_a", "part_b"))
def _two_parts(turns: int) -> dict[str, float]:
    return {"part_a": 1.0, "part_b": 0.0}


@register_reward("test_raises")
def _raises(answer: str | None) -> float:
    raise RuntimeError("scorer broke")


@register_reward("test_returns_none")
def _returns_none(answer: str | None) -> float | None:
    return None


def path_reward(ground_truth) -> float:
    return 0.25


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("1,234", 1234),
        ("  Store B. ", "store b"),
        ("12%", "12"),
        ("0.30000000000000004", 0.3),
        ("**7**", "7"),
    ],
)
def test_normalised_match_accepts_equivalent_answers(answer, truth):
    assert answers_match(answer, truth).match


@pytest.mark.parametrize(
    ("answer", "truth"), [("1235", 1234), ("store c", "store b"), (None, "x"), ("1.001", 1)]
)
def test_normalised_match_rejects_different_answers(answer, truth):
    assert not answers_match(answer, truth).match


def test_qa_plan_scores_accuracy_and_reports_raw_exact_with_weight_zero():
    plan = RewardPlan.build({"method": "qa_plain", "ground_truth": 1234})
    out = plan.score(ctx(answer="1,234", ground_truth=1234))
    assert out.components == {"qa_accuracy": 1.0, "qa_exact": 0.0}
    assert out.reward == 1.0  # qa_exact has weight 0: reported, not aggregated


def test_builtin_qa_method_includes_the_analysis_judge():
    plan = RewardPlan.build({"method": "qa", "ground_truth": 1})
    assert [fn.name for fn in plan.functions] == ["qa_accuracy", "judge_analysis", "qa_exact"]
    assert plan.needs_judge == ["judge_analysis"]


def test_unknown_method_is_rejected_at_build():
    with pytest.raises(RewardSpecError, match=r"unknown reward_spec\.method 'qna'"):
        RewardPlan.build({"method": "qna"})


def test_unknown_function_name_is_rejected_at_build():
    with pytest.raises(RewardSpecError, match="unknown reward function 'no_such_fn'"):
        RewardPlan.build({"method": "datatask", "function": ["no_such_fn"]})


def test_module_path_function_is_resolved_and_named_after_attr():
    plan = RewardPlan.build({"method": "datatask", "function": "tests.test_rewards:path_reward"})
    out = plan.score(ctx())
    assert out.components == {"path_reward": 0.25, "datatask_code": 0.5}
    assert out.reward == pytest.approx((0.25 + 0.5) / 2)


def test_a_misspelt_context_field_is_a_missing_argument_with_a_hint_at_build():
    """A parameter that is not a context field is an argument of the function's own; without a
    default and without ``args`` the plan refuses it, pointing at the field it resembles."""

    @register_reward("test_bad_param")
    def _bad(answr: str) -> float:
        return 0.0

    with pytest.raises(RewardSpecError) as info:
        RewardPlan.build({"method": "datatask", "function": ["test_bad_param"]})
    assert str(info.value) == (
        "reward_spec.function[0] (test_bad_param): missing argument 'answr' (test_bad_param takes: "
        "answr: str); or did you mean the context field 'answer'?"
    )


def test_duplicate_component_names_are_rejected_at_build():
    @register_reward("test_dup_a", components=("part_a",))
    def _dup(turns: int) -> float:
        return 0.0

    with pytest.raises(RewardSpecError, match="duplicate reward component 'part_a'"):
        RewardPlan.build({"method": "datatask", "function": ["test_two_parts", "test_dup_a"]})


def test_taken_name_with_a_different_function_is_rejected():
    with pytest.raises(RewardSpecError, match="already registered"):
        register_reward("qa_accuracy")(lambda answer: 0.0)


def test_dict_function_contributes_its_keys():
    out = RewardPlan.build({"method": "datatask", "function": ["test_two_parts"]}).score(ctx())
    assert out.components == {"part_a": 1.0, "part_b": 0.0, "datatask_code": 0.5}


def test_weights_make_a_weighted_mean_and_zero_weight_is_reported_only():
    spec = {"method": "datatask", "function": ["test_two_parts"], "weights": {"part_a": 3.0, "part_b": 0.0}}
    out = RewardPlan.build(spec).score(ctx())
    assert out.components["part_b"] == 0.0
    assert out.reward == pytest.approx((3 * 1.0 + 1 * 0.5) / 4)


def test_weight_for_unknown_component_is_rejected():
    with pytest.raises(RewardSpecError, match="unknown component 'qa_acc'"):
        RewardPlan.build({"method": "qa_plain", "weights": {"qa_acc": 1}})


def test_an_episode_without_code_turns_scores_its_code_component_0():
    """Skipping code must not pay: an answer-only datatask episode gets datatask_code 0, so its
    reward is the mean of 1.0 and 0.0 (it once left the component out and scored 1.0)."""
    out = RewardPlan.build({"method": "datatask", "function": ["test_len_ok"]}).score(ctx(code_pass=[]))
    assert out.components == {"test_len_ok": 1.0, "datatask_code": 0.0}
    assert out.reward == 0.5


def test_openresearch_turns_counts_cells_that_earned_code_pass_capped_at_one():
    plan = RewardPlan.build({"method": "openresearch", "function": ["test_len_ok"]})
    assert plan.score(ctx(turns=9, code_pass=[1, 0, 1, 1, 0, 1])).components["openresearch_turns"] == (
        pytest.approx(0.4)
    )
    assert plan.score(ctx(turns=30, code_pass=[1] * 25)).components["openresearch_turns"] == 1.0


def test_missing_tag_fails_the_gate_with_minus_one():
    out = RewardPlan.build({"method": "qa_plain"}).score(ctx(policy_text="<Answer>Answer: 5</Answer>"))
    assert (out.reward, out.components, out.format_ok, out.gate) == (
        -1.0,
        {"format_gate": -1.0},
        False,
        "tags",
    )


def test_unfenced_code_fails_the_fence_gate_for_datatask_only():
    text = "<Analyze>a</Analyze><Code>print(1)</Code><Answer>5</Answer>"
    out = RewardPlan.build({"method": "datatask", "function": ["test_len_ok"]}).score(ctx(policy_text=text))
    assert (out.reward, out.gate) == (-1.0, "fence")
    assert RewardPlan.build({"method": "qa_plain"}).score(ctx(policy_text=text)).gate is None


def test_a_raising_function_is_a_verifier_error_not_zero():
    out = RewardPlan.build({"method": "datatask", "function": ["test_raises"]}).score(ctx())
    assert out.status == "verifier_error"
    assert "test_raises: RuntimeError: scorer broke" in out.error


def test_none_from_a_non_optional_function_is_a_verifier_error():
    out = RewardPlan.build({"method": "datatask", "function": ["test_returns_none"]}).score(ctx())
    assert out.status == "verifier_error" and "returned None" in out.error


class _ContextTooLong(RuntimeError):
    """Stands in for the judge's context-length refusal: only its ``verifier_cause`` matters here."""

    verifier_cause = "context_length"


class _Unreachable(RuntimeError):
    verifier_cause = "judge_call"


class _OddCause(RuntimeError):
    verifier_cause = "the_policy_did_it"  # not a VerifierErrorCause


@register_reward("test_context_too_long")
def _context_too_long(answer: str | None) -> float:
    raise _ContextTooLong("prompt is 40000 tokens, the judge takes 32768")


@register_reward("test_unreachable_async")
async def _unreachable_async(answer: str | None) -> float:
    raise _Unreachable("connection refused")


@register_reward("test_odd_cause")
def _odd_cause(answer: str | None) -> float:
    raise _OddCause("?")


@register_reward("test_not_a_number")
def _not_a_number(answer: str | None) -> float:
    return "0.5"  # type: ignore[return-value]


def _cause(functions: list[str]) -> str | None:
    return RewardPlan.build({"method": "datatask", "function": functions}).score(ctx()).cause


def test_a_scored_episode_has_no_error_cause():
    assert _cause(["test_len_ok"]) is None


def test_an_exception_class_names_its_cause_through_verifier_cause():
    assert _cause(["test_context_too_long"]) == "context_length"


def test_an_async_function_exception_names_its_cause_too():
    assert _cause(["test_unreachable_async"]) == "judge_call"


def test_an_exception_without_a_verifier_cause_is_reward_raised():
    assert _cause(["test_raises"]) == "reward_raised"


def test_an_unknown_verifier_cause_value_is_reward_raised():
    assert _cause(["test_odd_cause"]) == "reward_raised"


@pytest.mark.parametrize("function", ["test_returns_none", "test_not_a_number"])
def test_a_value_that_is_not_a_reward_is_reward_raised(function):
    assert _cause([function]) == "reward_raised"


def test_no_component_with_positive_weight_is_reward_raised():
    plan = RewardPlan.build({"method": "datatask", "function": ["test_returns_none"]})
    plan.functions = []  # a plan left with nothing to weigh
    out = plan.score(ctx())
    assert (out.status, out.cause) == ("verifier_error", "reward_raised")


@pytest.mark.parametrize(
    ("functions", "cause"),
    [
        (["test_context_too_long", "test_unreachable_async"], "context_length"),
        (["test_unreachable_async", "test_context_too_long"], "judge_call"),
    ],
)
def test_with_several_failures_the_cause_is_the_first_failing_function_in_plan_order(functions, cause):
    out = RewardPlan.build({"method": "datatask", "function": functions}).score(ctx())
    assert out.cause == cause
    assert "_ContextTooLong" in out.error and "_Unreachable" in out.error  # both are still named


def test_async_functions_are_awaited():
    @register_reward("test_async_half")
    async def _half(answer: str | None) -> float:
        return 0.5

    out = RewardPlan.build({"method": "datatask", "function": ["test_async_half"]}).score(ctx(code_pass=[]))
    assert out.components == {"test_async_half": 0.5, "datatask_code": 0.0}


def test_plan_fingerprint_changes_with_weights():
    a = RewardPlan.build({"method": "qa"}).fingerprint()
    b = RewardPlan.build({"method": "qa", "weights": {"qa_exact": 1}}).fingerprint()
    assert a != b and a == RewardPlan.build({"method": "qa"}).fingerprint()


# ---------------------------------------------------------------------------- per-task arguments


@register_reward("test_within")
def _within(answer: str | None, limit: int, mode: Literal["chars", "words"] = "chars") -> float:
    size = len(answer or "") if mode == "chars" else len((answer or "").split())
    return float(size <= limit)


@register_reward("test_weights_arg", components=("w_first", "w_rest"))
def _weights_arg(turns: int, scale: float = 1.0, tags: list[str] | None = None) -> dict[str, float]:
    return {"w_first": min(1.0, scale), "w_rest": float(len(tags or []))}


def within(args: dict, alias: str | None = None) -> dict:
    item = {"name": "test_within", "args": args}
    return {**item, "as": alias} if alias else item


def test_arguments_are_passed_per_item_and_one_function_may_appear_twice_under_as():
    spec = {"method": "verified", "function": [within({"limit": 1}), within({"limit": 0}, "empty")]}
    out = RewardPlan.build(spec).score(ctx(answer="5"))  # len("5") = 1: within 1, not within 0
    assert out.components == {"test_within": 1.0, "empty": 0.0}
    assert out.reward == 0.5


def test_as_prefixes_the_components_of_a_multi_component_function():
    spec = {
        "method": "verified",
        "function": [{"name": "test_weights_arg", "args": {"tags": ["a"]}, "as": "x"}],
    }
    plan = RewardPlan.build(spec)
    assert plan.weights == {"x.w_first": 1.0, "x.w_rest": 1.0}
    assert plan.score(ctx()).components == {"x.w_first": 1.0, "x.w_rest": 1.0}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"limit": 2, "limt": 3}, "unknown argument 'limt' (test_within takes: limit: int, mode: "),
        ({}, "missing argument 'limit'"),
        ({"limit": "2"}, "argument 'limit' must be int, got '2'"),
        ({"limit": True}, "argument 'limit' must be int, got True"),
        ({"limit": 2, "mode": "lines"}, "argument 'mode' must be Literal['chars', 'words'], got 'lines'"),
        ({"limit": 2, "answer": "x"}, "'answer' is a context field the env passes; it cannot be set in args"),
    ],
)
def test_bad_arguments_fail_when_the_plan_is_built_with_one_line_naming_the_item(args, message):
    with pytest.raises(RewardSpecError) as info:
        RewardPlan.build({"method": "verified", "function": ["qa_accuracy", within(args)]})
    text = str(info.value)
    assert text.startswith("reward_spec.function[1] (test_within): ") and message in text
    assert "\n" not in text


@pytest.mark.parametrize(
    "args",
    [{"scale": 2}, {"scale": 0.5, "tags": ["a", "b"]}, {"tags": None}],
)
def test_arguments_of_their_annotated_types_are_accepted(args):
    RewardPlan.build({"method": "verified", "function": [{"name": "test_weights_arg", "args": args}]})


@pytest.mark.parametrize("args", [{"scale": "2"}, {"tags": ["a", 1]}, {"tags": "a"}])
def test_arguments_of_other_types_are_refused(args):
    with pytest.raises(RewardSpecError, match="must be"):
        RewardPlan.build({"method": "verified", "function": [{"name": "test_weights_arg", "args": args}]})


def test_the_same_function_twice_without_as_is_a_duplicate_component():
    spec = {"method": "verified", "function": [within({"limit": 1}), within({"limit": 2})]}
    with pytest.raises(RewardSpecError, match=r"duplicate reward component 'test_within'.*\"as\" name"):
        RewardPlan.build(spec)


def test_arguments_and_as_names_are_part_of_the_fingerprint():
    def fingerprint(*items) -> str:
        return RewardPlan.build({"method": "verified", "function": list(items)}).fingerprint()

    one = fingerprint(within({"limit": 1}))
    assert one == fingerprint(within({"limit": 1}))
    assert one != fingerprint(within({"limit": 2}))
    assert one != fingerprint(within({"limit": 1}, "short"))
    assert fingerprint("qa_accuracy") == fingerprint({"name": "qa_accuracy"})  # the plain name is the same


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"name": "test_within", "arg": {}}, "unknown key(s) arg"),
        ({"args": {}}, "'name' must be a reward function name"),
        ({"name": "test_within", "args": {"limit": 1}, "as": "format_gate"}, "'as' must be a component name"),
        ({"name": "test_within", "args": [1]}, "args must be an object"),
        (3, "expected a name or"),
    ],
)
def test_malformed_function_items_are_refused(item, message):
    with pytest.raises(RewardSpecError, match=re.escape(message)):
        RewardPlan.build({"method": "verified", "function": [item]})


def test_context_fields_are_the_dataclass_fields():
    """One definition: every field of RewardContext may be asked for, and nothing else."""
    from dataclasses import fields

    from rewards import CONTEXT_FIELDS

    assert {f.name for f in fields(RewardContext)} == CONTEXT_FIELDS
    assert {"action_format", "tool_errors", "prefix_turns"} <= CONTEXT_FIELDS

    @register_reward("test_reads_tools")
    def _reads(action_format: str, tool_errors: list[str]) -> float:
        return float(action_format == "tools" and not tool_errors)

    fn = RewardPlan.build({"method": "verified", "function": ["test_reads_tools"]}).functions[0].fn
    assert fn.params == ("action_format", "tool_errors") and fn.own == ()
