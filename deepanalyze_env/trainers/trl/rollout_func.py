"""TRL adapter: a multi-turn ``rollout_func`` for ``trl.GRPOTrainer`` and the one reward function.

TRL hands ``rollout_func`` the dataset's ``prompt`` values (already repeated ``num_generations``
times); each becomes one full ``DeepAnalyzeEnv`` episode. Token layout (docs/design.md §11):
the completion is the concatenation of the policy's turns, each cut at the token that completes
``</Code>``/``</Answer>``, with the ``<Execute>`` observations appended as raw text tokens that
carry ``env_mask`` 0 (no loss). Rewards are born in the env: the trainer gets exactly one reward
function that returns the env's reward, or None for episodes that must stay out of the gradient.

Generation goes through the trainer's own backends (``turns``): with vLLM, TRL's
``VLLMGeneration`` (stop strings and ids from ``generation_kwargs``); with transformers, the
unwrapped model through the generation layer's KV-cache engine (:class:`CachedTurns`: each
episode's cache is kept across its turns within one rollout call and dropped at its end), because
TRL's transformers path cannot stop on ``</Code>`` (several tokens), would generate to EOS each
turn and re-read every conversation.

How a turn ends (``generation.turn_end.split_turn``, README "Training with TRL"; the episode
driver ``core/driver.py`` turns the end into the env call, as on every other path): at the token
that completes a stop tag (the turn is
stepped; tokens after it are dropped, a token such as ``>\n`` that completes the tag is kept
whole), at the tokenizer's EOS without a tag (the episode ends there, ``termination: "eos"``;
the sampled EOS is its last token), or at a token limit without either: the episode's budget
ends it for ``length`` without a step; ``max_turn_tokens`` alone cuts the turn, which is then
stepped as it stands (SkyRL's per-turn generation limit behaves the same way). Every generated
token fits in ``max_completion_length`` with one token to spare for the EOS a finished episode
ends with.

Several processes generate in lockstep (:func:`lockstep_generate`): TRL's vLLM server mode (and
colocate with tensor parallelism, and transformers generation under ZeRO-3/FSDP) are collectives
that every rank must join with lists of the same length.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict, cast

from deepanalyze_env.core.contracts import (
    FinalMetadata,
    JsonObject,
    RewardStatus,
    Termination,
    VerifierErrorCause,
    trainable,
    verifier_error_rates,
)
from deepanalyze_env.core.driver import Turn, apply_turn
from deepanalyze_env.core.env import DeepAnalyzeEnv
from deepanalyze_env.core.hacking import flag_envs
from deepanalyze_env.core.memory import PeakWatch
from deepanalyze_env.core.tasks import env_extras
from deepanalyze_env.generation.interfaces import Tokenizer
from deepanalyze_env.generation.tag_tokens import token_rules
from deepanalyze_env.generation.tokens import prompt_token_ids
from deepanalyze_env.generation.turn_end import split_turn
from deepanalyze_env.trainers.curriculum import Outcome, group_variance
from deepanalyze_env.trainers.trl.turns import (
    Generated,
    RolloutTrainer,
    TurnGenerator,
    default_generator,
    eos_ids,
    rank_and_world,
    tokenizer_of,
)

log = logging.getLogger(__name__)

TASK_KEY = "task_id"  # carried inside the prompt's first message: TRL passes only prompts


# ---------------------------------------------------------------------------- tokenizer rules


def env_text(tok: Tokenizer, ids: Sequence[int]) -> str:
    """The text the env sees: special tokens dropped except the protocol's tags."""
    drop = token_rules(tok).drop_ids
    return tok.decode([i for i in ids if i not in drop], skip_special_tokens=False)


def encode_observation(tok: Tokenizer, text: str) -> list[int]:
    """Observation tokens as plain text: code that prints ``<|im_end|>`` must not put an EOS id
    into the context. Framing tags that are special tokens in this tokenizer stay those tokens."""
    plain = {"add_special_tokens": False, "split_special_tokens": True}
    framing = token_rules(tok).special_tags & {"<Execute>", "</Execute>"}
    start, end = text.find("<Execute>"), text.rfind("</Execute>")
    if not framing or start < 0 or end < start:
        return list(tok.encode(text, **plain))
    head, body, tail = text[: start + len("<Execute>")], text[start + len("<Execute>") : end], text[end:]
    return (
        list(tok.encode(head, add_special_tokens=False))
        + list(tok.encode(body, **plain))
        + list(tok.encode(tail, add_special_tokens=False))
    )


def lockstep_generate(
    trainer: RolloutTrainer, generate: TurnGenerator, contexts: list[list[int]], caps: list[int]
) -> list[Generated] | None:
    """One generation call per turn on every rank while any rank has an active episode.

    TRL's vLLM server mode gathers every rank's prompts and hands back equal slices, colocate
    with tensor parallelism gathers within its group, and ZeRO-3/FSDP generation runs collectives:
    each needs every rank in every call with lists of one length. So all ranks share their
    requests, split the lot into equal chunks (padded with copies of one request, at most
    ``world - 1`` of them, whose output is dropped), generate their chunk with one shared
    ``max_tokens`` and share the outputs back. Returns this rank's outputs, or None when no rank
    has anything left to generate (every rank then leaves its turn loop at the same call).
    """
    rank, world = rank_and_world()
    if world == 1:
        return generate(trainer, contexts, caps) if contexts else None
    import torch.distributed as dist

    shared: list[tuple[list[list[int]], list[int]]] = [([], [])] * world
    dist.all_gather_object(shared, (contexts, caps))
    every = [c for ctxs, _ in shared for c in ctxs]
    if not every:
        return None
    cap = max(c for _, cs in shared for c in cs)
    per = -(-len(every) // world)
    padded = every + [every[0]] * (per * world - len(every))
    mine = padded[rank * per : (rank + 1) * per]
    outs = generate(trainer, mine, [cap] * len(mine))
    if len(outs) != len(mine):
        raise RuntimeError(f"generator returned {len(outs)} turns for {len(mine)} requests")
    gathered: list[list[Generated]] = [[] for _ in range(world)]
    dist.all_gather_object(gathered, outs)
    flat = [o for part in gathered for o in part]
    start = sum(len(ctxs) for ctxs, _ in shared[:rank])
    return flat[start : start + len(contexts)]


def gather_outcomes(outcomes: list[Outcome]) -> list[Outcome]:
    """Every process's episode outcomes, in rank order (a GRPO group may span processes, and
    each process's curriculum must see the same evidence to draw the same tasks)."""
    _, world = rank_and_world()
    if world == 1:
        return outcomes
    import torch.distributed as dist

    gathered: list[list[Outcome]] = [[] for _ in range(world)]
    dist.all_gather_object(gathered, outcomes)
    return [o for part in gathered for o in part]


# ---------------------------------------------------------------------------- token bookkeeping


@dataclass
class _Episode:
    row: JsonObject
    env: DeepAnalyzeEnv
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    has_logprobs: bool = True
    final: FinalMetadata | None = None  # set when the episode has ended
    reward: float = 0.0  # the env's reward, once ``final`` is set

    @property
    def ended(self) -> FinalMetadata:
        if self.final is None:
            raise RuntimeError("the episode has not ended")
        return self.final

    def end(self, reward: float, metadata: dict[str, object]) -> None:
        self.reward = float(reward)
        self.final = cast(FinalMetadata, metadata)  # a done step's metadata is FinalMetadata

    def add(self, ids: Sequence[int], mask: int, logprobs: Sequence[float | None] | None) -> None:
        self.completion_ids.extend(ids)
        self.env_mask.extend([mask] * len(ids))
        if logprobs is None or len(logprobs) != len(ids):
            self.has_logprobs = self.has_logprobs and mask == 0
            self.logprobs.extend([0.0] * len(ids))
        else:  # vLLM reports a NaN logprob as None; TRL neutralises NaN in its importance ratio
            self.logprobs.extend(math.nan if x is None else float(x) for x in logprobs)


# ---------------------------------------------------------------------------- the rollout function


class EndedAs(TypedDict):
    """An episode's status and, for ``verifier_error``, its cause: what ``verifier_error_rates`` reads."""

    reward_status: str
    reward_error_cause: VerifierErrorCause | None


def ended_as(statuses: Sequence[str], causes: Sequence[VerifierErrorCause | None] | None) -> list[EndedAs]:
    """Per-episode statuses and causes (causes None: a caller without them, every cause None)."""
    causes = list(causes) if causes is not None else [None] * len(statuses)
    return [{"reward_status": s, "reward_error_cause": c} for s, c in zip(statuses, causes, strict=True)]


@dataclass
class RolloutStats:
    """What happened since the last ``drain()``: for logging per training step.

    Besides rewards and counts it holds where the rollout's time went (``generate_seconds``: the
    policy generating turns; ``env_seconds``: stepping the envs — code cells and the final
    scoring; ``scoring_seconds``: the reward computation alone, summed over episodes, so it may
    exceed its share of the wall time when episodes score in parallel) and whether the step can
    teach: ``groups`` / ``zero_variance_groups`` (``trainers.curriculum.group_variance``) and
    ``length_cut`` episodes.
    """

    rewards: list[float] = field(default_factory=list)
    components: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: Counter[str] = field(default_factory=Counter)
    terminations: Counter[str] = field(default_factory=Counter)
    ended: list[EndedAs] = field(default_factory=list)  # per episode, for ``verifier_error_rates``
    episodes: int = 0
    seconds: float = 0.0
    generate_seconds: float = 0.0
    env_seconds: float = 0.0
    scoring_seconds: float = 0.0
    groups: int = 0
    zero_variance_groups: int = 0
    suspects: list[tuple[str, list[str]]] = field(default_factory=list)  # core/hacking.py: (id, reasons)


class RolloutOutput(TypedDict):
    """What ``rollout_func`` returns to ``GRPOTrainer``: its three required keys, then the extra
    fields TRL hands to the reward function (and the environment's mask of policy tokens)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float]] | None
    env_mask: NotRequired[list[list[int]]]
    env_reward: list[float | None]
    reward_components: list[dict[str, float]]
    reward_status: list[RewardStatus]
    reward_error_cause: list[VerifierErrorCause | None]
    termination: list[Termination]
    episode_id: NotRequired[list[str]]


MetricLogger = Callable[[str, float], None]
"""TRL's ``log_metric`` for a reward function: one named scalar per call."""


class DeepAnalyzeRollout:
    """``rollout_func(prompts, trainer)`` running one env episode per prompt.

    ``rows`` are dataset rows (docs/design.md §4) keyed by their ``task_id``; prompts built with
    :func:`trl_prompt` carry that id, so two tasks with identical text are never confused.
    """

    def __init__(
        self,
        rows: Sequence[JsonObject],
        env_config: JsonObject,
        *,
        max_completion_length: int | None = None,
        max_turn_tokens: int | None = None,
        score_truncated: bool = False,
        generator: TurnGenerator | None = None,
        env_workers: int = 8,
        run_id: str | None = None,
    ):
        self.rows = {str(r["task_id"]): r for r in rows}
        if len(self.rows) != len(rows):
            raise ValueError("dataset rows must have unique task_id values")
        self.env_config = dict(env_config)
        self.max_completion_length = max_completion_length
        self.max_turn_tokens = max_turn_tokens
        self.score_truncated = score_truncated
        self.generator = generator
        self.env_workers = env_workers
        self.run_id = run_id or uuid.uuid4().hex[:8]
        self.stats = RolloutStats()
        self._calls = 0
        # Called with every process's finished episodes after each call (the curriculum's feed).
        self.listeners: list[Callable[[list[Outcome]], None]] = []
        # The trainer's memory watch: a call is the step's "rollout" phase, what follows its "update".
        self.memory: PeakWatch | None = None
        for row in self.rows.values():  # fail on a bad row or config now, not mid-training
            DeepAnalyzeEnv(env_config=self.env_config, extras=env_extras(row))

    def drain(self) -> RolloutStats:
        stats, self.stats = self.stats, RolloutStats()
        return stats

    def __call__(self, prompts: list[list[JsonObject]], trainer: RolloutTrainer) -> RolloutOutput:
        if self.memory is not None:
            self.memory.phase("rollout")
        try:
            return self._rollout(prompts, trainer)
        finally:
            if self.memory is not None:
                self.memory.phase("update")

    def _rollout(self, prompts: list[list[JsonObject]], trainer: RolloutTrainer) -> RolloutOutput:
        start = time.monotonic()
        self._calls += 1
        tok = tokenizer_of(trainer)
        token_rules(tok)  # a tokenizer whose stop tags cannot end a turn fails here, before any episode
        budget = self.max_completion_length or trainer.args.max_completion_length
        generate = self.generator or default_generator(trainer)
        eos = eos_ids(trainer)
        template_kwargs: dict[str, object] = dict(getattr(trainer, "chat_template_kwargs", None) or {})
        episodes: list[_Episode] = []
        try:
            for i, prompt in enumerate(prompts):
                episodes.append(self._start(prompt, tok, i, template_kwargs))
            with ThreadPoolExecutor(max_workers=max(1, min(self.env_workers, len(episodes) or 1))) as pool:
                while True:
                    active: list[_Episode] = []
                    for ep in episodes:
                        if ep.final is None and self._room(ep, budget) <= 0:
                            self._end_for_length(ep)
                        elif ep.final is None:
                            active.append(ep)
                    caps = [min(self._room(ep, budget), self.max_turn_tokens or budget) for ep in active]
                    contexts = [ep.prompt_ids + ep.completion_ids for ep in active]
                    started = time.monotonic()
                    outs = lockstep_generate(trainer, generate, contexts, caps)
                    self.stats.generate_seconds += time.monotonic() - started
                    if outs is None:  # no episode left on any process
                        break
                    if len(outs) != len(active):
                        raise RuntimeError(f"generator returned {len(outs)} turns for {len(active)} episodes")
                    started = time.monotonic()
                    steps = [
                        pool.submit(self._advance, ep, out, cap, tok, budget, set(eos))
                        for ep, out, cap in zip(active, outs, caps, strict=True)
                    ]
                    for fut in steps:
                        fut.result()
                    self.stats.env_seconds += time.monotonic() - started
            close = getattr(generate, "close", None)
            if close is not None:  # the weights change before the next call: drop its cache
                close()
            for ep in episodes:
                finished = ep.ended["termination"] != "length" or self.score_truncated
                if finished and (not ep.completion_ids or ep.completion_ids[-1] not in eos):
                    ep.add([eos[0]], 0, None)  # a finished episode ends with EOS (TRL's truncation check)
        except BaseException:  # a failed batch leaves no kernel or scratch folder, and no half records
            close = getattr(generate, "close", None)
            if close is not None:
                close()
            for ep in episodes:
                ep.env.close(record=False)
            raise
        for ep in episodes:
            ep.env.close()
        result = self._collect(episodes)
        if self.listeners:
            outcomes = gather_outcomes([self._outcome(ep) for ep in episodes])
            for listener in self.listeners:
                listener(outcomes)
        self.stats.seconds += time.monotonic() - start
        return result

    # -- per episode

    @staticmethod
    def _room(ep: _Episode, budget: int) -> int:
        """Tokens the next turn may take: the budget less what is used and one for the final EOS."""
        return budget - len(ep.completion_ids) - 1

    def _start(
        self, prompt: list[JsonObject], tok: Tokenizer, index: int, template_kwargs: dict[str, object]
    ) -> _Episode:
        if not isinstance(prompt, list) or not prompt or TASK_KEY not in prompt[0]:
            raise ValueError(
                "rollout_func needs conversational prompts whose first message carries 'task_id' "
                "(build the dataset with deepanalyze_env.trainers.trl.rollout_func.trl_dataset_rows)"
            )
        task_id = str(prompt[0][TASK_KEY])
        row = self.rows.get(task_id)
        if row is None:
            raise ValueError(f"prompt names task_id {task_id!r}, which is not in the rollout's rows")
        extras = env_extras(row)
        extras["episode_id"] = f"{self.run_id}-{self._calls}-{index}"
        env = DeepAnalyzeEnv(env_config=self.env_config, extras=extras)
        messages = [{k: v for k, v in m.items() if k != TASK_KEY} for m in prompt]
        messages, _ = env.init(messages)
        return _Episode(row=row, env=env, prompt_ids=prompt_token_ids(tok, messages, **template_kwargs))

    def _advance(
        self, ep: _Episode, out: Generated, cap: int, tok: Tokenizer, budget: int, eos: set[int]
    ) -> None:
        ids = list(out.ids[:cap])
        logprobs = list(out.logprobs[:cap]) if out.logprobs is not None else None
        keep, end = split_turn(tok, ids, eos)
        out_of_room = cap >= self._room(ep, budget)  # this turn's limit was the episode's budget
        ep.add(ids[:keep], 1, logprobs[:keep] if logprobs is not None else None)
        # The episode driver maps the end to the env call: an action cut by the budget is never
        # stepped; one cut by max_turn_tokens alone is stepped as it stands (a no-code turn unless
        # it holds an answer), as SkyRL's generator does with its per-turn generation limit.
        turn = Turn(env_text(tok, ids[:keep]), end, out_of_budget=end == "length" and out_of_room)
        step = apply_turn(ep.env, turn)
        if step["done"]:
            ep.end(step["reward"], step["metadata"])
            return
        obs_ids = encode_observation(tok, "".join(o["content"] for o in step["observations"]))
        room = self._room(ep, budget)
        ep.add(obs_ids[: max(room, 0)], 0, None)
        if len(obs_ids) >= room:
            self._end_for_length(ep)

    @staticmethod
    def _end_for_length(ep: _Episode) -> None:
        step = ep.env.end_for_length()
        ep.end(step["reward"], step["metadata"])

    # -- batch output

    def _trains(self, ep: _Episode) -> bool:
        meta = ep.ended
        return trainable(meta["reward_status"], meta["termination"], score_truncated=self.score_truncated)

    def _outcome(self, ep: _Episode) -> Outcome:
        meta = ep.ended
        return {
            "task_id": str(ep.row["task_id"]),
            "reward": ep.reward if self._trains(ep) else None,
            "reward_status": meta["reward_status"],
            "termination": meta["termination"],
            "reward_components": dict(meta["reward_components"]),
        }

    def _collect(self, episodes: list[_Episode]) -> RolloutOutput:
        rewards: list[float | None] = []
        groups: dict[str, list[float]] = defaultdict(list)
        for ep in episodes:
            meta = ep.ended
            trains = self._trains(ep)
            rewards.append(ep.reward if trains else None)
            self.stats.episodes += 1
            self.stats.statuses[meta["reward_status"]] += 1
            self.stats.ended += ended_as([meta["reward_status"]], [meta.get("reward_error_cause")])
            self.stats.terminations[meta["termination"]] += 1
            self.stats.scoring_seconds += float(ep.env.timings.get("reward_ms", 0.0)) / 1000.0
            if trains:
                self.stats.rewards.append(ep.reward)
                groups[str(ep.row["task_id"])].append(ep.reward)
            for name, value in meta["reward_components"].items():
                self.stats.components[name].append(value)
        self.stats.suspects += flag_envs(ep.env for ep in episodes)
        counted, zero = group_variance(groups.values())
        self.stats.groups += counted
        self.stats.zero_variance_groups += zero
        use_logprobs = all(ep.has_logprobs for ep in episodes)
        # An episode without a reward trains nothing: an all-zero mask also keeps its tokens out of
        # the loss normaliser (DAPO's num_items_in_batch), which would otherwise shrink every step.
        masks = [
            ep.env_mask if reward is not None else [0] * len(ep.env_mask)
            for ep, reward in zip(episodes, rewards, strict=True)
        ]
        return {
            "prompt_ids": [ep.prompt_ids for ep in episodes],
            "completion_ids": [ep.completion_ids for ep in episodes],
            "logprobs": [ep.logprobs for ep in episodes] if use_logprobs else None,
            "env_mask": masks,
            "env_reward": rewards,
            "reward_components": [dict(ep.ended["reward_components"]) for ep in episodes],
            "reward_status": [ep.ended["reward_status"] for ep in episodes],
            "reward_error_cause": [ep.ended.get("reward_error_cause") for ep in episodes],
            "termination": [ep.ended["termination"] for ep in episodes],
            "episode_id": [str(ep.env.extras["episode_id"]) for ep in episodes],
        }


def environment_reward(
    completions: Sequence[object],
    env_reward: list[float | None],
    reward_components: list[dict[str, float]],
    reward_status: list[str],
    termination: list[str],
    log_metric: MetricLogger | None = None,
    reward_error_cause: list[VerifierErrorCause | None] | None = None,
    **_: object,
) -> list[float | None]:
    """The one reward function: the env's reward, None where the episode is kept out of training.

    Components are logged with ``log_metric`` rather than returned as extra reward functions,
    because TRL drops a row from its group baseline only when *every* function returns None.
    """
    if log_metric is not None:
        log_episode_metrics(log_metric, reward_components, reward_status, termination, reward_error_cause)
    return [None if r is None or (isinstance(r, float) and math.isnan(r)) else float(r) for r in env_reward]


def log_episode_metrics(
    log_metric: MetricLogger,
    components: Sequence[dict[str, float]],
    statuses: Sequence[str],
    terminations: Sequence[str],
    causes: Sequence[VerifierErrorCause | None] | None = None,
) -> None:
    """TRL's logs for a batch of episodes, on both TRL paths: each component's mean as
    ``reward_components/<name>`` (over the episodes that have it), ``reward_status/<status>``
    and ``termination/<termination>`` counts, and ``verifier_error/<cause>``, the share of the
    batch excluded for each cause (every cause, 0.0 when none: a rising line is a policy learning
    to be excluded)."""
    per_component: dict[str, list[float]] = defaultdict(list)
    for comps in components:
        for name, value in comps.items():
            per_component[name].append(value)
    for name, values in per_component.items():
        log_metric(f"reward_components/{name}", sum(values) / len(values))
    for status, count in Counter(statuses).items():
        log_metric(f"reward_status/{status}", float(count))
    for term, count in Counter(terminations).items():
        log_metric(f"termination/{term}", float(count))
    for cause, rate in verifier_error_rates(ended_as(statuses, causes)).items():
        log_metric(f"verifier_error/{cause}", rate)


def trl_prompt(row: JsonObject) -> list[JsonObject]:
    """The row's prompt messages with its task id carried in the first message."""
    messages = [dict(cast(JsonObject, m)) for m in cast(list[JsonObject], row["prompt"])]
    messages[0][TASK_KEY] = str(row["task_id"])
    return messages


def trl_dataset_rows(rows: Sequence[JsonObject]) -> list[dict[str, list[JsonObject]]]:
    """Rows for ``datasets.Dataset.from_list``: just the prompt (the rollout holds the rest)."""
    return [{"prompt": trl_prompt(r)} for r in rows]
