"""An ASGI app under uvicorn on a background thread: how ``collect`` and the tests host the MCP
server and the recording proxy next to their own work, and how ``serve`` runs in the foreground.

Only loopback is the default: the server runs code for whoever reaches it, so binding another
address is the user's explicit choice (``serve --host``).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import ASGIApp

LOOPBACK = "127.0.0.1"
FORCED_STOP_S = 0.5
"""The most a forced stop waits for uvicorn's thread: long enough for it to close its sockets
(WebSocket clients get a close frame); it is a daemon, so the process need not wait for it. It may
never end by itself: OpenEnv's handler of a connection closing awaits ``env.close`` queued behind
the running cell in that session's one-thread executor."""


class BackgroundServer:
    """``start()`` returns once the socket listens (port 0: an ephemeral one, read back);
    ``stop()`` lets requests in flight finish, then returns; ``stop(force=True)`` does not wait
    for them (the server is being stopped by a signal)."""

    def __init__(self, app: ASGIApp, host: str = LOOPBACK, port: int = 0, ws_max_size: int = 16 * 2**20):
        import uvicorn

        config = uvicorn.Config(
            app, host=host, port=port, log_level="critical", lifespan="on", ws_max_size=ws_max_size
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self.host = host
        self.port = port

    def start(self, timeout_s: float = 20.0) -> BackgroundServer:
        self._thread = threading.Thread(target=self._server.run, name="serve-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        try:
            while not self._server.started:
                if not self._thread.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"the HTTP server on {self.host}:{self.port} did not start")
                time.sleep(0.01)
        except BaseException:  # Ctrl-C while uvicorn starts: it must not go on listening
            self.stop(force=True)
            raise
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout_s: float = 10.0, *, force: bool = False) -> None:
        self._server.should_exit = True
        if force:  # uvicorn closes the sockets without waiting for requests in flight
            self._server.force_exit = True
            timeout_s = min(timeout_s, FORCED_STOP_S)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_foreground(
    app: ASGIApp,
    host: str,
    port: int,
    announce: Callable[[str], None],
    ws_max_size: int = 16 * 2**20,
    on_interrupt: Callable[[], None] | None = None,
) -> None:
    """Serve until Ctrl-C or SIGTERM (``deepanalyze-rl serve``); ``announce(url)`` is told where,
    once the socket listens (port 0: the ephemeral port it got). On Ctrl-C ``on_interrupt()``
    runs first (it records what is running), then the server stops without waiting for requests
    in flight: a cell or a kernel start would hold it for as long as they take."""
    from deepanalyze_env.serve.stopping import WAIT_STEP_S

    _check_bind(host, port)
    server = BackgroundServer(app, host, port, ws_max_size=ws_max_size).start()
    interrupted = True
    try:
        announce(server.url)
        while server.alive:
            time.sleep(WAIT_STEP_S)
        interrupted = False
    except KeyboardInterrupt:
        if on_interrupt is not None:
            on_interrupt()
        raise
    finally:
        server.stop(force=interrupted)


def _check_bind(host: str, port: int) -> None:
    """A port in use (or an address not here) is the user's to fix: one line, not uvicorn's log."""
    from deepanalyze_env.core.config import ConfigError

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc} (--port 0 takes any free port)"
        ) from None
