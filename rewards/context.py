"""What a reward function may ask for (docs/design.md §7): one definition, one constructor.

The fields of :class:`RewardContext` are the whole list a reward function may name as
parameters (:data:`CONTEXT_FIELDS` is derived from them, so the registry and the dataclass
cannot disagree), and :meth:`RewardContext.for_episode` is the one way to build one from an
episode's turns: the env calls it at the final step, ``rescore`` calls it on a recorded episode
and ``judge-eval`` on a fixture candidate, so a field is computed by one rule everywhere (the
answer of a ``tools`` episode is its ``submit_answer`` argument in all three, never the tags).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from deepanalyze_env.core.contracts import JsonValue
from deepanalyze_env.core.formats import get_format

if TYPE_CHECKING:
    from rewards.judge import JudgeSession
    from rewards.registry import RewardFunction


@dataclass
class RewardContext:
    """What a reward function may ask for: it names fields as parameters and gets only those.

    Example::

        def short_answer(answer: str | None) -> float:
            return float(answer is not None and len(answer) < 200)
    """

    answer: str | None
    """The final answer: text of the policy's last ``<Answer>`` block, after its last ``Answer:``."""
    policy_text: str
    """The policy's own turns joined by newlines (no observations)."""
    trajectory: str
    """Everything after the prompt, observations included, as the model saw it."""
    messages: list[dict]
    """The whole conversation: prompt messages, policy turns, observations."""
    ground_truth: JsonValue
    """``reward_spec["ground_truth"]``."""
    question: str | None
    """The row's ``input_seq`` (what judges are shown as the task)."""
    code_pass: list[int]
    """Per code turn: 1 when the cell passed (profile rule), else 0."""
    turns: int
    """Policy turns taken."""
    workspace: Path | None
    """The episode's scratch folder (files the policy wrote); valid only while scoring."""
    reward_spec: dict
    """The row's whole reward spec (per-task options are better given as the function's ``args``)."""
    judge: JudgeSession | None = None
    """The episode's judge session, or None when the plan needs no judge."""
    exec_statuses: list[str] = field(default_factory=list)
    """Per code turn: its exec status (``ok``, ``error``, ``timeout``, ``crashed``, ``no_code``,
    ``skipped``)."""
    prefix_turns: int = 0
    """Policy turns of the row's ``prefix`` (a recovery task); 0 for an ordinary row. Every other
    field covers only the turns after the prefix (``messages`` excepted: the whole conversation)."""
    action_format: str = "tags"
    """How the policy acted: ``tags`` or ``tools`` (``env_config.action_format``); ``answer`` is
    the ``submit_answer`` argument in ``tools``."""
    tool_errors: list[str] = field(default_factory=list)
    """``tools`` format: why each invalid tool call was invalid (any fails the format gate)."""
    policy_turns: list[str] = field(default_factory=list)
    """The policy's own turns, one string each (what ``policy_text`` joins): the format gate
    reads each turn's protocol on its own. Empty: ``policy_text`` is read as one turn."""

    def kwargs_for(self, fn: RewardFunction) -> dict[str, object]:
        """The context fields ``fn`` (a registered reward function) names, by name."""
        return {name: getattr(self, name) for name in fn.params}

    @classmethod
    def for_episode(
        cls,
        *,
        messages: Sequence[Mapping[str, JsonValue]],
        episode_start: int,
        policy_turns: Sequence[str],
        reward_spec: Mapping[str, JsonValue],
        question: str | None,
        code_pass: Iterable[int] = (),
        exec_statuses: Iterable[str] = (),
        workspace: Path | None = None,
        judge: JudgeSession | None = None,
        prefix_turns: int = 0,
        action_format: str = "tags",
        submitted: str | None = None,
        tool_errors: Iterable[str] = (),
    ) -> RewardContext:
        """The context of an episode whose own part starts at ``messages[episode_start]``.

        ``policy_turns`` are the policy's own turns as it wrote them; ``submitted`` is an answer
        given outside the tags (the ``tools`` format's ``submit_answer`` argument, or a
        judge-eval candidate that is an answer only). The action format reads the answer
        (``core/formats``): ``tools`` from ``submitted`` only, ``tags`` from ``submitted`` when
        there is one, else from the last ``<Answer>`` of the turns.
        """
        return cls(
            answer=get_format(action_format).answer(policy_turns, submitted),
            policy_text="\n".join(policy_turns),
            policy_turns=list(policy_turns),
            trajectory="".join(str(m.get("content") or "") for m in messages[episode_start:]),
            messages=[dict(m) for m in messages],
            ground_truth=reward_spec.get("ground_truth"),
            question=question,
            code_pass=list(code_pass),
            turns=len(policy_turns),
            workspace=workspace,
            reward_spec=dict(reward_spec),
            judge=judge,
            exec_statuses=[str(s) for s in exec_statuses],
            prefix_turns=prefix_turns,
            action_format=action_format,
            tool_errors=list(tool_errors),
        )


CONTEXT_FIELDS: frozenset[str] = frozenset(f.name for f in dataclasses.fields(RewardContext))
"""The names a reward function's parameters may take to be passed a context field."""
