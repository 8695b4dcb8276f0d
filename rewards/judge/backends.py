"""Judge backends: an OpenAI-compatible endpoint, a local transformers model, or replay-only.

A backend turns one rendered prompt into one reply text and nothing more — plus whether the
token limit cut it, which only the backend can see: caching, retries, the concurrency cap and
call records live in :mod:`rewards.judge.client`, so every backend gets them the same way.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from deepanalyze_env.core.contracts import JsonValue
from rewards.judge.errors import (
    JudgeCacheMiss,
    JudgeCallError,
    JudgeConfigError,
    JudgeContentRefused,
    JudgeContextRefused,
    key_from_env,
    redact,
)
from rewards.judge.settings import JudgeSettings

if TYPE_CHECKING:
    import httpx
    from openai import AsyncOpenAI
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# Keyless local servers (vLLM, SGLang) still need *some* key for the client to send.
PLACEHOLDER_KEY = "EMPTY"

# How OpenAI-compatible servers say a prompt does not fit the model (HTTP 400): OpenAI and vLLM
# ("This model's maximum context length is 32768 tokens. However, you requested 40000 tokens
# (38976 in the messages, 1024 in the completion)" / "your messages resulted in N tokens" /
# "your request has N input tokens"), OpenAI's code "context_length_exceeded", SGLang and
# vLLM's engine ("… is longer than the model's context length (N tokens)", "… is too long to
# fit into the model (context length N)").
_CONTEXT_REFUSAL = re.compile(
    r"maximum context length|context[ _]length[ _]exceeded|longer than the model'?s context length"
    r"|too long to fit into the model|exceeds the model'?s (?:maximum )?context",
    re.IGNORECASE,
)
_CONTEXT_LIMIT = re.compile(
    r"(?:maximum context length is|context length(?: is)?)\s*\(?\s*(\d[\d,]*)\s*(?:tokens)?", re.IGNORECASE
)
_PROMPT_TOKENS = re.compile(
    r"\((\d[\d,]*) in the messages|messages resulted in (\d[\d,]*) tokens"
    r"|request has (\d[\d,]*) input tokens|\((\d[\d,]*) tokens\) is longer",
    re.IGNORECASE,
)


# How OpenAI-compatible servers refuse a prompt for its content (HTTP 400): OpenAI's codes
# "invalid_prompt" ("your prompt was flagged as potentially violating our usage policy") and
# "content_policy_violation", Azure OpenAI's "content_filter" ("… triggering Azure OpenAI's
# content management policy").
_CONTENT_REFUSAL = re.compile(
    r"\b(?:invalid_prompt|content_policy_violation|content_filter)\b|content management policy"
    r"|flagged as potentially violating",
    re.IGNORECASE,
)


def content_refusal_of(status: int, message: str) -> bool:
    """Whether an HTTP error is the server refusing to judge the prompt's content."""
    return status == 400 and _CONTENT_REFUSAL.search(message) is not None


def _number(text: str | None) -> int | None:
    return int(text.replace(",", "")) if text else None


def context_refusal_of(status: int, message: str) -> tuple[int | None, int | None] | None:
    """``(limit, prompt_tokens)`` as the server stated them (None where it did not) when an HTTP
    error is a context-length refusal, else None."""
    if status not in (400, 413) or not _CONTEXT_REFUSAL.search(message):
        return None
    limit = _CONTEXT_LIMIT.search(message)
    prompt = _PROMPT_TOKENS.search(message)
    given = next((g for g in prompt.groups() if g), None) if prompt else None
    return _number(limit.group(1) if limit else None), _number(given)


@dataclass(frozen=True)
class Generation:
    """One reply and whether generation stopped at the token limit rather than by itself."""

    text: str
    cut: bool = False


class Backend:
    """Interface. ``generate`` may raise anything; ``is_retryable`` decides what is retried."""

    name = "base"

    def __init__(self, settings: JudgeSettings):
        self.settings = settings

    async def generate(self, prompt: str, sample: int) -> Generation:
        raise NotImplementedError

    def is_retryable(self, exc: BaseException) -> bool:
        return False

    def secrets(self) -> tuple[str, ...]:
        """Strings that must be scrubbed from anything this backend's errors produce."""
        return ()

    def context_refusal(self, exc: BaseException) -> JudgeContextRefused | JudgeContentRefused | None:
        """``exc`` as a :class:`JudgeContextRefused` when it is the server refusing the prompt as
        longer than the model's context, as a :class:`JudgeContentRefused` when it refuses its
        content, else None."""
        return None

    async def aclose(self) -> None:
        return None


class OpenAIBackend(Backend):
    """``openai.AsyncOpenAI`` with its own retries off: one retry policy (tenacity) owns backoff."""

    name = "openai"

    def __init__(self, settings: JudgeSettings):
        super().__init__(settings)
        if settings.base_url is None and key_from_env(settings.api_key_env) is None:
            raise JudgeConfigError(
                f"the openai judge has no base_url (so it would call api.openai.com) and the "
                f"environment variable {settings.api_key_env} is not set"
            )
        self._client: AsyncOpenAI | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._request_options: dict[str, object] = {}  # handed to the client's ``post`` as is

    def _get_client(self) -> AsyncOpenAI:
        """Create the client on the loop that uses it; its connection pool belongs to that loop."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            import openai

            self._client = openai.AsyncOpenAI(
                base_url=self.settings.base_url,
                api_key=key_from_env(self.settings.api_key_env) or PLACEHOLDER_KEY,
                max_retries=0,
                timeout=self.settings.timeout_s,
                http_client=self._http_client(openai),
            )
            self._loop = loop
            # Every option given explicitly: the request-options model deep-copies the default of
            # each option left out, and its "not given" sentinels copy slowly (≈ 0.3 ms a call).
            self._request_options = {
                "headers": {},
                "params": {},
                "max_retries": 0,
                "timeout": self._client.timeout,
                "post_parser": openai.NOT_GIVEN,
            }
        return self._client

    def _http_client(self, openai: ModuleType) -> httpx.AsyncClient | None:
        """openai's aiohttp transport when wanted and available; None means its default (httpx)."""
        wanted = self.settings.http_transport
        if wanted == "httpx":
            return None
        factory = getattr(openai, "DefaultAioHttpClient", None)
        if factory is not None:
            try:
                return factory(timeout=self.settings.timeout_s)
            except (ImportError, RuntimeError) as exc:
                if wanted == "aiohttp":
                    raise JudgeConfigError(f"judge http_transport 'aiohttp' is unavailable: {exc}")
        elif wanted == "aiohttp":
            raise JudgeConfigError(
                "judge http_transport 'aiohttp' needs an openai release with DefaultAioHttpClient"
            )
        return None

    async def generate(self, prompt: str, sample: int) -> Generation:
        """One chat completion through the client's generic ``post`` with ``cast_to=object``.

        ``chat.completions.create`` would walk the typed parameters and build pydantic models
        on every call; at judge concurrency on a small machine that client-side CPU (~2 ms a
        call here, serialised on the one event loop) became the bottleneck. ``post`` keeps
        what matters — base URL, auth, timeouts, the connection pool and the typed HTTP errors
        — and hands back the JSON, of which we need one field.
        """
        client = self._get_client()
        body = {
            "model": self.settings.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": self.settings.temperature,
            "max_tokens": self.settings.max_tokens,
        }
        # The client's timeout is per network phase; this bounds the whole call.
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                data = await client.post(
                    "/chat/completions", body=body, cast_to=object, options=self._request_options
                )
        except ValueError as exc:  # a 200 whose body is not JSON
            raise JudgeCallError(
                f"{self.settings.label}: malformed response from the server ({type(exc).__name__}: "
                + redact(str(exc)[:200], self.secrets())
                + ")"
            ) from None
        return self._content(data)

    def _content(self, data: JsonValue) -> Generation:
        try:
            choice = data["choices"][0]
            content = choice["message"]["content"]
        except (KeyError, IndexError, TypeError):
            shape = redact(str(data)[:120], self.secrets())
            raise JudgeCallError(
                f"{self.settings.label}: malformed response (no choices[0].message: {shape!r})"
            )
        if isinstance(choice, dict) and choice.get("finish_reason") == "content_filter":
            raise JudgeContentRefused(
                f"{self.settings.label}: the reply was withheld (finish_reason=content_filter)"
            )
        if not isinstance(content, str) or not content.strip():
            reason = choice.get("finish_reason") if isinstance(choice, dict) else None
            raise JudgeCallError(f"{self.settings.label}: empty reply (finish_reason={reason})")
        return Generation(content, choice.get("finish_reason") == "length")

    def is_retryable(self, exc: BaseException) -> bool:
        import openai

        if isinstance(exc, TimeoutError | openai.APITimeoutError | openai.APIConnectionError):
            return True
        if isinstance(exc, openai.APIStatusError):
            return exc.status_code == 429 or exc.status_code >= 500
        return False

    def secrets(self) -> tuple[str, ...]:
        key = key_from_env(self.settings.api_key_env)
        return (key,) if key else ()

    def context_refusal(self, exc: BaseException) -> JudgeContextRefused | JudgeContentRefused | None:
        import openai

        if not isinstance(exc, openai.APIStatusError):
            return None
        body = exc.body
        inner = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), dict) else body
        parts = [str(exc)]
        if isinstance(inner, dict):
            parts += [str(inner.get("message") or ""), str(inner.get("code") or "")]
        text = " ".join(parts)
        described = describe_openai_error(exc, self.settings, self.secrets()) or f"HTTP {exc.status_code}"
        if content_refusal_of(exc.status_code, text):
            return JudgeContentRefused(
                f"{self.settings.label}: the judge refused the prompt's content ({described})"
            )
        refusal = context_refusal_of(exc.status_code, text)
        if refusal is None:
            return None
        return JudgeContextRefused(
            f"{self.settings.label}: the prompt does not fit the judge's context ({described})",
            limit=refusal[0],
            prompt_tokens=refusal[1],
        )

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def resolve_model_path(model: str) -> tuple[Path, dict[str, str]]:
    """``/dir`` → (dir, {}); ``/dir/file.gguf`` → (dir, {"gguf_file": name}).

    A directory without ``config.json`` holding exactly one ``.gguf`` file is read from that
    file, so pointing at the folder of a downloaded GGUF works too.
    """
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise JudgeConfigError(f"judge model file does not exist: {path}")
        return path.parent, {"gguf_file": path.name}
    if path.is_dir() and not (path / "config.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return path, {"gguf_file": ggufs[0].name}
    return path, {}


class TransformersBackend(Backend):
    """A local causal LM, loaded on first use, generating in a worker thread one call at a time.

    ``generate`` of a torch model holds the GIL only partly and is not safe to run twice at
    once on one model, so calls are serialised by a lock; ``asyncio.to_thread`` keeps the event
    loop (and other envs' judge calls) responsive meanwhile. A call past ``timeout_s`` fails,
    but its thread cannot be interrupted: it finishes in the background while holding the lock.
    """

    name = "transformers"

    def __init__(self, settings: JudgeSettings):
        super().__init__(settings)
        self._lock = threading.Lock()
        self._model: PreTrainedModel | None = None
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._device: str = "cpu"

    def _load(self) -> None:
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise JudgeConfigError(
                f"the transformers judge needs torch and transformers installed ({exc}); "
                "install the 'trl' extra"
            )
        ref = self.settings.model
        if ref.startswith("embedded:"):  # e.g. "embedded:smollm2", converted once to a local folder
            from deepanalyze_env.generation.models import resolve_model

            ref = resolve_model(ref)
        directory, extra = resolve_model_path(ref)
        log.info("loading judge model from %s %s", directory, extra or "")
        self._tokenizer = AutoTokenizer.from_pretrained(directory, **extra)
        model = AutoModelForCausalLM.from_pretrained(directory, **extra)
        self._device = "cuda" if torch.cuda.is_available() else "cpu"
        self._model = model.to(self._device).eval()

    def _end_ids(self) -> set[int]:
        """Token ids that end generation by themselves (the tokenizer's and the model's EOS)."""
        ids: set[int] = set()
        for source in (
            self._tokenizer.eos_token_id,
            getattr(self._model.generation_config, "eos_token_id", None),
        ):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, list | tuple):
                ids.update(i for i in source if isinstance(i, int))
        return ids

    def _generate_sync(self, prompt: str) -> Generation:
        import torch

        with self._lock:
            if self._model is None:
                self._load()
            tok = self._tokenizer
            if getattr(tok, "chat_template", None):
                text = tok.apply_chat_template(
                    [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
                )
                enc = tok(text, return_tensors="pt", add_special_tokens=False)
            else:
                enc = tok(prompt, return_tensors="pt")
            enc = {k: v.to(self._device) for k, v in enc.items()}
            sampling: dict[str, bool | float] = {"do_sample": False}
            if self.settings.temperature > 0:
                sampling = {"do_sample": True, "temperature": self.settings.temperature}
            pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
            with torch.no_grad():
                out = self._model.generate(
                    **enc, max_new_tokens=self.settings.max_tokens, pad_token_id=pad, **sampling
                )
            new = out[0, enc["input_ids"].shape[1] :].tolist()
            # Cut: the whole budget spent and the last token is not an end token.
            cut = len(new) >= self.settings.max_tokens and (not new or new[-1] not in self._end_ids())
            return Generation(tok.decode(new, skip_special_tokens=True), cut)

    async def generate(self, prompt: str, sample: int) -> Generation:
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                reply = await asyncio.to_thread(self._generate_sync, prompt)
        except TimeoutError:
            raise JudgeCallError(f"{self.settings.label}: timed out after {self.settings.timeout_s:g} s")
        except (JudgeConfigError, JudgeCallError):
            raise
        except Exception as exc:
            raise JudgeCallError(f"{self.settings.label}: generation failed: {type(exc).__name__}: {exc}")
        if not reply.text.strip():
            raise JudgeCallError(f"{self.settings.label}: empty reply")
        return reply


class ReplayBackend(Backend):
    """Answers only from the cache (the client looks there first); reaching it is a miss."""

    name = "replay"

    async def generate(self, prompt: str, sample: int) -> Generation:
        raise JudgeCacheMiss(
            f"{self.settings.label}: no recorded reply in {self.settings.cache_path} for this prompt "
            f"(sample {sample}); replay needs the same model name, prompt files and sampling settings"
        )


def make_backend(settings: JudgeSettings) -> Backend:
    if settings.backend == "openai":
        return OpenAIBackend(settings)
    if settings.backend == "transformers":
        return TransformersBackend(settings)
    if settings.backend == "replay":
        return ReplayBackend(settings)
    raise JudgeConfigError(f"unknown judge backend {settings.backend!r}")


__all__ = [
    "Backend",
    "Generation",
    "OpenAIBackend",
    "ReplayBackend",
    "TransformersBackend",
    "make_backend",
    "resolve_model_path",
]


def describe_openai_error(
    exc: BaseException, settings: JudgeSettings, secrets: tuple[str, ...]
) -> str | None:
    """A one-line cause for an ``openai`` exception, scrubbed of secrets; None if not one."""
    import openai

    if isinstance(exc, openai.APITimeoutError):
        cause = exc.__cause__ or exc.__context__
        if cause is not None and "connect" in type(cause).__name__.lower():
            # The aiohttp transport reports a refused connection as a connect timeout.
            return "connection failed (" + redact(f"{type(cause).__name__}: {cause}"[:200], secrets) + ")"
        return f"timed out after {settings.timeout_s:g} s"
    if isinstance(exc, TimeoutError):
        return f"timed out after {settings.timeout_s:g} s"
    if isinstance(exc, openai.APIStatusError):
        body = exc.body
        if isinstance(body, dict):
            inner = body.get("error") if isinstance(body.get("error"), dict) else body
            detail = inner.get("message") or str(body)
        else:
            detail = str(body) if body is not None else ""
        detail = redact(" ".join(str(detail).split())[:200], secrets)
        return f"HTTP {exc.status_code}" + (f": {detail}" if detail else "")
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        reason = f"{type(cause).__name__}: {cause}" if cause else str(exc)
        return "connection failed (" + redact(reason[:200], secrets) + ")"
    if isinstance(exc, openai.OpenAIError):
        return redact(f"{type(exc).__name__}: {exc}"[:300], secrets)
    return None
