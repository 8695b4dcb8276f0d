"""What the env hands out, as types: statuses, step metadata, the finished episode, the record.

Trainer adapters, offline tools and users' scripts read these shapes; ``docs/design.md``
("Step output", "Episode record") explains each field, and ``tests/test_design_doc.py`` keeps
the two in step. The value tuples (``REWARD_STATUSES`` …) are derived from the ``Literal``
types, so a new status is added in one place.

Example::

    from deepanalyze_env.core.contracts import FinalMetadata, trainable

    def reward_to_train(reward: float, meta: FinalMetadata) -> float | None:
        return reward if trainable(meta["reward_status"], meta["termination"]) else None
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict, cast, get_args

RewardStatus = Literal["scored", "verifier_error", "environment_error"]
"""``scored``: every component computed. ``verifier_error``: a reward function or the judge
could not produce a score (judge outage, unparsable reply). ``environment_error``: an
infrastructure fault from outside the episode (worker killed while idle, workspace copy
failed). Trainers keep the two error statuses out of the gradient."""

VerifierErrorCause = Literal["judge_parse", "context_length", "judge_call", "reward_raised"]
"""Why an episode is ``verifier_error`` (``reward_error_cause``): the judge replied without a
readable verdict; the judge refused the prompt for its context length; the judge could not be
called (unreachable, HTTP error, timeout, a replay miss); anything else a reward function or the
plan raised or returned (a non-number, no component with weight > 0, a bug). A reward function's
exception names its cause in a ``verifier_cause`` class attribute; without one it is
``reward_raised``. Counted per step as a rate (:func:`verifier_error_rates`), so a policy that
learns to be excluded shows as a rising line."""

Termination = Literal["answer", "max_turns", "length", "eos", "error"]
"""Why the episode ended: an ``<Answer>`` block, the turn limit, a trainer's token budget, the
policy's end-of-sequence token without a closing tag (TRL), or an infrastructure fault
mid-episode (with ``environment_error``)."""

ExecStatus = Literal["ok", "error", "timeout", "crashed", "no_code", "skipped"]
"""Outcome of one code turn: ran cleanly; raised; hit ``timeout_s``; its process died (the
policy's doing); the turn held no code; not run (``upstream`` profile, task without data)."""

Gate = Literal["tags", "fence", "tools"]
"""Which format gate failed: the protocol tags, (datatask/openresearch) a non-Python fence, or
(``action_format: tools``) an invalid tool call or no ``submit_answer``."""

ProfileName = Literal["v1", "upstream"]

JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
"""A value as JSON carries it: what a report, record or request holds before it is read into its
TypedDict or dataclass. Use it at a boundary (a file just read, a request body), not as a
stand-in for a shape the project defines."""

JsonObject = dict[str, JsonValue]
"""A JSON object (see ``JsonValue``)."""

REWARD_STATUSES: tuple[str, ...] = get_args(RewardStatus)
TERMINATIONS: tuple[str, ...] = get_args(Termination)
EXEC_STATUSES: tuple[str, ...] = get_args(ExecStatus)
VERIFIER_ERROR_CAUSES: tuple[VerifierErrorCause, ...] = get_args(VerifierErrorCause)


class ToolCallFunction(TypedDict):
    """The called function of a structured tool call: its name and its arguments by name."""

    name: str
    arguments: dict[str, str]


class ChatToolCall(TypedDict):
    """A structured call in an assistant message (``tools`` format), as chat templates render it."""

    type: Literal["function"]
    function: ToolCallFunction


class ChatMessage(TypedDict):
    """One message of an episode's conversation: a prompt message, a policy turn (a valid
    ``tools``-format call structured in ``tool_calls``) or an observation (a tool result names
    its tool in ``name``)."""

    role: str
    content: str
    name: NotRequired[str]
    tool_calls: NotRequired[list[ChatToolCall]]


class ExecInfo(TypedDict):
    """One code turn as the env saw it (``metadata["exec"]``, and per turn in records)."""

    status: ExecStatus
    elapsed_ms: float
    truncated: bool  # the output exceeded ``max_output_chars`` (head and tail kept)


class TurnMetadata(TypedDict):
    """``step()`` metadata while the episode goes on."""

    code_pass: int  # 1 when the cell counts as passing (profile rule), else 0
    exec: ExecInfo


class JudgeSummary(TypedDict):
    """``metadata["judge"]``: who judged, with which prompts, and every call of the episode."""

    backend: str
    model: str
    base_url: str | None  # without credentials
    temperature: float
    max_tokens: int
    prompt_hashes: dict[str, str]  # rubric → sha256 of the prompt used
    calls: list[dict[str, Any]]  # rubric, prompt_hash, reply, parsed score or error, latency


class FinalMetadata(TypedDict):
    """``step()`` metadata of the final step (``done`` is true)."""

    reward_components: dict[str, float]  # component name → value (``{"format_gate": -1.0}`` on a failed gate)
    reward_status: RewardStatus
    reward_error_cause: VerifierErrorCause | None  # why it is ``verifier_error``; None otherwise
    format_ok: bool
    gate: Gate | None  # which gate failed; None when it passed
    termination: Termination
    code_pass: list[int]  # per code turn
    turns: int  # policy turns taken
    exec: list[ExecInfo]  # per code turn
    error: NotRequired[str]  # why the status is not ``scored``
    reward_notes: NotRequired[dict[str, str]]  # function name (or format_gate) → why it scored what it did
    judge: NotRequired[JudgeSummary]  # present when the judge was called


class Versions(TypedDict):
    """What produced and scored an episode, so a number can be traced to code and data."""

    package: str  # deepanalyze-env version
    profile: str
    reward_plan: str | None  # fingerprint of the reward plan; None when the row had none (row_errors)
    policy_id: str | None
    judge_model: str | None
    judge_prompts: dict[str, str]  # rubric → sha256 of the prompt file
    kernel: dict[str, str]  # kernel package → version


class AgentTrace(TypedDict):
    """``record["agent"]``: an episode an outside agent played (``deepanalyze-rl collect``). The
    policy is a black box: what it sent to its model is what the recording proxy saw."""

    kind: Literal["black-box"]
    command: str  # the agent command line as given
    exit_code: int | None  # None: still running when the time limit killed it
    seconds: float
    model_calls: list[JsonObject]  # per model call: request, response (token ids and logprobs
    # when the upstream returned them), status, latency_ms
    stderr_tail: str  # the last lines the agent wrote to stderr


class EpisodeRecord(TypedDict):
    """One line of ``episodes-*.jsonl`` (fields in this order; see ``RECORD_FIELDS``)."""

    episode_id: str
    task_id: str | None
    task_hash: str
    reward_spec: JsonObject
    input_seq: str | None
    data: str | None
    workspace_id: str | None
    messages: list[ChatMessage]  # prompt, policy turns (tool calls structured) and observations
    reward: float | None
    reward_components: dict[str, float]
    reward_status: str  # a RewardStatus, or "unfinished" for an episode closed before its end
    reward_error_cause: VerifierErrorCause | None  # why it is ``verifier_error``; None otherwise
    format_ok: bool | None
    gate: Gate | None
    termination: Termination | None
    code_pass: list[int]
    turns: int
    exec: list[ExecInfo]
    judge: JudgeSummary | None
    usage: JsonValue  # token counts per turn, when the policy reports them
    agent: AgentTrace | None  # an outside agent's run (``collect``); None for the env's own policies
    versions: Versions
    timings: dict[str, float]  # init_ms, reward_ms
    error: str | None


RECORD_FIELDS: tuple[str, ...] = tuple(EpisodeRecord.__annotations__)


@dataclass(frozen=True)
class EpisodeResult:
    """A closed episode as the env reports it; :func:`records.build_record` serialises it.

    Built by ``DeepAnalyzeEnv.result()`` so that records (and anything else that wants the
    whole episode) read one value instead of the env's internals.
    """

    extras: JsonObject  # the dataset row's extras (task fields, episode_id, usage)
    task_id: str | None
    messages: list[ChatMessage]
    reward: float | None  # None while unfinished
    metadata: FinalMetadata | None  # None while unfinished
    code_pass: list[int]
    turns: int
    exec: list[ExecInfo]
    timings: dict[str, float]
    versions: Versions
    unfinished: str | None = None  # why an unfinished episode was closed early (``close(unfinished=…)``)


def trainable(reward_status: str | None, termination: str | None, *, score_truncated: bool = False) -> bool:
    """Does an episode's reward go into the gradient? Only a measured reward (``scored``; the two
    error statuses, and a record's ``unfinished``, are not measurements), and of an episode a
    token budget cut (``termination: "length"``) only when the trainer trains such episodes as
    their failed gate (``score_truncated``). The one rule behind both TRL paths, SkyRL's row
    verdicts and ``stats``' valid episodes."""
    if reward_status != "scored":
        return False
    return termination != "length" or score_truncated


def verifier_error_cause(item: Mapping[str, object]) -> VerifierErrorCause | None:
    """The cause of one episode's ``verifier_error`` (its step metadata or record), None when it is
    not one. A record written before causes were recorded (no ``reward_error_cause``), or holding a
    cause this version does not know, counts as ``reward_raised``."""
    if item.get("reward_status") != "verifier_error":
        return None
    cause = item.get("reward_error_cause")
    return cast(VerifierErrorCause, cause) if cause in VERIFIER_ERROR_CAUSES else "reward_raised"


def verifier_error_rates(items: Iterable[Mapping[str, object]]) -> dict[VerifierErrorCause, float]:
    """The share of ``items`` (final step metadata or episode records, one per episode) that are
    ``verifier_error``, per cause; every cause is present (0.0 when none, and for no episodes), so a
    logged curve exists from the first step. The one rule behind TRL's ``metrics.jsonl`` and logs,
    the env metrics SkyRL logs, ``view``, ``stats`` and ``eval`` reports."""
    counts = dict.fromkeys(VERIFIER_ERROR_CAUSES, 0)
    total = 0
    for item in items:
        total += 1
        cause = verifier_error_cause(item)
        if cause is not None:
            counts[cause] += 1
    return {cause: (n / total if total else 0.0) for cause, n in counts.items()}
