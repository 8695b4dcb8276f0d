"""How ``serve`` and ``collect`` stop on Ctrl-C or SIGTERM: at any moment, start-up included.

Python runs signal handlers in the main thread only, between bytecodes. So the rule here is that
the main thread of a serving command does no blocking work of its own: every transport (uvicorn,
the stdio loop) runs on a daemon thread, and the main thread waits on it in short, interruptible
steps. A Ctrl-C is then a ``KeyboardInterrupt`` in the main thread within a fraction of a second,
whatever the other threads are doing (starting a kernel, running a cell, reading stdin).

What used to hold a stopped command for tens of seconds (docs/design.md section 15):

- asyncio's runner turns SIGINT into a cancellation of its main task, and a cancellation waits
  for every worker thread the task awaits: the stdio server waited for a kernel start, a cell,
  or a line on stdin that never came;
- uvicorn's graceful shutdown waits for requests in flight (a cell, a kernel start);
- the interpreter's exit joins the thread pools (OpenEnv's per-session executors, ``collect``'s
  agent pool) whose threads are blocked in a cell or a kernel start, then tears down a heap of
  ~2,600 modules, which takes seconds on a busy machine.

So the commands record what was running first (the hub closes every episode as it stands) and
then end their process with :func:`end_process`, which runs the ``atexit`` handlers (a judge
cache's flush, logging) and exits without the joins and the teardown. A kernel worker still
running a cell goes with the fork server, which ends its workers when this process dies.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import NoReturn

WAIT_STEP_S = 0.2
"""How long the main thread blocks at a time while a transport runs: the longest a Ctrl-C waits."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside: SIGTERM stops the command as Ctrl-C does (a ``KeyboardInterrupt`` in the main
    thread, so every ``finally`` runs). Off the main thread, where no handler can be set, it
    changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def wait_for(thread: threading.Thread, until: threading.Event | None = None) -> None:
    """Block until ``thread`` ends (or ``until`` is set), in steps a signal can land between."""
    while thread.is_alive() and not (until is not None and until.is_set()):
        thread.join(WAIT_STEP_S)


def end_process(code: int) -> NoReturn:
    """End the command's process now: its records are written. Runs the ``atexit`` handlers and
    flushes the output, then exits without joining threads still blocked in a cell or a kernel
    start and without the interpreter's teardown. For a command's last line only: a library
    caller keeps its process."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
