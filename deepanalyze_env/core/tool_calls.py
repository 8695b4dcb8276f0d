"""The tool-calling action format (``env_config.action_format: tools``): the one owner of its
tool set, its call syntax and the rules a call must meet.

Most current open models act through their chat template's native tool calls rather than the
``<Analyze>/<Code>/<Answer>`` tags. In this format an episode's actions are calls of two tools —
the public contract — with free text allowed between them:

- ``run_python(code)``: runs ``code`` in the episode's sandboxed kernel, exactly as a ``<Code>``
  block would (same ``code_pass`` rule, same output cap); the tool result is the cell's output;
- ``submit_answer(answer)``: ends the episode with ``answer`` as the final answer.

A turn's text is read as hermes-style tool calls, ``<tool_call>{"name": …, "arguments": {…}}
</tool_call>`` (Qwen, Hermes and most chat templates render calls this way): the turn is cut
after its first closing ``</tool_call>`` (one call per turn, as one code block per turn in the
tag format), so ``</tool_call>`` is the stop string a trainer generates with. A call that does
not parse (whatever the JSON reader rejects, nesting too deep for it included), names an
unknown tool or has invalid arguments is the policy's failure: the turn
gets an error result naming the reason (:data:`ToolError`), nothing runs, and the episode's
format gate fails (``gate: "tools"``). Trainers that parse calls themselves (TRL's
``environment_factory``) hand the env a :class:`ToolCall` directly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from deepanalyze_env.core.contracts import ChatMessage, ChatToolCall, EpisodeRecord, JsonObject, JsonValue
from deepanalyze_env.core.fold import Folded

RUN_PYTHON = "run_python"
SUBMIT_ANSWER = "submit_answer"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
STOP_STRINGS: tuple[str, ...] = (CALL_CLOSE,)

# tool name -> (its one argument, what the argument is); the schemas below are built from this
TOOL_ARGUMENTS: dict[str, tuple[str, str]] = {
    RUN_PYTHON: ("code", "Python source to run in the analysis kernel; print() what you want to see."),
    SUBMIT_ANSWER: ("answer", "The final answer; for a single value, the value itself."),
}
TOOL_DESCRIPTIONS: dict[str, str] = {
    RUN_PYTHON: (
        "Run one block of Python in a sandboxed kernel whose working directory holds the task's "
        "data files, and return its printed output (errors included)."
    ),
    SUBMIT_ANSWER: "Submit the final answer and end the analysis.",
}
TOOL_NAMES: tuple[str, ...] = tuple(TOOL_ARGUMENTS)

ToolError = Literal["unparsable", "unknown_tool", "bad_arguments"]
"""Why a call is not a valid action: its text is not a JSON object with ``name`` and
``arguments``; it names a tool outside :data:`TOOL_NAMES`; its arguments are not exactly the
tool's one argument as text (a number is accepted as an answer and read as its JSON text)."""


@dataclass(frozen=True)
class ToolCall:
    """One valid call: a known tool and its one argument as text."""

    name: str
    argument: str

    def arguments(self) -> dict[str, str]:
        return {TOOL_ARGUMENTS[self.name][0]: self.argument}


@dataclass(frozen=True)
class ParsedTurn:
    """A policy turn in the tools format: the free text before its call, and its call or the
    reason it has none that counts (``call`` and ``error`` both None: no call at all)."""

    text: str
    call: ToolCall | None
    error: ToolError | None = None
    detail: str = ""  # what was wrong, for the error result and the gate's note


def _load_json(text: str) -> tuple[JsonValue, str | None]:
    """``text`` read as JSON, or None and why not. Whatever the reader can raise on hostile text
    is a reason, not an exception: too deeply nested (a ``RecursionError`` past a few thousand
    brackets), not JSON, an integer past Python's digit limit (a ``ValueError``)."""
    try:
        return json.loads(text), None
    except RecursionError:
        return None, "nested too deeply to read"
    except ValueError as exc:
        return None, getattr(exc, "msg", None) or str(exc)


def check_call(name: JsonValue, arguments: JsonValue) -> ToolCall | tuple[ToolError, str]:
    """A :class:`ToolCall` when ``name`` and ``arguments`` (as a call's JSON carries them) make a
    valid call, else the named reason and what was wrong."""
    if not isinstance(name, str) or name not in TOOL_ARGUMENTS:
        return "unknown_tool", f"unknown tool {name!r} (the tools are {', '.join(TOOL_NAMES)})"
    if isinstance(arguments, str):  # some templates carry the arguments as JSON text
        arguments, why = _load_json(arguments)
        if why is not None:
            return "bad_arguments", f"{name}: arguments are not a JSON object ({why})"
    key = TOOL_ARGUMENTS[name][0]
    if not isinstance(arguments, dict) or set(arguments) != {key}:
        got = sorted(arguments) if isinstance(arguments, dict) else type(arguments).__name__
        return "bad_arguments", f"{name} takes exactly one argument, {key!r} (got {got})"
    value = arguments[key]
    if name == SUBMIT_ANSWER and isinstance(value, int | float) and not isinstance(value, bool):
        value = json.dumps(value)
    if not isinstance(value, str) or not value.strip():
        return "bad_arguments", f"{name}: {key!r} must be non-empty text"
    return ToolCall(name, value)


def parse_turn(action: str) -> ParsedTurn:
    """Read one (already truncated) turn: its free text and its first call. The call's tags are
    found in the turn's fold (``core/fold.py``: ``＜tool_call＞`` is one), its JSON read as typed."""
    reading = Folded.of(action)
    start = reading.folded.find(CALL_OPEN)
    if start < 0:
        return ParsedTurn(action, None)
    text = reading.raw_slice(0, start)
    end = reading.folded.find(CALL_CLOSE, start)
    body = reading.raw_slice(start + len(CALL_OPEN), end if end >= 0 else len(reading.folded))
    if end < 0:
        return ParsedTurn(text, None, "unparsable", f"{CALL_OPEN} without {CALL_CLOSE}")
    payload, why = _load_json(body)
    if why is not None:
        return ParsedTurn(text, None, "unparsable", f"the call is not JSON ({why})")
    if not isinstance(payload, dict) or "name" not in payload or "arguments" not in payload:
        return ParsedTurn(text, None, "unparsable", 'a call is {"name": …, "arguments": {…}}')
    checked = check_call(payload["name"], payload["arguments"])
    if isinstance(checked, ToolCall):
        return ParsedTurn(text, checked)
    return ParsedTurn(text, None, checked[0], checked[1])


def render_call(call: ToolCall) -> str:
    """The hermes-style text of a call (what a scripted policy or an SFT reference writes).
    ``</`` inside the JSON is written ``<\\/`` (the same string to a JSON reader), so code that
    mentions ``</tool_call>`` cannot end the call early."""
    payload = json.dumps({"name": call.name, "arguments": call.arguments()}).replace("</", "<\\/")
    return f"{CALL_OPEN}\n{payload}\n{CALL_CLOSE}"


def assistant_message(turn: ParsedTurn, raw: str) -> ChatMessage:
    """The record's view of a policy turn: the free text and, for a valid call, the structured
    ``tool_calls`` chat templates render; an invalid or missing call keeps the raw text."""
    if turn.call is None:
        return {"role": "assistant", "content": raw}
    call: ChatToolCall = {
        "type": "function",
        "function": {"name": turn.call.name, "arguments": turn.call.arguments()},
    }
    return {"role": "assistant", "content": turn.text.strip(), "tool_calls": [call]}


def result_message(name: str, output: str) -> ChatMessage:
    """The tool result the policy sees next (role ``tool``)."""
    return {"role": "tool", "name": name, "content": output}


def error_output(turn: ParsedTurn) -> str:
    """The error result of an invalid call: the reason's name and what was wrong."""
    return f"[Error]: invalid tool call ({turn.error}): {turn.detail}"


def tool_schemas() -> list[JsonObject]:
    """The two tools as JSON schemas (the ``tools=`` of a chat template)."""
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": TOOL_DESCRIPTIONS[name],
                "parameters": {
                    "type": "object",
                    "properties": {arg: {"type": "string", "description": about}},
                    "required": [arg],
                },
            },
        }
        for name, (arg, about) in TOOL_ARGUMENTS.items()
    ]


def from_tags(turn: str) -> str:
    """A tag-format turn written as a tools-format turn: the ``<Analyze>`` text as free text, then
    its ``<Code>`` as a ``run_python`` call or its ``<Answer>`` as a ``submit_answer`` call (a turn
    with neither stays free text). How reference trajectories, written in tags, become tool-call
    episodes with the same cells and answers (``rollout --policy scripted`` in the tools format)."""
    from deepanalyze_env.core import protocol

    analysis = "\n".join(b.strip() for b in protocol.blocks(turn, "<Analyze>", "</Analyze>"))
    code = protocol.extract_code(turn)
    answers = protocol.read_turn(turn).answers  # an <Answer> written inside code is no answer
    answer = answers[0] if answers else None
    if code is not None:
        call: ToolCall | None = ToolCall(RUN_PYTHON, code)
    elif answer is not None and answer.strip():
        call = ToolCall(SUBMIT_ANSWER, answer.strip())
    else:
        call = None
    text = analysis if analysis else ("" if call is not None else turn)
    if call is None:
        return text
    return (text + "\n" if text else "") + render_call(call)


def assistant_text(message: ChatMessage) -> str:
    """The text a policy wrote for a recorded assistant message: its free text and, for a
    structured call, the call as hermes text (what :func:`parse_turn` reads back)."""
    text = str(message.get("content") or "")
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        checked = check_call(function.get("name"), function.get("arguments"))
        if isinstance(checked, ToolCall):
            text = (text + "\n" if text else "") + render_call(checked)
    return text


def is_tools_record(record: EpisodeRecord | JsonObject) -> bool:
    """Whether an episode record was played in the tools format (it holds a structured call or a
    tool result)."""
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in record.get("messages") or [])
