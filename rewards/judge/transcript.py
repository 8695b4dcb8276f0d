"""The judge's view of an episode: its messages as parts, each with the author its role gives it.

Why this exists: the ``trajectory`` context field joins message contents as the model saw them,
so an ``<Execute>`` block the policy typed into its own turn reads exactly like real execution
output, and a judge told that ``<Execute>`` holds what the code printed takes the forgery as
evidence. Here authorship comes from who appended the message, never from its text: an
``assistant`` message is the analyst's turn (a recovery row's ``prefix`` turns are ``recorded``
ones), any other message after the first turn is the environment's reply. The env appends
exactly one assistant message per policy turn and nothing but observations between them, so the
last ``turns + prefix_turns`` assistant messages mark where the judged part begins (the
convention ``core.records.own_turn_indices`` documents).

This module only builds the parts; :func:`rewards.judge.prompts.render` draws them with marker
lines the policy cannot write and escapes observation tags inside analyst text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from deepanalyze_env.core.contracts import JsonValue

Author = Literal["analyst", "recorded", "environment"]

# A lone UTF-16 surrogate: a JSON string in a policy's tool call can decode to one (``"\\ud800"``),
# and no UTF-8 text — a prompt, a cache key — can carry it.
_SURROGATE = re.compile("[\ud800-\udfff]")

# How the env renders a tags-format observation (``core.protocol.render_observation``).
_RENDERED_OBSERVATION = re.compile(r"\n<Execute>\n.*?\n</Execute>\n", re.DOTALL)


@dataclass(frozen=True)
class Part:
    """One message of the episode: who wrote it, and its text as the judge should read it."""

    author: Author
    text: str


@dataclass(frozen=True)
class Transcript:
    """An episode as authored parts, in order; a rubric field value that ``render`` marks part by part."""

    parts: tuple[Part, ...]

    def canonical(self) -> str:
        """Authors and texts in one string: what the section id hashes, so the id covers every part."""
        return "".join(f"\x1e{part.author}\x1f{part.text}" for part in self.parts)

    def recorded_prefix(self) -> Transcript:
        """The parts before the episode's first own turn: a recovery row's recorded turns and the
        environment's replies to them, which the task supplied. What stays when the episode's own
        text is emptied to decide whose failure a refused or unfittable prompt is."""
        first_own = next(
            (i for i, part in enumerate(self.parts) if part.author == "analyst"), len(self.parts)
        )
        return Transcript(self.parts[:first_own])


def sendable(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD, so the judge can be sent it: left in,
    it would fail the prompt's encoding, a failure the policy's own text chose."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def sendable_field(value: str | Transcript) -> str | Transcript:
    """A rubric field (text or transcript) as :func:`sendable` text."""
    if isinstance(value, Transcript):
        return Transcript(tuple(Part(part.author, sendable(part.text)) for part in value.parts))
    return sendable(str(value))


def _text(content: JsonValue) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI-style content parts
        return "".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content)
    return str(content)


def _call_text(call: JsonValue) -> str:
    """A structured tool call as readable text: the tool, then each argument's name and value."""
    function = call.get("function", call) if isinstance(call, Mapping) else {}
    name = function.get("name", "?") if isinstance(function, Mapping) else "?"
    arguments = function.get("arguments") if isinstance(function, Mapping) else call
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return f"Tool call {name}, arguments:\n{arguments}"
    if isinstance(arguments, Mapping) and all(isinstance(v, str) for v in arguments.values()):
        return "\n".join(f"Tool call {name}, {key}:\n{value}" for key, value in arguments.items()) or (
            f"Tool call {name}"
        )
    return f"Tool call {name}, arguments:\n{json.dumps(arguments, ensure_ascii=False)}"


def _assistant_text(message: Mapping[str, JsonValue]) -> str:
    pieces = [_text(message.get("content")).strip("\n")]
    pieces += [_call_text(call) for call in message.get("tool_calls") or []]
    return "\n".join(p for p in pieces if p)


def episode_transcript(
    messages: Sequence[Mapping[str, JsonValue]], turns: int, prefix_turns: int = 0
) -> Transcript:
    """The judged part of ``messages``: the ``prefix_turns`` recorded turns, then the ``turns`` own
    ones, each followed by the environment's replies. A context whose messages hold fewer assistant
    turns than it claims raises: judging a shorter trajectory than the episode's would be a guess.
    """
    assistant = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    wanted = turns + prefix_turns
    if turns < 0 or prefix_turns < 0 or wanted > len(assistant):
        raise ValueError(
            f"the context's messages hold {len(assistant)} assistant turn(s) but it counts "
            f"turns={turns} and prefix_turns={prefix_turns}"
        )
    if wanted == 0:
        return Transcript(())
    window = assistant[len(assistant) - wanted :]
    recorded = set(window[:prefix_turns])
    parts = []
    for index in range(window[0], len(messages)):
        message = messages[index]
        if message.get("role") == "assistant":
            parts.append(Part("recorded" if index in recorded else "analyst", _assistant_text(message)))
        else:
            parts.append(Part("environment", _text(message.get("content")).strip("\n")))
    return Transcript(tuple(parts))


def messages_from_rendered(text: str) -> list[dict[str, str]]:
    """Split a tags-format trajectory whose observations the env rendered (fixtures, benchmarks)
    back into assistant and observation messages.

    Only for text this repository wrote: it trusts every ``<Execute>`` block in ``text``, which is
    exactly what must never be done with a policy's turn — the env hands judges its messages.
    """
    messages: list[dict[str, str]] = []
    position = 0
    for match in _RENDERED_OBSERVATION.finditer(text):
        messages.append({"role": "assistant", "content": text[position : match.start()]})
        messages.append({"role": "user", "content": match.group(0)})
        position = match.end()
    if position < len(text) or not messages:
        messages.append({"role": "assistant", "content": text[position:]})
    return messages
