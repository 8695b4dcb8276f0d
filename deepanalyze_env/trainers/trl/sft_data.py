"""SFT warm start data: episode records → token sequences laid out exactly as the GRPO trainers see them.

A record (docs/design.md §9) holds the prompt messages the env built (system prompt included),
then the policy's turns with the ``<Execute>`` observations between them. It is rendered as the
TRL rollout (:mod:`deepanalyze_env.trainers.trl.rollout_func`) renders a live episode: the prompt through the
chat template with the generation prompt, then one completion made of each policy turn's tokens
and each observation's tokens, both as plain text (no special-token parsing) and piece by
piece, and the closing EOS of a finished episode. Only policy tokens carry loss; the prompt,
the observations and the EOS the trainer appends are labelled -100, as ``env_mask`` 0 keeps them
out of the GRPO loss (an EOS the policy sampled, ``termination: "eos"``, is its own and
trained). Encoding piece by piece (not the joined text) is the point: BPE merges across a
turn/observation boundary would otherwise give SFT token ids the policy never produces in RL.

Which records are data: a ``verifier_error`` episode's actions are real policy output (only its
reward could not be computed), so it is usable; an ``environment_error`` episode was cut short
or shaped by an infrastructure fault (a dead worker, a missing workspace), so its observations
are not what the task produces; ``unfinished`` records have no ending. Quality selection
(reward, accuracy, format) is the ``--keep`` filter language over the same records.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from deepanalyze_env.core import tool_calls
from deepanalyze_env.core.contracts import EpisodeRecord, JsonObject
from deepanalyze_env.core.filters import RecordFilter
from deepanalyze_env.core.records import load_run, own_turn_indices
from deepanalyze_env.generation.interfaces import Tokenizer
from deepanalyze_env.generation.tag_tokens import token_rules
from deepanalyze_env.generation.tokens import (
    prompt_token_ids,
    text_token_ids,
    tool_episode_ids,
    tool_prompt_ids,
)
from deepanalyze_env.trainers.trl.rollout_func import encode_observation

log = logging.getLogger(__name__)

USABLE_STATUSES = ("scored", "verifier_error")
UNUSABLE_STATUSES = ("environment_error", "unfinished")
IGNORE_INDEX = -100  # the label that carries no loss (transformers' convention)


class SFTDataError(ValueError):
    """The records cannot be used for SFT; the message says which and why."""


@dataclass
class RenderedEpisode:
    """One record as token ids: ``prompt_ids`` then ``completion_ids`` with a loss mask over them."""

    episode_id: str
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    completion_mask: list[int] = field(default_factory=list)  # 1: policy token (loss); 0: not

    def add(self, ids: Sequence[int], mask: int) -> None:
        self.completion_ids.extend(ids)
        self.completion_mask.extend([mask] * len(ids))

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    @property
    def labels(self) -> list[int]:
        masked = [IGNORE_INDEX] * len(self.prompt_ids)
        return masked + [
            t if m else IGNORE_INDEX for t, m in zip(self.completion_ids, self.completion_mask, strict=True)
        ]


def split_messages(record: EpisodeRecord) -> tuple[list[JsonObject], list[JsonObject]]:
    """(prompt messages, episode messages): the prompt is everything before the first policy turn.

    The policy's turns are the last ``turns`` assistant messages: a recovered episode (a row with
    a ``prefix``) starts with replayed turns that reached the policy as part of its prompt."""
    messages = cast(list[JsonObject], list(record.get("messages") or []))
    mine = own_turn_indices(record)
    if not mine:
        raise SFTDataError(f"record {record.get('episode_id')}: no policy turn in its messages")
    return messages[: mine[0]], messages[mine[0] :]


def render_record(
    tokenizer: Tokenizer,
    record: EpisodeRecord,
    eos_token_id: int | None = None,
    template_kwargs: JsonObject | None = None,
) -> RenderedEpisode:
    """The record's tokens and loss mask, as the TRL rollout builds them for the same turns.

    ``template_kwargs`` are the chat template's extra arguments (``trl.chat_template_kwargs``),
    which the rollout and the eval policy pass to the same :func:`prompt_token_ids`. The closing
    EOS carries loss exactly when the policy sampled it: an episode with ``termination: "eos"``
    ended on the policy's own EOS (the rollout trains it); any other finished episode's EOS is the
    one the rollout appends (no loss)."""
    prompt, episode = split_messages(record)
    out = RenderedEpisode(
        str(record.get("episode_id")), prompt_token_ids(tokenizer, prompt, **(template_kwargs or {}))
    )
    for message in episode:
        text = str(message.get("content") or "")
        if message.get("role") == "assistant":  # tags that are special tokens stay those tokens
            out.add(text_token_ids(tokenizer, text, token_rules(tokenizer).special_tags), 1)
        else:  # exactly as the rollout encodes observations (special framing tags kept)
            out.add(encode_observation(tokenizer, text), 0)
    if record.get("termination") != "length":  # a finished episode ends with EOS
        eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        out.add([eos], 1 if record.get("termination") == "eos" else 0)
    return out


def render_tool_record(
    tokenizer: Tokenizer, record: EpisodeRecord, template_kwargs: JsonObject | None = None
) -> RenderedEpisode:
    """A tools-format record as TRL's ``environment_factory`` path lays it out
    (``generation.tokens.tool_prompt_ids`` / ``tool_episode_ids``): the prompt with the tools' schemas;
    each policy turn as the text the model writes plus its end-of-message token, with loss; the
    tool results between turns as the template frames them, without loss. Results after the last
    turn are dropped (nothing trains on them)."""
    prompt, episode = split_messages(record)
    kwargs = dict(template_kwargs or {})
    out = RenderedEpisode(str(record.get("episode_id")), tool_prompt_ids(tokenizer, prompt, **kwargs))
    try:
        pieces = tool_episode_ids(tokenizer, episode, **kwargs)
    except ValueError as exc:
        raise SFTDataError(f"record {record.get('episode_id')}: {exc}") from exc
    while pieces and pieces[-1][1] == 0:
        pieces.pop()
    for ids, mask in pieces:
        out.add(ids, mask)
    return out


def render_episode(
    tokenizer: Tokenizer, record: EpisodeRecord, template_kwargs: JsonObject | None = None
) -> RenderedEpisode:
    """A record in the layout of the GRPO path its action format trains on: tool-call records as
    TRL's ``environment_factory`` lays them out, tag records as our ``rollout_func`` does."""
    if tool_calls.is_tools_record(record):
        return render_tool_record(tokenizer, record, template_kwargs)
    return render_record(tokenizer, record, template_kwargs=template_kwargs)


@dataclass
class Selection:
    """The records chosen for SFT and how many were dropped for each reason, so a run says what it
    trained on."""

    records: list[EpisodeRecord]
    total: int
    dropped: Counter[str]  # reason -> count

    def describe(self) -> str:
        parts = [f"{len(self.records)} of {self.total} records selected"]
        parts += [f"{n} {reason}" for reason, n in sorted(self.dropped.items())]
        return "; ".join(parts)


def select_records(
    records: Iterable[EpisodeRecord], keep: str | None = None, statuses: Sequence[str] = USABLE_STATUSES
) -> Selection:
    """Records whose status is usable and that match ``keep`` (the ``rollout --keep`` language)."""
    bad = [s for s in statuses if s in UNUSABLE_STATUSES]
    if bad:
        raise SFTDataError(
            f"status {bad[0]!r} is not SFT data: its observations come from an infrastructure fault "
            f"or it never ended (usable: {', '.join(USABLE_STATUSES)})"
        )
    matcher = RecordFilter(keep) if keep else None
    chosen: list[EpisodeRecord] = []
    dropped: Counter[str] = Counter()
    total = 0
    for record in records:
        total += 1
        status = record.get("reward_status")
        if status not in statuses:
            dropped[f"status {status}"] += 1
        elif not own_turn_indices(record):  # nothing the policy wrote (or only a replayed prefix)
            dropped["without a policy turn"] += 1
        elif matcher is not None and not matcher(record):
            dropped["not matching the filter"] += 1
        else:
            chosen.append(record)
    return Selection(chosen, total, dropped)


def load_records(paths: Sequence[str | Path]) -> list[EpisodeRecord]:
    """Records from JSONL files or run folders (``rollout --out``, a train ``output_dir``)."""
    records: list[EpisodeRecord] = []
    for path in paths:
        try:
            records.extend(cast(list[EpisodeRecord], load_run(path).records))
        except FileNotFoundError:
            raise SFTDataError(f"no such records file or run folder: {path}")
        except ValueError as exc:
            raise SFTDataError(str(exc))
    return records


def sft_rows(tokenizer: Tokenizer, records: Sequence[EpisodeRecord]) -> list[dict[str, list[int]]]:
    """Pre-tokenised rows for ``trl.SFTTrainer`` (``input_ids`` and ``labels``; TRL keeps given labels)."""
    rows = []
    for record in records:
        rendered = render_episode(tokenizer, record)
        rows.append({"input_ids": rendered.input_ids, "labels": rendered.labels})
    return rows
