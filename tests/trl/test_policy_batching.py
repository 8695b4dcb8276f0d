"""The local eval/rollout policy batches concurrent episodes' turns into one generation round.

Real SmolLM2 (greedy), real threads. The oracle for each turn is the same policy with
``max_batch=1`` (one turn per round, the behaviour before batching)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from deepanalyze_env.offline.policies import PolicyError, TransformersPolicy, TurnContext

QUESTIONS = [
    "What is the mean of column age in data.csv?",
    "Count the rows of wine.csv where alcohol > 12.",
    "Which column of fair.csv has the most missing values?",
]


def _ctx(i: int) -> TurnContext:
    messages = [
        {"role": "system", "content": "You analyse data. Write <Analyze>, then <Code>."},
        {"role": "user", "content": QUESTIONS[i]},
    ]
    return TurnContext(f"ep{i}", f"t{i}", None, 0, messages, 2)


class CountingGenerate:
    """Wraps the real engine's ``generate`` to record each round's batch size."""

    def __init__(self, engine):
        self.inner = engine.generate
        self.sizes: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, model, requests):
        with self.lock:
            self.sizes.append(len(requests))
        return self.inner(model, requests)


@pytest.fixture(scope="module")
def policy(smollm2_dir):
    return TransformersPolicy(model=smollm2_dir, max_tokens=24, device="cpu", max_batch=3, batch_wait_s=5.0)


def test_concurrent_turns_share_one_generate_and_match_unbatched_turns(policy, smollm2_dir):
    spy = CountingGenerate(policy._engine)
    policy._engine.generate = spy
    try:
        with ThreadPoolExecutor(3) as pool:
            batched = list(pool.map(policy.act, [_ctx(i) for i in range(3)]))
    finally:
        del policy._engine.generate
    assert spy.sizes == [3]
    policy.max_batch = 1
    try:
        alone = [policy.act(_ctx(i)) for i in range(3)]
    finally:
        policy.max_batch = 3
    assert [t.text for t in batched] == [t.text for t in alone]
    assert [t.usage for t in batched] == [t.usage for t in alone]
    assert all(t.text for t in batched)


def test_a_lone_turn_goes_after_the_wait_window_without_a_full_batch(policy):
    policy.batch_wait_s = 0.2
    try:
        turn = policy.act(_ctx(0))
    finally:
        policy.batch_wait_s = 5.0
    assert turn.usage["prompt_tokens"] == len(policy._prompt_ids(_ctx(0)))
    assert 0 < turn.usage["completion_tokens"] <= 24


def test_a_failed_generate_reaches_every_episode_in_the_batch(policy):
    def broken(model, requests):
        raise RuntimeError("out of memory")

    policy._engine.generate = broken
    try:
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(policy.act, _ctx(i)) for i in range(3)]
            errors = [f.exception(timeout=60) for f in futures]
    finally:
        del policy._engine.generate
    assert all(isinstance(e, PolicyError) and "out of memory" in str(e) for e in errors)
    assert policy.act(_ctx(1)).text  # the policy still works afterwards


def test_max_batch_below_one_is_refused(smollm2_dir):
    from deepanalyze_env.core.config import ConfigError

    with pytest.raises(ConfigError, match="max_batch"):
        TransformersPolicy(model=smollm2_dir, max_batch=0)


TOOL_CALL = '<tool_call>\n{"name": "run_python", "arguments": {"code": "print(1)"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("action_format", "text", "ended", "expected"),
    [
        ("tags", "<Analyze>a</Analyze>\n<Code>\nprint(1)\n</Code>", True, "stop"),  # at its stop tag
        ("tags", "<Analyze>I think it is B.</Analyze>", True, "eos"),  # the message ended
        ("tags", "<Analyze>I think it is", False, "length"),  # max_tokens came first
        ("tools", TOOL_CALL, True, "stop"),  # a closed call, then the end-of-message token
        ("tools", "I think it is B.", True, "eos"),  # a message without a call
        ("tools", TOOL_CALL[:30], False, "length"),  # cut inside the call
    ],
)
def test_a_local_turn_reports_how_it_ended_as_the_trl_rollout_reads_it(
    policy, action_format, text, ended, expected
):
    """The sampled ids as the engine hands them back (the EOS kept; a row padded to the batch's
    longest), read into the turn's end the driver plays."""
    from deepanalyze_env.offline.policies import _Request

    tok = policy._tok
    eos = policy._engine.eos_ids[0]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    row = tok.encode(text, add_special_tokens=False) + ([eos, pad, pad] if ended else [])
    request = _Request([1, 2, 3], seed=0)
    saved = policy.action_format
    policy.action_format = action_format
    try:
        policy._finish(request, row, pad)
    finally:
        policy.action_format = saved
    assert request.result is not None and request.result.end == expected
    assert request.result.finish_reason == ("length" if expected == "length" else "stop")
