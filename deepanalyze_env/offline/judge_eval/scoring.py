"""Scoring fixture candidates through the registered judge reward functions, with repeats
as separate judge samples (own cache entries), on the shared judge client."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from deepanalyze_env.offline.judge_eval.fixtures import Candidate, FixtureCase, judge_function
from rewards import RewardContext
from rewards.aio import background_loop
from rewards.judge import JudgeClient, JudgeError, JudgeParseError, JudgeSession
from rewards.judge.session import JudgeCall
from rewards.judge.transcript import Transcript, messages_from_rendered

log = logging.getLogger(__name__)

_PROTOCOL_TAG = re.compile(r"</?(?:Analyze|Understand|Code|Execute|Answer)>")
_EXECUTE_BLOCK = re.compile(r"(\n?<Execute>.*?</Execute>\n?)", re.DOTALL)

# ---------------------------------------------------------------------------------- scoring


SampleStatus = Literal["scored", "parse_error", "call_error", "error"]


@dataclass
class Sample:
    """One repeat of one candidate: the verdict, or why there is none."""

    case_id: str
    candidate: int
    repeat: int
    status: SampleStatus
    score: float | None = None  # in [0, 1]; the mean over dimensions for a multi-dimension judge
    dimensions: dict[str, float] | None = None
    error: str | None = None
    calls: list[JudgeCall] = field(default_factory=list)


class RepeatSession(JudgeSession):
    """A session whose judge calls carry the repeat index as their sample index.

    The built-in judge functions always ask for sample 0; offsetting it makes repeat *k* a
    separate draw (and a separate cache entry) while repeat 0 is exactly what training asks.
    """

    def __init__(self, client: JudgeClient, *, score_rule: str, repeat: int):
        super().__init__(client, score_rule=score_rule)
        self.repeat = repeat

    async def evaluate(
        self,
        rubric: str,
        fields: dict[str, str | Transcript],
        *,
        sample: int = 0,
        policy_fields: tuple[str, ...] = (),
    ) -> float | dict[str, float]:
        return await super().evaluate(
            rubric, fields, sample=sample + self.repeat, policy_fields=policy_fields
        )


def looks_like_trajectory(text: str) -> bool:
    return _PROTOCOL_TAG.search(text) is not None


def candidate_context(case: FixtureCase, candidate: Candidate, session: JudgeSession) -> RewardContext:
    """The reward context the env would build for this candidate at the end of an episode, by
    the env's own constructor (:meth:`rewards.RewardContext.for_episode`).

    A candidate written in the tag protocol is a whole trajectory: its ``<Execute>`` blocks are
    the observations and the text between them the policy's turns, so the answer is read from the
    policy's text exactly as the env reads it and an answer-only judge sees what it sees in
    training; a trajectory without an ``<Answer>`` has none, which the built-in answer judges
    score 0.0 without a call, as in training. Plain text (no protocol tags) is an answer given
    outside the tags, read as the tools format reads a submitted answer.
    """
    text = candidate.text
    messages: list[dict[str, str]] = [{"role": "user", "content": case.question}]
    if looks_like_trajectory(text):
        # The fixture's text is ours (observations rendered by the env's own executor), so its
        # <Execute> blocks are split back into observation messages: what an analysis judge is shown.
        messages += messages_from_rendered(text)
        submitted = None
    else:
        messages.append({"role": "assistant", "content": text})
        submitted = text
    spec = {"method": case.method, "ground_truth": case.ground_truth, "function": [case.judge]}
    return RewardContext.for_episode(
        messages=messages,
        episode_start=1,
        policy_turns=[m["content"] for m in messages[1:] if m["role"] == "assistant"],
        reward_spec=spec,
        question=case.question,
        judge=session,
        submitted=submitted,
    )


async def score_sample(
    case: FixtureCase, index: int, repeat: int, client: JudgeClient, score_rule: str
) -> Sample:
    """Score one candidate once through the registered judge function; never raises."""
    sample = Sample(case.id, index, repeat, "error")
    session = RepeatSession(client, score_rule=score_rule, repeat=repeat)
    try:
        fn = judge_function(case.judge)
        kwargs = candidate_context(case, case.candidates[index], session).kwargs_for(fn)
        if fn.is_async:
            value = await fn.fn(**kwargs)
        else:  # a sync judge function must not block the loop that serves its judge calls
            value = await asyncio.to_thread(fn.fn, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        sample.score, sample.dimensions = _normalise(value)
        sample.status = "scored"
    except JudgeParseError as exc:
        sample.status, sample.error = "parse_error", str(exc)
    except JudgeError as exc:
        sample.status, sample.error = "call_error", f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        sample.status, sample.error = "error", f"{type(exc).__name__}: {exc}"
    sample.calls = [call.copy() for call in session.calls]
    if sample.error:
        log.info("%s candidate %d repeat %d: %s", case.id, index, repeat, sample.error)
    return sample


def _normalise(value: Any) -> tuple[float, dict[str, float] | None]:  # a judge function's output
    if isinstance(value, dict):
        if not value:
            raise ValueError("the judge function returned an empty dict")
        dims = {str(k): float(v) for k, v in value.items()}
        return sum(dims.values()) / len(dims), dims
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"the judge function returned {value!r}, not a number or a dict of numbers")
    if not math.isfinite(float(value)):
        raise ValueError(f"the judge function returned {value!r}")
    return float(value), None


def run_samples(
    cases: Sequence[FixtureCase],
    client: JudgeClient,
    *,
    repeats: int,
    score_rule: str,
    on_done: Callable[[Sample], None] | None = None,
) -> list[Sample]:
    """Every (case, candidate, repeat) scored concurrently on the background loop.

    At most ``concurrency`` samples run at once. The client would cap the calls anyway, but
    its latency clock starts before its own queue; submitting everything at once would make
    the reported latency the time spent waiting behind other samples rather than the judge's
    answer time. ``on_done`` runs in the calling thread as each sample finishes (progress).
    """
    loop = background_loop()
    gate = asyncio.Semaphore(client.settings.concurrency)

    async def bounded(case: FixtureCase, index: int, repeat: int) -> Sample:
        async with gate:
            return await score_sample(case, index, repeat, client, score_rule)

    futures = [
        asyncio.run_coroutine_threadsafe(bounded(case, index, repeat), loop)
        for case in cases
        for index in range(len(case.candidates))
        for repeat in range(repeats)
    ]
    try:
        for future in concurrent.futures.as_completed(futures):
            if on_done is not None:
                on_done(future.result())
    except BaseException:
        for future in futures:
            future.cancel()
        raise
    return [future.result() for future in futures]
