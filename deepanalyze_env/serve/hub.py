"""The open episodes of one server: a cap on how many, a key per client session, and a reaper.

Every transport (MCP over HTTP, the OpenEnv server, ``collect``) keeps its episodes here, so
the session cap, the idle timeout and the clean-up on shutdown are one rule. A client that goes
away without a word is found by the reaper (no call for ``idle_timeout_s``) and its episode is
closed as unfinished; ``close_all`` at shutdown does the same for the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.contracts import JsonObject, JsonValue
from deepanalyze_env.serve.session import EpisodeSession, ServeError, ServeLimits, served_config

log = logging.getLogger(__name__)

MAX_GONE = 100_000  # released keys remembered (a key the server minted, reused, is refused)


class TaskBook:
    """The tasks a server offers, by id (rows from ``core.tasks.load_task_files``)."""

    def __init__(self, rows: Sequence[JsonObject]):
        self.rows = {str(r.get("task_id")): r for r in rows}
        if not self.rows:
            raise ConfigError("no tasks to serve: the task files are empty")

    def get(self, task_id: JsonValue) -> JsonObject:
        if task_id is None or str(task_id) not in self.rows:
            some = ", ".join(list(self.rows)[:3])
            raise ServeError(
                f"unknown task id {task_id!r} (this server has {len(self.rows)} tasks, e.g. {some})"
            )
        return self.rows[str(task_id)]


def check_servable(rows: Sequence[JsonObject], env_config: JsonObject) -> None:
    """Fail before serving, not at a client's first call: every row must build an env in the tools
    format (its reward plan, its workspace, the judge its plan needs). Raises ``ConfigError``
    naming the first bad task and how many there are."""
    from deepanalyze_env.core.config import EnvConfig
    from deepanalyze_env.core.row_check import row_problem

    config = EnvConfig.from_any({**served_config(env_config), "row_errors": "raise"})
    bad = [(r.get("task_id"), p) for r in rows if (p := row_problem(r, config)) is not None]
    if not bad:
        return
    task_id, problem = bad[0]
    hint = " (on the command line: --judge-base-url URL --judge-model NAME)" if "judge" in problem else ""
    raise ConfigError(
        f"{len(bad)} of {len(rows)} tasks cannot be served; first, task {task_id}: {problem}{hint}"
    )


class SessionHub:
    """Open episodes by key. ``open`` refuses one past ``max_sessions``; a background thread
    closes idle ones; ``close_all`` ends everything."""

    def __init__(
        self,
        env_config: JsonObject,
        limits: ServeLimits,
    ):
        limits.validate()
        self.env_config = dict(env_config)
        self.limits = limits
        self.listeners: list[Callable[[Hashable, EpisodeSession], None]] = []  # told of every closed episode
        self._sessions: dict[Hashable, EpisodeSession] = {}
        self._opening: dict[Hashable, str | None] = {}  # key -> why it was released while starting
        self._starting: dict[Hashable, EpisodeSession] = {}  # key -> its episode, kernel starting
        self._gone: OrderedDict[Hashable, str] = OrderedDict()  # released keys: never reopened
        self._lock = threading.Lock()
        self._closing: str | None = None  # why close_all ran: no episode opens after it
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="serve-reaper", daemon=True)
        self._reaper.start()

    def running(self) -> int:
        """Episodes still running (each holds a kernel worker); ended ones wait for their release."""
        with self._lock:
            return sum(1 for s in self._sessions.values() if s.ended is None) + len(self._opening)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def open(
        self, key: Hashable, row: JsonObject, *, episode_id: str | None = None, policy_id: str = "served"
    ) -> EpisodeSession:
        """Start an episode of ``row`` under ``key`` (a kernel starts: this blocks for a moment).
        The session stays under its key after its episode ends, so the client's later calls are
        told it ended, until :meth:`release` (the client left) or the reaper forgets it; a key
        once released is never given another episode (one session, one episode)."""
        with self._lock:
            if self._closing is not None:
                raise ServeError(f"the server is stopping ({self._closing}); no episode starts")
            if key in self._gone:
                raise ServeError(f"this session's episode has ended ({self._gone[key]}); open a new session")
            if key in self._sessions or key in self._opening:
                raise ServeError("this session already has an episode")
            running = sum(1 for s in self._sessions.values() if s.ended is None) + len(self._opening)
            if running >= self.limits.max_sessions:
                raise ServeError(
                    f"too many open episodes: the limit is {self.limits.max_sessions} (--max-sessions); "
                    "end one or try again later"
                )
            self._opening[key] = None
            session = EpisodeSession(self.env_config, row, self.limits, episode_id, policy_id)
            self._starting[key] = session
        try:
            session.start()
        except BaseException:
            with self._lock:
                self._opening.pop(key, None)
                self._starting.pop(key, None)
            session.abandon("the episode could not start")
            raise
        with self._lock:
            released = self._opening.pop(key, None)
            self._starting.pop(key, None)
            if released is None:
                self._sessions[key] = session
                return session
        session.abandon(released)  # its client left while the kernel started
        raise ServeError(f"the session ended while its episode was starting ({released})")

    def find(self, episode_id: str) -> tuple[Hashable, EpisodeSession] | None:
        """The session (and its key) playing ``episode_id``, if any."""
        with self._lock:
            for key, session in self._sessions.items():
                if session.episode_id == episode_id:
                    return key, session
        return None

    def get(self, key: Hashable) -> EpisodeSession | None:
        with self._lock:
            return self._sessions.get(key)

    def gone(self, key: Hashable) -> str | None:
        """Why ``key`` was released, if it was."""
        with self._lock:
            return self._gone.get(key)

    def release(self, key: Hashable, reason: str, *, wait: bool = True) -> EpisodeSession | None:
        """Forget ``key``; an episode still running (or still starting) is closed as unfinished with
        ``reason``. ``wait=False``: see :meth:`EpisodeSession.abandon`."""
        with self._lock:
            self._gone.setdefault(key, reason)  # the first reason is the one that holds
            while len(self._gone) > MAX_GONE:
                self._gone.popitem(last=False)
            starting = self._starting.get(key)
            if key in self._opening:
                self._opening[key] = self._opening[key] or reason  # open() closes it when its start returns
            session = self._sessions.get(key)
        if starting is not None:
            if not wait:  # stopping: the start may never return
                starting.drop_scratch()
            return None
        if session is None:
            return None
        session.abandon(
            reason, wait=wait
        )  # recorded before the key goes: an empty hub means every record is out
        with self._lock:
            popped = self._sessions.pop(key, None)
        if popped is not None:
            self._closed(key, popped)
        return popped

    def _closed(self, key: Hashable, session: EpisodeSession) -> None:
        for listener in self.listeners:
            try:
                listener(key, session)
            except Exception:
                log.exception("a listener of closed episodes failed")

    def _reap_loop(self) -> None:
        while not self._stop.wait(self.limits.reap_period_s):
            self.reap()

    def reap(self) -> int:
        """Release every session idle past the timeout (a running episode is closed as unfinished;
        an ended one is forgotten); returns how many."""
        now = time.monotonic()
        with self._lock:
            idle = [
                k
                for k, s in self._sessions.items()
                if not s.busy and now - s.last_call > self.limits.idle_timeout_s
            ]
        for key in idle:
            self.release(key, self.limits.idle_reason)
        return len(idle)

    def close_all(self, reason: str = "the server stopped", *, wait: bool = True) -> None:
        """Close every episode (running or starting) with ``reason``; from now on none opens."""
        self._stop.set()
        with self._lock:
            self._closing = self._closing or reason
            keys = list(self._sessions) + list(self._opening)
        for key in keys:
            self.release(key, reason, wait=wait)
