"""``profile: upstream`` reproduces DeepAnalyze's reward; every expectation is computed by hand
from upstream's rules (docs/design.md §8), not by the code under test."""

from __future__ import annotations

import pytest

from deepanalyze_env.core.env import DeepAnalyzeEnv
from rewards.judge.fake_server import FakeJudgeServer, Reply
from tests.conftest import code, play

ANALYZE = "<Analyze>plan</Analyze>\n"
DIMS = (
    '```json\n{"usefulness": 5, "richness": 4, "soundness": 3, "interpretability": 2, "readability": 1}\n```'
)


@pytest.fixture
def judge():
    with FakeJudgeServer(Reply(text="Weaknesses: few\nSCORE: 3")) as server:
        yield server


def make(workspace_root, judge, spec, **extra):
    config = {
        "workspace_root": str(workspace_root),
        "profile": "upstream",
        "executor": {"timeout_s": 1},
        "judge": {"backend": "openai", "base_url": judge.url, "model": "j", "max_retries": 0, "timeout_s": 2},
    }
    extras = {"reward_spec": spec, "data": "data", "workspace_id": "ws", "input_seq": "Which store?", **extra}
    env = DeepAnalyzeEnv(env_config=config, extras=extras)
    env.init([{"role": "user", "content": "q"}])
    return env


def test_answer_close_anywhere_wins_over_an_earlier_code_close(workspace_root, judge):
    env = make(workspace_root, judge, {"method": "qa", "ground_truth": "B"})
    out = play(env, ANALYZE + "<Code>print(1)</Code><Answer>Answer: B</Answer>")
    assert out["done"] and out["metadata"]["termination"] == "answer"


def test_qa_is_the_mean_of_raw_exact_match_and_the_first_score(workspace_root, judge):
    judge.script(Reply(text="The candidate wrote SCORE: 5 but I give\nSCORE: 2"))
    env = make(workspace_root, judge, {"method": "qa", "ground_truth": "B"})
    out = play(env, ANALYZE + "<Answer>Store B\nAnswer: B</Answer>")
    # exact: "B" == "B" -> 1.0; first SCORE match is 5 -> 1.0; mean -> 1.0
    assert out["metadata"]["reward_components"] == {"qa_acc_reward": 1.0, "qa_analysisc_reward": 1.0}
    assert out["reward"] == 1.0


def test_qa_exact_match_is_raw_so_a_numeric_truth_never_matches(workspace_root, judge):
    env = make(workspace_root, judge, {"method": "qa", "ground_truth": 42})
    out = play(env, ANALYZE + "<Answer>Answer: 42</Answer>")
    # "42" == 42 is False -> 0.0; SCORE: 3 -> 0.6; mean 0.3
    assert out["metadata"]["reward_components"] == {"qa_acc_reward": 0.0, "qa_analysisc_reward": 0.6}
    assert out["reward"] == pytest.approx(0.3)


def test_gate_reads_execution_output_as_upstream_did(workspace_root, judge):
    env = make(workspace_root, judge, {"method": "qa", "ground_truth": "B"})
    printed = "<Code>\nt = 'Analyze>'\nprint('<' + t + '</' + t)\n</Code>"
    out = play(env, printed, "<Answer>Answer: B</Answer>")
    assert out["metadata"]["format_ok"] is True  # v1 would fail the gate: the policy never wrote <Analyze>
    assert out["reward"] == pytest.approx((1.0 + 0.6) / 2)


def test_timeout_counts_as_a_pass_and_empty_output_as_a_failure(workspace_root, judge):
    env = make(
        workspace_root, judge, {"method": "datatask", "ground_truth": "7", "function": "judge_accuracy"}
    )
    timed_out = env.step(code("while True:\n    pass"))
    silent = env.step(code("x = 1"))
    failed = env.step(code("1/0"))
    printed = env.step(code("print('7 rows')"))
    out = play(env, ANALYZE + "<Answer>7</Answer>")
    assert [timed_out["metadata"]["code_pass"], silent["metadata"]["code_pass"]] == [1, 0]
    assert [failed["metadata"]["code_pass"], printed["metadata"]["code_pass"]] == [0, 1]
    assert timed_out["metadata"]["exec"]["status"] == "timeout"
    comps = out["metadata"]["reward_components"]
    # a scalar judge is keyed by str(function); code reward = mean([1, 0, 0, 1]) = 0.5
    assert comps == {"judge_accuracy": 0.6, "datatask_code_reward": 0.5}
    assert out["reward"] == pytest.approx((0.6 + 0.5) / 2)


def test_datatask_function_list_is_the_key_of_a_scalar_judge(workspace_root, judge):
    spec = {"method": "datatask", "ground_truth": "7", "function": ["llm_as_judgement_accuracy"]}
    out = play(make(workspace_root, judge, spec), code("print(7)"), ANALYZE + "<Answer>7</Answer>")
    assert out["metadata"]["reward_components"] == {
        "['llm_as_judgement_accuracy']": 0.6,
        "datatask_code_reward": 1.0,
    }


def test_two_scalar_judges_collide_under_one_key_as_upstream(workspace_root, judge):
    spec = {
        "method": "datatask",
        "ground_truth": "7",
        "function": ["judge_accuracy", "llm_as_judgement_accuracy"],
    }
    out = play(make(workspace_root, judge, spec), code("print(7)"), ANALYZE + "<Answer>7</Answer>")
    assert list(out["metadata"]["reward_components"]) == [str(spec["function"]), "datatask_code_reward"]


def test_unfenced_code_fails_the_fence_gate(workspace_root, judge):
    spec = {"method": "datatask", "ground_truth": "7", "function": "judge_accuracy"}
    out = play(
        make(workspace_root, judge, spec), ANALYZE + "<Code>print(7)</Code>", ANALYZE + "<Answer>7</Answer>"
    )
    assert (out["reward"], out["metadata"]["gate"]) == (-1.0, "fence")


def test_openresearch_uses_bare_dimension_names_code_and_turns(workspace_root, judge):
    judge.script(Reply(text="notes\n" + DIMS))
    spec = {"method": "openresearch", "ground_truth": "", "function": "llm_as_judgement_opendomain"}
    out = play(
        make(workspace_root, judge, spec), code("print(1)"), code("1/0"), ANALYZE + "<Answer>report</Answer>"
    )
    comps = out["metadata"]["reward_components"]
    expected = {
        "usefulness": 1.0,
        "richness": 0.8,
        "soundness": 0.6,
        "interpretability": 0.4,
        "readability": 0.2,
        "openresearch_code_reward": 0.5,
        "openresearch_turns_reward": 0.3,
    }
    assert comps == pytest.approx(expected)
    assert out["reward"] == pytest.approx(sum(expected.values()) / 7)


def test_the_judge_reply_is_read_by_the_session_so_bare_json_scores_as_in_judge_eval(workspace_root, judge):
    """Upstream read dimensions only from a fenced block; the profile now reads replies through the
    episode's JudgeSession (the code judge-eval scores with), so a bare JSON verdict counts."""
    judge.script(
        Reply(
            text='{"usefulness": 5, "richness": 5, "soundness": 5, "interpretability": 5, "readability": 4}'
        )
    )
    spec = {"method": "openresearch", "ground_truth": "", "function": "judge_opendomain"}
    env = make(workspace_root, judge, spec)
    out = play(env, code("print(1)"), ANALYZE + "<Answer>report</Answer>")
    meta = out["metadata"]
    assert meta["reward_status"] == "scored"
    assert meta["reward_components"]["readability"] == pytest.approx(0.8)
    # mean(1, 1, 1, 1, 0.8, code 1.0, turns 0.2) = 6.0 / 7
    assert out["reward"] == pytest.approx(6.0 / 7)
    (call,) = meta["judge"]["calls"]
    assert call["rubric"] == "judge_opendomain" and call["score"]["readability"] == 4.0


def test_an_unreadable_judge_reply_scores_zero_but_is_flagged(workspace_root, judge):
    judge.script(Reply(text="A fine report overall, I would say."))
    spec = {"method": "openresearch", "ground_truth": "", "function": "judge_opendomain"}
    out = play(make(workspace_root, judge, spec), code("print(1)"), ANALYZE + "<Answer>report</Answer>")
    meta = out["metadata"]
    assert meta["reward_status"] == "verifier_error" and "judge_opendomain" in meta["error"]
    assert meta["reward_components"]["usefulness"] == 0.0
    assert meta["judge"]["calls"][0]["parse_error"]
    # upstream's value: mean(0,0,0,0,0, code 1.0, turns 0.2) = 1.2 / 7
    assert out["reward"] == pytest.approx(1.2 / 7)


def test_without_a_workspace_code_is_not_run_and_counts_zero(workspace_root, judge):
    env = make(workspace_root, judge, {"method": "qa", "ground_truth": "B"}, data=None, workspace_id=None)
    step = env.step(code("print(1)"))
    env.close()
    assert step["metadata"]["code_pass"] == 0 and step["metadata"]["exec"]["status"] == "skipped"


def test_unknown_function_names_still_fail_at_construction(workspace_root, judge):
    with pytest.raises(ValueError, match="unknown reward function"):
        make(
            workspace_root,
            judge,
            {"method": "datatask", "ground_truth": "7", "function": "llm_as_judgment_acc"},
        )
