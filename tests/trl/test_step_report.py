"""The per-step GRPO report (``metrics.jsonl`` and the console table): where the step's time went
and whether it could teach — trained episodes, length cuts, zero-variance groups, a non-zero loss.

The real rollout runs real env episodes; the policy's turns are scripted per episode so the
expected counts are known by construction: task a answers right twice (one group, zero variance),
task b right once and wrong once (a group with variance), task c runs out of its token budget
(length-cut, untrained, a group of one that is not counted).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("trl")

from deepanalyze_env.trainers.trl.rollout_func import DeepAnalyzeRollout, environment_reward, trl_prompt
from deepanalyze_env.trainers.trl.train import _make_callback, step_line
from deepanalyze_env.trainers.trl.turns import Generated
from rewards import register_reward
from tests.conftest import qa_extras


def _run_rollout(tok, workspace_root):
    rows = [
        {"prompt": [{"role": "user", "content": "Which store?"}], "task_id": t, **qa_extras()} for t in "abc"
    ]
    right = tok.encode("<Analyze>a</Analyze><Answer>Answer: B</Answer>", add_special_tokens=False)
    wrong = tok.encode("<Analyze>a</Analyze><Answer>Answer: C</Answer>", add_special_tokens=False)
    rambling = tok.encode("x " * 200, add_special_tokens=False)  # no tag, past the 64-token budget
    script = [right, right, right, wrong, rambling]  # the prompts' order: a, a, b, b, c

    def generator(trainer, contexts, caps):
        assert len(contexts) == 5  # every episode answers (or is cut) in its first turn
        return [Generated(ids, None) for ids in script]

    rollout = DeepAnalyzeRollout(rows, {"workspace_root": str(workspace_root)}, generator=generator)
    fake = SimpleNamespace(
        processing_class=tok, args=SimpleNamespace(max_completion_length=64), eos_token_ids=[tok.eos_token_id]
    )
    prompts = [trl_prompt(rows[i]) for i in (0, 0, 1, 1, 2)]
    out = rollout(prompts, fake)
    assert out["env_reward"][4] is None and out["termination"][4] == "length"  # the premise
    return rollout


def test_a_step_line_counts_what_decides_whether_the_step_can_teach(
    smollm2_tokenizer, workspace_root, tmp_path
):
    rollout = _run_rollout(smollm2_tokenizer, workspace_root)
    reporter = _make_callback(rollout, tmp_path)
    reporter.on_step_begin(None, SimpleNamespace(global_step=0), None)
    reporter.on_step_end(None, SimpleNamespace(global_step=1), None)
    reporter.on_log(None, SimpleNamespace(global_step=1), None, logs={"loss": 0.25, "grad_norm": 1.5})
    line = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert line["teach"] == {
        "episodes_trained": 4,
        "length_cut": 1,
        "groups": 2,
        "zero_variance_groups": 1,
        "loss_nonzero": True,
    }
    assert line["episodes"] == 5


def test_a_step_line_says_where_the_time_went(smollm2_tokenizer, workspace_root):
    rollout = _run_rollout(smollm2_tokenizer, workspace_root)
    stats = rollout.drain()
    # a step that took 2 s more than its rollout spent the rest on the policy update
    line = step_line(1, stats, {"loss": 0.0}, step_seconds=stats.seconds + 2.0, elapsed=9.0)
    time_ = line["time"]
    assert set(time_) == {"step_s", "rollout_s", "generate_s", "env_s", "scoring_s", "update_s"}
    assert time_["update_s"] == pytest.approx(2.0, abs=2e-3)
    assert time_["env_s"] > 0  # five episodes were stepped in their envs
    assert time_["generate_s"] + time_["env_s"] <= time_["rollout_s"] + 1e-3  # parts of the rollout
    assert line["teach"]["loss_nonzero"] is False  # a zero loss is reported as such


def test_a_step_without_a_logged_loss_reports_it_as_unknown(smollm2_tokenizer, workspace_root, tmp_path):
    rollout = _run_rollout(smollm2_tokenizer, workspace_root)
    reporter = _make_callback(rollout, tmp_path)
    reporter.on_log(None, SimpleNamespace(global_step=1), None, logs={"reward": -0.5})
    line = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert line["teach"]["loss_nonzero"] is None and line["time"]["step_s"] == 0.0


class _JudgeDown(RuntimeError):
    """Stands in for the judge's call failure: only its ``verifier_cause`` matters here."""

    verifier_cause = "judge_call"


@register_reward("test_step_report_judge_down")
def _judge_down(answer: str | None) -> float:
    raise _JudgeDown("connection refused")


def _rollout_with_an_outage(tok, workspace_root):
    """Task x's plan calls a judge that is down; task y's is scored: 2 of 4 episodes excluded."""
    down = {"method": "qa_plain", "ground_truth": "B", "function": ["test_step_report_judge_down"]}
    rows = [
        {
            "prompt": [{"role": "user", "content": "Which store?"}],
            "task_id": "x",
            **qa_extras(reward_spec=down),
        },
        {"prompt": [{"role": "user", "content": "Which store?"}], "task_id": "y", **qa_extras()},
    ]
    right = tok.encode("<Analyze>a</Analyze><Answer>Answer: B</Answer>", add_special_tokens=False)

    def generator(trainer, contexts, caps):
        return [Generated(right, None) for _ in contexts]

    rollout = DeepAnalyzeRollout(rows, {"workspace_root": str(workspace_root)}, generator=generator)
    fake = SimpleNamespace(
        processing_class=tok, args=SimpleNamespace(max_completion_length=64), eos_token_ids=[tok.eos_token_id]
    )
    out = rollout([trl_prompt(rows[i]) for i in (0, 0, 1, 1)], fake)
    return rollout, out


def test_a_step_line_gives_the_verifier_error_rate_by_cause(smollm2_tokenizer, workspace_root, tmp_path):
    rollout, out = _rollout_with_an_outage(smollm2_tokenizer, workspace_root)
    assert out["reward_error_cause"] == ["judge_call", "judge_call", None, None]  # the premise
    reporter = _make_callback(rollout, tmp_path)
    reporter.on_log(None, SimpleNamespace(global_step=1), None, logs={"loss": 0.1})
    line = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert line["verifier_error_rates"] == {
        "judge_parse": 0.0,
        "context_length": 0.0,
        "judge_call": 0.5,
        "reward_raised": 0.0,
    }


def test_a_step_without_exclusions_still_gives_every_cause_as_zero(smollm2_tokenizer, workspace_root):
    stats = _run_rollout(smollm2_tokenizer, workspace_root).drain()
    line = step_line(1, stats, {"loss": 0.0}, step_seconds=1.0, elapsed=1.0)
    assert line["verifier_error_rates"] == dict.fromkeys(
        ("judge_parse", "context_length", "judge_call", "reward_raised"), 0.0
    )


def test_trls_logs_give_the_verifier_error_rate_by_cause(smollm2_tokenizer, workspace_root):
    _, out = _rollout_with_an_outage(smollm2_tokenizer, workspace_root)
    logged: dict[str, float] = {}
    environment_reward(completions=[""] * 4, log_metric=logged.__setitem__, **out)
    assert {k: v for k, v in logged.items() if k.startswith("verifier_error/")} == {
        "verifier_error/judge_parse": 0.0,
        "verifier_error/context_length": 0.0,
        "verifier_error/judge_call": 0.5,
        "verifier_error/reward_raised": 0.0,
    }
