"""Closing tags a tokenizer keeps as added (often special) tokens: stop on their ids.

A trainer ends a policy turn at ``</Code>`` / ``</Answer>`` with stop strings. vLLM matches stop
strings against the text it detokenizes with ``skip_special_tokens`` on, so a tag that the
tokenizer holds as a special token never appears there and the turn runs on to EOS or the
generation limit (DeepAnalyze's own checkpoints are trained with such tags and stop on token
ids). When a closing tag is one added token, its id is a stop token instead; a tag that is
split into several pieces some of which are special cannot be stopped on at all, and is refused.

Pure: reads a Hugging Face tokenizer, imports no trainer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from deepanalyze_env.core import protocol
from deepanalyze_env.core.config import ConfigError


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", None) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(i for i, token in decoder.items() if getattr(token, "special", False))
    return ids


def tag_stop_ids(tokenizer: Any, tags: Iterable[str] = protocol.STOP_TAGS) -> dict[str, int]:
    """``{tag: token id}`` for each closing tag the tokenizer holds as one added token.

    Raises ConfigError (one line) when a tag cannot be stopped on: split into several pieces of
    which some are special (stop strings skip those, and no single id marks the tag), or held as
    one token that does not decode back to the tag (the env would never see it). Tags made of
    ordinary pieces need nothing: the stop strings fire on them.
    """
    added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    special = _special_ids(tokenizer)
    out: dict[str, int] = {}
    for tag in tags:
        ids = list(tokenizer.encode(tag, add_special_tokens=False))
        if len(ids) == 1 and tag in added:
            # trainers decode sampled ids keeping special tokens (SkyRL's client: batch_decode with
            # transformers' default skip_special_tokens=False); the env must read the tag back
            shown = tokenizer.decode(ids, skip_special_tokens=False)
            if shown != tag:
                raise ConfigError(
                    f"the tokenizer holds {tag} as token {ids[0]} but decodes it as {shown!r}: "
                    "the env would never see the tag"
                )
            out[tag] = ids[0]
        elif any(i in special for i in ids):
            pieces = [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
            raise ConfigError(
                f"the tokenizer splits {tag} into {pieces}, some of them special tokens: vLLM's stop "
                f"strings skip special tokens and no single token marks {tag}, so turns would not stop "
                "there; use a tokenizer that holds each closing tag as one token or as ordinary text"
            )
    return out
