"""The TRL rollout's token layout, masks, truncation and rewards.

Generation is replaced by scripted token sequences here (a stand-in for the policy, so each
test knows exactly what was "generated"); the env, its kernels and the tokenizer are real.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from deepanalyze_env.trainers.trl.rollout_func import DeepAnalyzeRollout, environment_reward, trl_prompt
from deepanalyze_env.trainers.trl.turns import Generated
from tests.conftest import qa_extras

CODE_TURN = "<Analyze>look</Analyze>\n<Code>\n```python\nprint(6 * 7)\n```\n</Code>"
ANSWER_TURN = "<Analyze>done</Analyze>\n<Answer>\nAnswer: B\n</Answer>"


def row(task_id: str, truth: str = "B") -> dict:
    extras = qa_extras(reward_spec={"method": "qa_plain", "ground_truth": truth})
    return {"prompt": [{"role": "user", "content": "Which store?"}], "task_id": task_id, **extras}


def fake_trainer(tok, max_completion_length: int = 4096) -> SimpleNamespace:
    return SimpleNamespace(
        processing_class=tok,
        args=SimpleNamespace(max_completion_length=max_completion_length),
        eos_token_ids=[tok.eos_token_id],
    )


def scripted(tok, plan: list[str], extra_after_stop: str = ""):
    """Every episode emits ``plan[k]`` as its k-th turn (k = observations already in its context)."""

    def generate(trainer, contexts, max_new):
        outs = []
        for ctx, cap in zip(contexts, max_new, strict=True):
            turn = tok.decode(ctx).count("</Execute>")
            ids = tok.encode(plan[min(turn, len(plan) - 1)] + extra_after_stop, add_special_tokens=False)[
                :cap
            ]
            outs.append(Generated(ids, [-0.5] * len(ids)))
        return outs

    return generate


def run(tok, rows, plan, env_config, extra_after_stop="", **kw):
    rollout = DeepAnalyzeRollout(rows, env_config, generator=scripted(tok, plan, extra_after_stop), **kw)
    budget = kw.get("max_completion_length") or 4096
    return rollout, rollout([trl_prompt(r) for r in rows], fake_trainer(tok, budget))


@pytest.fixture
def env_config(workspace_root):
    return {"workspace_root": str(workspace_root), "executor": {"timeout_s": 5}}


def test_observation_tokens_are_masked_and_policy_tokens_are_not(tiny_tokenizer, env_config):
    tok = tiny_tokenizer
    _, out = run(tok, [row("t1")], [CODE_TURN, ANSWER_TURN], env_config)
    ids, mask = out["completion_ids"][0], out["env_mask"][0]
    code_ids = tok.encode(CODE_TURN, add_special_tokens=False)
    assert ids[: len(code_ids)] == code_ids and set(mask[: len(code_ids)]) == {1}
    observed = [t for t, m in zip(ids, mask, strict=True) if m == 0]
    assert tok.decode(observed[:-1]) == "\n<Execute>\n42\n\n</Execute>\n"
    assert observed[-1] == tok.eos_token_id  # a finished episode ends with EOS, unmasked from loss
    answer_ids = tok.encode(ANSWER_TURN, add_special_tokens=False)
    assert ids[-1 - len(answer_ids) : -1] == answer_ids
    assert out["env_reward"] == [1.0] and out["reward_status"] == ["scored"]


def test_tokens_after_the_closing_code_tag_are_dropped(tiny_tokenizer, env_config):
    tok = tiny_tokenizer
    _, out = run(
        tok,
        [row("t1")],
        [CODE_TURN, ANSWER_TURN],
        env_config,
        extra_after_stop=" and then <Answer>Answer: Z</Answer>",
    )
    text = tok.decode(out["completion_ids"][0])
    assert "Answer: Z" not in text
    assert text.count("</Code>") == 1 and "42" in text
    assert len(out["logprobs"][0]) == len(out["completion_ids"][0])


def test_completion_budget_ends_the_episode_as_length_and_masks_it(tiny_tokenizer, env_config):
    tok = tiny_tokenizer
    budget = len(tok.encode(CODE_TURN, add_special_tokens=False)) + 3
    _, out = run(tok, [row("t1")], [CODE_TURN, ANSWER_TURN], env_config, max_completion_length=budget)
    assert len(out["completion_ids"][0]) <= budget
    assert out["termination"] == ["length"]
    assert out["env_reward"] == [None]  # masked from training by default
    assert out["completion_ids"][0][-1] != tok.eos_token_id  # TRL sees it as truncated


def test_truncated_episode_can_be_scored_as_a_failed_gate(tiny_tokenizer, env_config):
    tok = tiny_tokenizer
    budget = len(tok.encode(CODE_TURN, add_special_tokens=False)) + 3
    _, out = run(
        tok,
        [row("t1")],
        [CODE_TURN, ANSWER_TURN],
        env_config,
        max_completion_length=budget,
        score_truncated=True,
    )
    assert out["termination"] == ["length"] and out["env_reward"] == [-1.0]


def test_identical_prompts_with_different_reward_specs_are_not_confused(tiny_tokenizer, env_config):
    tok = tiny_tokenizer
    rows = [row("says-b", truth="B"), row("says-a", truth="A")]
    assert rows[0]["prompt"] == rows[1]["prompt"]
    _, out = run(tok, rows, [ANSWER_TURN], env_config)
    assert out["env_reward"] == [1.0, 0.0]


def test_unscored_episode_gives_none(tiny_tokenizer, env_config, monkeypatch):
    tok = tiny_tokenizer
    from tools.kernel import Kernel, KernelError

    def broken(self, code):
        raise KernelError("scratch disk full (injected)")

    monkeypatch.setattr(Kernel, "run", broken)
    _, out = run(tok, [row("t1")], [CODE_TURN, ANSWER_TURN], env_config)
    assert out["reward_status"] == ["environment_error"] and out["env_reward"] == [None]


def test_reward_function_returns_env_rewards_and_logs_components():
    logged: dict[str, float] = {}
    rewards = environment_reward(
        completions=["a", "b", "c"],
        env_reward=[1.0, None, -1.0],
        reward_components=[{"qa_accuracy": 1.0}, {}, {"format_gate": -1.0}],
        reward_status=["scored", "verifier_error", "scored"],
        termination=["answer", "answer", "max_turns"],
        log_metric=lambda name, value: logged.__setitem__(name, value),
    )
    assert rewards == [1.0, None, -1.0]
    assert logged["reward_components/qa_accuracy"] == 1.0
    assert logged["reward_status/verifier_error"] == 1.0 and logged["termination/max_turns"] == 1.0


def test_prompt_without_task_id_is_a_clear_error(tiny_tokenizer, env_config):
    rollout = DeepAnalyzeRollout([row("t1")], env_config, generator=lambda *a: [])
    with pytest.raises(ValueError, match="task_id"):
        rollout([[{"role": "user", "content": "x"}]], fake_trainer(tiny_tokenizer))
