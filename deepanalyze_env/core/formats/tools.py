"""The tools format (``action_format: tools``): native calls of ``run_python`` and ``submit_answer``.

A turn is cut after its first ``</tool_call>`` and read as hermes text (``core/tool_calls.py``,
the syntax's owner), or handed over already parsed (``DeepAnalyzeEnv.act``). ``submit_answer``
ends the episode with its argument as the answer; a message without a call hands the turn back
(``eos``); an invalid call runs nothing and its result says why. Outputs come back as ``tool``
messages, without ``<Execute>`` framing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from deepanalyze_env.core import protocol, tool_calls
from deepanalyze_env.core.contracts import ChatMessage, Gate
from deepanalyze_env.core.errors import ConfigError
from deepanalyze_env.core.formats.base import Action, ActionFormat
from deepanalyze_env.core.tool_calls import ParsedTurn

if TYPE_CHECKING:
    from deepanalyze_env.core.config import EnvConfig
    from deepanalyze_env.core.profiles import Profile
    from rewards.context import RewardContext


def _error(turn: ParsedTurn) -> str | None:
    return f"{turn.error}: {turn.detail}" if turn.error is not None else None


class ToolsFormat(ActionFormat):
    """Tool calls (docs/design.md §6, "Action formats"); v1 profile only, no prefix rows."""

    name = "tools"
    prompt_file = "prompts/tools.md"
    stop_strings = tuple(tool_calls.STOP_STRINGS)
    blocks = ((tool_calls.CALL_OPEN, tool_calls.CALL_CLOSE),)

    def read(self, text: str, profile: Profile) -> Action:
        cut = self.cut(text)
        return self.from_call(tool_calls.parse_turn(cut), cut)

    def from_call(self, turn: ParsedTurn, raw: str | None) -> Action:
        """``raw``: the turn's text as the policy wrote it (default: the free text and the call
        rendered as hermes text)."""
        call, error = turn.call, _error(turn)
        if raw is None:
            raw = turn.text + (tool_calls.render_call(call) if call is not None else "")
        message = tool_calls.assistant_message(turn, raw)
        if call is None and error is None:  # a message without a call hands the turn back: the end
            return Action(raw, message, end="eos")
        if call is None:  # an invalid call: nothing runs, the result says why
            return Action(raw, message, no_code=tool_calls.error_output(turn), error=error)
        if call.name == tool_calls.SUBMIT_ANSWER:
            return Action(raw, message, end="answer", error=error, submitted=call.argument)
        return Action(raw, message, code=call.argument, error=error)

    def read_at_eos(self, text: str, profile: Profile) -> Action:
        """No closing ``</tool_call>`` came: whatever call the turn began does not count."""
        turn = tool_calls.parse_turn(text)
        return Action(
            text=text, message=tool_calls.assistant_message(turn, text), end="eos", error=_error(turn)
        )

    def observation(self, output: str, config: EnvConfig) -> ChatMessage:
        return tool_calls.result_message(tool_calls.RUN_PYTHON, output)

    def gate(self, ctx: RewardContext, fence: bool) -> tuple[Gate, str] | None:
        """The tag gate in spirit: every call valid, and the episode ended by ``submit_answer``
        (code goes in a ``code`` argument: there is no fence to check)."""
        if ctx.tool_errors:
            return "tools", "; ".join(ctx.tool_errors)
        if ctx.answer is None:
            return "tools", "the episode ended without a submit_answer call"
        return None

    def answer(self, policy_turns: Sequence[str], submitted: str | None) -> str | None:
        """The ``submit_answer`` argument, never the text."""
        return protocol.answer_value(submitted)

    def own_text(self, turn: str) -> str:
        return tool_calls.parse_turn(turn).text.strip()

    def validate(self, config: EnvConfig) -> None:
        if config.profile != "v1":
            raise ConfigError(
                "env_config.action_format: tools needs profile v1 "
                "(the upstream profile is DeepAnalyze's tag rules)"
            )
