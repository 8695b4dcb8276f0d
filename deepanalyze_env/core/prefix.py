"""A row's ``prefix``: earlier turns of an episode that a recovery task starts from.

``deepanalyze-rl recover`` cuts a recorded episode right after a failed cell's ``<Execute>``
observation; the messages from the policy's first turn up to that observation become the new
row's ``prefix``. The env replays the prefix's cells in the episode's own kernel at ``init``
(files written by earlier cells exist again, and with ``stateful_cells`` so do variables) and
shows the prefix to the policy as prior conversation. A replayed output that differs from the
recorded one means the starting point cannot be rebuilt: that row is not reproducible.

The shape is checked here so a bad prefix is a one-line ``ConfigError`` at env construction
(and in the startup row check), never a surprise mid-episode.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from deepanalyze_env.core import protocol
from deepanalyze_env.core.errors import ConfigError

OBSERVATION_HEAD = "\n<Execute>\n"
SHOWN_CHARS = 120  # of each output in a mismatch message


@dataclass(frozen=True)
class PrefixTurn:
    """One policy turn of the prefix and the observation that was recorded after it."""

    action: str  # the assistant message, as recorded (already cut at its closing tag)
    observation: dict[str, str]  # {"role": …, "content": "\n<Execute>\n…\n</Execute>\n"}


def parse_prefix(value: object, has_answer: Callable[[str], bool]) -> list[PrefixTurn]:
    """The row's ``prefix`` as turns; raises ``ConfigError`` naming what is wrong.

    A prefix is a non-empty list of ``{role, content}`` messages that alternate an ``assistant``
    turn and its ``<Execute>`` observation (any role but ``assistant``), ending with an
    observation. It may arrive as JSON text (Parquet). No turn may hold an answer: the episode
    would have ended there.
    """
    if hasattr(value, "tolist"):  # a list column read back through pandas is a numpy array
        value = value.tolist()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"extras.prefix is a string but not JSON: {exc.msg}")
    if not isinstance(value, Sequence) or isinstance(value, str | bytes) or not value:
        raise ConfigError("extras.prefix must be a non-empty list of {role, content} messages")
    messages = list(value)
    if len(messages) % 2:
        raise ConfigError(
            f"extras.prefix has {len(messages)} messages; it must alternate assistant turns and their "
            "<Execute> observations and end with an observation"
        )
    turns = []
    for i in range(0, len(messages), 2):
        action, observation = messages[i], messages[i + 1]
        for j, message in ((i, action), (i + 1, observation)):
            if not isinstance(message, dict) or not isinstance(message.get("content"), str):
                raise ConfigError(f"extras.prefix[{j}] must be a {{role, content}} message with text content")
        if action.get("role") != "assistant":
            raise ConfigError(
                f"extras.prefix[{i}] must be an assistant turn, got role {action.get('role')!r}"
            )
        role = observation.get("role")
        if (
            not isinstance(role, str)
            or role == "assistant"
            or not observation["content"].startswith(OBSERVATION_HEAD)
        ):
            raise ConfigError(
                f"extras.prefix[{i + 1}] must be the <Execute> observation of the turn before it"
            )
        if has_answer(action["content"]):
            raise ConfigError(f"extras.prefix[{i}] holds an <Answer>: a prefix ends before the episode does")
        turns.append(PrefixTurn(action["content"], {"role": role, "content": observation["content"]}))
    return turns


def prefix_messages(turns: Sequence[PrefixTurn]) -> list[dict[str, str]]:
    """The prefix as chat messages (what the policy is shown after the prompt)."""
    out: list[dict[str, str]] = []
    for turn in turns:
        out.append({"role": "assistant", "content": turn.action})
        out.append({"role": turn.observation["role"], "content": turn.observation["content"]})
    return out


def _short(text: str) -> str:
    text = text.strip("\n")
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def first_mismatch(turns: Sequence[PrefixTurn], execute: Callable[[str], str]) -> str | None:
    """Replay every turn with ``execute`` (action → output) in order; None when each rendered
    output equals the recorded observation, else a one-line reason naming the first turn that
    differs. Replay stops there: later cells would run on a state that is already wrong."""
    for n, turn in enumerate(turns, 1):
        replayed = protocol.render_observation(execute(turn.action))
        if replayed != turn.observation["content"]:
            recorded = (
                turn.observation["content"].removeprefix(OBSERVATION_HEAD).removesuffix("\n</Execute>\n")
            )
            got = replayed.removeprefix(OBSERVATION_HEAD).removesuffix("\n</Execute>\n")
            return (
                f"prefix replay differs at prefix turn {n} of {len(turns)}: "
                f"recorded {_short(recorded)!r}, replayed {_short(got)!r}"
            )
    return None
