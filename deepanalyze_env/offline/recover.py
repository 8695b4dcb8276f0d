"""Recovery tasks cut from failed episodes (``deepanalyze-rl recover``).

RL barely teaches error recovery when a failed cell is only ever met by chance mid-episode. This
turns every failure of a scored episode into a task that *starts* there: the new row is the
parent's task (prompt, reward spec, workspace, question) plus a ``prefix`` — the parent's
messages from its first policy turn up to and including the failed cell's ``<Execute>``
observation — and a ``lineage``. The env replays the prefix at ``init`` (core/prefix.py); a row
is written only when that replay reproduces every recorded output here, now, so a training run
does not discover at episode time that its starting point cannot be rebuilt. Rows that do not
reproduce are counted and the first reasons shown, never dropped silently.

Where a record's turns are: the prompt is every message before the first assistant message;
each later assistant message followed by an ``<Execute>`` observation is a code turn; the
record's ``exec`` list describes its *last* ``len(exec)`` code turns (an episode that itself ran
from a prefix records only its own turns), so a recovered episode can be recovered again and its
new prefix holds the old one.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from deepanalyze_env import ENV_ID
from deepanalyze_env.core.cells import replay_prefix
from deepanalyze_env.core.config import ConfigError, EnvConfig
from deepanalyze_env.core.contracts import EpisodeRecord, JsonObject, JsonValue
from deepanalyze_env.core.env import load_system_prompt
from deepanalyze_env.core.prefix import OBSERVATION_HEAD
from deepanalyze_env.core.profiles import PROFILES
from deepanalyze_env.core.tasks import DATA_SOURCE
from rewards import RewardSpecError
from tools.kernel import KernelError

log = logging.getLogger(__name__)

FAILED_STATUSES = ("error", "timeout")  # a cell the policy must recover from
RECOVERY = "recovery"  # the reward component (rewards/recovery.py)
CutMode = Literal["all", "first"]


class Lineage(TypedDict):
    """A recovery row's ``lineage`` column: where its starting point was cut from."""

    parent_episode_id: str
    parent_task_id: str | None
    cut_turn: int  # policy turns in the prefix (the failed cell is this turn of the parent)
    failed_status: str  # "error" | "timeout"


Message = dict[str, JsonValue]  # a chat message as the record holds it


class RecoveryRow(TypedDict):
    """A dataset row of a recovery task (:func:`recovery_row`): the parent's task fields, the
    conversation up to the failed cell's observation (``prefix``) and where it came from."""

    prompt: list[Message]
    env_class: str
    reward_spec: JsonValue
    data: str | None
    workspace_id: str | None
    input_seq: str | None
    task_id: str
    data_source: str
    extra_info: JsonObject
    prefix: list[Message]
    lineage: Lineage


@dataclass(frozen=True)
class Cut:
    """One failed cell of a record: where the new task starts."""

    episode_id: str
    task_id: str | None
    cut_turn: int  # policy turns in the prefix; the failed cell is this turn of the parent conversation
    status: str  # the failed cell's exec status
    prompt: list[Message]
    prefix: list[Message]


@dataclass
class RecoverReport:
    """What ``recover`` did with every record it read (each record lands in exactly one count)."""

    rows: list[RecoveryRow] = field(default_factory=list)
    read: int = 0
    filtered_out: int = 0  # --keep said no
    not_scored: int = 0  # verifier_error, environment_error, unfinished
    no_failure: int = 0  # scored, but no cell failed
    unusable: list[str] = field(default_factory=list)  # records whose turns cannot be located
    cuts: int = 0
    not_reproducible: list[str] = field(default_factory=list)  # one reason per skipped cut
    bad_spec: list[str] = field(default_factory=list)  # cuts whose reward spec builds no plan here

    @property
    def skipped(self) -> int:
        return len(self.not_reproducible)

    @property
    def done(self) -> int:
        """Cuts handled so far (written or skipped)."""
        return len(self.rows) + len(self.not_reproducible) + len(self.bad_spec)


def strip_system_prompt(prompt: list[Message], system_prompt: str | None) -> list[Message]:
    """Undo what ``init`` added (the env adds the configured system prompt again)."""
    prompt = [dict(m) for m in prompt]
    if not system_prompt or not prompt or prompt[0].get("role") != "system":
        return prompt
    content = str(prompt[0].get("content") or "")
    if content == system_prompt:
        return prompt[1:]
    if content.startswith(system_prompt + "\n\n"):
        prompt[0]["content"] = content[len(system_prompt) + 2 :]
    return prompt


def cuts_of(record: EpisodeRecord, *, mode: CutMode = "all", system_prompt: str | None = None) -> list[Cut]:
    """Every failed cell of one record as a cut (only the first with ``mode="first"``).

    Raises ``ValueError`` when the record's messages do not hold the code turns its ``exec``
    list describes (a hand-edited or foreign record).
    """
    messages = [dict(m) for m in record.get("messages") or []]
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    executed = list(record.get("exec") or [])
    if first is None:
        if executed:
            raise ValueError("the record has exec entries but no assistant turn")
        return []
    code_turns = [  # (index of the assistant turn, index of its observation)
        (i, i + 1)
        for i in range(first, len(messages) - 1)
        if messages[i].get("role") == "assistant"
        and messages[i + 1].get("role") != "assistant"
        and str(messages[i + 1].get("content") or "").startswith(OBSERVATION_HEAD)
    ]
    if len(code_turns) < len(executed):
        raise ValueError(
            f"the record lists {len(executed)} code turns in exec but its messages hold {len(code_turns)}"
        )
    own = code_turns[len(code_turns) - len(executed) :]
    prompt = strip_system_prompt(messages[:first], system_prompt)
    cuts = []
    for (_turn_at, obs_at), info in zip(own, executed, strict=True):
        status = str((info or {}).get("status"))
        if status not in FAILED_STATUSES:
            continue
        prefix = [{"role": m.get("role"), "content": m.get("content")} for m in messages[first : obs_at + 1]]
        cuts.append(
            Cut(
                episode_id=str(record.get("episode_id")),
                task_id=record.get("task_id"),
                cut_turn=sum(1 for m in prefix if m["role"] == "assistant"),
                status=status,
                prompt=prompt,
                prefix=prefix,
            )
        )
        if mode == "first":
            break
    return cuts


def with_recovery(spec: JsonValue, weight: float) -> JsonObject:
    """``spec`` plus the ``recovery`` component at ``weight`` (0: reported, not in the reward)."""
    spec = dict(spec or {})
    refs = spec.get("function") or []
    refs = [refs] if isinstance(refs, str) else list(refs)
    if RECOVERY not in refs:
        refs.append(RECOVERY)
    spec["function"] = refs
    spec["weights"] = {**(spec.get("weights") or {}), RECOVERY: float(weight)}
    return spec


def recovery_row(record: EpisodeRecord, cut: Cut, recovery_weight: float | None = None) -> RecoveryRow:
    """The dataset row of a cut: the parent's task fields, its ``prefix`` and its ``lineage``;
    with ``recovery_weight`` the reward spec also weights the ``recovery`` component."""
    parent_task = cut.task_id if cut.task_id is not None else "task"
    task_id = f"{parent_task}/recover/{cut.episode_id}/turn{cut.cut_turn}"
    spec = record.get("reward_spec")
    if isinstance(spec, str):  # a Parquet-born row may have carried it as JSON text
        spec = json.loads(spec)
    if recovery_weight is not None:
        spec = with_recovery(spec, recovery_weight)
    return {
        "prompt": cut.prompt,
        "env_class": ENV_ID,
        "reward_spec": spec,
        "data": record.get("data"),
        "workspace_id": record.get("workspace_id"),
        "input_seq": record.get("input_seq"),
        "task_id": task_id,
        "data_source": DATA_SOURCE,
        "extra_info": {
            "task_id": task_id,
            "method": spec.get("method") if isinstance(spec, dict) else None,
            "parent_task_id": cut.task_id,
        },
        "prefix": cut.prefix,
        "lineage": Lineage(
            parent_episode_id=cut.episode_id,
            parent_task_id=cut.task_id,
            cut_turn=cut.cut_turn,
            failed_status=cut.status,
        ),
    }


def recover(
    records: Iterable[EpisodeRecord],
    env_config: EnvConfig | JsonObject,
    *,
    keep: Callable[[EpisodeRecord], bool] | None = None,
    mode: CutMode = "all",
    recovery_weight: float | None = None,
    on_cut: Callable[[RecoverReport], None] | None = None,
) -> RecoverReport:
    """Recovery rows from ``records``, each checked by replaying its prefix in a real kernel.

    ``env_config`` must be the one the records were collected with (``workspace_root``,
    ``stateful_cells``, executor limits, ``profile``, ``system_prompt``): the replay runs under
    it and compares outputs byte for byte. ``recovery_weight`` adds the ``recovery`` component
    to every row's reward spec at that weight (a spec that cannot take it makes the row
    skipped and reported in ``bad_spec``). ``on_cut`` is called after each replay (progress).
    A kernel fault during a replay counts the row as not reproducible, with the fault as reason.
    """
    config = EnvConfig.from_any(env_config)
    system_prompt = load_system_prompt(config.system_prompt, config.action_format)
    report = RecoverReport()
    pending: list[tuple[EpisodeRecord, Cut]] = []
    for record in records:
        report.read += 1
        if keep is not None and not keep(record):
            report.filtered_out += 1
            continue
        if record.get("reward_status") != "scored":
            report.not_scored += 1
            continue
        try:
            cuts = cuts_of(record, mode=mode, system_prompt=system_prompt)
        except ValueError as exc:
            report.unusable.append(f"{record.get('episode_id')}: {exc}")
            continue
        if not cuts:
            report.no_failure += 1
        pending += [(record, cut) for cut in cuts]
    report.cuts = len(pending)
    profile = PROFILES[config.profile]  # EnvConfig.validate checked the name
    for record, cut in pending:
        row = recovery_row(record, cut, recovery_weight)
        try:
            profile.build_plan(row["reward_spec"] or {})
        except RewardSpecError as exc:
            report.bad_spec.append(f"{row['task_id']}: {exc}")
            if on_cut is not None:
                on_cut(report)
            continue
        try:
            mismatch = replay_prefix(config, row)
        except ConfigError as exc:
            mismatch = f"the row cannot be set up: {exc}"
        except KernelError as exc:  # not the row's fault, but it could not be checked: not written
            mismatch = f"kernel fault during the replay: {exc}"
        if mismatch is None:
            report.rows.append(row)
        else:
            report.not_reproducible.append(f"{row['task_id']}: {mismatch}")
            log.info("not reproducible: %s: %s", row["task_id"], mismatch)
        if on_cut is not None:
            on_cut(report)
    return report


def status_counts(report: RecoverReport) -> Counter[str]:
    """Failed statuses of the written rows (for the summary line)."""
    return Counter(str(row["lineage"]["failed_status"]) for row in report.rows)
