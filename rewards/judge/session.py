"""``JudgeSession``: the judge as one episode sees it, recording every call it makes.

The env creates one per episode and passes it to reward functions as the ``judge`` context
field. It renders the rubric prompt, asks the shared :class:`JudgeClient` with the rubric's
parser as the reply check (so a reply without a verdict, or cut by the token limit, is asked
again and never cached) and appends a JSON-serialisable record to :attr:`calls` — raw reply,
parsed verdict or the reason there is none, the reasons earlier replies were refused
(``rejected``), latency, cache flag — so records show exactly which prompt version and which
reply produced a reward, and a failed episode shows why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypedDict

from deepanalyze_env.core.contracts import JudgeSummary
from rewards.judge.cache import cache_key
from rewards.judge.client import JudgeClient, Verdict
from rewards.judge.errors import JudgeError, JudgeParseError, JudgePromptTooLong
from rewards.judge.parse import parse_dimensions, parse_score
from rewards.judge.prompts import get_rubric, render
from rewards.judge.transcript import Transcript

log = logging.getLogger(__name__)


class JudgeCall(TypedDict):
    """One judge call as the session records it (``JudgeSummary.calls``)."""

    rubric: str
    prompt_hash: str
    backend: str
    model: str
    sample: int
    key: str | None  # cache key; None when the call failed before one was made
    reply: str | None  # the raw reply (the last one, when none held a verdict)
    score: Verdict | None  # the parsed verdict
    parse_error: str | None
    latency_ms: float | None
    cached: bool
    attempts: int
    rejected: list[str]  # why each earlier reply of the call was refused
    error: str | None


class JudgeSession:
    """Episode-scoped view of a shared client. ``score_rule``: ``"last"`` (v1) | ``"first"`` (upstream)."""

    def __init__(self, client: JudgeClient, *, score_rule: str = "last"):
        if score_rule not in ("last", "first"):
            raise ValueError(f"score_rule must be 'last' or 'first', got {score_rule!r}")
        self.client = client
        self.score_rule = score_rule
        self.calls: list[JudgeCall] = []

    @property
    def model(self) -> str:
        return self.client.settings.model

    def _check(self, rubric: str) -> Callable[[str], Verdict]:
        spec = get_rubric(rubric)
        if spec.kind == "dimensions":
            return lambda text: parse_dimensions(text, spec.low, spec.high)
        return lambda text: parse_score(text, spec.low, spec.high, which=self.score_rule)

    async def evaluate(
        self,
        rubric: str,
        fields: dict[str, str | Transcript],
        *,
        sample: int = 0,
        policy_fields: tuple[str, ...] = (),
    ) -> float | dict[str, float]:
        """Score ``fields`` with ``rubric``: a number (``SCORE`` rubrics) or a dimension dict.

        Raises a :class:`JudgeError` subclass (call failure, cache miss, a reply without a verdict
        or cut by the token limit after every retry; :class:`JudgePromptTooLong` before any call
        when the rendered prompt passes ``max_prompt_chars``, saying whether emptying the
        ``policy_fields`` would have made it fit) after recording the call; the message names
        the judge, rubric and cause. ``sample`` numbers repeated draws of one prompt (useful at
        temperature > 0): it separates their cache entries and nothing else.
        """
        settings = self.client.settings
        prompt = render(rubric, fields, settings.prompt_dir)
        limit = settings.max_prompt_chars
        if len(prompt.text) > limit:
            emptied = render(rubric, {**fields, **dict.fromkeys(policy_fields, "")}, settings.prompt_dir)
            policy_caused = len(emptied.text) <= limit
            whose = "the episode's own text" if policy_caused else "the task's fields"
            raise JudgePromptTooLong(
                f"rubric {rubric}: the judge prompt is {len(prompt.text):,} characters, over "
                f"judge.max_prompt_chars {limit:,} ({whose} made it so); not sent",
                policy_caused=policy_caused,
            )
        record = JudgeCall(
            rubric=rubric,
            prompt_hash=prompt.prompt_hash,
            backend=settings.backend,
            model=settings.model,
            sample=sample,
            key=None,
            reply=None,
            score=None,
            parse_error=None,
            latency_ms=None,
            cached=False,
            attempts=0,
            rejected=[],
            error=None,
        )
        self.calls.append(record)
        try:
            completion = await self.client.complete(prompt.text, sample=sample, check=self._check(rubric))
        except JudgeParseError as exc:
            kind = type(exc).__name__
            record.update(reply=exc.raw, attempts=exc.attempts, rejected=list(exc.rejected))
            key = cache_key(settings.model, prompt.text, settings.temperature, settings.max_tokens, sample)
            record.update(key=key, cached=exc.attempts == 0)
            if exc.latency_ms is not None:
                record["latency_ms"] = round(exc.latency_ms, 3)
            record["parse_error"] = str(exc)
            record["error"] = f"{kind}: {exc}"
            log.warning("%s, rubric %s: no verdict: %s", settings.label, rubric, exc)
            error = type(exc)(f"{settings.label}, rubric {rubric}: unparsable reply: {exc}", exc.raw)
            error.attempts, error.rejected, error.latency_ms = exc.attempts, exc.rejected, exc.latency_ms
            raise error from None
        except JudgeError as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"
            attempts = getattr(exc, "attempts", None)
            if attempts is not None:
                record["attempts"] = attempts
            raise
        record.update(
            key=completion.key,
            reply=completion.text,
            latency_ms=round(completion.latency_ms, 3),
            cached=completion.cached,
            attempts=completion.attempts,
            rejected=list(completion.rejected),
            score=completion.verdict,
        )
        return completion.verdict

    def prompt_hashes(self) -> dict[str, str]:
        return {call["rubric"]: call["prompt_hash"] for call in self.calls}

    def summary(self) -> JudgeSummary:
        """What a record's ``judge`` field holds: who judged, with which prompts, and every call."""
        return {
            **self.client.describe(),
            "prompt_hashes": self.prompt_hashes(),
            "calls": [dict(call) for call in self.calls],
        }
