"""Run whole episodes outside a trainer: env construction, the step loop, and cleanup."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from deepanalyze_env.env import DeepAnalyzeEnv
from deepanalyze_env.policies import Policy
from deepanalyze_env.tasks import env_extras

log = logging.getLogger(__name__)


@dataclass
class EpisodeResult:
    task_id: str
    label: str | None
    reward: float | None
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    @property
    def status(self) -> str:
        return self.metadata.get("reward_status", "config_error" if self.error else "unfinished")


def run_episode(
    env_config: dict[str, Any], row: dict[str, Any], policy: Policy, label: str | None = None
) -> EpisodeResult:
    start = time.monotonic()
    task_id = str(row.get("task_id", "?"))
    extras = env_extras(row)
    env = DeepAnalyzeEnv(env_config=env_config, extras=extras)
    try:
        messages, _ = env.init(row["prompt"])
        turn = 0
        while True:
            action = policy.act(task_id, label, turn, messages)
            out = env.step(action)
            messages = [*messages, {"role": "assistant", "content": out["postprocessed_action"] or ""}]
            messages.extend(out["observations"])
            turn += 1
            if out["done"]:
                return EpisodeResult(
                    task_id, label, out["reward"], dict(out["metadata"]), seconds=time.monotonic() - start
                )
    finally:
        env.close()
