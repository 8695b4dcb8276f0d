"""How the KV-cache engine picks a token from a step's logits: greedy at temperature 0, else
temperature, top-k and top-p as ``generate`` applies them, each row drawing from its own
generator (seeded by its request), so a sampled turn does not depend on which turns share its
batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Sampler:
    """``temperature`` 0 is greedy; ``top_k`` 0 and ``top_p`` 1.0 are off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def pick(self, logits: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
        """One token per row of ``logits`` (``generators``: one per row, unused when greedy)."""
        import torch

        if self.greedy:
            return logits.argmax(dim=-1)
        scores = logits.float() / self.temperature
        if self.top_k > 0:
            kth = torch.topk(scores, min(self.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=True, dim=-1)
            cum = ordered.softmax(dim=-1).cumsum(dim=-1)
            drop = cum - ordered.softmax(dim=-1) > self.top_p  # keep the smallest set reaching top_p
            scores = scores.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
        probs = scores.softmax(dim=-1)
        picks = [torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(generators)]
        return torch.cat(picks)
