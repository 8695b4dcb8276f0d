"""The env behind OpenEnv's server conventions (``openenv-core``): typed action, observation and
state; ``reset`` / ``step`` / ``state`` over its WebSocket session protocol (``/ws``).

What maps to what:

- ``reset(task_id=ID)`` starts an episode of that task (or the server's ``--task-id``); the
  observation carries the task prompt (system prompt and task message) and the data files.
  A second ``reset`` on the same connection closes the running episode as unfinished.
- ``step(DeepAnalyzeAction(tool, arguments))`` is one tool call of the tools action format:
  ``tool`` is ``run_python`` or ``submit_answer``, ``arguments`` its one argument. A call the
  format refuses is played as the policy's failure, as in-process. The observation's ``reward``
  is None until the episode ends, then the env's reward, with its components and status.
- ``state`` is :class:`DeepAnalyzeState` (episode id, step count, task, whether it ended).
- One WebSocket connection is one env instance; when it closes, OpenEnv calls ``close()`` and
  an episode still running is recorded as unfinished. A connection with no successful ``reset``
  or ``step`` for ``--idle-timeout`` is closed the same way (OpenEnv's own reaper): a refused
  ``reset`` (an unknown task) starts nothing and keeps nothing alive.

What OpenEnv cannot carry: token ids and logprobs (an OpenEnv client sends actions, not
samples), and OpenEnv's stateless HTTP routes (``POST /reset``, ``/step``), which build a new env
per request: they are not registered (production mode), since an episode there would end with
each request.
"""

from __future__ import annotations

import functools
import itertools
from typing import TYPE_CHECKING

from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field
from pydantic import JsonValue as PydanticJson

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.contracts import JsonObject, JsonValue
from deepanalyze_env.serve.hub import SessionHub, TaskBook
from deepanalyze_env.serve.session import EpisodeSession, ServeError

if TYPE_CHECKING:
    from fastapi import FastAPI

_keys = itertools.count()


class DeepAnalyzeAction(Action):
    """One call of the tools action format."""

    tool: str = Field(description="run_python or submit_answer")
    arguments: dict[str, PydanticJson] = Field(  # JSON values, as pydantic validates them
        default_factory=dict, description='{"code": …} or {"answer": …}'
    )


class DeepAnalyzeObservation(Observation):
    """What the client sees after ``reset`` (the task) or ``step`` (the call's result)."""

    text: str = Field(default="", description="the task prompt after reset; the tool result after step")
    task_id: str | None = None
    files: list[dict[str, str]] = Field(default_factory=list, description="after reset: the data files")
    status: str | None = Field(default=None, description="run_python: the cell's exec status")
    code_pass: int | None = None
    is_error: bool = Field(default=False, description="the call was invalid (the env's error result)")
    reward_components: dict[str, float] = Field(default_factory=dict)
    reward_status: str | None = None
    termination: str | None = None
    format_ok: bool | None = None
    error: str | None = None


class DeepAnalyzeState(State):
    """The episode behind a session: OpenEnv's id and step count, plus the task, the calls made
    (refused ones included) and why it ended, once it has."""

    task_id: str | None = None
    calls: int = 0
    ended: str | None = None


class ServedEnvironment(Environment[DeepAnalyzeAction, DeepAnalyzeObservation, DeepAnalyzeState]):
    """One OpenEnv session: at most one episode at a time, kept in the server's hub."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, hub: SessionHub, book: TaskBook, default: JsonObject | None = None):
        super().__init__()
        self.hub = hub
        self.book = book
        self.default = default
        self.connection = f"openenv-{next(_keys)}"
        self.key: str | None = None  # the hub key of the current episode (a new one per reset)
        self.resets = 0
        self.session: EpisodeSession | None = None
        self.closed: str | None = None  # why OpenEnv closed this session (its connection may stay)

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: str | None = None,
        **kwargs: JsonValue,
    ) -> DeepAnalyzeObservation:
        """Start an episode of ``task_id``. ``seed`` changes nothing (the task is the task) and a
        client's ``episode_id`` is not used: record ids are the server's, so no client can name
        (and overwrite) another episode."""
        if self.closed is not None:
            raise ServeError(f"this session was closed ({self.closed}); connect again")
        if kwargs:
            unknown = ", ".join(sorted(kwargs))
            raise ServeError(f"reset takes task_id (and seed, episode_id); unknown: {unknown}")
        if task_id is None and self.default is None:
            raise ServeError("reset needs task_id=ID (this server has no --task-id)")
        row = self.book.get(task_id) if task_id is not None else self.default
        if self.key is not None:
            self.hub.release(self.key, "the client reset the environment before submit_answer")
        self.resets += 1
        self.key = f"{self.connection}-{self.resets}"
        try:
            self.session = self.hub.open(self.key, row, policy_id="served:openenv")
        except ConfigError as exc:
            raise ServeError(f"the episode could not start: {exc}") from None
        return DeepAnalyzeObservation(
            text=self.session.prompt_text(), task_id=self.session.task_id, files=self.session.files()
        )

    def step(
        self, action: DeepAnalyzeAction, timeout_s: float | None = None, **kwargs: JsonValue
    ) -> DeepAnalyzeObservation:
        if self.session is None:
            raise ServeError("call reset(task_id=…) first")
        result = self.session.call(action.tool, action.arguments)
        data = result.data
        if not result.done:
            return DeepAnalyzeObservation(
                text=result.text,
                task_id=self.session.task_id,
                status=data.get("status"),
                code_pass=data.get("code_pass"),
                is_error=result.is_error,
            )
        return DeepAnalyzeObservation(
            text=result.text,
            task_id=self.session.task_id,
            is_error=result.is_error,
            done=True,
            reward=data.get("reward"),
            reward_components=data.get("reward_components") or {},
            reward_status=data.get("reward_status"),
            termination=data.get("termination"),
            format_ok=data.get("format_ok"),
            error=data.get("error"),
        )

    @property
    def state(self) -> DeepAnalyzeState:
        if self.session is None:
            return DeepAnalyzeState()
        s = self.session.state()
        return DeepAnalyzeState(
            episode_id=s["episode_id"],
            step_count=s["turns"],
            task_id=s["task_id"],
            calls=s["calls"],
            ended=s["ended"],
        )

    def close(self) -> None:
        """OpenEnv ends the session: the client disconnected, or it was idle (OpenEnv's reaper,
        which leaves the connection open: a later ``reset`` on it is refused)."""
        self.closed = "disconnected or idle"
        if self.key is not None:
            self.hub.release(self.key, "the OpenEnv client disconnected or went idle before submit_answer")
        self.session = None


def openenv_app(hub: SessionHub, book: TaskBook, default: JsonObject | None = None) -> FastAPI:
    """The FastAPI app: OpenEnv's WebSocket session routes (``/ws``), ``/health``, ``/schema``,
    ``/metadata``; at most ``max_sessions`` connections (OpenEnv answers the next CAPACITY_REACHED),
    each closed after ``idle_timeout_s`` without a successful reset or step (what OpenEnv counts
    as activity: a refused call, a ``state`` read, a WebSocket ping do not count)."""
    from fastapi import FastAPI
    from openenv.core.env_server.types import ConcurrencyConfig

    app = FastAPI(title="deepanalyze-env (OpenEnv)")
    server = HTTPEnvServer(
        functools.partial(ServedEnvironment, hub, book, default),
        DeepAnalyzeAction,
        DeepAnalyzeObservation,
        concurrency_config=ConcurrencyConfig(
            max_concurrent_envs=hub.limits.max_sessions, session_timeout=hub.limits.idle_timeout_s
        ),
    )
    server.register_routes(app, mode="production")
    return app
