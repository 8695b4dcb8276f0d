"""How the TRL rollout generates a turn: the trainer's own model through the core's KV-cache
engine (:class:`CachedTurns`, the default), ``generate()`` over whole conversations
(:func:`transformers_turns`, for options the engine lacks and as its reference), or TRL's vLLM
path (:func:`vllm_turns`). Each backend takes contexts and per-context token caps and returns
the generated ids; where a turn stops is decided by ``rollout.split_turn``, not here."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from deepanalyze_env.core import protocol
from deepanalyze_env.core.generation import GenerationEngine, GenRequest, unsupported_options
from deepanalyze_env.core.tag_tokens import token_rules

log = logging.getLogger(__name__)


@dataclass
class Generated:
    """One generated turn: its token ids and, from vLLM, their log-probabilities."""

    ids: list[int]
    logprobs: list[float | None] | None


TurnGenerator = Callable[[Any, list[list[int]], list[int]], list[Generated]]


def tokenizer_of(trainer: Any) -> Any:
    proc = trainer.processing_class
    return getattr(proc, "tokenizer", proc)


@contextmanager
def generation_model(trainer: Any) -> Iterator[Any]:
    """The trainer's model ready to generate (unwrapped, ZeRO-3/FSDP parameters gathered), under
    ``torch.no_grad()``."""
    import torch
    from trl.models import unwrap_model_for_generation

    dist = getattr(trainer, "_dist", None)
    full_params = (
        dist.summon_full_params(trainer.model_wrapped, recurse=False) if dist is not None else nullcontext()
    )
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=getattr(trainer.args, "ds3_gather_for_generation", True),
            generation_kwargs=getattr(trainer, "generation_kwargs", None),
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model,
        torch.no_grad(),
        full_params,
    ):
        yield model


def transformers_turns(trainer: Any, contexts: list[list[int]], max_new: list[int]) -> list[Generated]:
    """One turn for each context with the policy itself, stopping at ``</Code>``/``</Answer>``/EOS:
    one left-padded ``generate`` over the whole conversations (re-read every turn). The default
    transformers backend is :class:`CachedTurns`; this stays for generation options the engine
    does not implement, and as its reference."""
    import torch
    from transformers import StoppingCriteriaList, StopStringCriteria

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
    eos = eos_ids(trainer)
    stop_ids = list(token_rules(tok).stop_ids)
    if stop_ids:  # tags that are special tokens: StopStringCriteria cannot see them in text
        config.eos_token_id = list(dict.fromkeys([*eos, *stop_ids]))
    stop = StoppingCriteriaList([StopStringCriteria(tokenizer=tok, stop_strings=list(protocol.STOP_TAGS))])
    with generation_model(trainer) as model:
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            generation_config=config,
            stopping_criteria=stop,
        )
    ends = set(eos) | set(stop_ids)
    results = []
    for i, row in enumerate(out[:, width:].tolist()):
        ids = []
        for token in row[: max_new[i]]:
            ids.append(token)
            if token in ends:
                break
        results.append(Generated(ids, None))
    return results


class CachedTurns:
    """The transformers backend of one rollout call: :class:`GenerationEngine` keeps each
    episode's keys and values across its turns, so a turn prefills only its new observation.

    Made fresh for every rollout call and closed at its end: the weights change between
    calls, and a cache computed with old weights must never serve a new step. A sampled turn's
    seed is drawn from torch's global generator (seeded by the trainer), so runs repeat.
    Generation options the engine does not implement (``repetition_penalty``, ``sequence_bias``,
    beams…) send every turn to :func:`transformers_turns` instead, with a warning.
    """

    def __init__(self) -> None:
        self.engine: GenerationEngine | None = None
        self.fallback: list[str] | None = None

    def _engine_for(self, trainer: Any) -> GenerationEngine | None:
        if self.fallback is None:
            config = trainer.generation_config
            self.fallback = unsupported_options(config)
            if rank_and_world()[1] > 1 and getattr(trainer.args, "ds3_gather_for_generation", True) is False:
                # ZeRO-3 without gathered weights gathers per forward: ranks must call the model
                # equally often, which generate(synced_gpus) does and the engine does not
                self.fallback.append("ds3_gather_for_generation=False")
            if self.fallback:
                log.warning(
                    "generation options %s are not implemented by the KV-cache engine: "
                    "every turn re-reads its conversation through generate()",
                    ", ".join(self.fallback),
                )
                return None
            sample = bool(getattr(config, "do_sample", False))
            self.engine = GenerationEngine(
                tokenizer_of(trainer),
                eos_ids=eos_ids(trainer),
                stop_ids=token_rules(tokenizer_of(trainer)).stop_ids,
                temperature=float(config.temperature or 1.0) if sample else 0.0,
                top_k=getattr(config, "top_k", None) if sample else None,
                top_p=getattr(config, "top_p", None) if sample else None,
            )
        return self.engine

    def __call__(self, trainer: Any, contexts: list[list[int]], max_new: list[int]) -> list[Generated]:
        import torch

        engine = self._engine_for(trainer)
        if engine is None:
            return transformers_turns(trainer, contexts, max_new)
        seeds = torch.randint(0, 2**31 - 1, (len(contexts),)).tolist()
        requests = [GenRequest(list(c), n, s) for c, n, s in zip(contexts, max_new, seeds, strict=True)]
        with generation_model(trainer) as model:
            outs = engine.generate(model, requests)
        return [Generated(o.ids, None) for o in outs]

    def close(self) -> None:
        if self.engine is not None:
            self.engine.clear()


def vllm_turns(trainer: Any, contexts: list[list[int]], max_new: list[int]) -> list[Generated]:
    """TRL's own vLLM path; ``generation_kwargs`` carry the stop strings and stop ids (the train
    command sets them). The request's ``max_tokens`` is this turn's cap, not the episode budget:
    TRL reads it from ``vllm_generation.max_completion_length`` on both modes, so it is set there
    for the call."""
    engine = trainer.vllm_generation
    saved = engine.max_completion_length
    engine.max_completion_length = max(max_new)
    try:
        completion_ids, logprobs = trainer._generate_single_turn(contexts, None, {}, 1)
    finally:
        engine.max_completion_length = saved
    results = []
    for i, ids in enumerate(completion_ids):
        lps = list(logprobs[i])[: max_new[i]] if logprobs is not None else None
        results.append(Generated(list(ids)[: max_new[i]], lps))
    return results


def default_generator(trainer: Any) -> TurnGenerator:
    """vLLM's path when the trainer uses vLLM, else a fresh :class:`CachedTurns` (one per call)."""
    return vllm_turns if getattr(trainer, "use_vllm", False) else CachedTurns()


def eos_ids(trainer: Any) -> list[int]:
    """The ids that end an episode: the trainer's own list (TRL's ``eos_token_ids``), else the
    tokenizer's EOS."""
    ids = getattr(trainer, "eos_token_ids", None)
    if ids:
        return list(ids)
    tok = tokenizer_of(trainer)
    return [tok.eos_token_id]


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) without one."""
    try:
        import torch.distributed as dist
    except ImportError:
        return 0, 1
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(), dist.get_world_size()
