"""LLM judge: shared per-process client (endpoint / local model / replay), cache, prompts, parsing.

Typical wiring (the env does this): ``client = get_judge_client(env_config.judge)`` once at
construction (validates the config), then per episode ``JudgeSession(client)`` goes into
``RewardContext.judge``; afterwards ``session.summary()`` / ``session.calls`` go to metadata
and the episode record.
"""

from __future__ import annotations

from rewards.judge.cache import JudgeCache, cache_key
from rewards.judge.client import Completion, JudgeClient, get_judge_client
from rewards.judge.errors import (
    JudgeCacheMiss,
    JudgeCallError,
    JudgeConfigError,
    JudgeContextRefused,
    JudgeError,
    JudgeParseError,
    JudgePromptTooLong,
    JudgeReplyCut,
    JudgeVerdictFromPolicy,
)
from rewards.judge.parse import DIMENSIONS, parse_dimensions, parse_score
from rewards.judge.prompts import RUBRICS, prompt_hash, render, validate_prompts
from rewards.judge.session import JudgeSession
from rewards.judge.settings import JudgeSettings

__all__ = [
    "DIMENSIONS",
    "RUBRICS",
    "Completion",
    "JudgeCache",
    "JudgeCacheMiss",
    "JudgeCallError",
    "JudgeClient",
    "JudgeConfigError",
    "JudgeContextRefused",
    "JudgeError",
    "JudgeParseError",
    "JudgePromptTooLong",
    "JudgeReplyCut",
    "JudgeSession",
    "JudgeSettings",
    "JudgeVerdictFromPolicy",
    "cache_key",
    "get_judge_client",
    "parse_dimensions",
    "parse_score",
    "prompt_hash",
    "render",
    "validate_prompts",
]
