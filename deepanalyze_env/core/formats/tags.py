"""The tag format (``action_format: tags``, the default): ``<Analyze>/<Code>/<Answer>`` turns.

A turn is cut after its earliest closing tag by the profile's rule, ends the episode when it
holds an answer (read in prose, ``protocol.read_turn``), else runs its ``<Code>`` block; the
output comes back framed in ``<Execute>`` under ``env_config.observation_role``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from deepanalyze_env.core import protocol
from deepanalyze_env.core.contracts import ChatMessage, Gate
from deepanalyze_env.core.formats.base import Action, ActionFormat
from deepanalyze_env.core.prefix import PrefixTurn, parse_prefix

if TYPE_CHECKING:
    from deepanalyze_env.core.config import EnvConfig
    from deepanalyze_env.core.profiles import Profile
    from rewards.context import RewardContext


class TagsFormat(ActionFormat):
    """DeepAnalyze's tag protocol (docs/design.md §6, "The protocol, read")."""

    name = "tags"
    prompt_file = "prompts/protocol.md"
    stop_strings = tuple(protocol.STOP_TAGS)
    stops_are_tags = True
    # an <Answer> left open wins over an open <Code>, as the v1 cut reads the earliest stop
    blocks = (("<Answer>", protocol.ANSWER_CLOSE), ("<Code>", protocol.CODE_CLOSE))

    def cut(self, text: str, profile: Profile | None = None) -> str:
        """The profile's cut (v1: the earliest stop tag, read in the fold; upstream: DeepAnalyze's
        rule), the v1 cut without one."""
        return profile.truncate(text) if profile is not None else super().cut(text)

    def read(self, text: str, profile: Profile) -> Action:
        cut = self.cut(text, profile)
        return Action(
            text=cut,
            message={"role": "assistant", "content": cut},
            end="answer" if profile.has_answer(cut) else None,
            code=protocol.extract_code(cut),
            no_code=protocol.NO_CODE_MESSAGE,
        )

    def read_at_eos(self, text: str, profile: Profile) -> Action:
        cut = self.cut(text, profile)
        return Action(
            text=cut,
            message={"role": "assistant", "content": cut},
            end="answer" if profile.has_answer(cut) else "eos",
        )

    def observation(self, output: str, config: EnvConfig) -> ChatMessage:
        return {"role": config.observation_role, "content": protocol.render_observation(output)}

    def gate(self, ctx: RewardContext, fence: bool) -> tuple[Gate, str] | None:
        """The gate tags in the prose of the policy's own turns, then (``fence``) every
        ``<Code>`` block one Python fence. Both read each turn on its own, as the env read it to
        run its code: an unclosed ``<think>`` in one turn hides nothing in the next."""
        if ctx.tool_errors:  # a turn the env could not read (``DeepAnalyzeEnv._read``)
            return "tags", "; ".join(ctx.tool_errors)
        missing = protocol.missing_gate_tags(ctx.policy_turns or ctx.policy_text)
        if missing:
            return "tags", f"missing {', '.join(missing)}"
        turns = ctx.policy_turns or [ctx.policy_text]
        if fence and not all(protocol.is_python_fenced(b) for t in turns for b in protocol.code_blocks(t)):
            return "fence", "a <Code> block is not one ```python fenced block"
        return None

    def answer(self, policy_turns: Sequence[str], submitted: str | None) -> str | None:
        """The last ``<Answer>`` opened in prose; an answer given outside the tags (a judge-eval
        candidate that is an answer only) wins."""
        if submitted is not None:
            return protocol.answer_value(submitted)
        return protocol.extract_answer(policy_turns)

    def own_text(self, turn: str) -> str:
        return turn

    def parse_prefix(self, value: object, profile: Profile) -> list[PrefixTurn]:
        return parse_prefix(value, profile.has_answer)
