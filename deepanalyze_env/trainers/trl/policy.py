"""The model a TRL recipe trains (GRPO and SFT alike), loaded one way with its memory rules.

On CPU: float32, PyTorch's fused attention (``sdpa``) by name rather than transformers' default
— its CPU kernel keeps one block of attention scores at a time and a log-sum-exp per row for the
backward, where the eager path keeps every layer's heads x L x L scores and probabilities (an
update's memory would grow with the square of the episode length) — and freed tensor buffers
returned to the system (:func:`deepanalyze_env.core.memory.return_freed_buffers`). On a GPU the
checkpoint's own dtype and attention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepanalyze_env.core.memory import return_freed_buffers

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def load_trainable(model_dir: str, cuda: bool, *, return_freed: bool = True) -> PreTrainedModel:
    """The policy, ready for a trainer. ``return_freed`` False keeps glibc's default allocator
    behaviour (for measuring what it costs, ``benchmarks/memory.py``)."""
    import torch
    from transformers import AutoModelForCausalLM

    if cuda:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    if return_freed:
        return_freed_buffers()
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
