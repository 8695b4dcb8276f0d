"""What the viewer page receives: one index row per episode, one body per episode, the summary.

The index holds only what the run page filters, sorts and searches on (a few hundred bytes per
episode), so 10,000 episodes parse in milliseconds; a body is everything the episode page
shows and is parsed only when that episode is opened. Bodies are the record itself, with the
messages cut into tag segments (and code cells lexed, see :mod:`.highlight`) and the parts
that repeat across a run (the versions manifest, the judge settings) stored once and referred
to by number — which pays for the highlighting, keeping the page near the records' size.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from deepanalyze_env.core.contracts import AgentTrace, EpisodeRecord, JsonValue
from deepanalyze_env.core.filters import DERIVED
from deepanalyze_env.core.hacking import Watched, suspect_reasons
from deepanalyze_env.core.tool_calls import SUBMIT_ANSWER, assistant_text
from deepanalyze_env.offline.viewer.highlight import code_runs

log = logging.getLogger(__name__)

# The protocol's tags (DeepAnalyze's, plus <think> from reasoning models); anything else is text.
TAGS = ("Analyze", "Understand", "Code", "Execute", "Answer", "File", "Think", "think")
_OPEN = re.compile(r"<(" + "|".join(TAGS) + r")>")
EXCERPT = 160  # characters of the instruction / answer / error kept in the index for search
INDEX_COLUMNS = (
    "id",
    "task",
    "method",
    "family",
    "policy",
    "status",
    "termination",
    "reward",
    "turns",
    "kept",
    "cells",
    "failed_cells",
    "source",
    "text",
    "suspect",  # the reward-hacking watch's reasons (core/hacking.py); [] for an unflagged episode
)
_JUDGE_SETTINGS = ("backend", "model", "base_url", "temperature", "max_tokens", "prompt_hashes")


class Segment(TypedDict, total=False):
    """One piece of a message: ``t`` tag ('' for text between tags), ``s`` text inside the tag,
    ``o`` true when the closing tag is missing (a cut turn), ``h`` highlighting runs for Code."""

    t: str
    s: str
    o: bool
    h: list[int]


def segments(text: str) -> list[Segment]:
    """Cut ``text`` into tagged and untagged pieces; joining them back gives ``text`` exactly."""
    out: list[Segment] = []
    pos = 0
    while True:
        match = _OPEN.search(text, pos)
        if match is None:
            break
        if match.start() > pos:
            out.append({"t": "", "s": text[pos : match.start()]})
        tag = match.group(1)
        close = text.find(f"</{tag}>", match.end())
        inner_end = len(text) if close < 0 else close
        seg: Segment = {"t": tag, "s": text[match.end() : inner_end]}
        if close < 0:
            seg["o"] = True
        if tag == "Code":
            runs = code_runs(seg["s"])
            if runs:
                seg["h"] = runs
        out.append(seg)
        pos = inner_end if close < 0 else close + len(tag) + 3
    if pos < len(text):
        out.append({"t": "", "s": text[pos:]})
    return out


def join_segments(segs: Sequence[Segment]) -> str:
    """The inverse of :func:`segments` (tests check the round trip)."""
    parts = []
    for seg in segs:
        if not seg["t"]:
            parts.append(seg["s"])
        else:
            parts.append(f"<{seg['t']}>{seg['s']}" + ("" if seg.get("o") else f"</{seg['t']}>"))
    return "".join(parts)


def family(record: EpisodeRecord) -> str:
    """A task's family: the data workspace it runs on (tasks sharing data are one family)."""
    return str(record.get("workspace_id") or "–")


def _final_answer(record: EpisodeRecord) -> str:
    for message in reversed(record.get("messages") or []):
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:  # the tools format: submit_answer's argument
                function = call.get("function") or {}
                if function.get("name") == SUBMIT_ANSWER:
                    return str((function.get("arguments") or {}).get("answer") or "").strip()
            content = str(message.get("content") or "")
            start = content.rfind("<Answer>")
            if start >= 0:
                return content[start + 8 :].split("</Answer>")[0].strip()
            return ""
    return ""


def suspect_of(record: EpisodeRecord) -> list[str]:
    """Why the reward-hacking watch flags the episode (empty when it does not), computed from the
    record itself, so runs recorded before the watch existed are watched too."""
    try:
        return suspect_reasons(Watched.of_record(record))
    except Exception as exc:  # a malformed old record is shown, unflagged, never refused
        log.debug("no watch verdict for %s: %s", record.get("episode_id"), exc)
        return []


def _excerpt(text: object) -> str:
    text = " ".join(str(text or "").split())
    return text[:EXCERPT]


WeightSource = Literal["plan", "recomputed", "unknown"]
IndexRow = list[JsonValue]  # one episode's values, in INDEX_COLUMNS order


class ModelCallView(TypedDict):
    """One model call of an outside agent as the page shows it."""

    status: JsonValue
    latency_ms: JsonValue
    finish_reason: JsonValue
    said: str  # the reply's text and tool calls


class AgentView(TypedDict):
    """An outside agent's run as the page shows it (:func:`agent_view`)."""

    command: str
    exit_code: int | None
    seconds: float
    stderr_tail: str
    model_calls: list[ModelCallView]


@dataclass
class Payload:
    """Everything the page embeds, built record by record."""

    index: list[IndexRow] = field(default_factory=list)
    bodies: list[str] = field(default_factory=list)  # JSON text, one per episode
    shared: list[object] = field(default_factory=list)  # versions manifests and judge settings, once each
    _shared_ids: dict[str, int] = field(default_factory=dict)
    _weights: dict[str, tuple[dict[str, float] | None, str | None]] = field(default_factory=dict)

    def share(self, value: object) -> int | None:
        """The number of ``value`` in :attr:`shared` (added the first time); None for None."""
        if value is None:
            return None
        key = json.dumps(value, sort_keys=True, default=str)
        if key not in self._shared_ids:
            self._shared_ids[key] = len(self.shared)
            self.shared.append(value)
        return self._shared_ids[key]

    def weights(self, record: EpisodeRecord) -> tuple[dict[str, float] | None, WeightSource]:
        """Component weights, from the reward plan the record names (rebuilt from its reward_spec).

        Records carry the plan's fingerprint, not its weights; the plan is rebuilt with this
        code and its fingerprint compared, so a page never shows weights the run did not use
        without saying so ("recomputed": the fingerprint differs, e.g. the method changed since).
        A plan without weights (profile ``upstream``) is a plain mean: every component weighs 1.
        """
        versions = record.get("versions") or {}
        profile = str(versions.get("profile") or "v1")
        spec = record.get("reward_spec")
        key = json.dumps([profile, spec], sort_keys=True, default=str)
        if key not in self._weights:
            from deepanalyze_env.core.profiles import PROFILES

            try:
                plan = PROFILES[profile].build_plan(spec or {})
                weights = plan.weights
                weights = None if weights is None else {str(k): float(v) for k, v in weights.items()}
                self._weights[key] = (weights, plan.fingerprint())
            except Exception as exc:  # an unknown method or profile in an old run: no weights
                log.debug("no weights for %s: %s", spec, exc)
                self._weights[key] = (None, None)
        weights, fingerprint = self._weights[key]
        if fingerprint is None:
            return None, "unknown"
        if weights is None:
            weights = {str(c): 1.0 for c in record.get("reward_components") or {}}
        return weights, "plan" if fingerprint == versions.get("reward_plan") else "recomputed"

    def add(
        self, record: EpisodeRecord, *, kept: bool | None, source: int, suspect: list[str] | None = None
    ) -> None:
        """Index row and body of one episode; ``suspect``: its watch reasons when already known."""
        suspect = suspect_of(record) if suspect is None else suspect
        code_pass = record.get("code_pass") or []
        method = DERIVED["method"](record)
        versions = record.get("versions") or {}
        text = " ".join(
            x
            for x in (
                _excerpt(record.get("input_seq")),
                _excerpt(_final_answer(record)),
                _excerpt(record.get("error")),
            )
            if x
        )
        reward = record.get("reward")
        self.index.append(
            [
                str(record.get("episode_id")),
                str(record.get("task_id")),
                str(method) if method is not None else "–",
                family(record),
                str(versions.get("policy_id") or "–"),
                str(record.get("reward_status")),
                str(record.get("termination")),
                # an unscored episode's reward is a placeholder, not a reward: never sorted or filtered as one
                float(reward)
                if isinstance(reward, int | float) and record.get("reward_status") == "scored"
                else None,
                int(record.get("turns") or 0),
                kept,
                len(code_pass),
                sum(1 for p in code_pass if not p),
                source,
                text,
                list(suspect),
            ]
        )
        weights, weight_source = self.weights(record)
        judge = record.get("judge")
        judge_body = None
        if isinstance(judge, dict):
            judge_body = {
                "settings": self.share({k: judge.get(k) for k in _JUDGE_SETTINGS if k in judge}),
                "calls": judge.get("calls") or [],
            }
        body = {
            "messages": [
                {"role": str(m.get("role")), "segs": segments(assistant_text(m))}
                for m in record.get("messages") or []
            ],
            "reward_spec": record.get("reward_spec"),
            "data": record.get("data"),
            "workspace_id": record.get("workspace_id"),
            "task_hash": record.get("task_hash"),
            "reward": reward,
            "reward_components": record.get("reward_components") or {},
            "weights": weights,
            "weight_source": weight_source,
            "reward_status": record.get("reward_status"),
            "reward_error_cause": record.get("reward_error_cause"),
            "format_ok": record.get("format_ok"),
            "gate": record.get("gate"),
            "termination": record.get("termination"),
            "code_pass": code_pass,
            "exec": record.get("exec") or [],
            "judge": judge_body,
            "usage": record.get("usage"),
            "agent": agent_view(record.get("agent")),
            "versions": self.share(versions or None),
            "timings": record.get("timings"),
            "error": record.get("error"),
            "suspect": list(suspect),
        }
        self.bodies.append(script_json(body))


def agent_view(agent: AgentTrace | None) -> AgentView | None:
    """An outside agent's trace (``collect``) as the page shows it: the run, and per model call
    its status, latency and what the model answered (requests left out: they repeat the
    conversation the page already shows)."""
    if not isinstance(agent, dict):
        return None
    calls = []
    for call in agent.get("model_calls") or []:
        choices = ((call.get("response") or {}).get("choices") or [{}]) if isinstance(call, dict) else [{}]
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        message = choice.get("message") or {}
        said = [str(message.get("content") or "")] + [
            f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments')})"
            for c in message.get("tool_calls") or []
            if isinstance(c, dict)
        ]
        calls.append(
            {
                "status": call.get("status") if isinstance(call, dict) else None,
                "latency_ms": call.get("latency_ms") if isinstance(call, dict) else None,
                "finish_reason": choice.get("finish_reason"),
                "said": "\n".join(x for x in said if x)[:4000],
            }
        )
    return {
        "command": agent.get("command"),
        "exit_code": agent.get("exit_code"),
        "seconds": agent.get("seconds"),
        "stderr_tail": str(agent.get("stderr_tail") or "")[-2000:],
        "model_calls": calls,
    }


def script_json(value: object) -> str:
    """JSON that is safe inside a ``<script type="application/json">`` element.

    ``<`` is written as ``\\u003c`` so no string in the data can close the element (``</script>``)
    or open a comment; JSON.parse restores it. Lone surrogates (records keep them) become U+FFFD.
    """
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    text = text.replace("<", "\\u003c")
    return text.encode("utf-8", "replace").decode("utf-8")
