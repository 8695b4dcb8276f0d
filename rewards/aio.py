"""One background asyncio event loop per process, for async reward functions and the judge.

``env.step()`` is synchronous and may run in any thread (SkyRL uses a thread pool, TRL the
main thread, sometimes inside a running loop); submitting coroutines to a dedicated loop
thread works in all of those, and lets judge calls from many envs share one client.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_owner_pid: int | None = None


def background_loop() -> asyncio.AbstractEventLoop:
    global _loop, _owner_pid
    with _lock:
        if _loop is None or _owner_pid != os.getpid() or not _loop.is_running():
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            threading.Thread(target=run, name="deepanalyze-async", daemon=True).start()
            started.wait()
            _loop, _owner_pid = loop, os.getpid()
        return _loop


def run_sync(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the background loop and wait for its result from any thread."""
    return asyncio.run_coroutine_threadsafe(coro, background_loop()).result(timeout)
