"""Memory of a process tree: what a stage, a step or a benchmark really holds.

A training or eval process is never alone: the env's fork server and one kernel worker per
running episode are its descendants, forked from a preloaded parent and sharing most of their
pages with it. Summing their resident sets (RSS) counts the shared pandas/numpy pages once per
worker; the proportional set size (PSS) charges each shared page to its sharers in equal parts,
so a tree's PSS sum counts every page once — the number that says whether a job fits a machine.
Both come from ``/proc/<pid>/smaps_rollup``, which walks the page tables (tens of ms for a
multi-GB trainer), so a sampler reads RSS from the cheap ``statm`` every time and rescales each
process's PSS/RSS ratio from an occasional ``smaps_rollup`` (:class:`TreeReader`); the tree comes
from ``/proc/<pid>/task/*/children``.

:class:`PeakWatch` samples a tree on a background thread and keeps the peak of each *phase*
(e.g. ``rollout`` and ``update`` within a GRPO step). Sampling can miss a spike shorter than its
interval, so the watched root's own peak is also read exactly: the kernel keeps a per-process
high-water mark (``VmHWM``), which writing ``5`` to ``/proc/self/clear_refs`` resets at each
phase change (own process only). A tree peak is therefore reported as the sampled sums, raised
to at least the root's exact peak.

Everything here is Linux ``/proc``; elsewhere the functions return None and the watch records
nothing (a missing figure, never a made-up one). It lives in ``core`` because every layer above
(trainers, the pipeline, benchmarks) measures the same trees the env creates.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

log = logging.getLogger(__name__)

GIB = 1024**3


class PeakFigures(TypedDict):
    """A phase's (or a stage's) peaks, in bytes; ``samples`` is how many tree samples fed them."""

    peak_rss_bytes: int
    peak_pss_bytes: int
    root_hwm_bytes: int | None
    processes: int
    samples: int


@dataclass(frozen=True)
class TreeSample:
    """One reading of a process tree: summed RSS and PSS over its live processes."""

    rss_bytes: int
    pss_bytes: int
    processes: int


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except OSError:
            continue
        out.extend(int(x) for x in text.split())
    return out


def tree_pids(root: int) -> list[int]:
    """``root`` and every live descendant (a process that exits mid-walk is skipped)."""
    seen, stack = [], [root]
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.append(pid)
        stack.extend(_children(pid))
    return seen


def _rollup(pid: int) -> tuple[int, int] | None:
    """(RSS, PSS) in bytes of one process, or None when it is gone or unreadable."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    rss = pss = None
    for line in text.splitlines():
        if line.startswith("Rss:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("Pss:"):
            pss = int(line.split()[1]) * 1024
        if rss is not None and pss is not None:
            return rss, pss
    return None


def _statm_rss(pid: int) -> int | None:
    """Resident bytes of one process from ``statm`` (a few microseconds, unlike ``smaps_rollup``,
    which walks the page tables: ~30-100 ms for a 3 GB trainer)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
ROLLUP_EVERY_S = 5.0  # how often one process's PSS/RSS ratio is re-read
ROLLUP_MOVE_BYTES = 64 * 1024**2  # ... and at once when its RSS moved by more than this (or a fifth)


@dataclass
class TreeReader:
    """Reads a tree's summed RSS and PSS, cheaply enough to sample a trainer several times a
    second: RSS from ``statm`` at every reading, PSS as that RSS times the process's PSS/RSS ratio
    from its latest ``smaps_rollup`` (re-read every ``ROLLUP_EVERY_S``, at once for a process seen
    for the first time, and whenever its RSS moved by more than a fifth or 64 MiB since). A ratio
    moves slowly — what a process shares is decided by how it was forked and what it maps — while
    RSS is what moves within a step."""

    root: int
    _ratios: dict[int, tuple[float, float, int]] = field(default_factory=dict)  # pid -> (ratio, at, rss)

    def read(self) -> TreeSample | None:
        if _statm_rss(self.root) is None:
            return None
        now = time.monotonic()
        rss_sum = pss_sum = n = 0
        alive = set()
        for pid in tree_pids(self.root):
            rss = _statm_rss(pid)
            if rss is None:
                continue
            ratio, at, seen = self._ratios.get(pid, (1.0, -ROLLUP_EVERY_S, 0))
            if now - at >= ROLLUP_EVERY_S or abs(rss - seen) > max(ROLLUP_MOVE_BYTES, seen // 5):
                got = _rollup(pid)
                if got is not None and got[0] > 0:
                    ratio = got[1] / got[0]
                self._ratios[pid] = (ratio, now, rss)
            alive.add(pid)
            rss_sum, pss_sum, n = rss_sum + rss, pss_sum + int(rss * ratio), n + 1
        for gone in set(self._ratios) - alive:
            del self._ratios[gone]
        return TreeSample(rss_sum, pss_sum, n)


def sample_tree(root: int) -> TreeSample | None:
    """The tree's summed RSS and PSS now (exact: every process's ``smaps_rollup``), or None when
    ``root`` cannot be read (not Linux, gone)."""
    if _rollup(root) is None:
        return None
    rss = pss = n = 0
    for pid in tree_pids(root):
        got = _rollup(pid)
        if got is None:
            continue
        rss, pss, n = rss + got[0], pss + got[1], n + 1
    return TreeSample(rss, pss, n)


def own_hwm() -> int | None:
    """This process's resident high-water mark (``VmHWM``) in bytes, or None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_own_hwm() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


@dataclass
class _Peak:
    rss: int = 0
    pss: int = 0
    processes: int = 0
    samples: int = 0

    def add(self, s: TreeSample) -> None:
        self.rss = max(self.rss, s.rss_bytes)
        self.pss = max(self.pss, s.pss_bytes)
        self.processes = max(self.processes, s.processes)
        self.samples += 1


@dataclass
class PeakWatch:
    """Samples the tree under ``root`` (default: this process) every ``interval_s`` on a daemon
    thread and keeps each phase's peak. ``phase(name)`` closes the current phase and opens
    ``name`` (a repeated name accumulates into one peak until drained); ``drain()`` returns the
    closed and current phases' peaks and starts afresh. With ``root`` this process, the exact
    high-water mark is reset at every phase change and folded into that phase's peak."""

    root: int | None = None
    interval_s: float = 0.2
    phase_name: str = "run"
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _phase: str = field(default="", init=False)
    _peaks: dict[str, _Peak] = field(default_factory=dict, init=False, repr=False)
    _hwm: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _reader: TreeReader | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._phase = self.phase_name
        self._reader = TreeReader(self.root if self.root is not None else os.getpid())

    @property
    def own(self) -> bool:
        return self.root is None or self.root == os.getpid()

    def start(self) -> PeakWatch:
        if self._thread is None:
            if self.own:
                reset_own_hwm()
            self._thread = threading.Thread(target=self._loop, name="peak-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._sample_once()

    def __enter__(self) -> PeakWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample_once()

    def _sample_once(self) -> None:
        assert self._reader is not None
        with self._lock:
            sample = self._reader.read()
        if sample is None:
            return
        with self._lock:
            self._peaks.setdefault(self._phase, _Peak()).add(sample)

    def _close_hwm(self) -> None:
        """Fold this process's exact peak into the current phase (caller holds the lock)."""
        if not self.own:
            return
        hwm = own_hwm()
        if hwm is not None:
            self._hwm[self._phase] = max(self._hwm.get(self._phase, 0), hwm)
        reset_own_hwm()

    def phase(self, name: str) -> None:
        """Close the current phase (a last sample, the exact peak) and open ``name``."""
        self._sample_once()
        with self._lock:
            self._close_hwm()
            self._phase = name

    def drain(self) -> dict[str, PeakFigures]:
        """Every phase's peak since the last drain; the current phase stays open, counted afresh."""
        self._sample_once()
        with self._lock:
            self._close_hwm()
            peaks, hwm = self._peaks, self._hwm
            self._peaks, self._hwm = {}, {}
        out: dict[str, PeakFigures] = {}
        for name, p in peaks.items():
            exact = hwm.get(name)
            out[name] = PeakFigures(
                peak_rss_bytes=max(p.rss, exact or 0),
                peak_pss_bytes=p.pss,
                root_hwm_bytes=exact,
                processes=p.processes,
                samples=p.samples,
            )
        return out


def overall(figures: dict[str, PeakFigures]) -> PeakFigures | None:
    """The peaks over several phases (the largest of each figure), or None for no phases."""
    if not figures:
        return None
    values = list(figures.values())
    hwms = [v["root_hwm_bytes"] for v in values if v["root_hwm_bytes"] is not None]
    return PeakFigures(
        peak_rss_bytes=max(v["peak_rss_bytes"] for v in values),
        peak_pss_bytes=max(v["peak_pss_bytes"] for v in values),
        root_hwm_bytes=max(hwms) if hwms else None,
        processes=max(v["processes"] for v in values),
        samples=sum(v["samples"] for v in values),
    )


def gib(n: int | None) -> str:
    """``n`` bytes as ``1.23 GiB`` (``?`` for an unknown figure)."""
    return "?" if n is None else f"{n / GIB:.2f} GiB"


# glibc's M_MMAP_THRESHOLD (mallopt parameter -3): allocations at least this large get their own
# mapping, returned to the system when freed.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 20


def return_freed_buffers(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Make freed tensor buffers go back to the system (glibc only; False elsewhere).

    PyTorch's CPU allocator is glibc ``malloc``. glibc raises its mmap threshold each time a large
    mapped block is freed, so after the first few steps activations and log-prob tiles of tens of
    MB are carved from the heap instead, where freed blocks of one size rarely fit the next
    request of another: resident memory then grows with the number of differently shaped
    micro-batches, not with what is live (measured: 1.1 GiB more for one 3 x 1,536-token update of
    SmolLM2-135M, benchmarks/RESULTS.md). A fixed threshold keeps every buffer from 1 MiB up in
    its own mapping, so what a step frees is gone when it ends; the cost is a page-fault per
    fresh page of a big buffer.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, int(threshold)))


def host_oom_kills() -> int | None:
    """The host's OOM-kill counter (``/proc/vmstat`` ``oom_kill``), or None where unreadable."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    return None


def wait_measuring(proc: subprocess.Popen[bytes], interval_s: float = 0.2) -> tuple[int, PeakFigures | None]:
    """Wait for ``proc`` while sampling its tree: (exit code, peaks). The stage's own exact peak
    comes from ``wait4``'s rusage (the largest single process of the tree that was waited for),
    which the sampled sums are raised to. Ctrl-C waits a moment for the child (it got the signal
    too), then kills it, and re-raises."""
    watch = PeakWatch(root=proc.pid, interval_s=interval_s).start()
    max_rss: int | None = None
    try:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        max_rss = usage.ru_maxrss * 1024
    except KeyboardInterrupt:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    finally:
        watch.stop()
    peaks = overall(watch.drain())
    if peaks is not None and max_rss is not None:
        peaks["peak_rss_bytes"] = max(peaks["peak_rss_bytes"], max_rss)
        peaks["root_hwm_bytes"] = max_rss
    elif max_rss is not None:
        peaks = PeakFigures(
            peak_rss_bytes=max_rss, peak_pss_bytes=0, root_hwm_bytes=max_rss, processes=1, samples=0
        )
    return proc.returncode, peaks
