"""A randomly initialised one-layer Llama over a tokenizer's vocabulary: the model the trainer
tests run real steps on (SmolLM2-sized weights would make each step minutes on CPU)."""

from __future__ import annotations

from typing import Any


def tiny_llama(tok: Any, hidden: int = 32, layers: int = 1, heads: int = 2, **config: Any) -> Any:
    """``LlamaForCausalLM`` with ``hidden`` units (MLP twice that), ``heads`` query and key/value
    heads, and ``tok``'s pad and end-of-sequence ids; ``config`` adds or overrides LlamaConfig
    fields. The caller seeds torch first when the weights must repeat."""
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = {
        "vocab_size": len(tok),
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "pad_token_id": tok.pad_token_id,
        "eos_token_id": tok.eos_token_id,
    }
    return LlamaForCausalLM(LlamaConfig(**{**fields, **config}))
