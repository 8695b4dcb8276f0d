"""The rollout on TRL's vLLM generation path (server and colocate modes).

vLLM itself needs a GPU, so it is a scripted stand-in (``tests/trl/vllm_stub.py``); TRL's
``VLLMGeneration.generate`` (the public backend the rollout calls) runs as written, the env, its
kernels and the tokenizer are real.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")

from accelerate import Accelerator

from deepanalyze_env.trainers.trl.rollout_func import DeepAnalyzeRollout, trl_prompt
from tests.conftest import qa_extras
from tests.trl.vllm_stub import (
    ScriptedEngine,
    ScriptedServer,
    StubColocateGeneration,
    StubServerGeneration,
    record_sampling_params,
    stub_trainer,
)

CODE_TURN = "<Analyze>look</Analyze>\n<Code>\n```python\nprint(6 * 7)\n```\n</Code>"
ANSWER_TURN = "<Analyze>done</Analyze>\n<Answer>\nAnswer: B\n</Answer>"
BUDGET = 4096


def row() -> dict:
    return {"prompt": [{"role": "user", "content": "Which store?"}], "task_id": "t1", **qa_extras()}


@pytest.fixture
def env_config(workspace_root):
    return {"workspace_root": str(workspace_root), "executor": {"timeout_s": 10}}


def make_generation(mode: str, tok, reply, monkeypatch):
    kwargs = {
        "model": None,
        "accelerator": Accelerator(cpu=True),
        "processing_class": tok,
        "max_completion_length": BUDGET,
    }
    if mode == "server":
        backend = ScriptedServer(reply)
        return backend, StubServerGeneration(backend, **kwargs)
    record_sampling_params(monkeypatch)
    backend = ScriptedEngine(reply)
    return backend, StubColocateGeneration(backend, **kwargs)


def code_then_answer(tok, none_at: int | None = None):
    """First turn: code; then the answer. ``none_at``: that token of the first turn has logprob None."""

    def reply(prompt):
        turn = ANSWER_TURN if "</Execute>" in tok.decode(prompt) else CODE_TURN
        ids = tok.encode(turn, add_special_tokens=False)
        lps = [-0.5] * len(ids)
        if none_at is not None and turn == CODE_TURN:
            lps[none_at] = None
        return ids, lps

    return reply


@pytest.mark.parametrize("mode", ["server", "colocate"])
def test_per_turn_cap_is_the_requests_max_tokens(tiny_tokenizer, env_config, monkeypatch, mode):
    tok = tiny_tokenizer
    cap = 60
    backend, generation = make_generation(mode, tok, code_then_answer(tok), monkeypatch)
    rollout = DeepAnalyzeRollout([row()], env_config, max_turn_tokens=cap)
    out = rollout([trl_prompt(row())], stub_trainer(tok, generation.accelerator, generation, BUDGET))
    assert out["env_reward"] == [1.0]
    assert [r["max_tokens"] for r in backend.requests] == [cap, cap]  # not the episode budget
    assert generation.max_completion_length == BUDGET  # restored for TRL's own use


@pytest.mark.parametrize("mode", ["server", "colocate"])
def test_a_none_logprob_from_vllm_becomes_nan(tiny_tokenizer, env_config, monkeypatch, mode):
    tok = tiny_tokenizer
    _, generation = make_generation(mode, tok, code_then_answer(tok, none_at=3), monkeypatch)
    rollout = DeepAnalyzeRollout([row()], env_config, max_turn_tokens=200)
    out = rollout([trl_prompt(row())], stub_trainer(tok, generation.accelerator, generation, BUDGET))
    logprobs = out["logprobs"][0]
    assert len(logprobs) == len(out["completion_ids"][0])
    assert math.isnan(logprobs[3])
    assert logprobs[:3] == [-0.5, -0.5, -0.5] and logprobs[4] == -0.5
    assert out["env_reward"] == [1.0]
