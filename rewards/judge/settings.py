"""Frozen, validated judge settings built from ``env_config.judge`` (DESIGN contract 2).

``JudgeConfig`` is a mutable dataclass users edit; the client needs a hashable value so one
client (one connection pool, one concurrency cap, one cache connection) is shared by every
env in a process that uses the same judge. The API key is deliberately not a field: only
the *name* of its environment variable is kept, so dumping settings can never leak it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rewards.judge.errors import JudgeConfigError

BACKENDS = ("openai", "transformers", "replay")
JOURNALS = ("auto", "wal", "delete")


def public_url(url: str | None) -> str | None:
    """``url`` without user-info or query string, either of which may carry a credential."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@dataclass(frozen=True)
class JudgeSettings:
    backend: str
    model: str
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0
    max_retries: int = 3
    concurrency: int = 16
    temperature: float = 0.0
    max_tokens: int = 1024
    prompt_dir: str | None = None
    cache_path: str | None = None
    cache_journal: str = "auto"  # SQLite journal of the cache: auto | wal | delete (rewards/judge/cache.py)
    # Backoff between retries (exponential with jitter, capped). Not in env_config: the
    # defaults suit real endpoints; tests and benchmarks shorten them.
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 8.0
    # HTTP transport under the openai client: "auto" uses aiohttp when installed (about half
    # the per-request CPU of the default httpx pool, which matters at high concurrency on
    # small machines), else httpx.
    http_transport: str = "auto"

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> JudgeSettings:
        """Build from a ``JudgeConfig``, a mapping or another ``JudgeSettings``; validate."""
        if isinstance(config, JudgeSettings) or (
            dataclasses.is_dataclass(config) and not isinstance(config, type)
        ):
            values = dataclasses.asdict(config)
        elif isinstance(config, Mapping):
            values = dict(config)
        else:
            raise JudgeConfigError(f"judge settings must be a JudgeConfig or a mapping, got {config!r}")
        values.update(overrides)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise JudgeConfigError(f"unknown judge setting(s): {', '.join(unknown)}")
        backend = values.get("backend")
        if backend is None and values.get("base_url"):
            backend = "openai"  # a bare base_url means an OpenAI-compatible endpoint
        values["backend"] = backend
        values.setdefault("model", "")
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            raise JudgeConfigError(
                f"env_config.judge.backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}"
            )
        if not self.model:
            raise JudgeConfigError(
                f"env_config.judge.model is not set (the {self.backend} judge needs a model name"
                + (" or a local path)" if self.backend == "transformers" else ")")
            )
        if self.timeout_s <= 0:
            raise JudgeConfigError("env_config.judge.timeout_s must be > 0")
        if self.max_retries < 0:
            raise JudgeConfigError("env_config.judge.max_retries must be >= 0")
        if self.concurrency < 1:
            raise JudgeConfigError("env_config.judge.concurrency must be >= 1")
        if self.temperature < 0:
            raise JudgeConfigError("env_config.judge.temperature must be >= 0")
        if self.max_tokens < 1:
            raise JudgeConfigError("env_config.judge.max_tokens must be >= 1")
        if self.cache_journal not in JOURNALS:
            raise JudgeConfigError(
                f"env_config.judge.cache_journal must be one of {', '.join(JOURNALS)}, "
                f"got {self.cache_journal!r}"
            )
        if self.http_transport not in ("auto", "aiohttp", "httpx"):
            raise JudgeConfigError(
                f"judge http_transport must be auto, aiohttp or httpx, got {self.http_transport!r}"
            )
        if self.backoff_initial_s < 0 or self.backoff_max_s < 0:
            raise JudgeConfigError("judge backoff times must be >= 0")
        if self.prompt_dir is not None and not Path(self.prompt_dir).expanduser().is_dir():
            raise JudgeConfigError(f"env_config.judge.prompt_dir is not a directory: {self.prompt_dir}")
        if self.backend == "replay":
            if not self.cache_path:
                raise JudgeConfigError(
                    "env_config.judge.cache_path is not set: the replay judge answers only from a cache"
                )
            if not Path(self.cache_path).expanduser().is_file():
                raise JudgeConfigError(f"env_config.judge.cache_path does not exist: {self.cache_path}")

    def describe(self) -> dict[str, Any]:
        """What identifies this judge in metadata and records (no key, no key-variable value)."""
        return {
            "backend": self.backend,
            "model": self.model,
            "base_url": public_url(self.base_url),
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }

    @property
    def label(self) -> str:
        """Short human name for error messages: ``openai judge 'gpt-x' at http://…``."""
        where = f" at {public_url(self.base_url)}" if self.backend == "openai" and self.base_url else ""
        return f"{self.backend} judge {self.model!r}{where}"
