"""TRL adapter: a multi-turn ``rollout_func`` for ``trl.GRPOTrainer`` and the one reward function.

TRL hands ``rollout_func`` the dataset's ``prompt`` values (already repeated ``num_generations``
times); each becomes one full ``DeepAnalyzeEnv`` episode. Token layout (DESIGN "Token layout"):
the completion is the concatenation of the policy's turns, each cut at the token that completes
``</Code>``/``</Answer>``, with the ``<Execute>`` observations appended as raw text tokens that
carry ``env_mask`` 0 (no loss). Rewards are born in the env: the trainer gets exactly one reward
function that returns the env's reward, or None for episodes that must stay out of the gradient.

Generation goes through the trainer's own backends: with vLLM, ``trainer._generate_single_turn``
(TRL's path, which also keeps vLLM weights in sync; stop strings come from
``generation_kwargs``); with transformers, the unwrapped model's ``generate`` with a stop-string
criterion, because TRL's transformers path cannot stop on ``</Code>`` (several tokens) and would
generate to EOS each turn.
"""

from __future__ import annotations

import copy
import logging
import math
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from deepanalyze_env import protocol
from deepanalyze_env.env import DeepAnalyzeEnv
from deepanalyze_env.tasks import env_extras

log = logging.getLogger(__name__)

TASK_KEY = "task_id"  # carried inside the prompt's first message: TRL passes only prompts


@dataclass
class Generated:
    ids: list[int]
    logprobs: list[float] | None


TurnGenerator = Callable[[Any, list[list[int]], list[int]], list[Generated]]


def tokenizer_of(trainer: Any) -> Any:
    proc = trainer.processing_class
    return getattr(proc, "tokenizer", proc)


# ---------------------------------------------------------------------------- generation backends


def transformers_turns(trainer: Any, contexts: list[list[int]], max_new: list[int]) -> list[Generated]:
    """One turn for each context with the policy itself, stopping at ``</Code>``/``</Answer>``/EOS."""
    import torch
    from transformers import StoppingCriteriaList, StopStringCriteria
    from trl.models import unwrap_model_for_generation

    tok = tokenizer_of(trainer)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(len(c) for c in contexts)
    input_ids = torch.full((len(contexts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(contexts), width), dtype=torch.long)
    for i, ctx in enumerate(contexts):
        input_ids[i, width - len(ctx) :] = torch.tensor(ctx, dtype=torch.long)
        attention[i, width - len(ctx) :] = 1
    device = trainer.accelerator.device
    config = copy.deepcopy(trainer.generation_config)
    config.max_new_tokens = max(max_new)
    config.use_cache = True  # training may have turned the cache off (gradient checkpointing)
    stop = StoppingCriteriaList([StopStringCriteria(tokenizer=tok, stop_strings=list(protocol.STOP_TAGS))])
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            generation_kwargs=getattr(trainer, "generation_kwargs", None),
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model,
        torch.no_grad(),
    ):
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            generation_config=config,
            stopping_criteria=stop,
        )
    eos = set(_eos_ids(trainer))
    results = []
    for i, row in enumerate(out[:, width:].tolist()):
        ids = []
        for token in row[: max_new[i]]:
            ids.append(token)
            if token in eos:
                break
        results.append(Generated(ids, None))
    return results


def vllm_turns(trainer: Any, contexts: list[list[int]], max_new: list[int]) -> list[Generated]:
    """TRL's own vLLM path; ``generation_kwargs`` must carry the stop strings (the recipes set them)."""
    completion_ids, logprobs = trainer._generate_single_turn(contexts, None, {}, 1)
    results = []
    for i, ids in enumerate(completion_ids):
        lps = list(logprobs[i])[: max_new[i]] if logprobs is not None else None
        results.append(Generated(list(ids)[: max_new[i]], lps))
    return results


def default_generator(trainer: Any) -> TurnGenerator:
    return vllm_turns if getattr(trainer, "use_vllm", False) else transformers_turns


def _eos_ids(trainer: Any) -> list[int]:
    ids = getattr(trainer, "eos_token_ids", None)
    if ids:
        return list(ids)
    tok = tokenizer_of(trainer)
    return [tok.eos_token_id]


# ---------------------------------------------------------------------------- token bookkeeping


def cut_at_stop(tokenizer: Any, ids: list[int]) -> int:
    """Number of tokens to keep: up to and including the token that completes a stop tag."""
    if not any(tag in tokenizer.decode(ids, skip_special_tokens=False) for tag in protocol.STOP_TAGS):
        return len(ids)
    lo, hi = 1, len(ids)
    while lo < hi:  # smallest prefix whose text holds a stop tag (monotone in the prefix length)
        mid = (lo + hi) // 2
        text = tokenizer.decode(ids[:mid], skip_special_tokens=False)
        if any(tag in text for tag in protocol.STOP_TAGS):
            hi = mid
        else:
            lo = mid + 1
    return lo


def prompt_token_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """The prompt as every trainer sees it: the chat template with the generation prompt."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def plain_token_ids(tokenizer: Any, text: str) -> list[int]:
    """Text as plain tokens: a cell that prints a special token's text (``<|im_end|>``) must not
    inject that token into the sequence (observations here; recorded turns in SFT)."""
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))


@dataclass
class _Episode:
    row: dict[str, Any]
    env: DeepAnalyzeEnv
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    has_logprobs: bool = True
    final: dict[str, Any] | None = None

    def add(self, ids: Sequence[int], mask: int, logprobs: Sequence[float] | None) -> None:
        self.completion_ids.extend(ids)
        self.env_mask.extend([mask] * len(ids))
        if logprobs is None or len(logprobs) != len(ids):
            self.has_logprobs = self.has_logprobs and mask == 0
            self.logprobs.extend([0.0] * len(ids))
        else:
            self.logprobs.extend(float(x) for x in logprobs)


# ---------------------------------------------------------------------------- the rollout function


@dataclass
class RolloutStats:
    """What happened since the last ``drain()``: for logging per training step."""

    rewards: list[float] = field(default_factory=list)
    components: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: Counter = field(default_factory=Counter)
    terminations: Counter = field(default_factory=Counter)
    episodes: int = 0
    seconds: float = 0.0


class DeepAnalyzeRollout:
    """``rollout_func(prompts, trainer)`` running one env episode per prompt.

    ``rows`` are dataset rows (DESIGN contract 1) keyed by their ``task_id``; prompts built with
    :func:`trl_prompt` carry that id, so two tasks with identical text are never confused.
    """

    def __init__(
        self,
        rows: Sequence[dict[str, Any]],
        env_config: dict[str, Any],
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
        for row in self.rows.values():  # fail on a bad row or config now, not mid-training
            DeepAnalyzeEnv(env_config=self.env_config, extras=env_extras(row))

    def drain(self) -> RolloutStats:
        stats, self.stats = self.stats, RolloutStats()
        return stats

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        import time

        start = time.monotonic()
        self._calls += 1
        tok = tokenizer_of(trainer)
        budget = self.max_completion_length or trainer.args.max_completion_length
        generate = self.generator or default_generator(trainer)
        episodes = [self._start(prompt, tok, i) for i, prompt in enumerate(prompts)]
        eos = _eos_ids(trainer)[0]
        with ThreadPoolExecutor(max_workers=max(1, min(self.env_workers, len(episodes)))) as pool:
            while True:
                active = [ep for ep in episodes if ep.final is None]
                if not active:
                    break
                room = [budget - len(ep.completion_ids) for ep in active]
                for ep, left in zip(active, room, strict=True):
                    if left <= 0:
                        ep.final = self._end_for_length(ep)
                active = [ep for ep, left in zip(active, room, strict=True) if left > 0]
                if not active:
                    break
                caps = [min(left, self.max_turn_tokens or left) for left in room if left > 0]
                outs = generate(trainer, [ep.prompt_ids + ep.completion_ids for ep in active], caps)
                if len(outs) != len(active):
                    raise RuntimeError(f"generator returned {len(outs)} turns for {len(active)} episodes")
                steps = [
                    pool.submit(self._advance, ep, out, tok, budget)
                    for ep, out in zip(active, outs, strict=True)
                ]
                for fut in steps:
                    fut.result()
        for ep in episodes:
            if ep.final["termination"] != "length" or self.score_truncated:
                ep.add([eos], 0, None)  # a finished episode ends with EOS (TRL's truncation check)
            ep.env.close()
        result = self._collect(episodes)
        self.stats.seconds += time.monotonic() - start
        return result

    # -- per episode

    def _start(self, prompt: Any, tok: Any, index: int) -> _Episode:
        if not isinstance(prompt, list) or not prompt or TASK_KEY not in prompt[0]:
            raise ValueError(
                "rollout_func needs conversational prompts whose first message carries 'task_id' "
                "(build the dataset with deepanalyze_env.trl_rollout.trl_dataset_rows)"
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
        return _Episode(row=row, env=env, prompt_ids=prompt_token_ids(tok, messages))

    def _advance(self, ep: _Episode, out: Generated, tok: Any, budget: int) -> None:
        keep = cut_at_stop(tok, out.ids)
        ids = out.ids[:keep]
        ep.add(ids, 1, out.logprobs[:keep] if out.logprobs is not None else None)
        step = ep.env.step(tok.decode(ids, skip_special_tokens=True))
        if step["done"]:
            ep.final = {"reward": step["reward"], **step["metadata"]}
            return
        obs_ids = plain_token_ids(tok, "".join(o["content"] for o in step["observations"]))
        room = budget - len(ep.completion_ids)
        ep.add(obs_ids[: max(room, 0)], 0, None)
        if len(obs_ids) >= room:
            ep.final = self._end_for_length(ep)

    def _end_for_length(self, ep: _Episode) -> dict[str, Any]:
        step = ep.env.end_for_length()
        return {"reward": step["reward"], **step["metadata"]}

    # -- batch output

    def _collect(self, episodes: list[_Episode]) -> dict[str, Any]:
        rewards: list[float | None] = []
        for ep in episodes:
            meta = ep.final
            trainable = meta["reward_status"] == "scored" and (
                meta["termination"] != "length" or self.score_truncated
            )
            rewards.append(float(meta["reward"]) if trainable else None)
            self.stats.episodes += 1
            self.stats.statuses[meta["reward_status"]] += 1
            self.stats.terminations[meta["termination"]] += 1
            if trainable:
                self.stats.rewards.append(float(meta["reward"]))
            for name, value in meta["reward_components"].items():
                self.stats.components[name].append(value)
        use_logprobs = all(ep.has_logprobs for ep in episodes)
        return {
            "prompt_ids": [ep.prompt_ids for ep in episodes],
            "completion_ids": [ep.completion_ids for ep in episodes],
            "logprobs": [ep.logprobs for ep in episodes] if use_logprobs else None,
            "env_mask": [ep.env_mask for ep in episodes],
            "env_reward": rewards,
            "reward_components": [dict(ep.final["reward_components"]) for ep in episodes],
            "reward_status": [ep.final["reward_status"] for ep in episodes],
            "termination": [ep.final["termination"] for ep in episodes],
            "episode_id": [ep.env.extras["episode_id"] for ep in episodes],
        }


def environment_reward(
    completions: list[Any],
    env_reward: list[float | None],
    reward_components: list[dict[str, float]],
    reward_status: list[str],
    termination: list[str],
    log_metric: Callable | None = None,
    **_: Any,
) -> list[float | None]:
    """The one reward function: the env's reward, None where the episode is kept out of training.

    Components are logged with ``log_metric`` rather than returned as extra reward functions,
    because TRL drops a row from its group baseline only when *every* function returns None.
    """
    if log_metric is not None:
        per_component: dict[str, list[float]] = defaultdict(list)
        for comps in reward_components:
            for name, value in comps.items():
                per_component[name].append(value)
        for name, values in per_component.items():
            log_metric(f"reward_components/{name}", sum(values) / len(values))
        for status, count in Counter(reward_status).items():
            log_metric(f"reward_status/{status}", float(count))
        for term, count in Counter(termination).items():
            log_metric(f"termination/{term}", float(count))
    return [None if r is None or (isinstance(r, float) and math.isnan(r)) else float(r) for r in env_reward]


def trl_prompt(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The row's prompt messages with its task id carried in the first message."""
    messages = [dict(m) for m in row["prompt"]]
    messages[0][TASK_KEY] = str(row["task_id"])
    return messages


def trl_dataset_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows for ``datasets.Dataset.from_list``: just the prompt (the rollout holds the rest)."""
    return [{"prompt": trl_prompt(r)} for r in rows]
