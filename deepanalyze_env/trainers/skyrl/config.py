"""SkyRL 0.4's config tree, extended (by subclassing, as SkyRL asks) with our two sections.

- ``environment.skyrl_gym.deepanalyze``: the env config (docs/design.md §5), so
  ``environment.skyrl_gym.deepanalyze.judge.base_url=…`` works on the command line. SkyRL's
  generator hands this object to ``skyrl_gym.make`` as ``env_config``.
- ``deepanalyze``: options of the SkyRL adapter itself (what the recipe's ``rollout:`` holds).

Our defaults go in *before* the user's overrides, so anything here can be overridden; they
are the settings this env needs (docs/design.md §11 and §6) and SkyRL's own defaults
would get wrong (``max_turns`` 1, gsm8k env class, conversation-style observations).
"""

# No `from __future__ import annotations` in this module: SkyRL's config builder resolves field
# types as classes, and string annotations would make it skip our nested sections.

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from skyrl.train.config import (
    BaseConfig,
    EnvironmentConfig,
    SkyRLGymConfig,
    SkyRLTrainConfig,
)

from deepanalyze_env.core.config import ConfigError, EnvConfig
from deepanalyze_env.core.contracts import JsonValue
from deepanalyze_env.generation.interfaces import Tokenizer
from deepanalyze_env.generation.turn_end import turn_stops

ENV_SECTION = "environment.skyrl_gym.deepanalyze"
ESTIMATOR = "deepanalyze_grpo"
STOP = list(turn_stops().strings)  # where a turn ends: generation.turn_end, the one rule
TOOL_STOP = list(turn_stops(action_format="tools").strings)

# Applied under the user's overrides (theirs win). Each is something the env relies on.
DEFAULTS: dict[str, JsonValue] = {
    "environment.env_class": "deepanalyze",
    "generator.max_turns": 30,  # DeepAnalyze's turn limit; SkyRL's default is 1
    "generator.use_conversation_multi_turn": False,  # observations as raw text in one assistant turn
    "generator.sampling_params.stop": STOP,  # a turn ends at the tag that completes an action
    "generator.apply_overlong_filtering": True,  # length-cut episodes stay out of the loss
    "trainer.algorithm.advantage_estimator": ESTIMATOR,  # infra failures out of the gradient
    "trainer.algorithm.use_kl_loss": False,  # DeepAnalyze trained without it (SkyRL's default: true)
    f"{ENV_SECTION}.row_errors": "episode",  # a row that goes bad mid-run fails its episode, not the batch
    "trainer.logger": "console",  # SkyRL defaults to wandb, which refuses to start without a key
    "data.val_data": [],  # SkyRL defaults to a gsm8k file; evaluation is opt-in here
    # DeepAnalyze's lengths (SkyRL's defaults, 512/512/1024, cannot hold one task prompt)
    "trainer.max_prompt_length": 8000,
    "generator.max_input_length": 32768,
    "generator.sampling_params.max_generate_length": 32768,
}


@dataclass
class DeepAnalyzeGymConfig(SkyRLGymConfig):
    """SkyRL's skyrl_gym section with our env config under ``deepanalyze``, validated by ``EnvConfig``'s
    own rules."""

    deepanalyze: EnvConfig = field(default_factory=EnvConfig)


@dataclass
class DeepAnalyzeEnvironmentConfig(EnvironmentConfig):
    """SkyRL's environment section with ``env_class`` defaulting to ``deepanalyze``."""

    env_class: str = "deepanalyze"
    skyrl_gym: DeepAnalyzeGymConfig = field(default_factory=DeepAnalyzeGymConfig)


@dataclass
class AdapterConfig(BaseConfig):
    """The adapter's own root section ``deepanalyze``: what SkyRL has no key for (length-stop training,
    dead-judge stop, curriculum)."""

    score_truncated: bool = False
    """Episodes the trainer stopped for length (the env never said done): False keeps them out of
    the loss and the baseline (docs/design.md §6); True trains on them as a failed gate (−1.0)."""
    outage_fraction: float = 0.9
    """A batch counts toward the dead-judge stop when at least this fraction of its episodes that
    needed a measured reward got none (verifier_error / environment_error). Format-gate failures
    (scored without a judge) and length-stopped episodes are not counted."""
    outage_batches: int = 3
    """Stop the run after this many such batches in a row; 0 never stops."""
    curriculum: dict[str, Any] | None = None  # Any: SkyRL's config builder reads this type as a class
    """The success-rate curriculum (the recipe's ``curriculum`` section: ``kind: success_rate``
    and the fields of ``trainers.curriculum.CurriculumConfig``); None (the default) samples
    prompts as SkyRL does."""


@dataclass
class DeepAnalyzeSkyRLConfig(SkyRLTrainConfig):
    """SkyRL's train config with our environment and adapter sections, so one typed tree (and SkyRL's
    own override parser) configures a run."""

    environment: DeepAnalyzeEnvironmentConfig = field(default_factory=DeepAnalyzeEnvironmentConfig)
    deepanalyze: AdapterConfig = field(default_factory=AdapterConfig)


def _dotlist(overrides: list[str] | dict[str, JsonValue]) -> list[str]:
    from skyrl.train.config.config import overrides_dict_to_dotlist

    if isinstance(overrides, dict):
        return overrides_dict_to_dotlist(overrides)
    bad = [a for a in overrides if "=" not in a]
    if bad:
        raise ConfigError(f"argument {bad[0]!r} must look like key.path=value")
    return list(overrides)


def parse_config(overrides: list[str] | dict[str, JsonValue]) -> DeepAnalyzeSkyRLConfig:
    """Defaults, then ``overrides`` (``key.path=value`` strings or a dotted dict), validated.

    Our env section is checked first with the env's own strict rules so that a typo deep inside
    it (``…deepanalyze.judge.bse_url``) is reported with its full dotted path; everything else is
    SkyRL's strict dataclass validation. Errors are ``ConfigError`` with one line.
    """
    user = _dotlist(overrides)
    env_raw = OmegaConf.select(OmegaConf.from_cli(_dotlist(DEFAULTS) + user), ENV_SECTION)
    if env_raw is not None and not OmegaConf.is_dict(env_raw):
        raise ConfigError(f"{ENV_SECTION} must be a mapping")
    env = EnvConfig.from_any(env_raw, path=ENV_SECTION)
    required_stops = list(turn_stops(action_format=env.action_format).strings)
    dotlist = _dotlist(defaults_for(env.action_format)) + user
    try:
        cfg = DeepAnalyzeSkyRLConfig.from_cli_overrides(dotlist)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"SkyRL config: {exc}") from exc
    # SkyRL's builder leaves our section's nested parts as dicts; the env gets the typed one
    cfg.environment.skyrl_gym.deepanalyze = absolute_paths(env)
    cfg.data.train_data = [_absolute_data(d) for d in cfg.data.train_data]
    model = Path(cfg.trainer.policy.model.path).expanduser()
    if model.exists():  # a local folder; a hub name stays as it is
        cfg.trainer.policy.model.path = str(model.resolve())
    cfg.data.val_data = [_absolute_data(d) for d in cfg.data.val_data or []]
    for key in _TRAINER_PATHS:
        setattr(cfg.trainer, key, _absolute(getattr(cfg.trainer, key)))
    _one_turn_limit(cfg, user)
    # SkyRL builds eval_sampling_params without stop strings; eval turns must end at the tags too
    if cfg.generator.eval_sampling_params is not None and cfg.generator.eval_sampling_params.stop is None:
        cfg.generator.eval_sampling_params.stop = list(cfg.generator.sampling_params.stop or [])
    _stops_at_the_tags("generator.sampling_params.stop", cfg.generator.sampling_params.stop, required_stops)
    if cfg.generator.eval_sampling_params is not None:
        params = cfg.generator.eval_sampling_params
        _stops_at_the_tags("generator.eval_sampling_params.stop", params.stop, required_stops)
    _full_distribution(cfg)
    adapter = cfg.deepanalyze
    if not 0.0 < adapter.outage_fraction <= 1.0:
        raise ConfigError(f"deepanalyze.outage_fraction must be in (0, 1], got {adapter.outage_fraction}")
    if adapter.outage_batches < 0:
        raise ConfigError(f"deepanalyze.outage_batches must be >= 0, got {adapter.outage_batches}")
    if cfg.deepanalyze.score_truncated and cfg.generator.apply_overlong_filtering:
        raise ConfigError(
            "deepanalyze.score_truncated=true needs generator.apply_overlong_filtering=false "
            "(the filter would mask those episodes before they could be scored)"
        )
    _curriculum(cfg, user)
    if cfg.generator.step_wise_trajectories:
        raise ConfigError(
            "generator.step_wise_trajectories=true is not supported: this env appends observations "
            "inside one assistant turn (generator.use_conversation_multi_turn=false)"
        )
    return cfg


def _full_distribution(cfg: DeepAnalyzeSkyRLConfig) -> None:
    """Training turns are sampled from the distribution the loss scores: SkyRL's policy loss (as
    TRL's) takes each token's log-prob under the full tempered distribution, so ``top_p``,
    ``top_k`` or ``min_p`` on ``generator.sampling_params`` would bias every ratio silently
    (evaluation sampling may truncate: nothing trains on it)."""
    params = cfg.generator.sampling_params
    for key, neutral in (("top_p", (1.0,)), ("top_k", (-1, 0)), ("min_p", (0.0,))):
        value = getattr(params, key, None)
        if value is not None and value not in neutral:
            raise ConfigError(
                f"generator.sampling_params.{key}={value} truncates the sampling distribution, but the "
                "policy loss scores the full one: remove it (only temperature is allowed)"
            )


def _curriculum(cfg: DeepAnalyzeSkyRLConfig, user: list[str]) -> None:
    """Validate ``deepanalyze.curriculum`` (one-line errors) and store it normalised: every field,
    ``from_records`` absolute (the trainer runs in a Ray task with another working directory).
    The curriculum draws each batch when the trainer asks for it, so the train dataloader runs
    in-process: dataloader workers, which would prefetch batches drawn before the last step's
    outcomes were in, are refused rather than silently dropped."""
    from deepanalyze_env.trainers.skyrl.curriculum import as_mapping, curriculum_config

    tree = cfg.deepanalyze.curriculum
    if tree is not None and not isinstance(tree, dict):
        raise ConfigError("deepanalyze.curriculum must be a mapping with kind: success_rate")
    config = curriculum_config(tree)
    if config is None:
        return
    if config.from_records:
        config.from_records = _absolute(config.from_records)
    cfg.deepanalyze.curriculum = as_mapping(config)
    given = OmegaConf.from_cli(user)
    workers = OmegaConf.select(given, "data.dataloader.num_workers") or 0
    if int(workers) > 0 or OmegaConf.select(given, "data.dataloader.persistent_workers"):
        raise ConfigError(
            "deepanalyze.curriculum draws each batch when the trainer asks for it, so the train "
            "dataloader runs in the trainer's process: drop data.dataloader.num_workers / "
            "persistent_workers (workers would prefetch batches drawn before the last step's outcomes)"
        )


def _stops_at_the_tags(key: str, stop: list[str] | None, required: list[str]) -> None:
    """A turn must end at the tag that completes an action (``</Code>``/``</Answer>``, or
    ``</tool_call>`` in the tools format): without it in the stop list, turns run past it (the
    env cuts the text, but the sampled tokens and their logprobs run on)."""
    missing = [tag for tag in required if tag not in (stop or [])]
    if missing:
        raise ConfigError(
            f"{key}={list(stop) if stop is not None else None} lacks {' and '.join(missing)}: a turn must "
            f"stop at {' and '.join(required)} (other stop strings may be added)"
        )


def defaults_for(action_format: str) -> dict[str, JsonValue]:
    """:data:`DEFAULTS` for an action format. Tools: turns stop at ``</tool_call>``, and tool
    results go through the chat template as ``tool`` messages
    (``generator.use_conversation_multi_turn``), so the model sees them framed as it was trained
    to (Qwen3: ``<tool_response>``); the tag format appends ``<Execute>`` text inside one
    assistant turn instead."""
    if action_format != "tools":
        return DEFAULTS
    return {
        **DEFAULTS,
        "generator.sampling_params.stop": TOOL_STOP,
        "generator.use_conversation_multi_turn": True,
    }


def apply_tag_tokens(cfg: DeepAnalyzeSkyRLConfig, tokenizer: Tokenizer) -> dict[str, int]:
    """Closing tags the tokenizer holds as one added token become stop token ids of training and
    evaluation sampling (``additional_kwargs.stop_token_ids``, which SkyRL 0.4 passes to vLLM as
    it is; vLLM keeps the stop token in the returned ids and SkyRL decodes them with special
    tokens kept, so the env reads the tag). Idempotent; raises ConfigError for a tag that cannot
    be stopped on. Returns ``{tag: id}`` (``generation.turn_end.turn_stops``)."""
    ids = dict(turn_stops(tokenizer).ids_by_tag)
    if not ids:
        return ids
    if cfg.generator.inference_engine.enable_return_sample_support_set:
        raise ConfigError(
            f"the tokenizer holds {', '.join(ids)} as added tokens, which need stop_token_ids in "
            "generator.sampling_params.additional_kwargs, and SkyRL's sample-support capture refuses "
            "additional_kwargs: set generator.inference_engine.enable_return_sample_support_set=false"
        )
    for params in (cfg.generator.sampling_params, cfg.generator.eval_sampling_params):
        if params is None:
            continue
        extra = dict(params.additional_kwargs or {})
        stop_ids = [int(i) for i in extra.get("stop_token_ids") or []]
        stop_ids += [i for i in ids.values() if i not in stop_ids]
        extra["stop_token_ids"] = stop_ids
        params.additional_kwargs = extra
    return ids


def _one_turn_limit(cfg: DeepAnalyzeSkyRLConfig, user: list[str]) -> None:
    """SkyRL's generator hands ``generator.max_turns`` to every env (it wins over the env config),
    so the env's ``max_turns`` given alone becomes the generator's, and two different ones are an
    error rather than one silently ignored."""
    given = OmegaConf.from_cli(user)
    env_turns = OmegaConf.select(given, f"{ENV_SECTION}.max_turns")
    gen_turns = OmegaConf.select(given, "generator.max_turns")
    if env_turns is None:
        return
    if gen_turns is None:
        cfg.generator.max_turns = int(env_turns)
    elif int(gen_turns) != int(env_turns):
        raise ConfigError(
            f"generator.max_turns={gen_turns} and {ENV_SECTION}.max_turns={env_turns} disagree; "
            "SkyRL uses generator.max_turns for every episode, so set one of them"
        )


# Ray runs the trainer and the envs in worker processes whose working directory is not the one
# the command was started from: relative paths are made absolute here, against the caller's.
_ENV_PATHS = ("workspace_root", "records_dir")
_JUDGE_PATHS = ("cache_path", "prompt_dir")
_TRAINER_PATHS = ("log_path", "ckpt_path", "export_path")


def _absolute(value: str | None) -> str | None:
    return str(Path(value).expanduser().resolve()) if value else value


def absolute_paths(env: EnvConfig) -> EnvConfig:
    changes: dict[str, str | None] = {k: _absolute(getattr(env, k)) for k in _ENV_PATHS}
    if env.system_prompt and env.system_prompt != "protocol":
        changes["system_prompt"] = _absolute(env.system_prompt)
    judge = dataclasses.replace(env.judge, **{k: _absolute(getattr(env.judge, k)) for k in _JUDGE_PATHS})
    executor = env.executor
    if executor.python and "/" in executor.python:  # "python3" is a command, not a path
        executor = dataclasses.replace(executor, python=_absolute(executor.python))
    return dataclasses.replace(env, judge=judge, executor=executor, **changes)


def _absolute_data(source: str) -> str:
    """Local files become absolute; anything else (a hub dataset name) is left alone."""
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() or path.suffix in (".parquet", ".json", ".jsonl") else source
