"""A recovery row through the TRL rollout: the prefix is the prompt, only the new turns are trained.

Generation is scripted (a stand-in for the policy); the env, its kernels and the tokenizer are real.
"""

from __future__ import annotations

from deepanalyze_env.trainers.trl.rollout_func import DeepAnalyzeRollout, trl_prompt
from deepanalyze_env.trainers.trl.turns import Generated
from tests.test_recover import ANSWER, BEST, PREFIX, PROMPT, SPEC
from tests.trl.test_rollout_masks import fake_trainer


def test_the_prefix_is_rendered_as_prior_conversation_and_not_trained(tiny_tokenizer, workspace_root):
    tok = tiny_tokenizer
    row = {
        "prompt": PROMPT,
        "task_id": "t/recover/e1/turn2",
        "reward_spec": dict(SPEC),
        "data": "data",
        "workspace_id": "ws",
        "input_seq": "Which store?",
        "prefix": PREFIX,
    }
    plan = iter([BEST, ANSWER])

    def generate(trainer, contexts, max_new):
        ids = tok.encode(next(plan), add_special_tokens=False)
        return [Generated(ids, [-0.5] * len(ids))]

    config = {"workspace_root": str(workspace_root), "executor": {"timeout_s": 5}}
    rollout = DeepAnalyzeRollout([row], config, generator=generate)
    out = rollout([trl_prompt(row)], fake_trainer(tok))
    # the tiny chat template, applied by hand: every message, then the generation prompt
    rendered = "".join(f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in [*PROMPT, *PREFIX])
    assert tok.decode(out["prompt_ids"][0]) == rendered + "<|assistant|>\n"
    completion = tok.decode(out["completion_ids"][0])
    assert completion.startswith(BEST) and "boom" not in completion  # the failed cell is not re-emitted
    assert out["env_reward"] == [1.0] and out["reward_status"] == ["scored"]
