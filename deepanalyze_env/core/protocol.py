"""The DeepAnalyze action protocol: truncation, done detection, code and answer extraction.

Pure functions over text, so trainers, the env and offline tools agree on what a turn means.
Format checks in ``v1`` read only what the policy wrote (assistant turns), never execution
output: a cell that prints ``<Answer>`` must not satisfy the gate.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

CODE_CLOSE = "</Code>"
ANSWER_OPEN = "<Answer>"
ANSWER_CLOSE = "</Answer>"
STOP_TAGS = (CODE_CLOSE, ANSWER_CLOSE)
GATE_TAGS = ("<Analyze>", "</Analyze>", ANSWER_OPEN, ANSWER_CLOSE)

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
CODE_OPEN = "<Code>"
# A fenced block: optional language word on the opening line, body, closing fence.
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\r?\n?(.*?)```", re.DOTALL)
PYTHON_FENCE_LANGS = frozenset({"python", "py", "python3"})


def truncate_action(action: str) -> str:
    """Cut after the earliest ``</Code>`` or ``</Answer>`` — what stop sequences would do."""
    cut = -1
    for tag in STOP_TAGS:
        pos = action.find(tag)
        if pos >= 0 and (cut < 0 or pos + len(tag) < cut):
            cut = pos + len(tag)
    return action if cut < 0 else action[:cut]


def strip_think(text: str) -> str:
    """Remove ``<think>…</think>`` spans (an unclosed one runs to the end)."""
    return _THINK.sub("", text)


def blocks(text: str, open_tag: str, close_tag: str) -> Iterator[str]:
    """Inner texts of ``open…close`` blocks, left to right, in linear time.

    Equivalent to ``re.finditer(open(.*?)close, DOTALL)`` but without its quadratic cost on
    text with many opening tags and no closing one (a policy can write a megabyte of
    ``<Code>``): once an opening tag has no closing tag after it, no later one can.
    """
    pos = 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            return
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            return
        yield text[start + len(open_tag) : end]
        pos = end + len(close_tag)


def has_answer(action: str) -> bool:
    return next(blocks(strip_think(action), ANSWER_OPEN, ANSWER_CLOSE), None) is not None


def extract_code_block(action: str) -> str | None:
    """Inner text of the first ``<Code>…</Code>`` block, or None when there is none."""
    return next(blocks(strip_think(action), CODE_OPEN, CODE_CLOSE), None)


def extract_code(action: str) -> str | None:
    """Python source of the turn: the fenced body if fenced (``python``/``py``/none), else raw.

    Returns None when the turn holds no ``<Code>`` block or the block is blank.
    """
    block = extract_code_block(action)
    if block is None:
        return None
    fence = _FENCE.search(block)
    code = fence.group(2) if fence else block
    code = code.strip("\n")
    return code if code.strip() else None


def code_blocks(policy_text: str) -> list[str]:
    return list(blocks(strip_think(policy_text), CODE_OPEN, CODE_CLOSE))


def is_python_fenced(block: str) -> bool:
    """True when the whole block is one fenced block tagged as Python."""
    stripped = block.strip()
    fence = _FENCE.fullmatch(stripped)
    return fence is not None and fence.group(1).lower() in PYTHON_FENCE_LANGS


def extract_answer(policy_turns: Iterable[str]) -> str | None:
    """Final answer: the policy's last ``<Answer>`` block, text after its last ``Answer:``."""
    last = None
    for turn in policy_turns:
        for block in blocks(strip_think(turn), ANSWER_OPEN, ANSWER_CLOSE):
            last = block
    return answer_value(last)


def answer_value(text: str | None) -> str | None:
    """The answer an answer text gives: after its last ``Answer:``, stripped (both action
    formats read a final answer by this rule)."""
    if text is None:
        return None
    text = text.strip()
    marker = text.rfind("Answer:")
    if marker >= 0:
        text = text[marker + len("Answer:") :].strip()
    return text


def missing_gate_tags(policy_text: str) -> list[str]:
    visible = strip_think(policy_text)
    return [tag for tag in GATE_TAGS if tag not in visible]


def render_observation(output: str) -> str:
    return f"\n<Execute>\n{output}\n</Execute>\n"
