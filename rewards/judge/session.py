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
from rewards.judge.budget import Fitted, TokenCounter, counter_for, fit, prompt_budget, prompt_tokens
from rewards.judge.cache import cache_key
from rewards.judge.client import Completion, JudgeClient, Verdict
from rewards.judge.errors import (
    JudgeContentRefused,
    JudgeContextRefused,
    JudgeError,
    JudgeParseError,
    JudgePromptTooLong,
    JudgeVerdictFromPolicy,
)
from rewards.judge.parse import FromPolicy, parse_dimensions, parse_score
from rewards.judge.prompts import get_rubric, render
from rewards.judge.transcript import Transcript, sendable_field

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
    prompt_tokens: int | None  # what the prompt sent costs (judge.max_prompt_tokens counts it)
    elided_chars: int  # characters cut from the middles of environment outputs to fit


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

    def _check(self, rubric: str, policy_text: str) -> Callable[[str], Verdict | FromPolicy]:
        spec = get_rubric(rubric)
        if spec.kind == "dimensions":
            return lambda text: parse_dimensions(text, spec.low, spec.high, policy_text=policy_text)
        return lambda text: parse_score(
            text, spec.low, spec.high, which=self.score_rule, policy_text=policy_text
        )

    async def evaluate(
        self,
        rubric: str,
        fields: dict[str, str | Transcript],
        *,
        sample: int = 0,
        policy_fields: tuple[str, ...] = (),
    ) -> float | dict[str, float]:
        """Score ``fields`` with ``rubric``: a number (``SCORE`` rubrics) or a dimension dict.

        ``policy_fields`` name the fields the episode wrote (its transcript, its answer). The
        prompt is fitted to ``judge.max_prompt_tokens`` (``rewards.judge.budget``: environment
        outputs elided in the middle); a server that still refuses it as too long for its
        context gets it once more, fitted to the context its refusal states. Raises a
        :class:`JudgeError` subclass after recording the call: a call failure, a cache miss, a
        reply without a verdict or cut by the token limit after every retry;
        :class:`JudgePromptTooLong` when the prompt cannot be made to fit, saying whether
        emptying the ``policy_fields`` would have made it fit (``policy_caused``: the episode's
        own text is the cause); :class:`JudgeVerdictFromPolicy` when the reply's verdicts
        conflict over one the episode wrote. The last two are the policy's failures, which the
        judge functions score 0 with the message as a note. ``sample`` numbers repeated draws of
        one prompt (useful at temperature > 0): it separates their cache entries and nothing else.
        """
        settings = self.client.settings
        fields = {name: sendable_field(value) for name, value in fields.items()}
        counter = counter_for(settings)
        budget = prompt_budget(settings, counter)
        fitted = fit(rubric, fields, settings.prompt_dir, counter, budget)
        if not fitted.fits:
            raise self._too_long(rubric, fields, policy_fields, counter, budget, fitted, None)
        record = JudgeCall(
            rubric=rubric,
            prompt_hash=fitted.prompt.prompt_hash,
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
            prompt_tokens=fitted.tokens,
            elided_chars=fitted.elided,
        )
        self.calls.append(record)
        check = self._check(rubric, _policy_text(fields, policy_fields))
        try:
            try:
                completion = await self.client.complete(fitted.prompt.text, sample=sample, check=check)
            except JudgeContentRefused as refused:
                raise await self._whose_content(rubric, fields, policy_fields, sample, refused) from None
            except JudgeContextRefused as refused:
                budget = _refit_budget(refused, fitted, settings.max_tokens)
                record["attempts"] = 1
                fitted = fit(rubric, fields, settings.prompt_dir, counter, budget)
                if not fitted.fits:
                    raise self._too_long(
                        rubric, fields, policy_fields, counter, budget, fitted, str(refused)
                    ) from None
                record.update(prompt_tokens=fitted.tokens, elided_chars=fitted.elided)
                log.info(
                    "%s, rubric %s: refitted to %d tokens after: %s", settings.label, rubric, budget, refused
                )
                try:
                    completion = await self.client.complete(fitted.prompt.text, sample=sample, check=check)
                except JudgeContextRefused as again:
                    raise self._too_long(
                        rubric, fields, policy_fields, counter, budget, fitted, str(again)
                    ) from None
        except JudgeParseError as exc:
            kind = type(exc).__name__
            record.update(reply=exc.raw, attempts=exc.attempts, rejected=list(exc.rejected))
            key = cache_key(
                settings.model, fitted.prompt.text, settings.temperature, settings.max_tokens, sample
            )
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
        self._record(record, completion)
        if isinstance(completion.verdict, FromPolicy):
            error = JudgeVerdictFromPolicy(f"rubric {rubric}: {completion.verdict.reason}")
            record["error"] = f"{type(error).__name__}: {error}"
            raise error
        return completion.verdict

    @staticmethod
    def _record(record: JudgeCall, completion: Completion) -> None:
        record.update(
            key=completion.key,
            reply=completion.text,
            latency_ms=round(completion.latency_ms, 3),
            cached=completion.cached,
            attempts=record["attempts"] + completion.attempts,
            rejected=list(completion.rejected),
            score=None if isinstance(completion.verdict, FromPolicy) else completion.verdict,
        )

    async def _whose_content(
        self,
        rubric: str,
        fields: dict[str, str | Transcript],
        policy_fields: tuple[str, ...],
        sample: int,
        refused: JudgeContentRefused,
    ) -> JudgeContentRefused:
        """Whose content the judge refused: asked once more with the ``policy_fields`` emptied,
        an answer means the episode's own text was refused (``policy_caused``); a refusal or any
        failure of that probe leaves it the task's, or the judge's."""
        if not policy_fields:
            return refused
        settings = self.client.settings
        emptied = render(rubric, {**fields, **dict.fromkeys(policy_fields, "")}, settings.prompt_dir)
        try:
            await self.client.complete(emptied.text, sample=sample)
        except JudgeError as exc:
            log.info("%s, rubric %s: the emptied prompt failed too: %s", settings.label, rubric, exc)
            return refused
        return JudgeContentRefused(
            f"rubric {rubric}: {refused}; with the episode's own text emptied the prompt was "
            "answered, so that text was refused: scored 0",
            policy_caused=True,
        )

    def _too_long(
        self,
        rubric: str,
        fields: dict[str, str | Transcript],
        policy_fields: tuple[str, ...],
        counter: TokenCounter,
        budget: int,
        fitted: Fitted,
        refusal: str | None,
    ) -> JudgePromptTooLong:
        """Whose failure a prompt that cannot fit is: the policy's when it fits with the
        ``policy_fields`` emptied (the episode's own text is the cause), else the task's."""
        settings = self.client.settings
        emptied = render(rubric, {**fields, **dict.fromkeys(policy_fields, "")}, settings.prompt_dir)
        policy_caused = bool(policy_fields) and prompt_tokens(emptied.text, counter) <= budget
        whose = "the episode's own text" if policy_caused else "the task's fields"
        limit = (
            f"judge.max_prompt_tokens {budget:,}" if refusal is None else f"the {budget:,} the judge allows"
        )
        message = (
            f"rubric {rubric}: the judge prompt is {fitted.tokens:,} tokens ({counter.name}) with "
            f"environment outputs elided, over {limit} ({whose} made it so); not sent"
        )
        if refusal is not None:
            message += f" again after: {refusal}"
        return JudgePromptTooLong(message, policy_caused=policy_caused)

    def prompt_hashes(self) -> dict[str, str]:
        return {call["rubric"]: call["prompt_hash"] for call in self.calls}

    def summary(self) -> JudgeSummary:
        """What a record's ``judge`` field holds: who judged, with which prompts, and every call."""
        return {
            **self.client.describe(),
            "prompt_hashes": self.prompt_hashes(),
            "calls": [dict(call) for call in self.calls],
        }


def _policy_text(fields: dict[str, str | Transcript], policy_fields: tuple[str, ...]) -> str:
    """Everything the episode put in front of the judge: the policy-written fields, a transcript's
    every part (its turns and what its cells printed)."""
    texts = []
    for name in policy_fields:
        value = fields.get(name, "")
        if isinstance(value, Transcript):
            texts += [part.text for part in value.parts]
        else:
            texts.append(str(value))
    return "\n".join(texts)


def _refit_budget(refused: JudgeContextRefused, fitted: Fitted, max_tokens: int) -> int:
    """A budget, in this session's counting, for a prompt the server refused as too long: the
    context it states less the reply's ``max_tokens``, scaled by how many of its tokens one of
    ours turned out to be (2 % slack), and below what was sent; a quarter less than what was sent
    when it states no context."""
    sent = max(fitted.tokens, 1)
    if refused.limit is None:
        return sent * 3 // 4
    ratio = refused.prompt_tokens / sent if refused.prompt_tokens else 1.0
    allowed = int((refused.limit - max_tokens) / max(ratio, 1e-9) * 0.98)
    return max(1, min(allowed, sent - 1))
