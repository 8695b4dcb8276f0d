"""The few methods the project calls on a tokenizer and a causal LM, as Protocols.

transformers ships no type information for its tokenizers and models that a reader could
follow, and the project uses a handful of their methods: encoding and decoding ids, the chat
template, the vocabulary's special tokens; a model's forward, its parameters and its config.
Naming that slice says what a function needs (a test may pass any object that has it, such as
a trained ``tokenizers`` BPE wrapped in ``PreTrainedTokenizerFast``) without importing
transformers where the annotation is read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


class Tokenizer(Protocol):
    """A Hugging Face tokenizer as the project uses it (``PreTrainedTokenizerBase``)."""

    eos_token_id: int | None
    pad_token_id: int | None
    eos_token: str | None
    pad_token: str | None
    chat_template: str | None
    all_special_ids: list[int]

    def __len__(self) -> int: ...

    def encode(
        self, text: str, *, add_special_tokens: bool = ..., split_special_tokens: bool = ...
    ) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = ...) -> str: ...

    def batch_decode(
        self, sequences: Sequence[Sequence[int]], *, skip_special_tokens: bool = ...
    ) -> list[str]: ...

    def apply_chat_template(
        self, conversation: Sequence[Mapping[str, object]], **options: object
    ) -> Sequence[int] | Mapping[str, Sequence[int]]: ...

    def get_added_vocab(self) -> dict[str, int]: ...

    def save_pretrained(self, save_directory: str) -> object: ...


class TextConfig(Protocol):
    """The shape of a decoder's attention: what the KV-cache engine sizes its buffer by."""

    num_hidden_layers: int
    num_attention_heads: int
    hidden_size: int


class ModelOutput(Protocol):
    """A forward's output: the next-token logits (batch, positions, vocabulary)."""

    logits: torch.Tensor


class CausalLM(Protocol):
    """A transformers causal LM as the engine and the trainers call it."""

    config: TextConfig

    def __call__(self, **inputs: object) -> ModelOutput: ...

    def forward(self, **inputs: object) -> ModelOutput: ...

    def parameters(self) -> Iterator[torch.nn.Parameter]: ...
