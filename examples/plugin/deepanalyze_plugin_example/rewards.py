"""The plugin's reward function.

Parameters named after context fields (``answer``, ``trajectory``, ``code_pass``, …) are
passed by the env; any other parameter is an argument of the function's own, set per task in
the reward spec: ``{"name": "answer_len_ok", "args": {"limit": 40}}``. The annotation is
checked when the plan is built, so ``"limit": "40"`` fails before any episode runs.
"""

from __future__ import annotations


def answer_len_ok(answer: str | None, limit: int = 200) -> float:
    """1.0 when the final answer is at most ``limit`` characters, else 0.0 (also without an answer)."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return float(answer is not None and len(answer) <= limit)
