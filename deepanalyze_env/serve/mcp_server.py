"""The env as an MCP server (the official ``mcp`` SDK): one MCP session is one episode.

Tools are the tool-calling action format's own, ``run_python(code)`` and ``submit_answer(answer)``
(same names, descriptions and argument schemas as :func:`core.tool_calls.tool_schemas`). The
task is readable as resources: ``deepanalyze://task/prompt`` (the system prompt and the task
message, with its data listing), ``deepanalyze://task/files`` (the data files as JSON) and
``deepanalyze://episode/state``. ``submit_answer`` returns the reward, its components and the
status, computed by the env.

Transports:

- **stdio**: the process serves exactly one episode of one task (``serve --transport stdio
  --tasks FILE --task-id ID``); when the client closes stdin an episode still running is
  recorded as unfinished.
- **streamable HTTP**: each session (the ``Mcp-Session-Id`` of the initialize handshake) plays
  its own episode, of the task the server was started with or the one its URL names
  (``/mcp?task_id=ID``); ``collect`` binds a URL to one planned episode (``?episode=TOKEN``).
  The episode is decided at the handshake: a handshake naming no task the server has is
  refused there (:class:`SessionGate`), so it holds no session. A session ended by the client
  (HTTP DELETE) or idle past the timeout (no tool call; pings do not count) is ended, its
  episode recorded as unfinished. The SDK's session-less protocol era has no session to hold an
  episode, so the server declines its ``server/discover`` probe and clients fall back to the
  handshake; a request that still comes without a session gets an error saying so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn, Protocol

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from deepanalyze_env.core import tool_calls
from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.contracts import JsonObject, JsonValue
from deepanalyze_env.serve.hub import SessionHub, TaskBook
from deepanalyze_env.serve.session import EpisodeSession, ServeError

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.shared.message import SessionMessage
    from starlette.requests import Request
    from starlette.routing import Route
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

PROMPT_URI = "deepanalyze://task/prompt"
FILES_URI = "deepanalyze://task/files"
STATE_URI = "deepanalyze://episode/state"
STDIO_KEY = "stdio"
SERVER_NAME = "deepanalyze-env"


@dataclass(frozen=True)
class Assignment:
    """What a new session plays: the task row, the episode id (None: a fresh one) and the policy
    id its record carries. ``give_back`` undoes a claim when the handshake fails after all."""

    row: JsonObject
    episode_id: str | None = None
    policy_id: str = "served:mcp"
    give_back: Callable[[], None] | None = field(default=None, compare=False)


Assigner = Callable[["Request | None"], Assignment]
"""Which episode a new session plays, from its handshake's HTTP request (None over stdio).
Raises :class:`ServeError` when the request names no task the server has."""


@dataclass
class CallClock:
    """Whether a tool call counted (the episode counted it against ``max_calls``)."""

    counted: bool = False


class SessionCapReached(ServeError):
    """A handshake past ``--max-sessions``."""


@dataclass
class HttpSession:
    """One MCP session over HTTP, from its handshake to its end: the episode it will play and its
    idle clock (started by the handshake, restarted by each tool call, stopped while one runs)."""

    assignment: Assignment
    last_active: float = field(default_factory=time.monotonic)
    calls_running: int = 0

    def idle(self, now: float, timeout_s: float) -> bool:
        return self.calls_running == 0 and now - self.last_active > timeout_s


def mcp_tools() -> list[types.Tool]:
    return [
        types.Tool(
            name=s["function"]["name"],
            description=s["function"]["description"],
            input_schema=s["function"]["parameters"],
        )
        for s in tool_calls.tool_schemas()
    ]


class EpisodeServer:
    """The MCP handlers over a :class:`SessionHub`: each MCP session gets its episode on its first
    tool call or resource read. Over HTTP it also keeps the open sessions (:class:`HttpSession`,
    by ``Mcp-Session-Id``): their cap, their idle clock and their end."""

    def __init__(self, hub: SessionHub, assign: Assigner):
        self.hub = hub
        self.assign = assign
        self._locks: dict[str, anyio.Lock] = {}
        self.sessions: dict[str, HttpSession] = {}
        self._handshakes = 0  # admitted, not answered yet: they count against the cap
        self._lock = threading.Lock()  # sessions are ended from the hub's threads too
        self._manager: StreamableHTTPSessionManager | None = None  # the SDK's (HTTP)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        hub.listeners.append(lambda key, session: self._episode_closed(str(key)))

    def server(self) -> Server:
        server: Server = Server(
            SERVER_NAME,
            version="1",
            instructions="One session is one data-analysis episode: read deepanalyze://task/prompt, "
            "call run_python to analyse the data files, then submit_answer.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_read_resource=self._read_resource,
        )
        server.add_request_handler("server/discover", types.RequestParams, _no_discover)
        return server

    # ------------------------------------------------------------------ sessions

    @staticmethod
    def session_key(ctx: ServerRequestContext) -> str:
        if ctx.request is None:
            return STDIO_KEY
        key = ctx.request.headers.get("mcp-session-id")
        if not key:
            raise ServeError(
                "this server plays one episode per MCP session: connect with the initialize handshake "
                "(protocol 2025-11-25; e.g. mcp.Client(url, mode='legacy'))"
            )
        return key

    def admit(self, request: Request) -> Assignment:
        """A handshake: the episode the new session will play. Refused (:class:`ServeError`, and
        nothing is kept) when the request names no task the server has, or ``max_sessions``
        sessions are open (:class:`SessionCapReached`)."""
        limit = self.hub.limits.max_sessions
        with self._lock:
            if len(self.sessions) + self._handshakes >= limit:
                raise SessionCapReached(
                    f"too many open sessions: the limit is {limit} (--max-sessions); "
                    "end one or try again later"
                )
            assignment = self.assign(request)
            self._handshakes += 1
        return assignment

    def handshake_done(self, key: str | None, assignment: Assignment) -> None:
        """The SDK answered the handshake: ``key`` is the new session, or None when it refused."""
        with self._lock:
            self._handshakes -= 1
            if key is not None:
                self.sessions[key] = HttpSession(assignment)
        if key is None and assignment.give_back is not None:
            assignment.give_back()

    def end(self, key: str, reason: str, *, wait: bool = True) -> None:
        """End an HTTP session (the client deleted it, or it went idle): its episode is closed as
        unfinished if it still runs, and the SDK's session is terminated. Blocks (call it off the
        event loop); ``wait=False``: see :meth:`SessionHub.release`."""
        with self._lock:
            known = self.sessions.pop(key, None) is not None
        if known:
            self.hub.release(key, reason, wait=wait)
            self._terminate_soon(key)

    def end_episode(self, episode_id: str, reason: str, *, wait: bool = True) -> None:
        """End every session bound to ``episode_id`` (``collect``, once its agent is gone: a
        session that never opened its episode would otherwise hold its slot until idle)."""
        with self._lock:
            keys = [k for k, s in self.sessions.items() if s.assignment.episode_id == episode_id]
        for key in keys:
            self.end(key, reason, wait=wait)

    def _episode_closed(self, key: str) -> None:
        """The hub released this session's episode (idle, or ``collect`` is done with it): the
        session ends with it."""
        self._locks.pop(key, None)
        with self._lock:
            known = self.sessions.pop(key, None) is not None
        if known:
            self._terminate_soon(key)

    @contextmanager
    def _calling(self, ctx: ServerRequestContext) -> Iterator[CallClock]:
        """A tool call: the idle clock of its HTTP session stops while it runs and starts again
        when it returns, if the episode counted it (against ``max_calls``: the caller says so).
        A call refused without counting (the episode has ended, another call runs, no episode
        could start) is not activity: a client cannot keep a slot with calls that cost it
        nothing."""
        clock = CallClock()
        if ctx.request is None:  # stdio: one session for the life of the process
            yield clock
            return
        key = self.session_key(ctx)
        with self._lock:
            session = self.sessions.get(key)
            if session is None:
                raise ServeError(self._ended(key))
            session.calls_running += 1
        try:
            yield clock
        finally:
            with self._lock:
                session.calls_running -= 1
                if clock.counted:
                    session.last_active = time.monotonic()

    def _assignment(self, key: str, ctx: ServerRequestContext) -> Assignment:
        if ctx.request is None:
            return self.assign(None)
        with self._lock:
            session = self.sessions.get(key)
        if session is None:
            raise ServeError(self._ended(key))
        return session.assignment

    def _ended(self, key: str) -> str:
        why = self.hub.gone(key)
        return f"this session has ended ({why}); open a new session" if why else "unknown session"

    # ------------------------------------------------------------------ ending SDK sessions (HTTP)

    def bind(self, manager: StreamableHTTPSessionManager) -> None:
        """The SDK's session manager of the HTTP app (:func:`http_app`)."""
        self._manager = manager

    def start_reaper(self) -> None:
        """On the event loop's first request: the reaper of idle sessions starts there."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._spawn(self._reap_loop())

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reap_loop(self) -> None:
        limits = self.hub.limits
        while True:
            await anyio.sleep(limits.reap_period_s)
            now = time.monotonic()
            with self._lock:
                idle = [k for k, s in self.sessions.items() if s.idle(now, limits.idle_timeout_s)]
            for key in idle:
                try:
                    await anyio.to_thread.run_sync(self.end, key, limits.idle_reason)
                except Exception:  # the next period tries again; the reaper must not die
                    log.exception("could not end idle session %s", key)

    def _terminate_soon(self, key: str) -> None:
        """Terminate the SDK's session ``key`` on the event loop (from any thread): its streams
        close and its ID answers 404 from then on."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._spawn, self._terminate(key))

    async def _terminate(self, key: str) -> None:
        # The SDK has no public way for the server to end a session; its manager's table of
        # transports (mcp 2.3) is read here, and the transport's terminate() is public.
        transport = getattr(self._manager, "_server_instances", {}).get(key)
        if transport is not None and not transport.is_terminated:
            await transport.terminate()

    async def _episode(self, ctx: ServerRequestContext) -> tuple[str, EpisodeSession]:
        key = self.session_key(ctx)
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock:
            session = self.hub.get(key)
            if session is not None:
                return key, session
            assignment = self._assignment(key, ctx)
            try:
                session = await anyio.to_thread.run_sync(
                    lambda: self.hub.open(
                        key, assignment.row, episode_id=assignment.episode_id, policy_id=assignment.policy_id
                    )
                )
            except ConfigError as exc:
                raise ServeError(f"the episode could not start: {exc}") from None
            return key, session

    # ------------------------------------------------------------------ handlers

    async def _list_tools(
        self, ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=mcp_tools())

    async def _call_tool(
        self, ctx: ServerRequestContext, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            with self._calling(ctx) as clock:
                _, session = await self._episode(ctx)
                before = session.calls
                try:
                    result = await anyio.to_thread.run_sync(session.call, params.name, params.arguments or {})
                finally:
                    clock.counted = session.calls > before
        except ServeError as exc:
            return types.CallToolResult(content=[types.TextContent(text=f"error: {exc}")], is_error=True)
        return types.CallToolResult(
            content=[types.TextContent(text=result.text)],
            structured_content=result.data,
            is_error=result.is_error,
        )

    async def _list_resources(
        self, ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    uri=PROMPT_URI,
                    name="task",
                    mime_type="text/markdown",
                    description="The system prompt and the task, with its data listing",
                ),
                types.Resource(
                    uri=FILES_URI,
                    name="files",
                    mime_type="application/json",
                    description="The task's data files (name, size)",
                ),
                types.Resource(
                    uri=STATE_URI,
                    name="state",
                    mime_type="application/json",
                    description="This episode: id, task, turns, calls, whether it ended",
                ),
            ]
        )

    async def _read_resource(
        self, ctx: ServerRequestContext, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        readers: dict[str, tuple[str, Callable[[EpisodeSession], str]]] = {
            PROMPT_URI: ("text/markdown", lambda s: s.prompt_text()),
            FILES_URI: ("application/json", lambda s: json.dumps(s.files())),
            STATE_URI: ("application/json", lambda s: json.dumps(s.state())),
        }
        if uri not in readers:
            raise MCPError(types.INVALID_PARAMS, f"unknown resource {uri!r} (known: {', '.join(readers)})")
        try:
            _, session = await self._episode(ctx)  # not activity: reading costs a client nothing
        except ServeError as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from None
        mime, read = readers[uri]
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, text=read(session), mime_type=mime)]
        )


async def _no_discover(ctx: ServerRequestContext, params: types.RequestParams) -> NoReturn:
    raise MCPError(
        types.METHOD_NOT_FOUND,
        "server/discover: this server plays one episode per session; use the initialize handshake",
    )


def task_from_query(rows: TaskBook, default: JsonObject | None = None) -> Assigner:
    """A session plays the task its URL names (``?task_id=ID``), else ``default``."""

    def assign(request: Request | None) -> Assignment:
        task_id = request.query_params.get("task_id") if request is not None else None
        if task_id is None:
            if default is None:
                raise ServeError("name the task in the URL: /mcp?task_id=ID (or start serve with --task-id)")
            return Assignment(default)
        return Assignment(rows.get(task_id))

    return assign


async def run_stdio(episodes: EpisodeServer, client_gone: Callable[[], None] | None = None) -> None:
    """Serve one episode over stdin/stdout until the client closes stdin. What is left is closed
    the moment stdin ends, without waiting for a running cell (the SDK's loop would wait for
    that call's handler; the client will not read its result, and an MCP client gives its server
    two seconds before SIGTERM and SIGKILL); then ``client_gone()`` tells the command."""
    from mcp.server.stdio import stdio_server

    reason = "the client closed the stdio connection"

    async def stdin_ended() -> None:
        await anyio.to_thread.run_sync(lambda: episodes.hub.close_all(reason, wait=False))
        if client_gone is not None:
            client_gone()

    server = episodes.server()
    try:
        async with stdio_server() as (read, write):
            await server.run(_EndWatch(read, stdin_ended), write, server.create_initialization_options())
    finally:
        episodes.hub.close_all(reason, wait=False)


class _Incoming(Protocol):
    """The stdio server's read stream, as :class:`_EndWatch` uses it."""

    async def receive(self) -> SessionMessage | Exception: ...

    async def aclose(self) -> None: ...


class _EndWatch:
    """The stdio server's read stream, calling ``on_end`` when it ends (the client closed stdin)
    before the SDK's loop sees the end and waits for its running handlers."""

    def __init__(self, inner: _Incoming, on_end: Callable[[], Awaitable[None]]):
        self.inner = inner
        self.on_end = on_end

    @property
    def last_context(self) -> object:  # the SDK reads the sender's context from its stream, if any
        return getattr(self.inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            return await self.inner.receive()
        except anyio.EndOfStream:
            await self.on_end()
            raise

    def __aiter__(self) -> _EndWatch:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> _EndWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def http_app(episodes: EpisodeServer, *, host: str, extra_routes: list[Route] | None = None) -> SessionGate:
    """The streamable-HTTP app (``/mcp``): the SDK's session manager behind a :class:`SessionGate`
    that owns the sessions' start (the handshake), cap, idle clock and end. The SDK's own cap
    is off (the gate's counts the same sessions and names the flag); its own idle timeout, which
    any request (a ping) restarts, stays as a backstop."""
    server = episodes.server()
    limits = episodes.hub.limits
    app = server.streamable_http_app(
        streamable_http_path="/mcp",
        session_idle_timeout=limits.idle_timeout_s,
        max_sessions=None,
        max_request_body_size=limits.max_request_bytes,
        host=host,
        custom_starlette_routes=extra_routes,
    )
    episodes.bind(server.session_manager)
    return SessionGate(app, episodes)


class SessionGate:
    """ASGI wrapper in front of the SDK's app: where an HTTP session starts and ends.

    - A handshake (``initialize`` without a session) is checked before the SDK sees it: a task
      the server does not have, a URL without a task (and no ``--task-id``), an unknown or used
      episode token, or ``--max-sessions`` sessions open, is answered with a JSON-RPC error (HTTP
      400, or 503 at the cap) and nothing is kept: no session, no slot.
    - ``DELETE /mcp`` (the client ending its session) closes the session's episode, recorded as
      unfinished if it still runs.
    """

    def __init__(self, app: ASGIApp, episodes: EpisodeServer):
        self.app = app
        self.episodes = episodes
        self.max_body = episodes.hub.limits.max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        self.episodes.start_reaper()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        key = headers.get("mcp-session-id")
        if scope.get("method") == "POST" and not key:
            body, receive = await _peek_body(receive, self.max_body)
            message = _json_or_none(body)
            if isinstance(message, list) and any(_is_initialize(m) for m in message):
                await _send_error(send, None, 400, types.INVALID_REQUEST, "send initialize on its own")
                return
            if _is_initialize(message):
                await self._handshake(scope, receive, send, message)
                return
        await self.app(scope, receive, send)
        if scope.get("method") == "DELETE" and key:
            await anyio.to_thread.run_sync(
                self.episodes.end, key, "the client ended the session before submit_answer"
            )

    async def _handshake(self, scope: Scope, receive: Receive, send: Send, message: JsonObject) -> None:
        from starlette.requests import Request

        try:
            assignment = self.episodes.admit(Request(scope))
        except ServeError as exc:
            status, code = (
                (503, types.INTERNAL_ERROR)
                if isinstance(exc, SessionCapReached)
                else (400, types.INVALID_PARAMS)
            )
            await _send_error(send, message.get("id"), status, code, str(exc))
            return
        opened: list[str] = []

        async def answer(event: Message) -> None:
            if event["type"] == "http.response.start" and event["status"] < 400 and not opened:
                for name, value in event.get("headers", []):
                    if name.decode("latin-1").lower() == "mcp-session-id":
                        opened.append(value.decode("latin-1"))
                        self.episodes.handshake_done(opened[0], assignment)  # before the client has it
            await send(event)

        try:
            await self.app(scope, receive, answer)
        finally:
            if not opened:
                self.episodes.handshake_done(None, assignment)


async def _peek_body(receive: Receive, limit: int) -> tuple[bytes | None, Receive]:
    """Read a request body of at most ``limit`` bytes (None when longer, or cut off), and a
    ``receive`` that hands the same body on: the SDK reads it again (and answers 413 itself)."""
    chunks: list[bytes] = []
    events: list[Message] = []
    size, more = 0, True
    while more and size <= limit:
        event = await receive()
        events.append(event)
        if event.get("type") != "http.request":
            return None, _replaying(events, receive)
        chunks.append(event.get("body", b""))
        size += len(chunks[-1])
        more = bool(event.get("more_body", False))
    body = b"".join(chunks)
    replay = [{"type": "http.request", "body": body, "more_body": more}]
    return (None if more else body), _replaying(replay, receive)


def _replaying(events: list[Message], receive: Receive) -> Receive:
    pending = list(events)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay


def _json_or_none(body: bytes | None) -> JsonValue:
    if body is None:
        return None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


def _is_initialize(message: JsonValue) -> bool:
    return isinstance(message, dict) and message.get("method") == "initialize"


async def _send_error(send: Send, request_id: JsonValue, status: int, code: int, text: str) -> None:
    """A JSON-RPC error at an HTTP status: the SDK's client shows the message, not the status."""
    if not isinstance(request_id, str | int) or isinstance(request_id, bool):
        request_id = None
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": text}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
