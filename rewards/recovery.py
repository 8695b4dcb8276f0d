"""The ``recovery`` component: did the policy's first cell after a recovery task's prefix run?

A recovery task (``deepanalyze-rl recover``) starts right after a failed cell; the question it
asks is whether the policy fixes the failure. The component is 1 when the first cell the policy
runs after the prefix earns code_pass (``v1``: it ends ``ok`` and prints something — a ``pass``
is no fix), 0 when it raises, times out, crashes or shows nothing, and 0 when the policy runs
no cell at all before it ends (it never showed a fix). Turns without code are passed over:
no cell ran in them. On a row without a prefix the question does not exist: the function is
registered ``needs_prefix``, so the env refuses such a row for a plan holding it (a
``ConfigError`` at construction), and a context without a prefix makes this function raise, so
it can never quietly score 0.
"""

from __future__ import annotations

from rewards.registry import register_reward

NOT_A_CELL = ("no_code", "skipped")


@register_reward("recovery", needs_prefix=True)
def recovery(exec_statuses: list[str], code_pass: list[int], prefix_turns: int) -> float:
    """1.0 when the first cell after the prefix earned code_pass (the profile's rule: in ``v1``
    it ran without error and printed something), else 0.0."""
    if prefix_turns <= 0:
        raise ValueError("the recovery component applies only to a row with a prefix (a recovery task)")
    cells = zip(exec_statuses, code_pass, strict=True)
    ran = [passed for status, passed in cells if status not in NOT_A_CELL]
    return float(bool(ran) and ran[0] == 1)
