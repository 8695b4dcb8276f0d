"""A recording OpenAI-compatible proxy: an outside agent's model calls, kept per episode.

``collect`` hands each agent the base URL ``http://127.0.0.1:PORT/proxy/TOKEN/v1``; the proxy
forwards ``POST …/chat/completions`` (streamed or not) and ``GET …/models`` to the user's
endpoint with the user's API key (the agent gets the token, never the key) and appends each
exchange — the request, the response (token ids and logprobs kept when the upstream returns
them), status and latency — to the token's trace. A streamed response is forwarded chunk by
chunk as it arrives and recorded as the message the chunks add up to.

What it trusts: nothing the agent sends beyond forwarding it. A request body over the size
limit is answered 413 unread; an unknown token 404; an upstream that fails is answered 502 and
recorded as a failed call, which makes ``collect`` leave that episode unrecorded (the model
failed, not the agent).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import TypedDict

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from deepanalyze_env.core.contracts import JsonObject, JsonValue

MAX_RECORDED_CHARS = 2_000_000  # per episode: what the trace keeps of requests and responses


class ModelCall(TypedDict):
    """One exchange the proxy forwarded (``record["agent"]["model_calls"]``)."""

    request: JsonObject  # as the agent sent it (the model name replaced when the upstream sets one)
    response: JsonObject | None  # None: the upstream was unreachable
    status: int
    latency_ms: float
    error: str | None


@dataclass
class ProxyTrace:
    """One episode's model calls, as the proxy saw them."""

    calls: list[ModelCall] = field(default_factory=list)
    upstream_failures: int = 0
    recorded_chars: int = 0
    dropped: int = 0  # calls past MAX_RECORDED_CHARS, counted but not kept


@dataclass
class Upstream:
    """The user's model endpoint."""

    base_url: str  # …/v1
    api_key: str | None = None
    model: str | None = None  # replaces the agent's model name when set
    timeout_s: float = 600.0
    api_key_env: str | None = None  # the variable the key came from: removed from agents' environments


class RecordingProxy:
    """Routes for a Starlette app; ``open(token)`` before an agent starts, ``close(token)`` after."""

    def __init__(self, upstream: Upstream, max_request_bytes: int = 8_000_000):
        self.upstream = upstream
        self.max_request_bytes = max_request_bytes
        self._traces: dict[str, ProxyTrace] = {}
        self._lock = threading.Lock()
        self._client = httpx.AsyncClient(timeout=upstream.timeout_s)

    def open(self, token: str) -> None:
        with self._lock:
            self._traces[token] = ProxyTrace()

    def close(self, token: str) -> ProxyTrace:
        with self._lock:
            return self._traces.pop(token, ProxyTrace())

    def routes(self) -> list[Route]:
        return [
            Route("/proxy/{token}/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/proxy/{token}/v1/models", self._models, methods=["GET"]),
        ]

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self.upstream.api_key:
            headers["authorization"] = f"Bearer {self.upstream.api_key}"
        return headers

    def _trace(self, request: Request) -> ProxyTrace | None:
        with self._lock:
            return self._traces.get(request.path_params["token"])

    async def _models(self, request: Request) -> Response:
        if self._trace(request) is None:
            return _error(404, "unknown proxy token")
        try:
            reply = await self._client.get(
                self.upstream.base_url.rstrip("/") + "/models", headers=self._headers()
            )
        except httpx.HTTPError as exc:
            return _error(502, f"upstream unreachable: {type(exc).__name__}")
        return Response(reply.content, status_code=reply.status_code, media_type="application/json")

    async def _chat(self, request: Request) -> Response:
        trace = self._trace(request)
        if trace is None:
            return _error(404, "unknown proxy token")
        body = await _read_bounded(request, self.max_request_bytes)
        if body is None:
            return _error(413, f"request body over {self.max_request_bytes} bytes")
        try:
            payload = json.loads(body)
            if not isinstance(payload, dict):
                raise ValueError("not an object")
        except ValueError:
            return _error(400, "the request body is not a JSON object")
        if self.upstream.model:
            payload["model"] = self.upstream.model
        url = self.upstream.base_url.rstrip("/") + "/chat/completions"
        start = time.monotonic()
        if payload.get("stream"):
            return await self._stream(trace, payload, url, start)
        try:
            reply = await self._client.post(url, json=payload, headers=self._headers())
        except httpx.HTTPError as exc:
            self._record(
                trace, payload, None, 502, start, error=f"upstream unreachable: {type(exc).__name__}"
            )
            return _error(502, f"upstream unreachable: {type(exc).__name__}")
        try:
            response = reply.json()
        except ValueError:
            response = {"raw": reply.text[:2000]}
        self._record(trace, payload, response, reply.status_code, start)
        return JSONResponse(response, status_code=reply.status_code)

    async def _stream(self, trace: ProxyTrace, payload: JsonObject, url: str, start: float) -> Response:
        request = self._client.build_request("POST", url, json=payload, headers=self._headers())
        try:
            reply = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            self._record(
                trace, payload, None, 502, start, error=f"upstream unreachable: {type(exc).__name__}"
            )
            return _error(502, f"upstream unreachable: {type(exc).__name__}")
        merged = StreamMerge()

        async def relay():
            try:
                async for line in reply.aiter_lines():
                    merged.feed(line)
                    yield (line + "\n").encode()
            finally:
                await reply.aclose()
                self._record(trace, payload, merged.response(), reply.status_code, start)

        return StreamingResponse(relay(), status_code=reply.status_code, media_type="text/event-stream")

    def _record(
        self,
        trace: ProxyTrace,
        request: JsonObject,
        response: JsonObject | None,
        status: int,
        start: float,
        error: str | None = None,
    ) -> None:
        entry = ModelCall(
            request=request,
            response=response,
            status=status,
            latency_ms=round((time.monotonic() - start) * 1000.0, 1),
            error=error,
        )
        size = len(json.dumps(entry, default=str))
        with self._lock:
            if status >= 500 or error is not None:
                trace.upstream_failures += 1
            if trace.recorded_chars + size > MAX_RECORDED_CHARS:
                trace.dropped += 1
                return
            trace.recorded_chars += size
            trace.calls.append(entry)


class _Function(TypedDict):
    name: str
    arguments: str


class _StreamedCall(TypedDict, total=False):
    """A tool call as its chunks add up (its ``id`` arrives with the first)."""

    type: str
    function: _Function
    id: JsonValue


class StreamMerge:
    """The chat completion a stream of ``data:`` chunks adds up to: content, tool calls (by
    index), finish reason, usage and logprobs (token entries concatenated)."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.tool_calls: dict[int, _StreamedCall] = {}
        self.logprobs: list[JsonValue] = []
        self.finish_reason: str | None = None
        self.usage: JsonValue = None
        self.model: str | None = None
        self.id: str | None = None
        self.size = 0
        self.truncated = False

    def feed(self, line: str) -> None:
        """Add one line of the stream (everything is relayed; past ``MAX_RECORDED_CHARS`` of
        recorded content the rest is counted, not kept)."""
        if not line.startswith("data:"):
            return
        self.size += len(line)
        if self.size > MAX_RECORDED_CHARS:
            self.truncated = True
            return
        data = line[5:].strip()
        if not data or data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            return
        self.id = self.id or chunk.get("id")
        self.model = self.model or chunk.get("model")
        self.usage = chunk.get("usage") or self.usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(str(delta["content"]))
            for call in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(
                    int(call.get("index", 0)),
                    _StreamedCall(type="function", function=_Function(name="", arguments="")),
                )
                slot["id"] = call.get("id") or slot.get("id")
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
            logprobs = (choice.get("logprobs") or {}).get("content")
            if logprobs:
                self.logprobs.extend(logprobs)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def response(self) -> JsonObject:
        """The merged chat completion, shaped as a non-streamed one (plus ``streamed: true``)."""
        message: JsonObject = {"role": "assistant", "content": "".join(self.content) or None}
        if self.tool_calls:
            message["tool_calls"] = [dict(self.tool_calls[i]) for i in sorted(self.tool_calls)]
        choice: JsonObject = {"index": 0, "message": message, "finish_reason": self.finish_reason}
        if self.logprobs:
            choice["logprobs"] = {"content": self.logprobs}
        merged: JsonObject = {
            "id": self.id,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage,
            "streamed": True,
        }
        if self.truncated:
            merged["truncated"] = True  # the stream outgrew what a trace keeps
        return merged


async def _read_bounded(request: Request, limit: int) -> bytes | None:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "deepanalyze_proxy"}}, status_code=status)
