"""A scripted OpenAI-compatible chat server on 127.0.0.1 that answers with tool calls (the judge's
fake answers with text only). Per request it finds the task by a substring of the first user
message and returns that script's next call — the how-manieth is the number of tool results in
the request — with logprobs and token ids, as vLLM returns them when asked."""

from __future__ import annotations

import json
import threading
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from deepanalyze_env.serve.http import BackgroundServer


class FakeToolModel:
    def __init__(self, scripts: dict[str, list[tuple[str, dict[str, Any]]]]):
        self.scripts = scripts
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self.server = BackgroundServer(
            Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])
        )

    def __enter__(self) -> FakeToolModel:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()

    @property
    def url(self) -> str:
        return f"{self.server.url}/v1"

    def next_call(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        messages = body.get("messages") or []
        first = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        script = next((s for key, s in self.scripts.items() if key in first), [])
        done = sum(1 for m in messages if m.get("role") == "tool")
        return script[done] if done < len(script) else None

    async def _chat(self, request: Request):
        body = await request.json()
        with self._lock:
            self.requests.append(body)
            self.headers.append(dict(request.headers))
            n = len(self.requests)
        call = self.next_call(body)
        tool_calls = []
        if call is not None:
            tool_calls = [
                {
                    "id": f"call_{n}",
                    "type": "function",
                    "function": {"name": call[0], "arguments": json.dumps(call[1])},
                }
            ]
        tokens = [{"token": "<tool_call>", "logprob": -0.25, "bytes": None, "top_logprobs": []}]
        if body.get("stream"):
            return StreamingResponse(self._chunks(n, tool_calls, tokens), media_type="text/event-stream")
        choice = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None if tool_calls else "I am done.",
                "tool_calls": tool_calls or None,
            },
            "finish_reason": "tool_calls" if tool_calls else "stop",
            "logprobs": {"content": tokens},
            "token_ids": [151657, 42, n],
        }
        return JSONResponse(
            {
                "id": f"fake-{n}",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [choice],
                "usage": {"prompt_tokens": 10, "completion_tokens": 3},
            }
        )

    async def _chunks(self, n: int, tool_calls: list[dict[str, Any]], tokens: list[dict[str, Any]]):
        for call in tool_calls:  # the arguments in two pieces, as real servers split them
            args = call["function"]["arguments"]
            half = len(args) // 2
            first = {
                "index": 0,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": args[:half]},
            }
            second = {"index": 0, "function": {"arguments": args[half:]}}
            for delta in (first, second):
                chunk = {
                    "id": f"fake-{n}",
                    "choices": [
                        {"index": 0, "delta": {"tool_calls": [delta]}, "logprobs": {"content": tokens}}
                    ],
                }
                yield f"data: {json.dumps(chunk)}\n\n"
        end = {"id": f"fake-{n}", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
        yield f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n"
