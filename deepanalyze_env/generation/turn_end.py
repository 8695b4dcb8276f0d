"""Where a policy turn ends: the one rule every generation path applies.

A turn ends at the first token that completes a stop tag (``</Code>``, ``</Answer>``; the token is
kept whole, so ``>\\n`` keeps its newline and tokens after it are dropped), else at the first
end-of-sequence token (kept: the episode ends there), else at the token limit. Who applies it:

- the KV-cache engine (``engine``) stops each row as it decodes: :func:`stop_candidates` says
  which sampled tokens can complete a tag (every tag ends in ``>``), and only for those
  :func:`completes_stop` decodes the turn's tail;
- the TRL rollout cuts every generated turn with :func:`split_turn` — on the engine's turns, on
  ``generate``'s and on vLLM's, which may run past the tag — built on the same two functions, so
  the engine and the rollout cannot disagree about a turn;
- samplers that stop by themselves (vLLM under TRL and SkyRL, ``generate``'s stop strings) are
  configured from :func:`turn_stops`: the stop strings of the action format, and the ids of the
  closing tags a tokenizer holds as single added tokens (``tag_tokens``), which vLLM's stop
  strings never see.

The tags themselves are the protocol's (``core.protocol.STOP_TAGS``; ``core.tool_calls`` for the
tools format, whose turns end at ``</tool_call>`` under SkyRL and at the end-of-message token on
TRL's tool path). ``tests/test_layers.py`` checks that nothing else reads those lists to stop a
turn.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from deepanalyze_env.core import protocol
from deepanalyze_env.core.driver import TurnEnd  # the contract; engine and trainers import it from here too
from deepanalyze_env.core.formats import get_format
from deepanalyze_env.generation.interfaces import Tokenizer
from deepanalyze_env.generation.tag_tokens import tag_stop_ids

STOP_TAGS = protocol.STOP_TAGS
_TAIL = max(len(tag) for tag in STOP_TAGS) + 1  # a tag of n characters spans at most n tokens


@dataclass(frozen=True)
class TurnStops:
    """What a sampler that stops by itself is told: stop strings, and closing tags held as single
    tokens as ``{tag: id}`` (their ids are stop token ids: stop strings skip special tokens)."""

    strings: tuple[str, ...]
    ids_by_tag: dict[str, int] = field(default_factory=dict)

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(self.ids_by_tag.values())


def turn_stops(tokenizer: Tokenizer | None = None, action_format: str = "tags") -> TurnStops:
    """The stop settings of a format (its ``stop_strings``, ``core/formats``); with a tokenizer
    and a tag format, also the ids of its single-token closing tags (raises ConfigError for a tag
    the tokenizer splits into special pieces, ``tag_tokens``)."""
    fmt = get_format(action_format)
    ids = tag_stop_ids(tokenizer) if tokenizer is not None and fmt.stops_are_tags else {}
    return TurnStops(fmt.stop_strings, ids)


def _holds_tag(text: str) -> bool:
    return any(tag in text for tag in STOP_TAGS)


_TABLES: weakref.WeakKeyDictionary[Tokenizer, tuple[int, list[bool]]] = weakref.WeakKeyDictionary()


def _vocab_table(tokenizer: Tokenizer) -> list[bool]:
    """Per token id: does its text hold a stop tag's last character? Read once per tokenizer
    object and vocabulary size (adding tokens reads it again)."""
    size = len(tokenizer)
    try:
        cached = _TABLES.get(tokenizer)
    except TypeError:  # not weak-referenceable: built every time
        cached = None
    if cached is None or cached[0] != size:
        last = {tag[-1] for tag in STOP_TAGS}
        pieces = tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False)
        cached = (size, [any(c in piece for c in last) for piece in pieces])
        try:
            _TABLES[tokenizer] = cached
        except TypeError:
            pass
    return cached[1]


def stop_candidates(tokenizer: Tokenizer, stop_ids: Iterable[int] = ()) -> list[bool]:
    """Per token id: can this token complete a stop tag? (its text holds a tag's last character,
    or it is one of ``stop_ids``). A fresh list: the caller may extend it."""
    table = list(_vocab_table(tokenizer))
    for i in stop_ids:
        if 0 <= i < len(table):
            table[i] = True
    return table


def completes_stop(tokenizer: Tokenizer, turn: Sequence[int]) -> bool:
    """Does the turn's last token complete a stop tag? Only the tail that can hold one is decoded."""
    tail = list(turn[-_TAIL:])
    if not _holds_tag(tokenizer.decode(tail, skip_special_tokens=False)):
        return False
    return not _holds_tag(tokenizer.decode(tail[:-1], skip_special_tokens=False))


def split_turn(tokenizer: Tokenizer, ids: Sequence[int], eos: Iterable[int]) -> tuple[int, TurnEnd]:
    """How many generated tokens the turn keeps, and what ended it: the first token that completes
    a stop tag (``stop``; what follows it is dropped, an EOS too), else the first EOS (``eos``,
    kept as the turn's last token), else every token (``length``: a token limit cut the turn)."""
    table = _vocab_table(tokenizer)
    ends = set(eos)
    for i, token in enumerate(ids):
        if 0 <= token < len(table) and table[token] and completes_stop(tokenizer, ids[: i + 1]):
            return i + 1, "stop"
        if token in ends:
            return i + 1, "eos"
    return len(ids), "length"


def text_turn_end(text: str, action_format: str = "tags", *, cut: bool = False) -> TurnEnd:
    """How a turn that reached us as text ended (a sampler that stops by itself, a scripted or
    remote turn), by :func:`split_turn`'s rule: ``stop`` when the text holds one of its format's
    stop strings (a sampler stops at the first; a tool call closed before the template's
    end-of-message token still counts), else ``length`` when a token limit cut it (``cut``), else
    ``eos``: the message ended without a stop string."""
    if any(stop in text for stop in get_format(action_format).stop_strings):
        return "stop"
    return "length" if cut else "eos"
