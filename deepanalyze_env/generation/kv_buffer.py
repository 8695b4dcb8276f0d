"""The KV-cache engine's per-call cache, and an episode's kept keys and values.

transformers' attention layers hand each step's keys and values to the cache object the forward
is given (``past_key_values``; ``cache`` in transformers 5) through ``update``. HF's own
``DynamicCache`` concatenates every layer's cache at every decode step; :class:`KVBuffer` is
preallocated instead and written in place, one shared position for every row, so a step costs
no copy of the cache. :class:`CacheEntry` is what the engine keeps of a finished turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass
class CacheEntry:
    """An episode's context as the model has seen it: its ids, and their keys and values
    ``[layers, 2, kv_heads, len(ids), head_dim]``."""

    ids: list[int]
    kv: torch.Tensor


class KVBuffer:
    """The per-call cache: ``kv[layer, 0|1, row, head, position, dim]``, written in place.

    The model's attention layers call :meth:`update`; ``rows`` selects the row being prefilled
    (one row at a time) or all rows (decode), ``start`` the position the new keys go to and
    ``offset`` the first position the attention reads (a prefilled row reads from its own start,
    so it needs no padding mask).
    """

    is_compileable = False
    is_sliding = False

    def __init__(self, kv: torch.Tensor):
        self.kv = kv
        self.rows: slice = slice(None)
        self.start = 0
        self.offset = 0

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.start + key.shape[2]
        k = self.kv[layer_idx, 0, self.rows]
        v = self.kv[layer_idx, 1, self.rows]
        k[:, :, self.start : end] = key
        v[:, :, self.start : end] = value
        return k[:, :, self.offset : end], v[:, :, self.offset : end]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.start

    def __len__(self) -> int:
        return int(self.kv.shape[0])


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, at most ``limit``."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if n >= limit or x != y:
            break
        n += 1
    return n
