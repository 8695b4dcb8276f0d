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
from dataclasses import dataclass
from typing import TypedDict

from deepanalyze_env.core.contracts import JudgeSummary
from rewards.judge.budget import Fitted, TokenCounter, counter_for, fit, prompt_budget
from rewards.judge.cache import cache_key
from rewards.judge.client import Completion, JudgeClient, Verdict
from rewards.judge.errors import (
    JudgeContentRefused,
    JudgeContextRefused,
    JudgeError,
    JudgeParseError,
    JudgePromptTooLong,
    JudgeReplyCut,
    JudgeVerdictFromPolicy,
)
from rewards.judge.parse import FromPolicy, cut_quoting_policy, parse_dimensions, parse_score
from rewards.judge.prompts import RenderedPrompt, get_rubric
from rewards.judge.transcript import Transcript, sendable_field

log = logging.getLogger(__name__)

_REFITS = 3  # context refusals refitted before the prompt is called unfittable


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
        context gets it again, fitted to the context its refusal states (:meth:`_send`). Raises a
        :class:`JudgeError` subclass after recording the call: a call failure, a cache miss, a
        reply without a verdict or cut by the token limit after every retry;
        :class:`JudgePromptTooLong` when the prompt cannot be made to fit, saying whether
        emptying the episode's own text would have made it fit (``policy_caused``);
        :class:`JudgeContentRefused` when the judge refuses the prompt's content — on any call,
        the first or a refitted one — ``policy_caused`` when the prompt without the episode's
        own text is answered; :class:`JudgeVerdictFromPolicy` when the reply's verdict is one the
        episode wrote (conflicting over it, or parroting an invalid one), or the reply was cut
        while quoting the episode's verdicts. The ``policy_caused`` ones are the policy's
        failures, which the judge functions score 0 with the message as a note. ``sample``
        numbers repeated draws of one prompt (useful at temperature > 0): it separates their
        cache entries and nothing else.
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
        sent = _Sent(fitted, budget)
        try:
            try:
                completion = await self._send(rubric, fields, policy_fields, sample, counter, sent)
            except JudgeContentRefused as refused:
                raise await self._whose_content(
                    rubric, fields, policy_fields, sample, counter, sent.budget, refused
                ) from None
            except JudgeReplyCut as cut:
                quoted = cut_quoting_policy(cut.raw, _policy_text(fields, policy_fields, sent.fitted))
                if quoted is None:
                    raise
                self._record_reply(record, sent, cut)
                raise JudgeVerdictFromPolicy(f"rubric {rubric}: {quoted.reason}") from None
        except JudgeParseError as exc:
            kind = type(exc).__name__
            self._record_reply(record, sent, exc)
            record["error"] = f"{kind}: {exc}"
            log.warning("%s, rubric %s: no verdict: %s", settings.label, rubric, exc)
            error = type(exc)(f"{settings.label}, rubric {rubric}: unparsable reply: {exc}", exc.raw)
            error.attempts, error.rejected, error.latency_ms = exc.attempts, exc.rejected, exc.latency_ms
            raise error from None
        except JudgeError as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"
            if record["reply"] is None:  # no reply recorded: the calls the failure took
                record["attempts"] = sent.refused + getattr(exc, "attempts", 0)
            raise
        finally:
            record.update(prompt_tokens=sent.fitted.tokens, elided_chars=sent.fitted.elided)
        self._record(record, completion, sent.refused)
        if isinstance(completion.verdict, FromPolicy):
            error = JudgeVerdictFromPolicy(f"rubric {rubric}: {completion.verdict.reason}")
            record["error"] = f"{type(error).__name__}: {error}"
            raise error
        return completion.verdict

    async def _send(
        self,
        rubric: str,
        fields: dict[str, str | Transcript],
        policy_fields: tuple[str, ...],
        sample: int,
        counter: TokenCounter,
        sent: _Sent,
        *,
        check: bool = True,
    ) -> Completion:
        """Ask the judge ``sent.fitted``; a refusal for the judge's context refits the prompt to the
        context it states and asks again, up to :data:`_REFITS` times (the server's count of the
        refitted prompt corrects the scale each time), then raises :class:`JudgePromptTooLong`
        by the emptying rule against the last budget. ``sent`` keeps what was asked last and how
        many calls were refused, so a failure is recorded against the prompt that caused it.
        Every other failure propagates: the caller has one handler for each, whichever call
        raised it. ``check`` False: the reply is not parsed (the content probe)."""
        settings = self.client.settings
        while True:
            parse = self._check(rubric, _policy_text(fields, policy_fields, sent.fitted)) if check else None
            try:
                return await self.client.complete(sent.fitted.prompt.text, sample=sample, check=parse)
            except JudgeContextRefused as refused:
                sent.refused += 1
                budget = _refit_budget(refused, sent.fitted, settings.max_tokens)
                refitted = fit(rubric, fields, settings.prompt_dir, counter, budget)
                if sent.refused > _REFITS or not refitted.fits:
                    shown = refitted if not refitted.fits else sent.fitted
                    raise self._too_long(
                        rubric, fields, policy_fields, counter, budget, shown, str(refused)
                    ) from None
                log.info(
                    "%s, rubric %s: refitted to %d tokens after: %s", settings.label, rubric, budget, refused
                )
                sent.fitted, sent.budget = refitted, budget

    @staticmethod
    def _record(record: JudgeCall, completion: Completion, refused: int) -> None:
        """A reply that was read: ``refused`` calls before it were refused as too long."""
        record.update(
            key=completion.key,
            reply=completion.text,
            latency_ms=round(completion.latency_ms, 3),
            cached=completion.cached,
            attempts=refused + completion.attempts,
            rejected=list(completion.rejected),
            score=None if isinstance(completion.verdict, FromPolicy) else completion.verdict,
        )

    def _record_reply(self, record: JudgeCall, sent: _Sent, exc: JudgeParseError) -> None:
        """A reply that held no verdict (or was cut): the reply, why, the call's attempts and the
        cache key of the prompt it answered."""
        s = self.client.settings
        record.update(
            reply=exc.raw,
            attempts=sent.refused + exc.attempts,
            rejected=list(exc.rejected),
            key=cache_key(s.model, sent.fitted.prompt.text, s.temperature, s.max_tokens, record["sample"]),
            cached=exc.attempts == 0,
            parse_error=str(exc),
        )
        if exc.latency_ms is not None:
            record["latency_ms"] = round(exc.latency_ms, 3)

    async def _whose_content(
        self,
        rubric: str,
        fields: dict[str, str | Transcript],
        policy_fields: tuple[str, ...],
        sample: int,
        counter: TokenCounter,
        budget: int,
        refused: JudgeContentRefused,
    ) -> JudgeContentRefused:
        """Whose content the judge refused: asked once more with the episode's own text emptied
        (:func:`_emptied`: a recovery row's recorded prefix stays, it is the task's), fitted to
        ``budget`` and refitted as any call is, an answer means the episode's own text was
        refused (``policy_caused``); a refusal, a prompt that cannot fit, or any failure of that
        probe leaves it the task's, or the judge's."""
        if not policy_fields:
            return refused
        settings = self.client.settings
        emptied = _emptied(fields, policy_fields)
        probe = fit(rubric, emptied, settings.prompt_dir, counter, budget)
        if not probe.fits:
            return refused
        try:
            await self._send(rubric, emptied, (), sample, counter, _Sent(probe, budget), check=False)
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
        """Whose failure a prompt that cannot fit is: the policy's when it fits with the episode's
        own text emptied (:func:`_emptied`; the episode's text is the cause), else the task's."""
        settings = self.client.settings
        policy_caused = (
            bool(policy_fields)
            and fit(rubric, _emptied(fields, policy_fields), settings.prompt_dir, counter, budget).fits
        )
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


def _policy_text(
    fields: dict[str, str | Transcript], policy_fields: tuple[str, ...], fitted: Fitted | None = None
) -> str:
    """Everything the episode put in front of the judge, as it wrote it and, given the prompt
    sent (``fitted``), as that prompt showed it (marker runs broken up, observation tags escaped:
    a judge quotes what it was shown): the policy-written fields, a transcript's every part (its
    turns and what its cells printed)."""
    texts = []
    for name in policy_fields:
        value = fields.get(name, "")
        if isinstance(value, Transcript):
            texts += [part.text for part in value.parts]
        else:
            texts.append(str(value))
        if fitted is not None:
            texts.append(_section(fitted.prompt, name))
    return "\n".join(texts)


def _section(prompt: RenderedPrompt, name: str) -> str:
    """The body of field ``name``'s section in a rendered prompt ("" when it has none)."""
    label = name.upper()
    begin = f"<<<BEGIN {label} {prompt.nonce}>>>\n"
    start = prompt.text.find(begin)
    end = prompt.text.find(f"\n<<<END {label} {prompt.nonce}>>>", start + 1)
    return prompt.text[start + len(begin) : end] if start >= 0 and end >= 0 else ""


def _emptied(
    fields: dict[str, str | Transcript], policy_fields: tuple[str, ...]
) -> dict[str, str | Transcript]:
    """``fields`` with the episode's own text removed: a policy-written text field emptied, a
    transcript cut to its recorded prefix (a recovery row's turns and their outputs, which the
    task supplied). What is left is what the task alone puts in the prompt."""
    emptied = dict(fields)
    for name in policy_fields:
        value = fields.get(name, "")
        emptied[name] = value.recorded_prefix() if isinstance(value, Transcript) else ""
    return emptied


@dataclass
class _Sent:
    """The prompt last asked of the judge (``fitted``, within ``budget``) and how many calls the
    judge refused as too long for its context."""

    fitted: Fitted
    budget: int
    refused: int = 0


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
