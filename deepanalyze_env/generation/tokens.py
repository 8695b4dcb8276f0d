"""How episode text becomes token ids, shared by the TRL rollout, SFT rendering and local policies.

The token layout (docs/design.md, "Trainer adapters") is part of what a trained model saw, so
every path that rebuilds an episode's ids must use these two functions: the prompt through the
chat template with the generation prompt, and text appended as plain tokens (a cell that prints
``<|im_end|>`` must not inject that special token). No tokenizer library is imported here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from deepanalyze_env.core.contracts import ChatMessage
from deepanalyze_env.generation.interfaces import Tokenizer


def prompt_token_ids(
    tokenizer: Tokenizer, messages: list[ChatMessage], **template_kwargs: object
) -> list[int]:
    """The prompt as every trainer sees it: the chat template with the generation prompt."""
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, **template_kwargs
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def plain_token_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """Text as plain tokens: a cell that prints a special token's text (``<|im_end|>``) must not
    inject that token into the sequence (observations here; recorded turns in SFT)."""
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))


def text_token_ids(tokenizer: Tokenizer, text: str, special_tags: Iterable[str] = ()) -> list[int]:
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


# ---------------------------------------------------------------------------- the tools format
# TRL's environment_factory path renders a tool conversation through the chat template: the
# prompt with the tools' schemas, each policy turn ending on its end-of-message token, and the
# tool results as the template frames them between turns. SFT and the local eval policy build the
# same ids with these functions, so what they train and evaluate is what GRPO samples.


_TRAINING_TEMPLATES: dict[tuple[int, str], str | None] = {}  # (tokenizer, its template) -> answer


def training_template(tokenizer: Tokenizer) -> str | None:
    """The template ``GRPOTrainer`` renders tool conversations with: the tokenizer's own when it
    is prefix-preserving (a later message never changes how earlier ones render), else TRL's
    training variant of it (Qwen3's own template drops the reasoning of earlier turns). Decided
    once per tokenizer and template: the check renders test conversations, and a local policy
    asks on every turn."""
    key = (id(tokenizer), str(tokenizer.chat_template))
    if key not in _TRAINING_TEMPLATES:
        try:
            from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving
        except ImportError:  # without TRL there is no GRPO layout to match: the tokenizer's own
            return None
        preserving = is_chat_template_prefix_preserving(tokenizer)
        _TRAINING_TEMPLATES[key] = None if preserving else get_training_chat_template(tokenizer)
    return _TRAINING_TEMPLATES[key]


def tool_prompt_ids(
    tokenizer: Tokenizer, messages: list[ChatMessage], **template_kwargs: object
) -> list[int]:
    """The prompt of a tools-format episode: the chat template with the two tools' schemas and
    the generation prompt."""
    from deepanalyze_env.core.tool_calls import tool_schemas

    options = {"chat_template": training_template(tokenizer), **template_kwargs}
    options.update(tools=tool_schemas(), add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(tokenizer.apply_chat_template(messages, **options))


def tool_turn_ids(tokenizer: Tokenizer, message: ChatMessage) -> list[int]:
    """A recorded policy turn of the tools format as the ids the model samples: its free text and
    hermes call, then its end-of-message token."""
    from deepanalyze_env.core.tool_calls import assistant_text

    return [*tokenizer.encode(assistant_text(message), add_special_tokens=False), tokenizer.eos_token_id]


def tool_suffix_ids(tokenizer: Tokenizer, results: list[ChatMessage], **template_kwargs: object) -> list[int]:
    """The tokens the chat template puts between a turn's end-of-message token and the next turn:
    the tool results and the next generation prompt (rendered after a stand-in call, the part
    after its end token). Raises ValueError for a template that renders the call differently once
    results follow it."""
    from deepanalyze_env.core.tool_calls import RUN_PYTHON, tool_schemas

    name = str(results[0].get("name") or RUN_PYTHON)
    stand_in = [{"type": "function", "function": {"name": name, "arguments": {}}}]
    head = [{"role": "user", "content": "."}, {"role": "assistant", "content": "", "tool_calls": stand_in}]
    options = {"chat_template": training_template(tokenizer), **template_kwargs}
    options.update(tools=tool_schemas(), tokenize=True, return_dict=False)
    before = list(tokenizer.apply_chat_template(head, **options))
    after = list(tokenizer.apply_chat_template(head + results, add_generation_prompt=True, **options))
    ends = [i for i, t in enumerate(before) if t == tokenizer.eos_token_id]
    if ends:
        before = before[: ends[-1] + 1]
    if after[: len(before)] != before:
        raise ValueError("the chat template renders a tool call differently once results follow it")
    return after[len(before) :]


def tool_episode_ids(
    tokenizer: Tokenizer, episode: list[ChatMessage], **template_kwargs: object
) -> list[tuple[list[int], int]]:
    """The ids after the prompt of a tools-format episode, as (ids, 1 for policy tokens / 0 for
    the rest) pieces: each turn, then the tool results before the next one (results after the
    last turn are left out: nothing follows them)."""
    pieces: list[tuple[list[int], int]] = []
    results: list[ChatMessage] = []
    for message in episode:
        if message.get("role") != "assistant":
            results.append(message)
            continue
        if results:
            pieces.append((tool_suffix_ids(tokenizer, results, **template_kwargs), 0))
            results = []
        pieces.append((tool_turn_ids(tokenizer, message), 1))
    if results:
        pieces.append((tool_suffix_ids(tokenizer, results, **template_kwargs), 0))
    return pieces
