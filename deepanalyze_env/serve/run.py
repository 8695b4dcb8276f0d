"""``deepanalyze-rl serve`` as a library call: which transport, which tasks, which limits.

The command parses flags and calls :func:`serve`; tests and users' scripts can call the same
function (or build the pieces themselves: :class:`SessionHub`, :class:`EpisodeServer`,
:func:`openenv_server.openenv_app`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, get_args

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.serve.hub import SessionHub, TaskBook, check_servable
from deepanalyze_env.serve.session import ServeLimits
from deepanalyze_env.serve.stopping import sigterm_as_interrupt, wait_for

if TYPE_CHECKING:
    from deepanalyze_env.serve.mcp_server import EpisodeServer

log = logging.getLogger(__name__)

Transport = Literal["stdio", "http", "openenv"]
TRANSPORTS: tuple[str, ...] = get_args(Transport)


@dataclass(frozen=True)
class ServeSettings:
    """One ``serve`` run."""

    transport: Transport
    """``stdio``: one MCP episode over stdin/stdout; ``http``: MCP over streamable HTTP at
    ``/mcp``, a session per episode; ``openenv``: OpenEnv's WebSocket protocol at ``/ws``."""
    rows: list[JsonObject]
    """The tasks offered (dataset rows, from ``core.tasks.load_task_files``)."""
    env_config: JsonObject
    """Every episode's env_config; ``action_format`` is always ``tools`` (the served tools)."""
    task_id: str | None = None
    """The task every session plays; stdio needs it, over HTTP a session may name its own."""
    host: str = "127.0.0.1"
    """Where HTTP transports listen; anything but loopback exposes code execution to that network."""
    port: int = 8765
    limits: ServeLimits = field(default_factory=ServeLimits)
    announce: Callable[[str], None] = lambda url: None
    """Told the URL once an HTTP transport listens (the command prints it)."""


def check(settings: ServeSettings) -> TaskBook:
    if settings.transport not in TRANSPORTS:
        raise ConfigError(f"transport must be one of {', '.join(TRANSPORTS)}, got {settings.transport!r}")
    try:
        settings.limits.validate()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    book = TaskBook(settings.rows)
    check_servable(settings.rows, settings.env_config)
    if settings.transport == "stdio" and settings.task_id is None:
        raise ConfigError("--transport stdio serves exactly one episode: give --task-id")
    if settings.task_id is not None and settings.task_id not in book.rows:
        raise ConfigError(f"--task-id {settings.task_id!r} is not in the task files")
    return book


def serve(settings: ServeSettings) -> None:
    """Run the server until its client leaves (stdio) or Ctrl-C / SIGTERM; every episode still
    running then is closed and recorded as unfinished. On a signal the episodes are recorded as
    they stand without waiting for a running cell or kernel start, and ``KeyboardInterrupt`` is
    raised: threads blocked in those may remain (the command then ends its process with
    :func:`serve.stopping.end_process`)."""
    book = check(settings)
    limits = settings.limits
    if settings.transport == "stdio":
        limits = replace(limits, max_sessions=1)
    hub = SessionHub(settings.env_config, limits)
    default = book.rows[settings.task_id] if settings.task_id is not None else None
    stopped = True
    try:
        with sigterm_as_interrupt():
            _run_transport(settings, hub, book, default)
        stopped = False
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM (an MCP client stopping its stdio server gives it two seconds):
        # record what is running as it stands and remove its scratch, without waiting for cells
        hub.close_all("the server was stopped", wait=False)
        raise
    finally:
        hub.close_all(wait=not stopped)


def _run_transport(
    settings: ServeSettings, hub: SessionHub, book: TaskBook, default: JsonObject | None
) -> None:
    limits = hub.limits

    def stop() -> None:  # Ctrl-C / SIGTERM: record what runs and remove its scratch first
        hub.close_all("the server was stopped", wait=False)

    if settings.transport == "openenv":
        from deepanalyze_env.serve.http import run_foreground
        from deepanalyze_env.serve.openenv_server import openenv_app

        app = openenv_app(hub, book, default)
        announce = settings.announce
        run_foreground(
            app,
            settings.host,
            settings.port,
            lambda url: announce(
                f"{url} (OpenEnv base URL: DeepAnalyzeEnvClient(base_url=...); WebSocket /ws)"
            ),
            limits.max_request_bytes,
            stop,
        )
        return
    from deepanalyze_env.serve.mcp_server import EpisodeServer, http_app, task_from_query

    episodes = EpisodeServer(hub, task_from_query(book, default))
    if settings.transport == "stdio":
        _run_stdio(episodes)
        return
    from deepanalyze_env.serve.http import run_foreground

    app = http_app(episodes, host=settings.host)
    run_foreground(
        app,
        settings.host,
        settings.port,
        lambda url: settings.announce(url + "/mcp"),
        limits.max_request_bytes,
        stop,
    )


def _run_stdio(episodes: EpisodeServer) -> None:
    """The stdio server's event loop on a daemon thread, the main thread waiting on it: asyncio's
    runner in the main thread would take Ctrl-C as a cancellation, which waits for the threads
    its task awaits (a kernel start, a cell, a read of stdin that may never return). Returns when
    the client closes stdin (its episode is recorded then), even while that thread still waits
    for a running cell."""
    import anyio

    from deepanalyze_env.serve.mcp_server import run_stdio

    failure: list[BaseException] = []
    client_gone = threading.Event()

    def loop() -> None:
        try:
            anyio.run(run_stdio, episodes, client_gone.set)
        except BaseException as exc:  # handed to the main thread
            failure.append(exc)

    thread = threading.Thread(target=loop, name="serve-stdio", daemon=True)
    thread.start()
    wait_for(thread, until=client_gone)
    if failure:
        raise failure[0]
