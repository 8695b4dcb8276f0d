"""The one episode driver: how a policy turn ended decides which env call plays it.

Every path that plays episodes — ``rollout``/``eval``/``collect`` (``offline/rollout.py``), the
TRL rollout function, TRL's ``environment_factory``, the bank's reference episodes and the
served sessions — hands its turns to :func:`apply_turn`, so a turn that ends the same way is the
same game everywhere. A turn reports its end as a :data:`TurnEnd`:

- ``stop``: it reached its format's stop string (a closing ``</Code>``/``</Answer>``, or a
  ``</tool_call>``; a sampler stops there) → ``env.step(text)``; a call the caller parsed itself
  (a tool-calling client, TRL's tool dispatch) → ``env.act(call)``;
- ``eos``: the policy ended its message without a stop string → ``env.end_with_eos(text)``: the
  episode ends by the format's rule (``termination: "eos"`` unless the turn holds an answer);
- ``length``: a token limit cut the turn → stepped as it stands (a turn-level limit, as SkyRL's
  per-turn generation limit and an OpenAI teacher's ``max_tokens``), unless the limit was the
  episode's own token budget (``out_of_budget``): then the action is never stepped and the
  episode ends for length (``env.end_for_length()``; trainers mask it unless ``score_truncated``).

Who says how a turn ended: ``generation.turn_end`` for token turns (``split_turn``) and for
text a sampler stopped by itself (``text_turn_end``); the offline policies map their backend's
finish reason onto it (``offline/policies.py``). :func:`play` runs a whole episode against a
:data:`NextTurn` source, for the paths that hold one episode at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from skyrl_gym.envs.base_text_env import BaseTextEnvStepOutput

    from deepanalyze_env.core.env import DeepAnalyzeEnv
    from deepanalyze_env.core.tool_calls import ParsedTurn

TurnEnd = Literal["stop", "eos", "length"]
"""``stop``: a stop string (tag) completed; ``eos``: an end-of-sequence token (the end of the
message) came first; ``length``: the turn's token limit came first."""


@dataclass(frozen=True)
class Turn:
    """One policy turn as the driver plays it: its text, how it ended, and for a call a caller
    parsed itself the parsed call (then ``text`` is the call's raw text, or empty for the
    default rendering)."""

    text: str
    end: TurnEnd = "stop"
    call: ParsedTurn | None = None
    out_of_budget: bool = False  # a ``length`` cut by the episode's token budget, not the turn's

    def __post_init__(self) -> None:
        if self.call is not None and self.end != "stop":
            raise ValueError(f"a parsed call is a turn that ended at its call (stop), not {self.end!r}")
        if self.out_of_budget and self.end != "length":
            raise ValueError("out_of_budget describes a length cut")


def apply_turn(env: DeepAnalyzeEnv, turn: Turn) -> BaseTextEnvStepOutput:
    """Play one turn: the only place where how a turn ended becomes an env call."""
    if turn.end == "length" and turn.out_of_budget:
        return env.end_for_length()
    if turn.call is not None:
        return env.act(turn.call, raw=turn.text or None)
    if turn.end == "eos":
        return env.end_with_eos(turn.text)
    return env.step(turn.text)


NextTurn = Callable[["BaseTextEnvStepOutput | None"], Turn]
"""A turn source: given the previous step's output (None before the first turn), the next turn.
A policy behind a conversation, a reference script, a remote agent; it raises to abandon the
episode (the caller closes the env without a record)."""


def play(env: DeepAnalyzeEnv, next_turn: NextTurn) -> BaseTextEnvStepOutput:
    """Play turns from ``next_turn`` until the episode is done; returns the final step. The env
    ends every episode: each turn either counts against ``max_turns`` or ends it."""
    out: BaseTextEnvStepOutput | None = None
    while out is None or not out["done"]:
        out = apply_turn(env, next_turn(out))
    return out
