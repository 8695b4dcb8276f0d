"""Profiles (docs/design.md §8): ``v1`` (fixed semantics) and ``upstream`` (DeepAnalyze's).

A profile is data: the truncation rule, the code-pass rule, the texts of executor failures
that the code-pass rule reads, whether code runs without a workspace, the reward plan, and
how a judge's ``SCORE:`` lines are read. Both keep v1's executor (no deadlock, enforced
timeouts) and v1's construction-time errors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deepanalyze_env.core import protocol

if TYPE_CHECKING:
    from rewards.plan import Plan


def truncate_upstream(action: str) -> str:
    """``</Answer>`` anywhere wins, else the first ``</Code>`` (DeepAnalyze's rule)."""
    for tag in (protocol.ANSWER_CLOSE, protocol.CODE_CLOSE):
        pos = action.find(tag)
        if pos >= 0:
            return action[: pos + len(tag)]
    return action


def code_pass_v1(status: str, output: str) -> int:
    """1 when the cell ran to the end without an error *and* printed something that is not
    whitespace, else 0 (docs/design.md §7, "Code pass").

    Both facts are the trainer side's own observations: ``status`` is the kernel's verdict from
    its clock and sockets, ``output`` the stream it captured; nothing rests on what the worker
    says about itself. A cell that shows nothing (``pass``, or a bare ``df = pd.read_csv(...)``)
    is a turn in which nothing was learned, so it earns nothing; the protocol prompt tells the
    policy to ``print()`` what it wants to see, and every shipped reference cell does.
    """
    return int(status == "ok" and bool(output.strip()))


def code_pass_upstream(status: str, output: str) -> int:
    """0 when the output holds ``[Error]:`` or is empty, else 1 — so a timeout counted as a pass.
    DeepAnalyze's rule, kept as it was."""
    return int(bool(output) and "[Error]:" not in output)


def has_answer_upstream(action: str) -> bool:
    return protocol.ANSWER_OPEN in action and protocol.ANSWER_CLOSE in action


def _v1_plan(spec: Mapping) -> Plan:
    from rewards import RewardPlan

    return RewardPlan.build(spec)


def _upstream_plan(spec: Mapping) -> Plan:
    from rewards.upstream import UpstreamPlan

    return UpstreamPlan.build(spec)


@dataclass(frozen=True)
class Profile:
    """The rules one profile scores by (truncation, answer test, code pass, reward plan, judge-reply
    rule): the v1 rules and DeepAnalyze's upstream rules side by side, so one env reproduces either."""

    name: str
    truncate: Callable[[str], str]
    has_answer: Callable[[str], bool]
    code_pass: Callable[[str, str], int]
    build_plan: Callable[[Mapping], Plan]
    score_rule: str  # which SCORE: line a judge reply is read by
    run_without_workspace: bool = True
    timeout_message: str | None = None  # None: the executor's own text
    crash_message: str | None = None


PROFILES: dict[str, Profile] = {
    "v1": Profile("v1", protocol.truncate_action, protocol.has_answer, code_pass_v1, _v1_plan, "last"),
    "upstream": Profile(
        "upstream",
        truncate_upstream,
        has_answer_upstream,
        code_pass_upstream,
        _upstream_plan,
        "first",
        run_without_workspace=False,
        # Upstream wrote "[Error]" without the colon for these, so its rule counted them as passes.
        timeout_message="[Error]\nTimeout: the cell ran longer than {timeout} seconds and was stopped.",
        crash_message="[Error]\nThe cell ended without a result.",
    ),
}
