"""Run whole episodes outside a trainer: jobs with deterministic ids, a policy as the episode
driver's turn source (``core/driver.py``: the one loop, the one mapping of turn ends), a thread pool.

The env writes each finished episode's record on ``close()`` (one ``O_APPEND`` write), so a
run killed at any moment loses only the episodes in flight. An episode the policy could not
finish (teacher endpoint down, Ctrl-C) is closed *without* a record: a half episode is not data,
and leaving it out lets ``--resume`` run it again under the same id, with no duplicate.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.contracts import ChatMessage, FinalMetadata, JsonObject, JsonValue
from deepanalyze_env.core.driver import Turn, play
from deepanalyze_env.core.env import DeepAnalyzeEnv
from deepanalyze_env.core.records import episode_id
from deepanalyze_env.core.tasks import env_extras
from deepanalyze_env.generation.turn_end import text_turn_end
from deepanalyze_env.offline.policies import Policy, PolicyError, PolicyTurn, TurnContext

if TYPE_CHECKING:
    from skyrl_gym.envs.base_text_env import BaseTextEnvStepOutput

log = logging.getLogger(__name__)


class TurnUsage(TypedDict, total=False):
    """One policy turn's usage as the record keeps it (``usage.per_turn``)."""

    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None


class EpisodeUsage(TypedDict, total=False):
    """``record["usage"]`` of an episode this module ran: per turn (None where the policy said
    nothing), and the totals."""

    per_turn: list[TurnUsage | None]
    prompt_tokens: int
    completion_tokens: int


class Interrupted(Exception):
    """The run is stopping (Ctrl-C); the episode was abandoned between turns."""


@dataclass(frozen=True)
class EpisodeJob:
    """One planned episode of a rollout or eval (row, task and sample index, episode id): planned before
    any runs, so resume knows what is missing."""

    row: JsonObject  # the dataset row
    task_index: int
    sample_index: int
    episode_id: str
    label: str | None = None

    @property
    def task_id(self) -> str:
        return str(self.row.get("task_id") or f"task-{self.task_index}")


@dataclass
class EpisodeOutcome:
    """How one planned episode of a rollout or eval ended: its reward and metadata, or why it did not
    finish (config, policy or interruption)."""

    task_id: str
    label: str | None
    reward: float | None
    metadata: FinalMetadata | dict[str, JsonValue] = field(default_factory=dict)  # empty when not finished
    error: str | None = None
    seconds: float = 0.0
    episode_id: str | None = None
    failure: str | None = None  # "config_error" | "policy_error" | "interrupted" when not finished

    @property
    def status(self) -> str:
        if self.failure:
            return self.failure
        return self.metadata.get("reward_status", "unfinished")

    @property
    def finished(self) -> bool:
        return self.failure is None


def plan_jobs(
    rows: Sequence[JsonObject],
    run_id: str,
    samples: int,
    labels_for: Callable[[str], Sequence[str | None]] | None = None,
) -> list[EpisodeJob]:
    """Every (task, sample) of a run, in order. ``labels_for(task_id)`` (scripted policy) makes
    one sample per label and repeat; sample indices count within a task, so ids stay stable."""
    jobs = []
    for t, row in enumerate(rows):
        labels: Sequence[str | None] = labels_for(str(row.get("task_id"))) if labels_for else [None]
        s = 0
        for label in labels:
            for _ in range(samples):
                jobs.append(EpisodeJob(row, t, s, episode_id(run_id, t, s), label))
                s += 1
    return jobs


def _add_usage(total: EpisodeUsage, turn: PolicyTurn) -> None:
    entry: TurnUsage | None = None
    if turn.usage is not None or turn.finish_reason is not None:
        entry = {**(turn.usage or {}), "finish_reason": turn.finish_reason}
    total["per_turn"].append(entry)
    if turn.usage:
        for key in ("prompt_tokens", "completion_tokens"):
            total[key] = total.get(key, 0) + int(turn.usage.get(key, 0))


@dataclass
class PolicyTurns:
    """A policy as the episode driver's turn source (``core/driver.py``): the conversation the
    policy is shown, one :class:`TurnContext` per turn, usage and time kept for the record. A
    turn whose policy did not say how it ended is read from its text (``text_turn_end``)."""

    policy: Policy
    job: EpisodeJob
    messages: list[ChatMessage]
    action_format: str = "tags"
    stop: threading.Event | None = None
    prompt_len: int = 0
    turn: int = 0
    usage: EpisodeUsage = field(default_factory=lambda: EpisodeUsage(per_turn=[]))
    policy_s: float = 0.0
    _last: str = ""

    def __post_init__(self) -> None:
        self.prompt_len = len(self.messages)

    def __call__(self, previous: BaseTextEnvStepOutput | None) -> Turn:
        if previous is not None:  # the last turn as the env kept it, then what it showed
            kept = previous["postprocessed_action"]  # None: the action was kept whole
            self.messages = [
                *self.messages,
                {"role": "assistant", "content": self._last if kept is None else kept},
            ]
            self.messages.extend(previous["observations"])
            self.turn += 1
        if self.stop is not None and self.stop.is_set():
            raise Interrupted()
        job = self.job
        ctx = TurnContext(
            job.episode_id, job.task_id, job.label, self.turn, list(self.messages), self.prompt_len
        )
        t0 = time.monotonic()
        action = self.policy.act(ctx)
        self.policy_s += time.monotonic() - t0
        if isinstance(action, str):
            action = PolicyTurn(action)
        _add_usage(self.usage, action)
        self._last = action.text
        return Turn(action.text, action.end or text_turn_end(action.text, self.action_format))


def run_episode(
    env_config: JsonObject,
    job: EpisodeJob | JsonObject,
    policy: Policy,
    label: str | None = None,
    *,
    stop: threading.Event | None = None,
) -> EpisodeOutcome:
    """One episode from ``init`` to the final step; the record is written by ``env.close()``.

    ``job`` may be a bare dataset row (then the env picks a random episode id).
    """
    if not isinstance(job, EpisodeJob):
        job = EpisodeJob(job, 0, 0, "", label)
    start = time.monotonic()
    extras = env_extras(job.row)
    if job.episode_id:
        extras["episode_id"] = job.episode_id
    config = dict(env_config)
    config.setdefault("policy_id", policy.policy_id + (f":{job.label}" if job.label else ""))
    try:
        env = DeepAnalyzeEnv(env_config=config, extras=extras)
    except ConfigError as exc:
        return EpisodeOutcome(
            job.task_id, job.label, None, error=str(exc), episode_id=job.episode_id, failure="config_error"
        )
    finished = False
    try:
        messages, _ = env.init(job.row["prompt"])
        turns = PolicyTurns(policy, job, messages, env.config.action_format, stop)
        out = play(env, turns)
        finished = True
        if any(u is not None for u in turns.usage["per_turn"]):
            env.extras["usage"] = turns.usage
        env.timings["policy_ms"] = turns.policy_s * 1000.0
        env.timings["episode_ms"] = (time.monotonic() - start) * 1000.0
        return EpisodeOutcome(
            job.task_id,
            job.label,
            out["reward"],
            dict(out["metadata"]),
            seconds=time.monotonic() - start,
            episode_id=job.episode_id,
        )
    except Interrupted:
        return EpisodeOutcome(job.task_id, job.label, None, episode_id=job.episode_id, failure="interrupted")
    except (PolicyError, ConfigError) as exc:
        log.warning("episode %s (%s) dropped: %s", job.episode_id, job.task_id, exc)
        kind = "policy_error" if isinstance(exc, PolicyError) else "config_error"
        return EpisodeOutcome(
            job.task_id, job.label, None, error=str(exc), episode_id=job.episode_id, failure=kind
        )
    except Exception as exc:  # a policy bug must cost one episode, not the run
        log.exception("episode %s (%s) dropped: the policy raised", job.episode_id, job.task_id)
        return EpisodeOutcome(
            job.task_id,
            job.label,
            None,
            error=f"{type(exc).__name__}: {exc}",
            episode_id=job.episode_id,
            failure="policy_error",
        )
    finally:
        env.close(record=finished)


def run_jobs(
    jobs: Iterable[EpisodeJob],
    env_config: JsonObject,
    policy: Policy,
    *,
    concurrency: int = 1,
    on_result: Callable[[EpisodeOutcome], None] | None = None,
    stop: threading.Event | None = None,
) -> list[EpisodeOutcome]:
    """Run ``jobs`` with up to ``concurrency`` episodes in flight; results in completion order.

    Jobs are submitted only as slots free up, so on ``stop`` (or Ctrl-C in the calling thread,
    which sets it) nothing new starts and episodes in flight end at their next turn boundary.
    """
    stop = stop or threading.Event()
    results: list[EpisodeOutcome] = []
    pending = iter(jobs)
    in_flight: set[Future] = set()
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="episode")

    def fill() -> None:
        while len(in_flight) < max(1, concurrency) and not stop.is_set():
            job = next(pending, None)
            if job is None:
                return
            in_flight.add(pool.submit(run_episode, env_config, job, policy, stop=stop))

    try:
        fill()
        while in_flight:
            done, _ = wait(in_flight, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in done:
                in_flight.discard(fut)
                result = fut.result()
                results.append(result)
                if on_result is not None:
                    on_result(result)
            fill()
    except BaseException:
        stop.set()
        for fut in in_flight:
            fut.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return results
