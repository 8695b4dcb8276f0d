"""One served episode: a task's env in the tools action format, driven by calls from outside.

A client outside this process (an MCP client, an OpenEnv client, an agent run by ``collect``)
plays an episode through the tool-calling action format's own tools, ``run_python(code)`` and
``submit_answer(answer)`` (:mod:`deepanalyze_env.core.tool_calls`): each call is one policy
turn that ended at its call, played by the episode driver (``core/driver.py``:
``DeepAnalyzeEnv.act``), so a served episode is scored by the same code, the same
reward plan and the same gate as one played in-process, and its record is an ordinary record.

What the server trusts: nothing the client sends. A call's name and arguments go through the
format's own check (an invalid call is the policy's failure, recorded, gate ``tools``); the
limits below are enforced here, before the env sees anything; the reward is computed by the env
when ``submit_answer`` (or the turn limit) ends the episode, and the client only reads it. An
episode the client leaves (disconnect, idle timeout, call limit) is closed at once — worker
killed, scratch removed — and recorded as ``unfinished`` with the reason.
"""

from __future__ import annotations

import json
import logging
import stat
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from skyrl_gym.envs.base_text_env import BaseTextEnvStepOutput

from deepanalyze_env.core import tool_calls
from deepanalyze_env.core.contracts import ExecStatus, Gate, JsonObject, JsonValue, RewardStatus, Termination
from deepanalyze_env.core.driver import Turn, apply_turn
from deepanalyze_env.core.env import DeepAnalyzeEnv
from deepanalyze_env.core.tasks import env_extras, format_size
from deepanalyze_env.core.tool_calls import ParsedTurn, ToolCall

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeLimits:
    """What one server allows its clients; every limit hit is a one-line error naming its flag."""

    max_sessions: int = 32
    """Episodes open at once. One more is refused (``--max-sessions``); each holds a kernel worker."""
    max_calls: int = 64
    """Tool calls per episode, valid or not. The call past it ends the episode, recorded as
    unfinished (``--max-calls``); the env's own ``max_turns`` still ends it first as a turn limit."""
    max_payload_bytes: int = 200_000
    """The largest tool argument (code or answer), in UTF-8 bytes. A bigger one is refused before
    the env sees it and nothing runs (``--max-payload-bytes``)."""
    max_request_bytes: int = 1_000_000
    """The largest HTTP request body; a bigger one is answered 413 unread (``--max-request-bytes``)."""
    idle_timeout_s: float = 600.0
    """A session with no tool call for this long is closed, its episode recorded as unfinished:
    its client is gone (``--idle-timeout``). Only a tool call is activity (it counts against
    ``max_calls``, so no session lives forever); the clock stops while a call runs. Pings,
    listings and resource reads are not activity: they cost a client nothing."""

    @property
    def idle_reason(self) -> str:
        return f"idle for more than {self.idle_timeout_s:g} s without a tool call (the client went away)"

    @property
    def reap_period_s(self) -> float:
        """How often the reapers look for idle sessions."""
        return min(5.0, max(0.05, self.idle_timeout_s / 4))

    def validate(self) -> None:
        for name in ("max_sessions", "max_calls", "max_payload_bytes", "max_request_bytes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.idle_timeout_s <= 0:
            raise ValueError("idle_timeout_s must be > 0")


def served_config(env_config: JsonObject) -> JsonObject:
    """A served episode's env_config: the user's, in the tools action format, with the tools'
    system prompt unless the user names one."""
    return {"system_prompt": "protocol", **env_config, "action_format": "tools"}


class ServeError(Exception):
    """A call the server refuses: a limit, an ended episode, an unknown task. One line, for the
    client; nothing ran."""


class TurnData(TypedDict):
    """A call's result as data while the episode goes on (``structuredContent`` over MCP)."""

    output: str
    status: ExecStatus
    code_pass: int


class EpisodeEnd(TypedDict):
    """How a finished episode ended, as clients read it (:attr:`EpisodeSession.final`)."""

    reward: float | None
    reward_components: dict[str, float]
    reward_status: RewardStatus
    termination: Termination
    format_ok: bool
    gate: Gate | None
    turns: int
    error: str | None


class EpisodeState(TypedDict):
    """``deepanalyze://episode/state`` and OpenEnv's state: where the episode stands."""

    episode_id: str | None
    task_id: str
    turns: int
    calls: int
    done: bool
    ended: str | None  # "finished", or why it was closed early


class DataFile(TypedDict):
    """One data file of the task (``deepanalyze://task/files``)."""

    name: str
    size: str  # human-readable (``format_size``)


@dataclass
class CallResult:
    """What one call returns to a client: the text a model would read, the same as data, whether
    the episode ended, and whether the call was invalid (the env's error result)."""

    text: str
    data: TurnData | EpisodeEnd
    done: bool
    is_error: bool = False


@dataclass
class EpisodeSession:
    """One episode of one task for one client. Calls are serialised (one turn at a time); every
    method is safe to call from any thread, and :meth:`abandon` from another thread while a call
    runs waits for it."""

    env_config: JsonObject
    row: JsonObject  # the task's dataset row
    limits: ServeLimits = field(default_factory=ServeLimits)
    episode_id: str | None = None
    policy_id: str = "served"
    env: DeepAnalyzeEnv | None = field(default=None, init=False)
    calls: int = field(default=0, init=False)
    last_call: float = field(default_factory=time.monotonic, init=False)
    ended: str | None = field(default=None, init=False)  # why it is over: "finished" or the reason
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _dropped: bool = field(default=False, init=False, repr=False)  # stopped while starting: no record

    @property
    def busy(self) -> bool:
        """A call is running (a cell may run up to its timeout; the idle clock waits for it)."""
        return self._lock.locked()

    @property
    def task_id(self) -> str:
        return str(self.row.get("task_id"))

    def start(self) -> None:
        """Build the env (a bad row raises ``ConfigError`` here) and start its workspace and kernel."""
        config = {**served_config(self.env_config), "policy_id": self.policy_id}
        extras = env_extras(self.row)
        self.episode_id = self.episode_id or uuid.uuid4().hex
        extras["episode_id"] = self.episode_id
        self.env = DeepAnalyzeEnv(env_config=config, extras=extras)
        self.env.init(self.row["prompt"])
        self.last_call = time.monotonic()

    # ------------------------------------------------------------------ what the client reads

    def prompt_text(self) -> str:
        """The task as the model should read it: the system prompt, then the task message."""
        prompt = self.env.messages[: self.env.prompt_len] if self.env is not None else []
        return "\n\n".join(str(m.get("content") or "") for m in prompt)

    def files(self) -> list[DataFile]:
        """The task's data files (name, size), read from the task's own folder without following
        links; the policy's scratch copy is not listed."""
        folder = self.env.source_workspace if self.env is not None else None
        if folder is None:
            return []
        found = []
        for entry in sorted(Path(folder).iterdir()):
            info = entry.lstat()
            if stat.S_ISREG(info.st_mode):
                found.append(DataFile(name=entry.name, size=format_size(info.st_size)))
        return found

    def state(self) -> EpisodeState:
        env = self.env
        return EpisodeState(
            episode_id=self.episode_id,
            task_id=self.task_id,
            turns=env.turns if env is not None else 0,
            calls=self.calls,
            done=self.ended is not None,
            ended=self.ended,
        )

    # ------------------------------------------------------------------ calls

    def call(self, name: JsonValue, arguments: JsonValue) -> CallResult:
        """One tool call as one policy turn. Raises :class:`ServeError` for a refused call (limit,
        ended episode); an invalid call is played (the env records why) and comes back with
        ``is_error``. A call while another of the same episode runs is refused at once: one
        turn at a time, and a client cannot pile up waiting calls (each would hold a server
        thread that other clients' calls need)."""
        if not self._lock.acquire(blocking=False):
            raise ServeError(
                "a call of this episode is still running: wait for its result (one call at a time)"
            )
        try:
            if self.ended is not None:
                raise ServeError(
                    f"this episode has ended ({self.ended}); start another (a new session, or reset)"
                )
            if self.env is None:
                raise ServeError("this episode has not started")
            self.last_call = time.monotonic()
            self.calls += 1
            if self.calls > self.limits.max_calls:
                self._abandon_locked(f"call limit: more than {self.limits.max_calls} calls (--max-calls)")
                raise ServeError(
                    f"call limit reached: {self.limits.max_calls} calls per episode (--max-calls); "
                    "the episode is closed as unfinished"
                )
            size = len(json.dumps(arguments, ensure_ascii=False, default=str).encode("utf-8", "replace"))
            if size > self.limits.max_payload_bytes:
                raise ServeError(
                    f"arguments of {size} bytes exceed the limit of {self.limits.max_payload_bytes} "
                    "(--max-payload-bytes); nothing ran"
                )
            checked = tool_calls.check_call(name, arguments)
            if isinstance(checked, ToolCall):
                turn = ParsedTurn("", checked)
            else:
                turn = ParsedTurn("", None, checked[0], checked[1])
            try:  # a call is a turn that ended at its call: the episode driver plays it
                return self._result(turn, apply_turn(self.env, Turn("", call=turn)))
            finally:
                self.last_call = time.monotonic()  # the idle clock starts when the call returns
        finally:
            self._lock.release()

    def _result(self, turn: ParsedTurn, out: BaseTextEnvStepOutput) -> CallResult:
        if self.ended is not None:  # the server was stopped while this call ran: recorded as it stood
            assert self.env is not None
            self.env.close(record=False)
            raise ServeError(f"this episode has ended ({self.ended})")
        if not out["done"]:
            content = str(out["observations"][0]["content"]) if out["observations"] else ""
            meta = out["metadata"]
            data = TurnData(output=content, status=meta["exec"]["status"], code_pass=meta["code_pass"])
            return CallResult(content, data, done=False, is_error=turn.call is None)
        self.ended = "finished"
        assert self.env is not None
        self.env.close()  # the record is written now; the worker and scratch go
        final = self.final
        assert final is not None  # it finished by this call
        return CallResult(final_text(final), final, done=True, is_error=turn.call is None)

    @property
    def final(self) -> EpisodeEnd | None:
        """How a finished episode ended, as clients read it (from the env's final step); None
        unless it finished by its own calls."""
        env = self.env
        if self.ended != "finished" or env is None or env.final_metadata is None:
            return None
        meta = env.final_metadata
        return EpisodeEnd(
            reward=env.final_reward,
            reward_components=dict(meta["reward_components"]),
            reward_status=meta["reward_status"],
            termination=meta["termination"],
            format_ok=meta["format_ok"],
            gate=meta["gate"],
            turns=meta["turns"],
            error=meta.get("error"),
        )

    def abandon(self, reason: str, *, wait: bool = True) -> bool:
        """Close an episode its client left, recorded as unfinished; False if it was already over.
        ``wait=False`` (the server is being stopped by a signal and has seconds to live): an
        episode whose cell is still running is recorded as it stands and its scratch folder
        removed at once; its worker goes with the server (the fork server ends its workers when
        its parent dies)."""
        if self._lock.acquire(blocking=wait):
            try:
                return self._abandon_locked(reason)
            finally:
                self._lock.release()
        return self._abandon_now(reason)

    def drop_scratch(self) -> None:
        """The server is stopping while this episode's kernel starts (it may not live to see the
        start return): its scratch folder goes now. Nothing was played, so it is not recorded,
        now or when the start returns; a folder still being copied at this moment is removed by
        the next process's sweep."""
        self._dropped = True
        workspace = self.env.workspace if self.env is not None else None
        if workspace is not None:
            workspace.remove()

    def _abandon_now(self, reason: str) -> bool:
        if self.ended is not None or self.env is None:
            return False
        self.ended = reason
        self.env.close(unfinished=reason, keep_worker=True)  # the running call's close ends the worker
        return True

    def _abandon_locked(self, reason: str) -> bool:
        if self.ended is not None:
            return False
        self.ended = reason
        if self.env is not None:
            self.env.close(unfinished=reason, record=not self._dropped)
        log.info("episode %s (task %s) closed unfinished: %s", self.episode_id, self.task_id, reason)
        return True


def final_text(final: EpisodeEnd) -> str:
    """The end of an episode as one line a model can read."""
    components = ", ".join(f"{k} {v:+.3f}" for k, v in (final.get("reward_components") or {}).items())
    reward = final.get("reward")
    shown = f"{reward:+.3f}" if isinstance(reward, int | float) else "none"
    line = f"episode finished ({final.get('termination')}): reward {shown} [{final.get('reward_status')}]"
    if components:
        line += f"; components: {components}"
    if final.get("error"):
        line += f"; error: {final['error']}"
    return line
