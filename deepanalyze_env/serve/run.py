"""``deepanalyze-rl serve`` as a library call: which transport, which tasks, which limits.

The command parses flags and calls :func:`serve`; tests and users' scripts can call the same
function (or build the pieces themselves: :class:`SessionHub`, :class:`EpisodeServer`,
:func:`openenv_server.openenv_app`).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.serve.hub import SessionHub, TaskBook, check_servable
from deepanalyze_env.serve.session import ServeLimits

log = logging.getLogger(__name__)

Transport = Literal["stdio", "http", "openenv"]
TRANSPORTS: tuple[str, ...] = get_args(Transport)


@dataclass(frozen=True)
class ServeSettings:
    """One ``serve`` run."""

    transport: Transport
    """``stdio``: one MCP episode over stdin/stdout; ``http``: MCP over streamable HTTP at
    ``/mcp``, a session per episode; ``openenv``: OpenEnv's WebSocket protocol at ``/ws``."""
    rows: list[dict[str, Any]]
    """The tasks offered (dataset rows, from ``core.tasks.load_task_files``)."""
    env_config: dict[str, Any]
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
    """Run the server until its client leaves (stdio) or Ctrl-C (HTTP); every episode still
    running then is closed and recorded as unfinished."""
    book = check(settings)
    limits = settings.limits
    if settings.transport == "stdio":
        limits = replace(limits, max_sessions=1)
    hub = SessionHub(settings.env_config, limits)
    default = book.rows[settings.task_id] if settings.task_id is not None else None
    previous = _stop_on_sigterm()
    try:
        _run_transport(settings, hub, book, default)
    except KeyboardInterrupt:
        # Ctrl-C or SIGTERM (an MCP client stopping its stdio server gives it two seconds):
        # record what is running as it stands and remove its scratch, without waiting for cells
        hub.close_all("the server was stopped", wait=False)
        raise
    finally:
        hub.close_all()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _stop_on_sigterm() -> Any:
    """SIGTERM stops the server as Ctrl-C does (so its ``finally`` runs); the old handler, or None
    off the main thread (where no handler can be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, stop)


def _run_transport(
    settings: ServeSettings, hub: SessionHub, book: TaskBook, default: dict[str, Any] | None
) -> None:
    limits = hub.limits

    def stop() -> None:  # Ctrl-C / SIGTERM: record what runs and remove its scratch before the server stops
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
        )
        return
    import anyio

    from deepanalyze_env.serve.mcp_server import EpisodeServer, http_app, run_stdio, task_from_query

    episodes = EpisodeServer(hub, task_from_query(book, default))
    if settings.transport == "stdio":
        anyio.run(run_stdio, episodes)
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
