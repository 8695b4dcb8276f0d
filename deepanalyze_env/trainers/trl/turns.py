"""How the TRL rollout generates a turn: the trainer's own model through the generation layer's
KV-cache engine (:class:`CachedTurns`, the default), ``generate()`` over whole conversations
(:func:`transformers_turns`, for options the engine lacks and as its reference), or TRL's vLLM
backend (:func:`vllm_turns`). Each backend takes contexts and per-context token caps and returns
the generated ids; where a turn stops is decided by ``generation.turn_end`` (the engine stops on
it, ``generate`` and vLLM are configured from its ``turn_stops``, and the rollout cuts every turn
with its ``split_turn``), not here."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from deepanalyze_env.generation.engine import GenerationEngine, GenRequest, unsupported_options
from deepanalyze_env.generation.interfaces import CausalLM, Tokenizer
from deepanalyze_env.generation.turn_end import turn_stops

if TYPE_CHECKING:
    from accelerate import Accelerator
    from transformers import GenerationConfig

log = logging.getLogger(__name__)


@dataclass
class Generated:
    """One generated turn: its token ids and, from vLLM, their log-probabilities."""

    ids: list[int]
    logprobs: list[float | None] | None


class TrainerArgs(Protocol):
    """The ``GRPOConfig`` fields the rollout reads."""

    max_completion_length: int
    gradient_checkpointing_kwargs: dict[str, object] | None


class RolloutTrainer(Protocol):
    """The slice of ``trl.GRPOTrainer`` the rollout reads (tests pass a namespace holding it).
    Optional attributes (``eos_token_ids``, ``use_vllm``, ``vllm_generation``,
    ``chat_template_kwargs``, the model for the transformers backends) are read with ``getattr``
    where a path needs them."""

    processing_class: object  # a tokenizer, or a processor that holds one
    args: TrainerArgs


class ModelTrainer(RolloutTrainer, Protocol):
    """A trainer whose own model generates (the transformers backends)."""

    model_wrapped: object
    accelerator: Accelerator
    generation_config: GenerationConfig


class VLLMBackend(Protocol):
    """TRL's ``VLLMGeneration`` (``trl.generation``), as :func:`vllm_turns` calls it."""

    max_completion_length: int

    def generate(
        self, prompts: list[list[int]], images: None, num_generations: int
    ) -> tuple[object, list[list[int]], list[list[list[float | None]]] | None, object]: ...


class VLLMTrainer(RolloutTrainer, Protocol):
    """A trainer with ``use_vllm``: its vLLM backend generates."""

    vllm_generation: VLLMBackend


TurnGenerator = Callable[[RolloutTrainer, list[list[int]], list[int]], list[Generated]]


def tokenizer_of(trainer: RolloutTrainer) -> Tokenizer:
    proc = trainer.processing_class
    tok: Tokenizer = getattr(proc, "tokenizer", proc)
    return tok


@contextmanager
def generation_model(trainer: ModelTrainer) -> Iterator[CausalLM]:
    """The trainer's model ready to generate (unwrapped, ZeRO-3/FSDP parameters gathered), under
    ``torch.no_grad()``."""
    import torch
    from trl.models import unwrap_model_for_generation

    t = trainer
    dist = getattr(t, "_dist", None)  # GRPOTrainer's FSDP handle, when it has one
    full_params = (
        dist.summon_full_params(t.model_wrapped, recurse=False) if dist is not None else nullcontext()
    )
    with (
        unwrap_model_for_generation(
            t.model_wrapped,
            t.accelerator,
            gather_deepspeed3_params=getattr(t.args, "ds3_gather_for_generation", True),
            generation_kwargs=getattr(t, "generation_kwargs", None),
            gradient_checkpointing_kwargs=t.args.gradient_checkpointing_kwargs,
        ) as model,
        torch.no_grad(),
        full_params,
    ):
        yield model


def transformers_turns(
    trainer: ModelTrainer, contexts: list[list[int]], max_new: list[int]
) -> list[Generated]:
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
    stops = turn_stops(tok)
    if stops.token_ids:  # tags that are special tokens: StopStringCriteria cannot see them in text
        config.eos_token_id = list(dict.fromkeys([*eos, *stops.token_ids]))
    stop = StoppingCriteriaList([StopStringCriteria(tokenizer=tok, stop_strings=list(stops.strings))])
    with generation_model(trainer) as model:
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            generation_config=config,
            stopping_criteria=stop,
        )
    ends = set(eos) | set(stops.token_ids)
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

    def _engine_for(self, trainer: ModelTrainer) -> GenerationEngine | None:
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
            tok = tokenizer_of(trainer)
            self.engine = GenerationEngine(
                tok,
                eos_ids=eos_ids(trainer),
                stop_ids=turn_stops(tok).token_ids,
                temperature=float(config.temperature or 1.0) if sample else 0.0,
                top_k=getattr(config, "top_k", None) if sample else None,
                top_p=getattr(config, "top_p", None) if sample else None,
            )
        return self.engine

    def __call__(
        self, trainer: ModelTrainer, contexts: list[list[int]], max_new: list[int]
    ) -> list[Generated]:
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


def vllm_turns(trainer: VLLMTrainer, contexts: list[list[int]], max_new: list[int]) -> list[Generated]:
    """TRL's vLLM backend (``trainer.vllm_generation``, TRL's public ``VLLMGeneration``), one
    sample per context; ``generation_kwargs`` carry the stop strings and stop ids (the train
    command sets them from ``turn_stops``). The request's ``max_tokens`` is this turn's cap, not
    the episode budget: ``VLLMGeneration.generate`` reads it from its ``max_completion_length`` on
    both modes, so it is set there for the call. Weights are in sync: ``GRPOTrainer`` pushes them
    to vLLM before it calls a ``rollout_func`` (docs/design.md §14)."""
    engine = trainer.vllm_generation
    saved = engine.max_completion_length
    engine.max_completion_length = max(max_new)
    try:
        _, completion_ids, logprobs, _ = engine.generate(prompts=contexts, images=None, num_generations=1)
    finally:
        engine.max_completion_length = saved
    results = []
    for i, ids in enumerate(completion_ids):
        # per token, the logprobs vLLM returned; the first is the sampled token's (as TRL reads it)
        lps: list[float | None] | None = None
        if logprobs is not None:
            lps = [token[0] for token in logprobs[i][: max_new[i]]]
        results.append(Generated(list(ids)[: max_new[i]], lps))
    return results


def default_generator(trainer: RolloutTrainer) -> TurnGenerator:
    """vLLM's path when the trainer uses vLLM, else a fresh :class:`CachedTurns` (one per call)."""
    return vllm_turns if getattr(trainer, "use_vllm", False) else CachedTurns()


def eos_ids(trainer: RolloutTrainer) -> list[int]:
    """The ids that end an episode: the trainer's own list (TRL's ``eos_token_ids``), else the
    tokenizer's EOS."""
    ids: list[int] | None = getattr(trainer, "eos_token_ids", None)
    if ids:
        return list(ids)
    return [tokenizer_of(trainer).eos_token_id]  # type: ignore[list-item]  # every chat tokenizer has one


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) without one."""
    try:
        import torch.distributed as dist
    except ImportError:
        return 0, 1
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(), dist.get_world_size()
