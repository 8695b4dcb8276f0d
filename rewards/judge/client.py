"""The per-process judge client: cache, retries, concurrency cap, one background event loop.

Every call runs on the process's background loop (:mod:`rewards.aio`) whichever thread or loop
asked for it, so one ``AsyncOpenAI`` connection pool and one ``asyncio.Semaphore`` serve all
envs in the process (SkyRL steps envs from a thread pool). Cache hits are answered before the
semaphore, without a call. Retries belong to one policy (tenacity: exponential backoff with
jitter, honouring ``Retry-After``) on timeouts, connection errors, 429 and 5xx, and — without a
wait — on replies that hold no verdict: cut by the token limit, or refused by the caller's
``check`` (the session's parser). Only a reply that passed is cached, so a replay or a rescore
never reads back a reply that was refused; a cut reply is never cached, checked or not.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from rewards.aio import background_loop, run_sync
from rewards.judge.backends import Backend, Generation, describe_openai_error, make_backend
from rewards.judge.cache import JudgeCache, cache_key
from rewards.judge.errors import JudgeCallError, JudgeError, JudgeParseError, JudgeReplyCut, redact
from rewards.judge.parse import FromPolicy
from rewards.judge.settings import JudgeIdentity, JudgeSettings

if TYPE_CHECKING:
    from deepanalyze_env.core.config import JudgeConfig

log = logging.getLogger(__name__)

Verdict = float | dict[str, float]  # a rubric's score, or its dimensions' scores
# A reply's verdict (FromPolicy: conflicting verdicts over one the policy wrote), or
# JudgeParseError when it holds none.
Check = Callable[[str], Verdict | FromPolicy]


@dataclass(frozen=True)
class Completion:
    """One judge reply with how it was obtained (cache hit, latency, attempts, cache key): recorded in
    the episode's judge session."""

    text: str
    cached: bool
    latency_ms: float
    attempts: int  # 0 for a cache hit
    key: str  # cache key (sha256 hex)
    verdict: Verdict | FromPolicy | None = None  # what ``check`` returned (None without a check)
    cut: bool = False  # stopped at the token limit (only without a check: with one, a cut is refused)
    rejected: list[str] = field(default_factory=list)  # why each earlier reply of this call was refused


def _retry_after_s(exc: BaseException | None) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    try:
        return max(0.0, float(headers.get("retry-after")))
    except (TypeError, ValueError):
        return None


class JudgeClient:
    """Shared by all episodes of a process that use the same :class:`JudgeSettings`."""

    def __init__(self, settings: JudgeSettings, backend: Backend | None = None):
        self.settings = settings
        self.backend = backend or make_backend(settings)
        self.cache = (
            JudgeCache(settings.cache_path, journal=settings.cache_journal) if settings.cache_path else None
        )
        self._pid = os.getpid()
        self._home_loop: asyncio.AbstractEventLoop | None = None  # the background loop, once seen
        self._used = False  # a call was made (so there may be connections to close)
        _live.add(self)
        self._semaphore: asyncio.Semaphore | None = None
        self._semaphore_loop: asyncio.AbstractEventLoop | None = None
        # "Full jitter": uniform in [0, min(max, initial * 2**attempt)], so clients that failed
        # together (a 429 storm) do not retry together.
        self._exp_wait = wait_random_exponential(
            multiplier=settings.backoff_initial_s, max=settings.backoff_max_s
        )

    # ------------------------------------------------------------------ public

    async def complete(self, prompt: str, *, sample: int = 0, check: Check | None = None) -> Completion:
        """The judge's reply to ``prompt`` (from the cache when recorded), from any event loop.

        ``check(text)`` returns the verdict or raises :class:`JudgeParseError`; a refused or cut
        reply is asked again within ``max_retries``, and the last refusal is raised after them.
        """
        if asyncio.get_running_loop() is self._home_loop:  # the usual case: already on the loop
            return await self._complete(prompt, sample, check)
        loop = background_loop()
        if asyncio.get_running_loop() is loop:
            self._home_loop = loop
            return await self._complete(prompt, sample, check)
        future = asyncio.run_coroutine_threadsafe(self._complete(prompt, sample, check), loop)
        return await asyncio.wrap_future(future)

    def complete_sync(self, prompt: str, *, sample: int = 0, check: Check | None = None) -> Completion:
        """Blocking form for code outside any event loop (CLI tools, tests)."""
        return run_sync(self._complete(prompt, sample, check))

    def describe(self) -> JudgeIdentity:
        return self.settings.describe()

    # ------------------------------------------------------------------ internals

    def _get_semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._semaphore_loop is not loop:
            self._semaphore = asyncio.Semaphore(self.settings.concurrency)
            self._semaphore_loop = loop
        return self._semaphore

    def _retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, JudgeParseError) or self.backend.is_retryable(exc)

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, JudgeParseError):  # the judge answered badly: no reason to back off
            return 0.0
        delay = self._exp_wait(state)
        hinted = _retry_after_s(exc)
        if hinted is not None:
            delay = max(delay, min(hinted, self.settings.backoff_max_s))
        return delay

    def _cause(self, exc: BaseException) -> str:
        secrets = self.backend.secrets()
        if self.settings.backend == "openai":
            described = describe_openai_error(exc, self.settings, secrets)
            if described:
                return described
        if isinstance(exc, TimeoutError):
            return f"timed out after {self.settings.timeout_s:g} s"
        return redact(f"{type(exc).__name__}: {exc}"[:300], secrets)

    def _before_sleep(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning(
            "%s: %s; retry %d/%d in %.2f s",
            self.settings.label,
            self._cause(exc) if exc else "failed",
            state.attempt_number,
            self.settings.max_retries,
            state.next_action.sleep if state.next_action else 0.0,
        )

    def _accept(
        self, generation: Generation, check: Check | None, attempts: int
    ) -> Verdict | FromPolicy | None:
        """The verdict of a fresh reply, or :class:`JudgeParseError` (retried) when it holds none."""
        if check is None:
            return None
        if generation.cut:
            raise JudgeReplyCut(
                f"the reply was cut by the token limit (finish_reason: length, max_tokens "
                f"{self.settings.max_tokens}): not a finished verdict",
                generation.text,
                attempts=attempts,
            )
        try:
            return check(generation.text)
        except JudgeParseError as exc:
            exc.attempts = attempts
            raise

    async def _complete(self, prompt: str, sample: int, check: Check | None = None) -> Completion:
        s = self.settings
        self._used = True
        key = cache_key(s.model, prompt, s.temperature, s.max_tokens, sample)
        start = time.perf_counter()
        if self.cache is not None:
            try:
                hit = self.cache.get(key)
            except Exception as exc:
                raise JudgeError(f"{s.label}: judge cache {s.cache_path} unreadable: {exc}") from None
            if hit is not None:
                verdict = None
                if check is not None:
                    try:
                        verdict = check(hit)
                    except JudgeParseError as exc:  # a reply recorded before it was checked
                        exc.attempts, exc.latency_ms = 0, (time.perf_counter() - start) * 1000.0
                        raise
                return Completion(hit, True, (time.perf_counter() - start) * 1000.0, 0, key, verdict)
        semaphore = self._get_semaphore()
        attempts = 0
        rejected: list[str] = []
        retrying = AsyncRetrying(
            stop=stop_after_attempt(s.max_retries + 1),
            wait=self._wait,
            retry=retry_if_exception(self._retryable),
            before_sleep=self._before_sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    async with semaphore:
                        generation = await self.backend.generate(prompt, sample)
                    try:
                        verdict = self._accept(generation, check, attempts)
                    except JudgeParseError as exc:
                        rejected.append(str(exc))
                        raise
        except JudgeParseError as exc:
            exc.args = (f"{exc} (after {attempts} attempt{'s' if attempts != 1 else ''})",)
            exc.rejected = rejected[:-1]  # the replies refused before the last one
            exc.latency_ms = (time.perf_counter() - start) * 1000.0
            raise
        except JudgeError:
            raise
        except Exception as exc:
            refused = self.backend.context_refusal(exc)
            if refused is not None:  # the session refits the prompt or decides whose failure it is
                raise refused from None
            # ``from None``: the chained original may quote a server body that echoes the key.
            raise JudgeCallError(
                f"{s.label}: {self._cause(exc)} (after {attempts} attempt{'s' if attempts != 1 else ''})",
                attempts=attempts,
                retryable=self.backend.is_retryable(exc),
            ) from None
        latency_ms = (time.perf_counter() - start) * 1000.0
        if self.cache is not None and not generation.cut:
            try:  # batched: committed by the writer thread
                self.cache.put(key, s.model, sample, generation.text)
            except Exception as exc:  # the score is still good; only the record is lost
                log.warning("%s: could not write the judge cache %s: %s", s.label, s.cache_path, exc)
        return Completion(
            generation.text, False, latency_ms, attempts, key, verdict, generation.cut, rejected
        )

    async def aclose(self) -> None:
        """Close connections and the cache handle (runs on the background loop from any caller)."""
        loop = background_loop()
        if asyncio.get_running_loop() is not loop:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.aclose(), loop))
            return
        await self.backend.aclose()
        if self.cache is not None:
            self.cache.close()

    def close(self) -> None:
        """Blocking :meth:`aclose` for code outside the background loop (teardown, atexit)."""
        run_sync(self.aclose(), timeout=10)


_live: weakref.WeakSet[JudgeClient] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Close this process's clients while the loop still runs, so no transport warns at exit."""
    for client in list(_live):
        if client._pid != os.getpid():
            continue
        if not client._used:  # nothing was opened on the loop; do not start one just to close
            if client.cache is not None:
                client.cache.close()
            continue
        try:
            client.close()
        except Exception as exc:
            log.debug("closing judge client at exit failed: %s", exc)


_clients: dict[tuple[int, JudgeSettings], JudgeClient] = {}
_clients_lock = threading.Lock()


def get_judge_client(config: JudgeConfig | JudgeSettings | Mapping[str, object]) -> JudgeClient:
    """The process's shared client for this judge config (``JudgeConfig``, mapping or settings).

    Validates the config (raising :class:`JudgeConfigError` naming the setting), so calling
    it at env construction makes a bad judge config fail before the first rollout.
    """
    settings = config if isinstance(config, JudgeSettings) else JudgeSettings.from_config(config)
    if settings.tokenizer:  # a tokenizer that cannot load fails here, not at the first score
        from rewards.judge.budget import counter_for

        counter_for(settings)
    key = (os.getpid(), settings)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = JudgeClient(settings)
        return client
