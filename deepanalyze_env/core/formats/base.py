"""What an action format is: how a policy's turn becomes an action, and the rules that go with it.

``DeepAnalyzeEnv`` plays every format by one loop (record the turn, end the episode or run its
cell, frame the output); what differs between formats is owned by one :class:`ActionFormat`
each: reading a turn into an :class:`Action` (at a stop string, and at the policy's
end-of-sequence token), framing a cell's output as the observation, the format gate, where the
final answer is read, and which rows and profiles the format can play. The text syntax stays in
its parser (``core/protocol.py`` for tags, ``core/tool_calls.py`` for tools), which offline
tools, servers and trainers also read without an env.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from deepanalyze_env.core.contracts import ChatMessage, Gate
from deepanalyze_env.core.errors import ConfigError
from deepanalyze_env.core.fold import Folded

if TYPE_CHECKING:
    from deepanalyze_env.core.config import EnvConfig
    from deepanalyze_env.core.prefix import PrefixTurn
    from deepanalyze_env.core.profiles import Profile
    from deepanalyze_env.core.tool_calls import ParsedTurn
    from rewards.context import RewardContext

Ending = Literal["answer", "eos"]
"""How a turn itself ends the episode (the turn limit and faults are the env's)."""


@dataclass(frozen=True)
class Action:
    """One policy turn as its format reads it: what the env records and what it does next.

    The env records ``text`` and ``message``, notes ``error`` (any fails the format gate), keeps
    ``submitted`` as the final answer, then ends the episode with ``end`` or, turns left, runs
    ``code`` as a cell (None: nothing runs and the observation is ``no_code``, counted as a
    ``no_code`` turn).
    """

    text: str  # the turn as the policy wrote it, cut where the format cuts it (``policy_turns``)
    message: ChatMessage  # the assistant message the conversation and the record keep
    end: Ending | None = None
    code: str | None = None
    no_code: str = ""  # the output shown for a turn with nothing to run: why
    error: str | None = None  # why the turn is not a valid action
    submitted: str | None = None  # an answer given outside the text (``submit_answer``)


class ActionFormat(ABC):
    """The rules of one ``env_config.action_format`` (registered by :attr:`name` in
    ``core/formats/__init__.py``). Instances hold no state: one serves every episode."""

    name: ClassVar[str]
    prompt_file: ClassVar[str]  # the shipped system prompt (``system_prompt: protocol``), in core/
    stop_strings: ClassVar[tuple[str, ...]]  # where a sampled turn ends (``generation/turn_end`` applies it)
    stops_are_tags: ClassVar[bool] = (
        False  # its stop strings are protocol tags a tokenizer may hold as one token
    )
    # (opening, closing) of the blocks a stop string closes, the one to close first when a
    # server swallowed the stop string first (:meth:`put_back`)
    blocks: ClassVar[tuple[tuple[str, str], ...]]

    def cut(self, text: str, profile: Profile | None = None) -> str:
        """The text cut: a turn up to and including its earliest stop string, read in the fold
        (``Folded.cut_after``) — what a sampler stopped there leaves — or all of it. The env
        reads every turn after it; offline policies cut local turns with it. ``profile``: the
        env's profile, for a format whose profiles cut their own way."""
        return Folded.of(text).cut_after(self.stop_strings)

    def put_back(self, text: str, hint: str | None = None) -> str:
        """The turn with the stop string a server swallowed put back. ``hint`` is the matched stop
        string when the server names it (vLLM's ``stop_reason``); otherwise the block left open
        is closed (the first of :attr:`blocks` that is). Text that already ends its block
        (servers that include the stop string) comes back unchanged."""
        if hint in self.stop_strings:
            return text if text.endswith(hint) else text + hint
        for opening, closing in self.blocks:
            start = text.rfind(opening)
            if start >= 0 and closing not in text[start:]:
                return text + closing
        return text

    @abstractmethod
    def read(self, text: str, profile: Profile) -> Action:
        """A turn as sampled (it ended at the format's stop string, or the sampler stopped it):
        cut after what the format executes, and read."""

    @abstractmethod
    def read_at_eos(self, text: str, profile: Profile) -> Action:
        """A turn the policy ended with its end-of-sequence token: the end-of-episode rule (its
        ``end`` is always set; no cell runs after an end-of-message token)."""

    @abstractmethod
    def observation(self, output: str, config: EnvConfig) -> ChatMessage:
        """A cell's output framed as the message the policy sees next."""

    @abstractmethod
    def gate(self, ctx: RewardContext, fence: bool) -> tuple[Gate, str] | None:
        """Which format gate the episode fails and why, or None when it passes (``fence``: the
        method also wants each cell in one Python fence, where the format has fences)."""

    @abstractmethod
    def answer(self, policy_turns: Sequence[str], submitted: str | None) -> str | None:
        """The episode's final answer (after its last ``Answer:``), or None."""

    @abstractmethod
    def own_text(self, turn: str) -> str:
        """The policy's own words in a recorded turn (what the reward-hacking watch reads)."""

    def from_call(self, turn: ParsedTurn, raw: str | None) -> Action:
        """A turn whose call a trainer parsed itself (``DeepAnalyzeEnv.act``); only formats that
        act through structured calls have one."""
        raise ConfigError(f"act() is the tools action format's step; this env has action_format: {self.name}")

    def parse_prefix(self, value: object, profile: Profile) -> list[PrefixTurn]:
        """A recovery row's ``prefix`` as turns to replay; a prefix is recorded tag turns, so
        only the tag format takes one."""
        raise ConfigError("a row with a prefix (a recovery task) needs action_format: tags")

    def validate(self, config: EnvConfig) -> None:  # noqa: B027 (a hook: most formats play every setting)
        """Settings this format cannot play (``EnvConfig.validate`` asks); every one by default."""
