"""Multi-turn generation with a KV cache kept across an episode's turns (local models only).

Both local generation paths — the eval/rollout policy (``offline/policies.py``) and the TRL
rollout with the trainer's own model (``trainers/trl/rollout_func.py``) — generate one turn for every
episode in flight, step the env, append the observation and generate again. Re-reading the
whole conversation each turn made prefill the larger part of a rollout (issue 27: ~390 s of
re-reading against ~130 s of decoding for 24 episodes x 3 turns on two cores). This engine keeps
what it computed instead:

- **Cache across turns.** After a turn, each episode's keys and values (context plus the turn's
  fed tokens) are kept as an entry. A later request whose context starts with an entry's tokens
  prefills only the rest — the observation and the turn's last token, which was sampled but
  never fed. Entries are found by content, not by name, so the callers pass whole contexts as
  before; a context that matches nothing is prefilled whole (and an identical prefix computed
  earlier in the same round — a GRPO group's shared prompt — is copied, not recomputed).
- **One batch per round.** All requests of a call decode together. Their caches are copied once
  per call into a preallocated buffer, right-aligned (left padding, masked), and every decode step
  writes its keys and values in place at one shared position — no per-step ``torch.cat`` of the
  cache (HF's ``DynamicCache`` concatenates every layer every step). The buffer grows in chunks
  of ``grow`` positions; finished rows are dropped from the batch in one copy once a quarter of
  it has finished.
- **Stops without text scans.** A turn ends where ``turn_end`` says: at the token that completes
  ``</Code>`` or ``</Answer>`` (kept whole), at an EOS id, or at its token cap. Only a sampled
  token that :func:`~deepanalyze_env.generation.turn_end.stop_candidates` marks (its text holds a
  ``>``, or it is a stop id) can complete a tag; only then is the turn's tail decoded.

Greedy turns are the tokens ``generate`` produces on the re-read conversation (tested on the
embedded SmolLM2), up to float rounding of the different kernel shapes. Sampling rule: each
request carries a seed and draws from its own ``torch.Generator`` seeded with it, so a sampled
turn does not depend on which other turns share its batch (up to that rounding).

Weights must not change while entries are kept: the TRL rollout clears the engine at the end
of every rollout call; a policy keeps one engine for its fixed model. Where a turn ends is
``turn_end``'s rule; the per-call cache is ``kv_buffer``, the sampling rule ``sampling``. torch
is imported when the engine first runs, so importing the trainers' modules stays cheap.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from deepanalyze_env.generation.interfaces import CausalLM, Tokenizer
from deepanalyze_env.generation.kv_buffer import CacheEntry, KVBuffer, common_prefix
from deepanalyze_env.generation.sampling import Sampler
from deepanalyze_env.generation.turn_end import TurnEnd, completes_stop, stop_candidates

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# Generation options this engine does not implement: a caller whose config sets one of them
# (to a non-neutral value) must use ``generate`` instead (see ``unsupported_options``).
_NEUTRAL: dict[str, tuple[float | None, ...]] = {
    "num_beams": (None, 1),
    "repetition_penalty": (None, 1.0),
    "min_p": (None, 0.0),
    "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0),
    "no_repeat_ngram_size": (None, 0),
    "min_new_tokens": (None, 0),
    "min_length": (None, 0),
    "sequence_bias": (None,),
    "bad_words_ids": (None,),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "penalty_alpha": (None,),
    "guidance_scale": (None, 1.0),
    "encoder_repetition_penalty": (None, 1.0),
    "exponential_decay_length_penalty": (None,),
}


def unsupported_options(config: object) -> list[str]:
    """Names of the options set in a ``GenerationConfig`` that this engine would ignore."""
    return [
        name
        for name, neutral in _NEUTRAL.items()
        if getattr(config, name, None) not in neutral and getattr(config, name, None) != {}
    ]


@dataclass
class GenRequest:
    """One turn: the whole context so far, its token cap and (for sampling) its seed."""

    ids: list[int]
    max_new: int
    seed: int = 0


@dataclass
class GenResult:
    """The turn's tokens; when ``finish`` is ``stop`` or ``eos`` the last one ended it."""

    ids: list[int]
    finish: TurnEnd
    reused: int  # context tokens whose keys and values came from the cache
    prefilled: int  # context tokens computed for this turn
    shared: int = 0  # context tokens copied from another request of the same call (shared prefix)


@dataclass
class EngineStats:
    """Counters since the engine was made (or :meth:`GenerationEngine.reset_stats`)."""

    calls: int = 0
    prefilled_tokens: int = 0
    reused_tokens: int = 0
    shared_tokens: int = 0  # prompt tokens copied from another row of the same round
    generated_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    # decode steps by batch size: {rows: [steps, seconds]} (the decode-step cost at N in flight)
    steps: dict[int, list[float]] = field(default_factory=dict)


class GenerationEngine:
    """Generates one turn for each request, reusing the keys and values of earlier turns.

    ``eos_ids`` end a turn (finish ``eos``); ``stop_ids`` are closing tags that are single
    (special) tokens; ``stop_tags`` False turns the closing-tag stop off (the tools format: a turn
    ends on its end-of-message token, as TRL generates it); ``temperature`` 0 is greedy.
    ``max_entries`` bounds the cached episodes (least recently used go first): a policy keeps a
    few per episode in flight.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        eos_ids: Iterable[int],
        stop_ids: Iterable[int] = (),
        stop_tags: bool = True,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        max_entries: int = 256,
        grow: int = 256,
        prefill_chunk: int = 1024,
    ):
        self.tok = tokenizer
        self.eos_ids = sorted({int(i) for i in eos_ids if i is not None})
        self.stop_ids = sorted({int(i) for i in stop_ids})
        self.stop_tags = stop_tags
        self.sampler = Sampler(
            temperature=float(temperature or 0.0),
            top_k=int(top_k or 0),
            top_p=float(top_p) if top_p is not None else 1.0,
        )
        self.max_entries = max_entries
        self.grow = grow
        self.prefill_chunk = prefill_chunk
        self.stats = EngineStats()
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()
        self._next_key = 0
        self._tables: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._cache_kw: dict[int, str] = {}

    # -- cache bookkeeping

    def clear(self) -> None:
        """Drop every cached entry (the weights are about to change)."""
        self._entries.clear()

    def reset_stats(self) -> None:
        self.stats = EngineStats()

    @property
    def cached_episodes(self) -> int:
        return len(self._entries)

    def _take(self, ids: list[int]) -> CacheEntry | None:
        """Remove and return the entry sharing the longest prefix with ``ids``, cut to that prefix
        (keys and values of a prefix do not depend on what follows it). At least one token of
        ``ids`` stays to be fed. A caller that re-tokenises a turn's text differently from the
        sampled ids still reuses everything before the first difference."""
        best_key, best_len = None, 0
        for key, entry in self._entries.items():
            n = common_prefix(entry.ids, ids, len(ids) - 1)
            if n > best_len:
                best_key, best_len = key, n
        if best_key is None:
            return None
        entry = self._entries.pop(best_key)
        if best_len < len(entry.ids):
            entry = CacheEntry(entry.ids[:best_len], entry.kv[:, :, :, :best_len])
        return entry

    def _put(self, entry: CacheEntry) -> None:
        self._entries[self._next_key] = entry
        self._next_key += 1
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    # -- model plumbing

    def _cache_kwarg(self, model: CausalLM) -> str:
        """``cache`` in transformers 5, ``past_key_values`` before."""
        key = id(model)
        if key not in self._cache_kw:
            params = inspect.signature(model.forward).parameters
            self._cache_kw[key] = "cache" if "cache" in params else "past_key_values"
        return self._cache_kw[key]

    def _device_tables(self, device: torch.device, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        key = (str(device), vocab)
        if key not in self._tables:
            if self.stop_tags:
                cand = stop_candidates(self.tok, self.stop_ids)[:vocab]
            else:
                cand = [i in self.stop_ids for i in range(vocab)]
            cand += [False] * (vocab - len(cand))
            eos = torch.zeros(vocab, dtype=torch.bool)
            for i in self.eos_ids:
                if 0 <= i < vocab:
                    eos[i] = True
            self._tables[key] = (torch.tensor(cand, dtype=torch.bool, device=device), eos.to(device))
        return self._tables[key]

    def _forward(
        self,
        model: CausalLM,
        buffer: KVBuffer,
        ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """One forward; ``mask`` is boolean (True = attend) and goes in additive (0 / dtype min),
        the form every attention implementation adds to its scores — eager attention would add
        a boolean mask as 0/1 — built once per forward rather than once per layer."""
        import torch

        dtype = buffer.kv.dtype
        additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        additive.masked_fill_(~mask, torch.finfo(dtype).min)
        kwargs = {self._cache_kwarg(model): buffer}
        out = model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=additive,
            use_cache=True,
            logits_to_keep=1,
            **kwargs,
        )
        return out.logits[:, -1, :]

    # -- one call

    def generate(self, model: CausalLM, requests: Sequence[GenRequest]) -> list[GenResult]:
        """One turn per request, decoded as one batch. Call under ``torch.no_grad()``."""
        import torch

        if not requests:
            return []
        started = time.perf_counter()
        self.stats.calls += 1
        param = next(model.parameters())
        device, dtype = param.device, param.dtype
        config = model.config
        text_config = getattr(config, "get_text_config", lambda: config)()
        layers = int(text_config.num_hidden_layers)
        heads = int(getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads)
        per_head = text_config.hidden_size // text_config.num_attention_heads
        dim = int(getattr(text_config, "head_dim", None) or per_head)

        taken = [self._take(list(r.ids)) for r in requests]
        cached = [len(e.ids) if e is not None else 0 for e in taken]
        suffix = [len(r.ids) - c for r, c in zip(requests, cached, strict=True)]
        for r in requests:
            if not r.ids:
                raise ValueError("a generation request needs at least one context token")
            if r.max_new < 1:
                raise ValueError(f"a generation request needs max_new >= 1, got {r.max_new}")
        rows = len(requests)
        width = max(len(r.ids) for r in requests)  # every row ends its context at position `width`
        capacity = width + min(max(r.max_new for r in requests), self.grow)
        kv = torch.zeros((layers, 2, rows, heads, capacity, dim), dtype=dtype, device=device)
        buffer = KVBuffer(kv)
        offsets = [width - len(r.ids) for r in requests]

        last_logits, shared = self._prefill(model, requests, taken, cached, suffix, buffer, offsets, width)
        fed = list(suffix)
        self.stats.prefilled_tokens += sum(fed)
        self.stats.reused_tokens += sum(c for c, e in zip(cached, taken, strict=True) if e is not None)
        prefill_done = time.perf_counter()
        self.stats.prefill_s += prefill_done - started
        outputs, finish = self._decode(model, requests, buffer, offsets, width, capacity, last_logits)
        self.stats.generated_tokens += sum(len(o) for o in outputs)
        self.stats.decode_s += time.perf_counter() - prefill_done
        return [
            GenResult(outputs[i], finish[i] or "length", cached[i] - shared[i], fed[i], shared[i])
            for i in range(rows)
        ]

    def _prefill(
        self,
        model: CausalLM,
        requests: Sequence[GenRequest],
        taken: list[CacheEntry | None],
        cached: list[int],
        suffix: list[int],
        buffer: KVBuffer,
        offsets: list[int],
        width: int,
    ) -> tuple[list[torch.Tensor], list[int]]:
        """Fill each row's cache up to ``width``: a kept entry's positions are copied, a prefix
        another row of this call already computed (a GRPO group's prompt) is shared, the rest is
        fed in chunks. Updates ``cached`` and ``suffix`` for shared prefixes; returns each row's
        last logits and its shared token count. One row at a time: batched prefill would pad,
        and on CPU it is compute-bound anyway."""
        import torch

        kv = buffer.kv
        device = kv.device
        last_logits = []
        shared = [0] * len(requests)
        done_prefixes: list[tuple[int, list[int]]] = []  # (row, context) prefilled this call
        for b, (r, entry) in enumerate(zip(requests, taken, strict=True)):
            o = offsets[b]
            start = o + cached[b]
            if entry is not None:
                kv[:, :, b, :, o:start] = entry.kv
            else:  # a prefix computed for another row of this call (a GRPO group's prompt)
                share_row, share_len = None, 0
                for row, ctx in done_prefixes:
                    n = common_prefix(ctx, r.ids, len(r.ids) - 1)
                    if n > share_len:
                        share_row, share_len = row, n
                if share_row is not None and share_len > 0:
                    so = offsets[share_row]
                    kv[:, :, b, :, o : o + share_len] = kv[:, :, share_row, :, so : so + share_len]
                    self.stats.shared_tokens += share_len
                    shared[b] = share_len
                    cached[b] = share_len
                    start = o + share_len
                    suffix[b] = len(r.ids) - share_len
            buffer.rows = slice(b, b + 1)
            buffer.offset = o
            pos = start
            logits = None
            while pos < width:
                end = min(width, pos + self.prefill_chunk)
                chunk = torch.tensor([r.ids[pos - o : end - o]], dtype=torch.long, device=device)
                positions = torch.arange(pos - o, end - o, device=device).unsqueeze(0)
                q, k = end - pos, end - o
                mask = torch.ones((q, k), dtype=torch.bool, device=device).tril(k - q)[None, None]
                buffer.start = pos
                logits = self._forward(model, buffer, chunk, positions, mask)
                pos = end
            last_logits.append(logits)
            done_prefixes.append((b, list(r.ids)))
        return last_logits, shared

    def _decode(
        self,
        model: CausalLM,
        requests: Sequence[GenRequest],
        buffer: KVBuffer,
        offsets: list[int],
        width: int,
        capacity: int,
        last_logits: list[torch.Tensor],
    ) -> tuple[list[list[int]], list[TurnEnd | None]]:
        """Decode every row together at one shared write position until each has stopped (end
        token, a completed closing tag, or its ``max_new``); finished rows are dropped from the
        batch in bulk and their caches kept for the next turn. Returns tokens and finish reasons."""
        import torch

        kv = buffer.kv
        device, dtype, dim = kv.device, kv.dtype, kv.shape[5]
        rows = len(requests)
        cand_table, eos_table = self._device_tables(device, last_logits[0].shape[-1])
        generators = []
        if not self.sampler.greedy:
            for r in requests:
                g = torch.Generator(device=device)
                g.manual_seed(int(r.seed) & 0xFFFFFFFFFFFF)
                generators.append(g)
        logits = torch.cat(last_logits)
        live = list(range(rows))  # request index of each batch row
        outputs: list[list[int]] = [[] for _ in requests]
        finish: list[TurnEnd | None] = [None] * rows
        ends = [0] * rows  # first position after a finished row's fed tokens
        caps = torch.tensor([r.max_new for r in requests], device=device)
        positions = torch.tensor([len(r.ids) for r in requests], device=device)
        starts = torch.tensor(offsets, device=device)[:, None]
        valid = torch.arange(capacity, device=device)[None, :] >= starts  # left padding is masked
        cursor = width
        step = 0
        dead = 0
        while True:
            tokens = self.sampler.pick(logits, [generators[i] for i in live] if generators else [])
            flags = eos_table[tokens] | cand_table[tokens] | (caps[live] <= step + 1)
            tokens_list = tokens.tolist()
            for j, i in enumerate(live):
                if finish[i] is None:
                    outputs[i].append(tokens_list[j])
            if bool(flags.any()):
                for j in flags.nonzero().flatten().tolist():
                    i = live[j]
                    if finish[i] is not None:
                        continue
                    token = tokens_list[j]
                    end: TurnEnd | None = None
                    if token in self.eos_ids:
                        end = "eos"
                    elif cand_table[token] and completes_stop(self.tok, outputs[i]):
                        end = "stop"
                    elif len(outputs[i]) >= requests[i].max_new:
                        end = "length"
                    if end is not None:
                        finish[i] = end
                        ends[i] = cursor
                        dead += 1
            if all(f is not None for f in finish):
                break
            if dead * 4 >= len(live):  # drop finished rows: one copy, not one per step
                keep = [j for j, i in enumerate(live) if finish[i] is None]
                for j, i in enumerate(live):
                    if finish[i] is not None:
                        self._store(requests[i], outputs[i], kv[:, :, j, :, offsets[i] : ends[i]])
                index = torch.tensor(keep, device=device)
                kv = kv.index_select(2, index)
                buffer.kv = kv
                valid = valid.index_select(0, index)
                tokens = tokens.index_select(0, index)
                live = [live[j] for j in keep]
                dead = 0
            if cursor >= kv.shape[4]:  # grow the buffer by a chunk (one copy per `grow` steps)
                extra = torch.empty((*kv.shape[:4], self.grow, dim), dtype=dtype, device=device)
                kv = torch.cat([kv, extra], dim=4)
                buffer.kv = kv
                valid = torch.cat(
                    [valid, torch.ones((valid.shape[0], self.grow), dtype=torch.bool, device=device)], dim=1
                )
            step_started = time.perf_counter()
            buffer.rows = slice(None)
            buffer.offset = 0
            buffer.start = cursor
            live_index = torch.tensor(live, device=device)
            pos = (positions.index_select(0, live_index) + step)[:, None]
            mask = valid[:, None, None, : cursor + 1]
            logits = self._forward(model, buffer, tokens[:, None], pos, mask)
            cursor += 1
            step += 1
            spent = time.perf_counter() - step_started
            slot = self.stats.steps.setdefault(len(live), [0, 0.0])
            slot[0] += 1
            slot[1] += spent
        for j, i in enumerate(live):
            self._store(requests[i], outputs[i], kv[:, :, j, :, offsets[i] : ends[i]])
        return outputs, finish

    def _store(self, request: GenRequest, output: list[int], kv: torch.Tensor) -> None:
        """Keep a finished row: its context and every generated token but the last (never fed)."""
        ids = list(request.ids) + output[:-1]
        if kv.shape[3] != len(ids):
            raise RuntimeError(f"cache rows out of step: {kv.shape[3]} positions for {len(ids)} tokens")
        self._put(CacheEntry(ids, kv.clone()))
