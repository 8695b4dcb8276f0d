"""A scripted OpenAI-compatible chat server on 127.0.0.1, for tests, benchmarks and smoke runs.

It implements only ``POST /v1/chat/completions`` (plus ``GET /stats``) and answers from a
script: a reply text chosen by a substring of the prompt, with optional delay, HTTP status
or raw garbage body. With ``context_tokens`` set it refuses a prompt that does not fit that
context (counted by ``token_count``, plus ``max_tokens``) with the HTTP 400 vLLM sends.
It counts calls and the largest number of requests in flight, so tests
can check retries and the concurrency cap against the real ``openai`` client over real HTTP.
Needs ``aiohttp`` (the ``dev`` extra). Run standalone with
``python -m rewards.judge.fake_server --delay 0.2`` (prints ``READY <base_url>``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from deepanalyze_env.core.contracts import JsonObject

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

DEFAULT_TEXT = "Weaknesses:\n- none found\nThe work is adequate.\nSCORE: 4"
TEMPLATE_TOKENS = 12  # what the "chat template" adds to a prompt under ``context_tokens``


@dataclass
class Reply:
    """One scripted response. ``raw_body`` is sent verbatim (e.g. garbage) with ``status``;
    ``finish_reason`` ``"length"`` plays a reply cut by the token limit."""

    text: str | None = DEFAULT_TEXT
    finish_reason: str = "stop"
    status: int = 200
    delay_s: float = 0.0
    raw_body: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Rule:
    match: str | None
    replies: collections.deque


class FakeJudgeServer:
    """Runs an aiohttp app on its own event-loop thread; ``url`` is the ``base_url`` to use."""

    def __init__(
        self,
        default: Reply | Callable[[str], Reply] | None = None,
        *,
        host: str = "127.0.0.1",
        context_tokens: int | None = None,
        token_count: Callable[[str], int] = len,
    ):
        self.default = default if default is not None else Reply()
        self.host = host
        self.context_tokens = context_tokens  # the model's context; None: any prompt fits
        self.token_count = token_count  # how the "model" counts a prompt (default: per character)
        self.port: int | None = None
        self.rules: list[_Rule] = []
        self.requests: list[JsonObject] = []  # the request bodies, as sent
        self.calls = 0
        self.refused = 0  # requests refused as longer than ``context_tokens``
        self.in_flight = 0
        self.max_in_flight = 0
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ scripting

    def script(self, *replies: Reply, match: str | None = None) -> None:
        """Prompts containing ``match`` (any prompt if None) get ``replies`` in order; the last repeats."""
        if not replies:
            raise ValueError("script() needs at least one Reply")
        with self._lock:
            self.rules.append(_Rule(match, collections.deque(replies)))

    def reset(self) -> None:
        with self._lock:
            self.rules.clear()
            self.requests.clear()
            self.calls = self.max_in_flight = self.refused = 0

    def _choose(self, prompt: str) -> Reply:
        with self._lock:
            for rule in self.rules:
                if rule.match is None or rule.match in prompt:
                    return rule.replies.popleft() if len(rule.replies) > 1 else rule.replies[0]
        return self.default(prompt) if callable(self.default) else self.default

    def _context_refusal(self, prompt: str, max_tokens: object) -> JsonObject | None:
        """vLLM's error body for a request longer than the model's context, or None when it fits."""
        if self.context_tokens is None:
            return None
        completion = max_tokens if isinstance(max_tokens, int) else 0
        prompt_tokens = self.token_count(prompt) + TEMPLATE_TOKENS
        if prompt_tokens + completion <= self.context_tokens:
            return None
        message = (
            f"This model's maximum context length is {self.context_tokens} tokens. However, you "
            f"requested {prompt_tokens + completion} tokens ({prompt_tokens} in the messages, "
            f"{completion} in the completion). Please reduce the length of the messages or completion."
        )
        return {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}

    # ------------------------------------------------------------------ HTTP

    def _app(self) -> web.Application:
        from aiohttp import web

        async def chat(request: web.Request) -> web.StreamResponse:
            self.calls += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                body = await request.json()
                messages = body.get("messages") or []
                prompt = str(messages[-1].get("content", "")) if messages else ""
                self.requests.append(
                    {
                        "time": time.monotonic(),
                        "model": body.get("model"),
                        "prompt": prompt,
                        "temperature": body.get("temperature"),
                        "max_tokens": body.get("max_tokens"),
                        "authorization": request.headers.get("Authorization"),
                    }
                )
                refusal = self._context_refusal(prompt, body.get("max_tokens"))
                if refusal is not None:
                    self.refused += 1
                    return web.json_response(refusal, status=400)
                reply = self._choose(prompt)
                if reply.delay_s:
                    await asyncio.sleep(reply.delay_s)
                if reply.raw_body is not None:
                    return web.Response(
                        text=reply.raw_body,
                        status=reply.status,
                        headers=reply.headers,
                        content_type="application/json",
                    )
                if reply.status != 200:
                    error = {"error": {"message": reply.text or "scripted failure", "type": "scripted"}}
                    return web.json_response(error, status=reply.status, headers=reply.headers)
                return web.json_response(
                    {
                        "id": f"chatcmpl-fake-{next(self._ids)}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model"),
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": reply.text},
                                "finish_reason": reply.finish_reason,
                            }
                        ],
                        "usage": {
                            "prompt_tokens": len(prompt) // 4,
                            "completion_tokens": 8,
                            "total_tokens": 0,
                        },
                    },
                    headers=reply.headers,
                )
            finally:
                self.in_flight -= 1

        async def stats(request: web.Request) -> web.Response:
            return web.json_response({"calls": self.calls, "max_in_flight": self.max_in_flight})

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/stats", stats)
        return app

    async def _serve(self, port: int) -> None:
        from aiohttp import web

        self._runner = web.AppRunner(
            self._app(), access_log=None, handler_cancellation=True, shutdown_timeout=0.1
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, port: int = 0) -> FakeJudgeServer:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="fake-judge-server", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(port), loop).result(10)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self._loop.close()
        self._loop = None

    def __enter__(self) -> FakeJudgeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Scripted OpenAI-compatible judge server (tests, benchmarks)."
    )
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before every reply")
    parser.add_argument("--reply", default=DEFAULT_TEXT, help="reply text for every request")
    args = parser.parse_args(argv)
    server = FakeJudgeServer(Reply(text=args.reply, delay_s=args.delay)).start(args.port)
    print(f"READY {server.url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
