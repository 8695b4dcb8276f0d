"""Registered judge rewards: names, aliases, component names, scaling, and failure → verifier_error."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from rewards import RewardContext, RewardPlan
from rewards.aio import run_sync
from rewards.judge import JudgeSession
from rewards.judge.fake_server import FakeJudgeServer, Reply
from rewards.judges import OPENDOMAIN_COMPONENTS, judge_accuracy, judge_opendomain, rubrics_for
from rewards.registry import resolve

from .conftest import FAKE_KEY, MODEL

POLICY = "<Analyze>count rows</Analyze>\n<Answer>Answer: 42</Answer>"
VERDICT = (
    '```json\n{"usefulness": 5, "richness": 4, "soundness": 3, "interpretability": 2, "readability": 1,}\n```'
)


def context(session: JudgeSession | None, spec: dict, answer: str | None = "42") -> RewardContext:
    return RewardContext(
        answer=answer,
        policy_text=POLICY,
        trajectory=POLICY + "\n<Execute>\n42\n</Execute>\n",
        messages=[
            {"role": "user", "content": "How many rows?"},
            {"role": "assistant", "content": "<Analyze>count rows</Analyze>\n<Code>print(42)</Code>"},
            {"role": "user", "content": "\n<Execute>\n42\n</Execute>\n"},
            {"role": "assistant", "content": POLICY},
        ],
        ground_truth=spec.get("ground_truth"),
        question="How many rows?",
        code_pass=[1],
        turns=2,
        workspace=None,
        reward_spec=spec,
        judge=session,
    )


@pytest.mark.parametrize(
    ("name", "alias", "components"),
    [
        ("judge_analysis", "llm_as_judgement_analyze", ("qa_analysis",)),
        ("judge_accuracy", "llm_as_judgement_accuracy", ("judge_accuracy",)),
        ("judge_opendomain", "llm_as_judgement_opendomain", OPENDOMAIN_COMPONENTS),
    ],
)
def test_each_judge_is_registered_under_its_v1_name_and_upstream_alias(name, alias, components):
    for ref in (name, alias):
        fn = resolve(ref)
        assert fn.needs_judge and fn.is_async
        assert fn.component_names == components
    assert resolve(name).fn is resolve(alias).fn


def test_opendomain_components_are_prefixed_dimensions():
    assert OPENDOMAIN_COMPONENTS == (
        "openresearch_usefulness",
        "openresearch_richness",
        "openresearch_soundness",
        "openresearch_interpretability",
        "openresearch_readability",
    )


def test_qa_plan_scores_the_analysis_judge_as_score_over_five(server: FakeJudgeServer, session):
    server.script(Reply(text="Weaknesses:\n- no sanity check\nSCORE: 4"))
    spec = {"method": "qa", "ground_truth": "42", "function": ["llm_as_judgement_analyze"]}
    outcome = RewardPlan.build(spec).score(context(session, spec))
    assert outcome.status == "scored", outcome.error
    assert outcome.components["qa_analysis"] == pytest.approx(0.8)
    assert "<Execute>" in server.requests[0]["prompt"]  # the judge sees the whole trajectory


def test_datatask_plan_scores_accuracy_against_the_reference(server: FakeJudgeServer, session):
    server.script(Reply(text="Weaknesses:\n- none found\nSCORE: 5"))
    spec = {"method": "datatask", "ground_truth": {"rows": 42}, "function": ["judge_accuracy"]}
    outcome = RewardPlan.build(spec).score(context(session, spec))
    assert outcome.status == "scored", outcome.error
    assert outcome.components["judge_accuracy"] == 1.0
    prompt = server.requests[0]["prompt"]
    assert '"rows": 42' in prompt and "How many rows?" in prompt


def test_openresearch_plan_scores_five_dimensions(server: FakeJudgeServer, session):
    server.script(Reply(text="Weaknesses:\n- thin\n" + VERDICT))
    spec = {"method": "openresearch", "ground_truth": "", "function": ["judge_opendomain"]}
    outcome = RewardPlan.build(spec).score(context(session, spec))
    assert outcome.status == "scored", outcome.error
    got = {k: outcome.components[k] for k in OPENDOMAIN_COMPONENTS}
    assert list(got.values()) == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2])
    assert "(no reference provided)" in server.requests[0]["prompt"]


def test_judge_failure_is_a_verifier_error_naming_the_judge_and_cause(server: FakeJudgeServer, make_client):
    server.script(Reply(status=500, text="boom"))
    session = JudgeSession(make_client(max_retries=1))
    spec = {"method": "datatask", "ground_truth": "42", "function": ["judge_accuracy"]}
    outcome = RewardPlan.build(spec).score(context(session, spec))
    assert outcome.status == "verifier_error"
    assert outcome.error.startswith("judge_accuracy: JudgeCallError: ")
    assert MODEL in outcome.error and "HTTP 500" in outcome.error
    assert FAKE_KEY not in outcome.error
    assert "judge_accuracy" not in outcome.components


def test_unparsable_reply_is_a_verifier_error_with_the_raw_reply_in_the_calls(server, session):
    server.script(Reply(text="Looks great to me."))
    spec = {"method": "qa", "ground_truth": "42", "function": ["judge_analysis"]}
    outcome = RewardPlan.build(spec).score(context(session, spec))
    assert outcome.status == "verifier_error"
    assert "JudgeParseError" in outcome.error and "unparsable reply" in outcome.error
    assert session.calls[0]["reply"] == "Looks great to me."
    json.dumps(session.summary())  # records must be able to hold it


def test_missing_answer_scores_zero_without_calling_the_judge(server: FakeJudgeServer, session):
    assert run_sync(judge_accuracy(question="q", answer=None, ground_truth="42", judge=session)) == 0.0
    dims = run_sync(judge_opendomain(question="q", answer=None, ground_truth="", judge=session))
    assert dims == dict.fromkeys(OPENDOMAIN_COMPONENTS, 0.0)
    assert server.calls == 0 and session.calls == []


def test_accuracy_without_a_reference_is_an_error_not_a_zero(session):
    with pytest.raises(ValueError, match="ground_truth"):
        run_sync(judge_accuracy(question="q", answer="42", ground_truth="", judge=session))


def test_judge_reward_without_a_judge_names_the_missing_setting():
    spec = {"method": "qa", "ground_truth": "42", "function": ["judge_analysis"]}
    outcome = RewardPlan.build(spec).score(context(None, spec))
    assert outcome.status == "verifier_error" and "env_config.judge" in outcome.error


def test_summary_lists_model_prompt_hashes_and_calls(server: FakeJudgeServer, session):
    server.script(Reply(text="SCORE: 3"))
    spec = {"method": "qa", "ground_truth": "42", "function": ["judge_analysis"]}
    RewardPlan.build(spec).score(context(session, spec))
    summary = session.summary()
    assert summary["model"] == MODEL and summary["backend"] == "openai"
    assert set(summary["prompt_hashes"]) == {"judge_analysis"}
    call = summary["calls"][0]
    assert set(call) >= {
        "rubric",
        "prompt_hash",
        "model",
        "sample",
        "reply",
        "score",
        "parse_error",
        "latency_ms",
        "cached",
        "error",
    }
    assert call["score"] == 3.0 and call["latency_ms"] > 0


def test_rubrics_for_maps_v1_names_and_aliases_to_prompt_files():
    plan = RewardPlan.build(
        {"method": "datatask", "ground_truth": "1", "function": ["llm_as_judgement_accuracy"]}
    )
    assert rubrics_for(plan.needs_judge) == ("judge_accuracy",)
    assert rubrics_for(["judge_analysis", "llm_as_judgement_analyze", "qa_accuracy"]) == ("judge_analysis",)


def test_envs_scoring_from_a_thread_pool_share_one_concurrency_cap(server: FakeJudgeServer, make_client):
    """SkyRL steps envs from a thread pool; their judge calls meet on one loop and one cap."""
    server.script(Reply(text="SCORE: 4", delay_s=0.1))
    client = make_client(concurrency=4)
    spec = {"method": "qa", "ground_truth": "42", "function": ["judge_analysis"]}
    plan = RewardPlan.build(spec)

    def score(i: int):
        ctx = context(JudgeSession(client), spec)
        ctx.messages[-1] = {"role": "assistant", "content": f"{POLICY}\nepisode {i}"}  # distinct prompts
        return plan.score(ctx)

    with ThreadPoolExecutor(12) as pool:
        outcomes = list(pool.map(score, range(12)))
    assert [o.status for o in outcomes] == ["scored"] * 12
    assert server.calls == 12 and server.max_in_flight == 4
