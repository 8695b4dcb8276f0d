"""CPU per judge request: the openai client path we use vs a bare aiohttp POST.

Why this exists: the judge benchmark (``benchmarks/judge.py``) misses its 1.1x-of-the-bound target
on small machines because every request's client-side CPU runs serially on the one event loop.
This isolates that cost: sequential requests to the scripted server (own process, no injected
latency), CPU time of the calling thread per request, for

1. ``AsyncOpenAI.post`` with ``cast_to=object`` over openai's aiohttp transport, every request
   option given (exactly what ``rewards.judge.backends.OpenAIBackend`` sends), and
2. a bare ``aiohttp.ClientSession.post`` of the same body (the floor for any HTTP client).

Usage: ``python benchmarks/judge_client_cost.py [--requests 300] [--prompt-chars 4500]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from judge import start_server  # noqa: E402


async def measure(url: str, n: int, prompt_chars: int) -> dict[str, float]:
    import aiohttp
    import openai

    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": "x" * prompt_chars}],
        "temperature": 0.0,
        "max_tokens": 16,
    }
    client = openai.AsyncOpenAI(
        base_url=url, api_key="unused", max_retries=0, http_client=openai.DefaultAioHttpClient()
    )
    options = {
        "headers": {},
        "params": {},
        "max_retries": 0,
        "timeout": client.timeout,
        "post_parser": openai.NOT_GIVEN,
    }

    async def via_openai() -> None:
        await client.post("/chat/completions", body=body, cast_to=object, options=options)

    out: dict[str, float] = {}
    async with aiohttp.ClientSession() as session:

        async def via_aiohttp() -> None:
            async with session.post(url + "/chat/completions", json=body) as response:
                await response.json()

        for name, call in (("openai_post", via_openai), ("bare_aiohttp", via_aiohttp)):
            for _ in range(50):  # connections, imports, caches
                await call()
            cpu, wall = time.thread_time(), time.perf_counter()
            for _ in range(n):
                await call()
            out[f"{name}_cpu_ms"] = round((time.thread_time() - cpu) / n * 1e3, 3)
            out[f"{name}_wall_ms"] = round((time.perf_counter() - wall) / n * 1e3, 3)
    await client.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--prompt-chars", type=int, default=4500, help="a typical rendered rubric prompt")
    args = parser.parse_args(argv)
    proc, url = start_server(0.0)
    try:
        result = asyncio.run(measure(url, args.requests, args.prompt_chars))
    finally:
        proc.terminate()
        proc.wait(10)
    result["python_speed_us"] = round(min(timeit.repeat("sum(range(100))", number=100_000, repeat=5)) * 10, 3)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
