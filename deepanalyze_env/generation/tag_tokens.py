"""The one owner of what a tokenizer's special and added tokens mean for the tag protocol.

A trainer ends a policy turn at ``</Code>`` / ``</Answer>`` with stop strings. vLLM matches stop
strings against the text it detokenizes with ``skip_special_tokens`` on, so a tag that the
tokenizer holds as a special token never appears there and the turn runs on to EOS or the
generation limit (DeepAnalyze's own checkpoints are trained with such tags and stop on token
ids). So every closing tag the tokenizer holds as one added token (special or not) gets its id
as a stop id too; a tag split into several pieces some of which are special cannot be stopped on
at all, and is refused — as is one held as a single token that does not decode back to the tag
(trainers decode sampled ids keeping special tokens, and the env must read the tag).

SkyRL (stop_token_ids of its sampling params), the TRL rollout (stop ids, the text the env
sees, observation encoding) and SFT (the same encoding) all read :func:`token_rules`; a refusal
is a :class:`ConfigError` with one line. Lives in ``core`` because local generation (eval, the
rollout command) needs the same rules; it imports no trainer.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from deepanalyze_env.core import protocol
from deepanalyze_env.core.errors import ConfigError
from deepanalyze_env.generation.interfaces import Tokenizer

# Tags of the protocol. Some tokenizers (DeepAnalyze's) hold them as special tokens; decoding for
# the env must keep them while dropping other special tokens such as EOS.
PROTOCOL_TAGS = (
    "<Analyze>",
    "</Analyze>",
    "<Understand>",
    "</Understand>",
    "<Code>",
    protocol.CODE_CLOSE,
    "<Execute>",
    "</Execute>",
    protocol.ANSWER_OPEN,
    protocol.ANSWER_CLOSE,
    "<think>",
    "</think>",
)


@dataclass(frozen=True)
class TokenRules:
    """What generation and encoding must know about a tokenizer's tag tokens, read once.

    ``stop_by_tag``: closing tags held as one added (or special) token → that id; generation
    stops on these ids as well as on the stop strings.
    ``drop_ids``: special tokens removed from the text the env sees (EOS, chat markers) — every
    special token except the protocol's tags, which must survive decoding.
    ``special_tags``: protocol tags that are special tokens (observation framing keeps them).
    """

    stop_by_tag: dict[str, int]
    drop_ids: frozenset[int]
    special_tags: frozenset[str]

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return tuple(self.stop_by_tag.values())


_RULES: weakref.WeakKeyDictionary[Tokenizer, tuple[int, TokenRules]] = weakref.WeakKeyDictionary()


def token_rules(tok: Tokenizer) -> TokenRules:
    """The rules of ``tok``, cached per tokenizer object and vocabulary size (adding tokens reads
    them again). Raises ConfigError for a closing tag that cannot be stopped on."""
    try:
        cached = _RULES.get(tok)
    except TypeError:  # not weak-referenceable: read every time (a dozen encodes)
        return _read_rules(tok)
    if cached is None or cached[0] != len(tok):
        cached = (len(tok), _read_rules(tok))
        _RULES[tok] = cached
    return cached[1]


def tag_stop_ids(tokenizer: Tokenizer) -> dict[str, int]:
    """``{closing tag: token id}`` for the tags that need a stop id (see :class:`TokenRules`)."""
    return dict(token_rules(tokenizer).stop_by_tag)


def _special_ids(tok: Tokenizer) -> set[int]:
    ids = set(getattr(tok, "all_special_ids", None) or [])
    decoder = getattr(tok, "added_tokens_decoder", None) or {}
    ids.update(i for i, token in decoder.items() if getattr(token, "special", False))
    return ids


def _read_rules(tok: Tokenizer) -> TokenRules:
    added = tok.get_added_vocab() if hasattr(tok, "get_added_vocab") else {}
    special = _special_ids(tok)
    single: dict[str, int] = {}
    stop_by_tag: dict[str, int] = {}
    for tag in PROTOCOL_TAGS:
        ids = list(tok.encode(tag, add_special_tokens=False))
        closing = tag in protocol.STOP_TAGS
        if len(ids) == 1:
            single[tag] = ids[0]
            if closing and (tag in added or ids[0] in special):
                shown = tok.decode(ids, skip_special_tokens=False)
                if shown != tag:
                    raise ConfigError(
                        f"the tokenizer holds the stop tag {tag!r} as token {ids[0]} but decodes it "
                        f"as {shown!r}: the env would never see the tag"
                    )
                stop_by_tag[tag] = ids[0]
        elif closing and any(i in special for i in ids):
            pieces = [tok.decode([i], skip_special_tokens=False) for i in ids]
            raise ConfigError(
                f"the tokenizer splits the stop tag {tag!r} into {pieces}, some of them special "
                "tokens: stop strings skip special tokens and no single token marks the tag, so "
                "turns would not stop there; use a tokenizer that holds each closing tag as one "
                "token or as ordinary text"
            )
    return TokenRules(
        stop_by_tag={t: stop_by_tag[t] for t in protocol.STOP_TAGS if t in stop_by_tag},
        drop_ids=frozenset(special - set(single.values())),
        special_tags=frozenset(tag for tag, i in single.items() if i in special),
    )
