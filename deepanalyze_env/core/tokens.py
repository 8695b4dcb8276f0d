"""How episode text becomes token ids, shared by the TRL rollout, SFT rendering and local policies.

The token layout (docs/design.md, "Trainer adapters") is part of what a trained model saw, so
every path that rebuilds an episode's ids must use these two functions: the prompt through the
chat template with the generation prompt, and text appended as plain tokens (a cell that prints
``<|im_end|>`` must not inject that special token). No tokenizer library is imported here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any


def prompt_token_ids(tokenizer: Any, messages: list[dict[str, Any]], **template_kwargs: Any) -> list[int]:
    """The prompt as every trainer sees it: the chat template with the generation prompt."""
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, **template_kwargs
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def plain_token_ids(tokenizer: Any, text: str) -> list[int]:
    """Text as plain tokens: a cell that prints a special token's text (``<|im_end|>``) must not
    inject that token into the sequence (observations here; recorded turns in SFT)."""
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))


def text_token_ids(tokenizer: Any, text: str, special_tags: Iterable[str] = ()) -> list[int]:
    """Text as plain tokens, except ``special_tags`` (protocol tags that are special tokens in
    this tokenizer, e.g. DeepAnalyze's ``<Code>``), which become their single ids — what a policy
    that sampled them produced. Everything else stays text, as :func:`plain_token_ids`."""
    tags = sorted((t for t in special_tags if t), key=len, reverse=True)
    if not tags or not any(t in text for t in tags):
        return plain_token_ids(tokenizer, text)
    ids: list[int] = []
    for piece in re.split("(" + "|".join(re.escape(t) for t in tags) + ")", text):
        if not piece:
            continue
        if piece in tags:
            ids += list(tokenizer.encode(piece, add_special_tokens=False))
        else:
            ids += plain_token_ids(tokenizer, piece)
    return ids
