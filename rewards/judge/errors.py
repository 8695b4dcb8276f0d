"""Judge failures as exception types, so a score that could not be produced is never a silent 0.

Each message names the judge (backend and model) and the cause, because the reward plan turns
an exception into the episode's ``error`` text (``"{function}: {ExcType}: {message}"``) and
that line is all an operator sees in the metadata. Messages never contain the API key:
everything built from a server's reply goes through :func:`redact` first.
"""

from __future__ import annotations

import os
import re

from deepanalyze_env.core.errors import ConfigError

# Bearer tokens and OpenAI-style keys that a server may echo back in an error body.
_TOKEN_PATTERNS = (
    re.compile(r"(?i)bearer\s+\S+"),
    re.compile(r"\bsk-[A-Za-z0-9_\-*.]{6,}"),
)


class JudgeError(RuntimeError):
    """Base class: the judge could not produce a score for this episode.

    ``verifier_cause`` names the ``verifier_error`` cause the reward plan counts it under
    (``judge_call``, ``judge_parse``, ``context_length``; docs/design.md §6, "Why a reward was
    not computed"). ``policy_caused``: the episode's own text or output made the verdict
    unusable, so the component scores 0 with the message as its note instead
    (``rewards.judges``) — never ``verifier_error``, which training masks.
    """

    verifier_cause = "judge_call"
    policy_caused = False


class JudgeConfigError(ConfigError):
    """``env_config.judge`` is unusable (missing model, unknown backend, missing prompt file…)."""


class JudgeCallError(JudgeError):
    """The judge was unreachable or failed after every retry (timeout, HTTP status, connection)."""

    def __init__(self, message: str, *, attempts: int = 1, retryable: bool = False):
        super().__init__(message)
        self.attempts = attempts
        self.retryable = retryable


class JudgeCacheMiss(JudgeError):
    """The ``replay`` backend found no recorded reply for a prompt."""


class JudgeParseError(JudgeError):
    """The judge replied, but the reply holds no valid verdict. ``raw`` keeps the whole reply;
    ``attempts`` counts the calls made for it (0: the reply came from the cache)."""

    verifier_cause = "judge_parse"

    def __init__(self, message: str, raw: str, *, attempts: int = 1):
        super().__init__(message)
        self.raw = raw
        self.attempts = attempts
        self.rejected: list[str] = []  # why each earlier reply of the same call was refused
        self.latency_ms: float | None = None  # the whole call, retries included


class JudgeReplyCut(JudgeParseError):
    """The reply stopped at the token limit (``finish_reason: length``, or a local model reaching
    ``max_new_tokens`` without its end token): whatever it holds is not a finished verdict. The
    session reads it once more: cut while quoting the policy's verdicts, it is the policy's
    (:class:`JudgeVerdictFromPolicy`); otherwise the judge's (``judge_parse``)."""


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """Remove ``secrets`` and anything that looks like a bearer token or API key from ``text``."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
    for pattern in _TOKEN_PATTERNS:
        text = pattern.sub("[redacted]", text)
    return text


def key_from_env(var: str | None) -> str | None:
    """The API key named by ``api_key_env``; read at call sites, never stored in settings."""
    if not var:
        return None
    value = os.environ.get(var)
    return value or None


class JudgeContextRefused(JudgeCallError):
    """The server refused the prompt as longer than the model's context (HTTP 400 "maximum context
    length …"). ``limit`` and ``prompt_tokens`` are the server's own figures when its message
    states them (vLLM and OpenAI do), else None. Not retried as is: the session fits the prompt
    to the stated limit and asks once more, then decides whose failure it is."""

    verifier_cause = "context_length"

    def __init__(self, message: str, *, limit: int | None = None, prompt_tokens: int | None = None):
        super().__init__(message, attempts=1, retryable=False)
        self.limit = limit
        self.prompt_tokens = prompt_tokens


class JudgeContentRefused(JudgeCallError):
    """The server refused to judge the prompt's content (HTTP 400 ``invalid_prompt`` /
    ``content_policy_violation``, Azure's ``content_filter``, or a reply stopped with
    ``finish_reason: content_filter``). The session asks once more with the policy-written fields
    emptied: when that is answered, the episode's own text was refused and ``policy_caused`` is
    set (the component scores 0); otherwise it is the task's (``verifier_error``, ``judge_call``)."""

    def __init__(self, message: str, *, policy_caused: bool = False):
        super().__init__(message, attempts=1, retryable=False)
        self.policy_caused = policy_caused


class JudgePromptTooLong(JudgeError):
    """The judge prompt does not fit the judge (``judge.max_prompt_tokens``, or the context a server
    refused it for), even with long environment outputs elided. ``policy_caused``: it fits once
    the policy-written fields are emptied, so the episode's own text is the cause (the component
    scores 0 with a note); otherwise the task's own fields are too long for the judge (a verifier
    problem, cause ``context_length``)."""

    verifier_cause = "context_length"

    def __init__(self, message: str, *, policy_caused: bool):
        super().__init__(message)
        self.policy_caused = policy_caused


class JudgeVerdictFromPolicy(JudgeError):
    """The reply's verdict is one the policy wrote: its verdicts conflict over one (a judge quoting
    the candidate's ``SCORE: 5``), it ends with or parrots one that is no valid verdict (``SCORE:
    9``), or it was cut by the token limit while quoting the policy's verdicts. The component
    scores 0 with this note (``rewards.judge.parse``)."""

    policy_caused = True
