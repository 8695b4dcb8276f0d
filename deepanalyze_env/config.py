"""``env_config`` (DESIGN contract 2) as typed dataclasses with strict, named validation.

Accepts a plain dict, an OmegaConf node or a dataclass, because SkyRL hands us OmegaConf and
users hand us dicts. An unknown key is an error naming its dotted path: a typo in a training
config must fail before the first rollout, not silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, get_type_hints


class ConfigError(ValueError):
    """A setting in env_config, extras or reward_spec is wrong; the message says which."""


@dataclass
class SandboxConfig:
    """``executor.sandbox``: protections around each kernel worker (``tools/sandbox.py``).

    None keeps the executor's default (in brackets). What holds depends on privileges: see the
    README's security model.
    """

    max_processes: int | None = None  # processes + threads per worker [512]
    file_size_mb: int | None = None  # largest single file a cell may write [1024]
    network: bool | None = None  # allow network access [false: empty network namespace]
    cgroup: bool | None = None  # a pids cgroup per worker where one can be made [true]
    readonly_fs: bool | None = None  # everything read-only but the workspace, as root [true]
    tmp_mb: int | None = None  # size of the private /tmp and /dev/shm [256]
    pid_namespace: bool | None = None  # each worker the init of its own PID namespace + /proc [true]
    uid: int | None = None  # as root, the uid cells run as; 0 keeps root, capabilities dropped [65534]
    seccomp: bool | None = None  # the libseccomp syscall filter in each worker [true]


@dataclass
class ExecutorConfig:
    timeout_s: float = 10.0
    memory_mb: int | None = 2048
    max_output_chars: int = 20000
    python: str | None = None
    preload: list[str] | None = None
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)

    def validate(self) -> None:
        if self.timeout_s <= 0:
            raise ConfigError("env_config.executor.timeout_s must be > 0")
        if self.memory_mb is not None and self.memory_mb <= 0:
            raise ConfigError("env_config.executor.memory_mb must be > 0 or null")
        if self.max_output_chars < 100:
            raise ConfigError("env_config.executor.max_output_chars must be >= 100")


@dataclass
class JudgeConfig:
    backend: str | None = None  # "openai" | "transformers" | "replay"
    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0
    max_retries: int = 3
    concurrency: int = 16
    temperature: float = 0.0
    max_tokens: int = 1024
    prompt_dir: str | None = None
    cache_path: str | None = None

    @property
    def configured(self) -> bool:
        return self.backend is not None or self.base_url is not None


@dataclass
class EnvConfig:
    workspace_root: str | None = None
    profile: str = "v1"
    max_turns: int = 30
    observation_role: str = "user"
    stateful_cells: bool = False
    system_prompt: str | None = None
    records_dir: str | None = None
    policy_id: str | None = None
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)

    @classmethod
    def from_any(cls, raw: Any, path: str = "env_config") -> EnvConfig:
        """Strict build from a dict, an OmegaConf node or an EnvConfig; ``path`` prefixes error
        messages (``environment.skyrl_gym.deepanalyze`` under SkyRL). An EnvConfig that SkyRL's
        config builder made holds plain dicts in its nested sections, so it is rebuilt."""
        if isinstance(raw, EnvConfig) and _fully_typed(raw):
            return raw
        config = _build(cls, to_plain(raw), path)
        config.validate()
        return config

    def validate(self) -> None:
        if self.max_turns < 1:
            raise ConfigError("env_config.max_turns must be >= 1")
        if not self.observation_role:
            raise ConfigError("env_config.observation_role must be a non-empty role name")
        self.executor.validate()


def _fully_typed(config: EnvConfig) -> bool:
    return (
        isinstance(config.executor, ExecutorConfig)
        and isinstance(config.executor.sandbox, SandboxConfig)
        and isinstance(config.judge, JudgeConfig)
    )


def to_plain(raw: Any) -> dict:
    """Turn a dict / OmegaConf node / dataclass / None into a plain dict."""
    if raw is None:
        return {}
    if dataclasses.is_dataclass(raw) and not isinstance(raw, type):
        return dataclasses.asdict(raw)
    if hasattr(raw, "_metadata") and hasattr(raw, "_content"):  # OmegaConf node, without importing it
        from omegaconf import OmegaConf

        return OmegaConf.to_container(raw, resolve=True) or {}
    if isinstance(raw, dict):
        return dict(raw)
    try:
        return dict(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"env_config must be a mapping, got {type(raw).__name__}")


def _build(cls: type, data: dict, path: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            known = ", ".join(sorted(names)) or "(none)"
            raise ConfigError(f"unknown key {path}.{key} (known keys: {known})")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, to_plain(value), f"{path}.{key}")
        else:
            kwargs[key] = _coerce(value, hint, f"{path}.{key}")
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, path: str) -> Any:
    """Light type checking for scalar settings (YAML and CLI overrides give strings/ints)."""
    text = str(hint)
    if value is None:
        if "None" in text:
            return None
        raise ConfigError(f"{path} must not be null")
    if "bool" in text:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"{path} must be true or false, got {value!r}")
    if "float" in text and not isinstance(value, bool):
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{path} must be a number, got {value!r}")
    if "int" in text and not isinstance(value, bool):
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{path} must be an integer, got {value!r}")
    if "list" in text:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return list(value)
    if "str" in text:
        return str(value)
    return value
