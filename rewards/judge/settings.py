"""Frozen, validated judge settings built from ``env_config.judge`` (docs/design.md §5).

``JudgeConfig`` is a mutable dataclass users edit; the client needs a hashable value so one
client (one connection pool, one concurrency cap, one cache connection) is shared by every
env in a process that uses the same judge. The API key is deliberately not a field: only
the *name* of its environment variable is kept, so dumping settings can never leak it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TypedDict
from urllib.parse import urlsplit, urlunsplit

from deepanalyze_env.core.config import JudgeConfig
from deepanalyze_env.core.errors import ConfigError
from rewards.judge.errors import JudgeConfigError


class JudgeIdentity(TypedDict):
    """What identifies a judge in metadata and records (:meth:`JudgeSettings.describe`): the head
    of ``contracts.JudgeSummary``, never a key."""

    backend: str
    model: str
    base_url: str | None  # without credentials
    temperature: float
    max_tokens: int


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


# Client-only settings: not in env_config (the defaults suit real endpoints; tests and
# benchmarks shorten the backoff). Every other field comes from ``JudgeConfig``.
_CLIENT_FIELDS: list[tuple[str, type, dataclasses.Field[object]]] = [
    # backoff between retries (exponential with jitter, capped)
    ("backoff_initial_s", float, dataclasses.field(default=0.5)),
    ("backoff_max_s", float, dataclasses.field(default=8.0)),
    # HTTP transport under the openai client: "auto" uses aiohttp when installed (about half the
    # per-request CPU of the default httpx pool, which matters at high concurrency on small
    # machines), else httpx.
    ("http_transport", str, dataclasses.field(default="auto")),
]


class _SettingsMethods:
    @classmethod
    def from_config(
        cls, config: JudgeConfig | JudgeSettings | Mapping[str, object], **overrides: object
    ) -> JudgeSettings:
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
        config_fields = {f.name for f in dataclasses.fields(JudgeConfig)}
        try:
            JudgeConfig(
                **{k: v for k, v in dataclasses.asdict(self).items() if k in config_fields}
            ).validate()
        except JudgeConfigError:
            raise
        except ConfigError as exc:
            raise JudgeConfigError(str(exc))
        if self.http_transport not in ("auto", "aiohttp", "httpx"):
            raise JudgeConfigError(
                f"judge http_transport must be auto, aiohttp or httpx, got {self.http_transport!r}"
            )
        if self.backoff_initial_s < 0 or self.backoff_max_s < 0:
            raise JudgeConfigError("judge backoff times must be >= 0")

    def describe(self) -> JudgeIdentity:
        """What identifies this judge in metadata and records (no key, no key-variable value)."""
        return JudgeIdentity(
            backend=self.backend,
            model=self.model,
            base_url=public_url(self.base_url),
            temperature=self.temperature,
            max_tokens=self.max_tokens,
        )

    @property
    def label(self) -> str:
        """Short human name for error messages: ``openai judge 'gpt-x' at http://…``."""
        where = f" at {public_url(self.base_url)}" if self.backend == "openai" and self.base_url else ""
        return f"{self.backend} judge {self.model!r}{where}"


JudgeSettings = dataclasses.make_dataclass(
    "JudgeSettings",
    [(f.name, f.type, dataclasses.field(default=f.default)) for f in dataclasses.fields(JudgeConfig)]
    + _CLIENT_FIELDS,
    bases=(_SettingsMethods,),
    frozen=True,
)
JudgeSettings.__module__ = __name__  # pickles by name (Ray tasks, worker processes)
JudgeSettings.__doc__ = """Frozen, hashable judge settings: ``JudgeConfig``'s fields plus client-only ones.

Build with :meth:`from_config`; equal settings share one client (connection pool, concurrency
cap, cache connection) per process."""
