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
  A session ended by the client (HTTP DELETE) or idle past the timeout closes its episode as
  unfinished. The SDK's session-less protocol era has no session to hold an episode, so the
  server declines its ``server/discover`` probe and clients fall back to the handshake; a
  request that still comes without a session gets an error saying so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from deepanalyze_env.core import tool_calls
from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.serve.hub import SessionHub
from deepanalyze_env.serve.session import EpisodeSession, ServeError

log = logging.getLogger(__name__)

PROMPT_URI = "deepanalyze://task/prompt"
FILES_URI = "deepanalyze://task/files"
STATE_URI = "deepanalyze://episode/state"
STDIO_KEY = "stdio"
SERVER_NAME = "deepanalyze-env"


@dataclass(frozen=True)
class Assignment:
    """What a new session plays: the task row, the episode id (None: a fresh one) and the policy
    id its record carries."""

    row: dict[str, Any]
    episode_id: str | None = None
    policy_id: str = "served:mcp"


Assigner = Callable[[Any], Assignment]
"""Which episode a new session plays, from its HTTP request (None over stdio). Raises
:class:`ServeError` when the request names no task the server has."""


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
    tool call or resource read."""

    def __init__(self, hub: SessionHub, assign: Assigner):
        self.hub = hub
        self.assign = assign
        self._locks: dict[str, anyio.Lock] = {}
        hub.listeners.append(lambda key, session: self._locks.pop(str(key), None))

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

    async def _episode(self, ctx: ServerRequestContext) -> tuple[str, EpisodeSession]:
        key = self.session_key(ctx)
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock:
            session = self.hub.get(key)
            if session is not None:
                return key, session
            assignment = self.assign(ctx.request)
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

    async def _list_tools(self, ctx: ServerRequestContext, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=mcp_tools())

    async def _call_tool(
        self, ctx: ServerRequestContext, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            _, session = await self._episode(ctx)
            result = await anyio.to_thread.run_sync(session.call, params.name, params.arguments or {})
        except ServeError as exc:
            return types.CallToolResult(content=[types.TextContent(text=f"error: {exc}")], is_error=True)
        return types.CallToolResult(
            content=[types.TextContent(text=result.text)],
            structured_content=result.data,
            is_error=result.is_error,
        )

    async def _list_resources(self, ctx: ServerRequestContext, params: Any) -> types.ListResourcesResult:
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
            _, session = await self._episode(ctx)
        except ServeError as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from None
        session.touch()
        mime, read = readers[uri]
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, text=read(session), mime_type=mime)]
        )


async def _no_discover(ctx: ServerRequestContext, params: Any) -> Any:
    raise MCPError(
        types.METHOD_NOT_FOUND,
        "server/discover: this server plays one episode per session; use the initialize handshake",
    )


def task_from_query(rows: Any, default: dict[str, Any] | None = None) -> Assigner:
    """A session plays the task its URL names (``?task_id=ID``), else ``default``."""

    def assign(request: Any) -> Assignment:
        task_id = request.query_params.get("task_id") if request is not None else None
        if task_id is None:
            if default is None:
                raise ServeError("name the task in the URL: /mcp?task_id=ID (or start serve with --task-id)")
            return Assignment(default)
        return Assignment(rows.get(task_id))

    return assign


async def run_stdio(episodes: EpisodeServer) -> None:
    """Serve one episode over stdin/stdout until the client closes stdin; then close what is left."""
    from mcp.server.stdio import stdio_server

    server = episodes.server()
    try:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        # at once, not after a running cell: the client will not read its result, and an MCP
        # client gives its server two seconds after closing stdin before SIGTERM and SIGKILL
        episodes.hub.close_all("the client closed the stdio connection", wait=False)


def http_app(episodes: EpisodeServer, *, host: str, extra_routes: list[Any] | None = None) -> Any:
    """The streamable-HTTP app (``/mcp``): the SDK's session manager with the hub's limits, and a
    wrapper that closes a session's episode when its client ends it (DELETE)."""
    server = episodes.server()
    limits = episodes.hub.limits
    app = server.streamable_http_app(
        streamable_http_path="/mcp",
        session_idle_timeout=limits.idle_timeout_s,
        max_sessions=limits.max_sessions,
        max_request_body_size=limits.max_request_bytes,
        host=host,
        custom_starlette_routes=extra_routes,
    )
    return SessionEndWatcher(app, episodes)


class SessionEndWatcher:
    """ASGI wrapper: a ``DELETE /mcp`` (the client ending its session) closes that session's
    episode, recorded as unfinished if it was still running. The SDK reaps an idle session's
    transport on its own; the hub's reaper closes its episode after the same timeout."""

    def __init__(self, app: Any, episodes: EpisodeServer):
        self.app = app
        self.episodes = episodes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
        if scope.get("type") == "http" and scope.get("method") == "DELETE":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            key = headers.get("mcp-session-id")
            if key:
                await anyio.to_thread.run_sync(
                    self.episodes.hub.release, key, "the client ended the session before submit_answer"
                )
