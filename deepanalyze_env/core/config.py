"""``env_config`` (docs/design.md §5) as typed dataclasses with strict, named validation.

Accepts a plain dict, an OmegaConf node or a dataclass, because SkyRL hands us OmegaConf and
users hand us dicts. An unknown key is an error naming its dotted path: a typo in a training
config must fail before the first rollout, not silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Literal, Union, get_args, get_origin, get_type_hints

from deepanalyze_env.core.contracts import JsonValue
from deepanalyze_env.core.errors import ConfigError

__all__ = ["ConfigError", "ConfigSource", "EnvConfig", "ExecutorConfig", "JudgeConfig", "SandboxConfig"]


@dataclass
class SandboxConfig:
    """``executor.sandbox``: protections around each kernel worker (``tools/sandbox.py``).

    None keeps the executor's default (in brackets). What holds depends on privileges: see the
    README's security model.
    """

    max_processes: int | None = None  # processes + threads per worker [512]
    file_size_mb: int | None = None  # largest single file a cell may write [1024]
    network: bool | None = None  # allow network access [false: empty network namespace]
    cgroup: bool | None = None  # a pids and a memory cgroup per worker where they can be made [true]
    readonly_fs: bool | None = None  # everything read-only but the workspace, as root [true]
    tmp_mb: int | None = None  # private /tmp and /dev/shm size where disk_mb cannot hold [256]
    pid_namespace: bool | None = None  # each worker the init of its own PID namespace + /proc [true]
    uid: int | None = None  # as root, the uid cells run as; 0 keeps root, capabilities dropped [65534]
    seccomp: bool | None = None  # the libseccomp syscall filter in each worker [true]
    allow_unsafe: bool | None = None  # start without a PID namespace, or as root on a writable fs [false]


@dataclass
class ExecutorConfig:
    """``env_config.executor``: how code cells run (``tools/kernel.py``, one worker per episode)."""

    timeout_s: float = 10.0
    """Wall-clock limit per cell; the worker and everything it started are killed past it."""
    memory_mb: int | None = 2048
    """Memory all of an episode's processes may add together beyond the preloaded stack (a
    memory cgroup per worker; also each process's ``RLIMIT_AS``); null: no cap."""
    disk_mb: int | None = 512
    """What an episode may write beyond its workspace copy: workspace, /tmp and /dev/shm share
    one tmpfs of this size over the copy (root); null: no bound."""
    max_output_chars: int = 20000
    """Longer output keeps its head and tail with a marker between them."""
    python: str | None = None
    """Interpreter for kernels (another venv with its own stack); default: the running one."""
    preload: list[str] | None = None
    """Modules the fork server imports once before forking workers; default: the kernel stack."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Protections around each worker (``executor.sandbox.*``)."""

    def validate(self) -> None:
        if self.timeout_s <= 0:
            raise ConfigError("env_config.executor.timeout_s must be > 0")
        if self.memory_mb is not None and self.memory_mb <= 0:
            raise ConfigError("env_config.executor.memory_mb must be > 0 or null")
        if self.disk_mb is not None and self.disk_mb <= 0:
            raise ConfigError("env_config.executor.disk_mb must be > 0 or null")
        if self.max_output_chars < 100:
            raise ConfigError("env_config.executor.max_output_chars must be >= 100")


JudgeBackend = Literal["openai", "transformers", "replay"]
JUDGE_BACKENDS: tuple[str, ...] = get_args(JudgeBackend)
CacheJournal = Literal["auto", "wal", "delete"]
CACHE_JOURNALS: tuple[str, ...] = get_args(CacheJournal)
RowErrors = Literal["raise", "episode"]
ROW_ERRORS: tuple[str, ...] = get_args(RowErrors)


@dataclass
class JudgeConfig:
    """``env_config.judge``: the LLM judge behind the rubric components (``qa_analysis``, …).

    The only definition of the judge's settings and their rules: the judge client's frozen key
    (``rewards.judge.JudgeSettings``) is derived from these fields and runs :meth:`validate`.
    """

    backend: str | None = None
    """``openai`` (any OpenAI-compatible server), ``transformers`` (a local model) or ``replay``
    (answers only from ``cache_path``); a bare ``base_url`` means ``openai``."""
    base_url: str | None = None
    """Endpoint of an OpenAI-compatible server, e.g. ``http://127.0.0.1:8001/v1``."""
    model: str | None = None
    """Model name at the endpoint, or a local folder / ``.gguf`` / ``embedded:smollm2``."""
    api_key_env: str = "OPENAI_API_KEY"
    """Name of the environment variable holding the API key (the key itself is never stored)."""
    timeout_s: float = 60.0
    """Per-request timeout; a request that times out is retried, then ``verifier_error``."""
    max_retries: int = 3
    """Retries on timeouts, HTTP 429 and 5xx (exponential backoff with jitter)."""
    concurrency: int = 16
    """Judge requests in flight at once, per process."""
    temperature: float = 0.0
    """Sampling temperature of the judge."""
    max_tokens: int = 1024
    """Longest judge reply."""
    max_prompt_tokens: int = 30000
    """Longest judge prompt in tokens (counted by ``tokenizer`` when set, else estimated at one
    token per UTF-8 byte, an upper bound), chat template included: the judge's context length
    minus ``max_tokens``. The default fits a 32k-token judge. A longer prompt has the middles of
    its environment outputs elided (docs/design.md §7, "Judge budget"); one that still does not
    fit is not sent — scored 0 with a note when the episode's own text is the cause, else
    ``verifier_error`` (cause ``context_length``)."""
    tokenizer: str | None = None
    """The judge's tokenizer, to count ``max_prompt_tokens`` exactly: a local folder, a ``.gguf``
    file or a model id already in the Hugging Face cache (never downloaded). The ``transformers``
    backend uses its model folder's by default (an ``embedded:`` model is estimated)."""
    max_prompt_chars: int | None = None
    """Replaced by ``max_prompt_tokens`` (a judge's limit is in tokens, and dense text costs a
    token per character or more); setting it is a ``ConfigError`` saying so."""
    prompt_dir: str | None = None
    """A folder of rubric files replacing the shipped ones (``rewards/prompts/``)."""
    cache_path: str | None = None
    """SQLite file caching replies by (model, prompt, sampling parameters, sample index)."""
    cache_journal: str = "auto"
    """SQLite journal of the cache: ``wal``; ``delete`` (the rollback journal, for network
    filesystems, where WAL is unsafe); ``auto`` picks ``delete`` when ``/proc/mounts`` shows the
    cache on NFS, Lustre, CIFS, GPFS, BeeGFS, Ceph and the like, else ``wal``."""

    @property
    def configured(self) -> bool:
        return self.backend is not None or self.base_url is not None

    def validate(self) -> None:
        """Rules a usable judge must meet (checked when a judge is built, not for unused ones)."""
        if self.backend not in JUDGE_BACKENDS:
            raise ConfigError(
                f"env_config.judge.backend must be one of {', '.join(JUDGE_BACKENDS)}, got {self.backend!r}"
            )
        if not self.model:
            raise ConfigError(
                f"env_config.judge.model is not set (the {self.backend} judge needs a model name"
                + (" or a local path)" if self.backend == "transformers" else ")")
            )
        if self.timeout_s <= 0:
            raise ConfigError("env_config.judge.timeout_s must be > 0")
        if self.max_retries < 0:
            raise ConfigError("env_config.judge.max_retries must be >= 0")
        if self.concurrency < 1:
            raise ConfigError("env_config.judge.concurrency must be >= 1")
        if self.temperature < 0:
            raise ConfigError("env_config.judge.temperature must be >= 0")
        if self.max_tokens < 1:
            raise ConfigError("env_config.judge.max_tokens must be >= 1")
        if self.max_prompt_chars is not None:
            raise ConfigError(
                "env_config.judge.max_prompt_chars was replaced by max_prompt_tokens (the judge's "
                "limit is in tokens): set that to the judge's context length minus max_tokens"
            )
        if self.max_prompt_tokens < 1:
            raise ConfigError("env_config.judge.max_prompt_tokens must be >= 1")
        if self.cache_journal not in CACHE_JOURNALS:
            raise ConfigError(
                f"env_config.judge.cache_journal must be one of {', '.join(CACHE_JOURNALS)}, "
                f"got {self.cache_journal!r}"
            )
        if self.prompt_dir is not None and not Path(self.prompt_dir).expanduser().is_dir():
            raise ConfigError(f"env_config.judge.prompt_dir is not a directory: {self.prompt_dir}")
        if self.backend == "replay":
            if not self.cache_path:
                raise ConfigError(
                    "env_config.judge.cache_path is not set: the replay judge answers only from a cache"
                )
            if not Path(self.cache_path).expanduser().is_file():
                raise ConfigError(f"env_config.judge.cache_path does not exist: {self.cache_path}")


@dataclass
class EnvConfig:
    """``env_config``: everything about an episode that is not in the dataset row.

    Build it with :meth:`from_any` (dict, OmegaConf node or EnvConfig); every key is optional
    and an unknown one is an error naming its dotted path. ``docs/design.md`` section 5 tables
    every key.

    Example::

        EnvConfig.from_any({"workspace_root": "data", "executor": {"timeout_s": 5}})
    """

    workspace_root: str | None = None
    """Folder holding the task folders (``<workspace_root>/<data>/<workspace_id>/``)."""
    profile: str = "v1"
    """``v1`` (this project's semantics) or ``upstream`` (DeepAnalyze's, for comparisons): a
    name in ``core.profiles.PROFILES``."""
    max_turns: int = 30
    """Turn limit when the row sets none (under SkyRL, ``generator.max_turns`` is the limit)."""
    observation_role: str = "user"
    """Role of the ``<Execute>`` observation messages (tag format; tool results are role ``tool``)."""
    action_format: str = "tags"
    """How the policy acts, a name in ``core.formats.FORMATS``: ``tags`` (``<Analyze>/<Code>/
    <Answer>``) or ``tools`` (native tool calls of ``run_python(code)`` and
    ``submit_answer(answer)``; v1 profile only)."""
    stateful_cells: bool = False
    """Keep variables between cells (DeepAnalyze's harness gives each cell a fresh namespace)."""
    system_prompt: str | None = None
    """``protocol`` (the shipped prompt of the action format: the tag protocol, or the tools'
    use), a file path, or null for none."""
    records_dir: str | None = None
    """Append each episode's record to ``episodes-<host>-<pid>.jsonl`` here on ``close()``."""
    policy_id: str | None = None
    """Recorded in ``versions.policy_id`` of every record."""
    row_errors: str = "raise"
    """``raise``: a bad dataset row (reward spec, workspace, a judge it needs) is a ConfigError at
    construction; ``episode``: the episode ends at once as ``environment_error``, so a trainer's
    batch survives a row that went bad after the startup check (the SkyRL entrypoint's default)."""
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    """How code cells run."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """The LLM judge (only needed by plans with judge components)."""

    @classmethod
    def from_any(cls, raw: ConfigSource, path: str = "env_config") -> EnvConfig:
        """Strict, validated build from a dict, an OmegaConf node or an EnvConfig; ``path``
        prefixes error messages (``environment.skyrl_gym.deepanalyze`` under SkyRL). An EnvConfig
        that SkyRL's config builder made holds plain dicts in its nested sections, so it is rebuilt."""
        config = raw if isinstance(raw, EnvConfig) and _fully_typed(raw) else _build(cls, to_plain(raw), path)
        config.validate()
        return config

    def validate(self) -> None:
        """The one check of every setting (the env and ``replay_prefix`` rely on it): the profile
        and action format are registered names, and the format can play the rest."""
        from deepanalyze_env.core.formats import get_format
        from deepanalyze_env.core.profiles import PROFILES

        if self.profile not in PROFILES:
            raise ConfigError(
                f"env_config.profile must be one of {', '.join(PROFILES)}, got {self.profile!r}"
            )
        if self.max_turns < 1:
            raise ConfigError("env_config.max_turns must be >= 1")
        if self.row_errors not in ROW_ERRORS:
            raise ConfigError(
                f"env_config.row_errors must be one of {', '.join(ROW_ERRORS)}, got {self.row_errors!r}"
            )
        if not self.observation_role:
            raise ConfigError("env_config.observation_role must be a non-empty role name")
        get_format(self.action_format).validate(self)
        self.executor.validate()


def _fully_typed(config: EnvConfig) -> bool:
    return (
        isinstance(config.executor, ExecutorConfig)
        and isinstance(config.executor.sandbox, SandboxConfig)
        and isinstance(config.judge, JudgeConfig)
    )


ConfigSource = EnvConfig | Mapping[str, object] | None
"""What ``env_config`` may arrive as: an EnvConfig, a dict or an OmegaConf node (a mapping)."""


def to_plain(raw: object) -> dict[str, object]:
    """Turn a dict / OmegaConf node / dataclass / None into a plain dict."""
    if raw is None:
        return {}
    if dataclasses.is_dataclass(raw) and not isinstance(raw, type):
        return dataclasses.asdict(raw)
    if hasattr(raw, "_metadata") and hasattr(raw, "_content"):  # OmegaConf node, without importing it
        from omegaconf import OmegaConf

        plain = OmegaConf.to_container(raw, resolve=True) or {}
        if not isinstance(plain, dict):
            raise ConfigError(f"env_config must be a mapping, got {type(plain).__name__}")
        return plain
    if isinstance(raw, dict):
        return dict(raw)
    try:
        return dict(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"env_config must be a mapping, got {type(raw).__name__}")


def _build(cls: type, data: dict[str, object], path: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must be a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, object] = {}
    for key, value in data.items():
        if key not in names:
            known = ", ".join(sorted(names)) or "(none)"
            raise ConfigError(f"unknown key {path}.{key} (known keys: {known})")
        hint = hints[key]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, to_plain(value), f"{path}.{key}")
        else:
            kwargs[key] = _coerce(value, hint, f"{path}.{key}")
    return cls(**kwargs)


def _to_bool(value: JsonValue, path: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"{path} must be true or false, got {value!r}")


def _to_int(value: JsonValue, path: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{path} must be an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{path} must be an integer, got {value!r}")


def _to_float(value: JsonValue, path: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{path} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{path} must be a number, got {value!r}")


def _to_str(value: JsonValue, path: str) -> str:
    return str(value)


def _to_list(value: JsonValue, path: str) -> list:
    if isinstance(value, str):  # a command-line override: comma-separated
        return [v.strip() for v in value.split(",") if v.strip()]
    try:
        return list(value)
    except TypeError:
        raise ConfigError(f"{path} must be a list, got {value!r}")


# annotation (or its origin, for ``list[str]``) → coercion; YAML and CLI overrides give text
_COERCE: dict[type, Callable[[JsonValue, str], object]] = {
    bool: _to_bool,
    int: _to_int,
    float: _to_float,
    str: _to_str,
    list: _to_list,
}


def _coerce(value: JsonValue, hint: object, path: str) -> object:
    """Check and convert a scalar setting by its annotation (``int``, ``float | None``, …); an
    annotation without a coercion (a union of several types) keeps the value as given."""
    args = get_args(hint)
    optional = get_origin(hint) in (Union, UnionType) and type(None) in args
    if optional:
        rest = [a for a in args if a is not type(None)]
        hint = rest[0] if len(rest) == 1 else object
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{path} must not be null")
    coerce = _COERCE.get(get_origin(hint) or hint)
    return value if coerce is None else coerce(value, path)
