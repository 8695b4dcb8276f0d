"""Process-tree memory (``core/memory.py``): what the pipeline records for every stage and the
trainer for every step. Expected sizes are what the test's own processes allocate and touch."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from deepanalyze_env.core import memory
from deepanalyze_env.learn.stages import exit_reason

MIB = 1024**2

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux /proc")

# A parent that touches 150 MiB, forks a child that touches 100 MiB more (both held at once),
# then waits for the go-ahead file before both exit.
TREE = textwrap.dedent(
    """
    import os, sys, time
    go = sys.argv[1]
    a = bytearray(150 * 1024 * 1024)
    for i in range(0, len(a), 4096): a[i] = 1
    pid = os.fork()
    if pid == 0:
        b = bytearray(100 * 1024 * 1024)
        for i in range(0, len(b), 4096): b[i] = 1
        open(go + ".child", "w").close()
        while not os.path.exists(go): time.sleep(0.05)
        os._exit(0)
    while not os.path.exists(go): time.sleep(0.05)
    os.waitpid(pid, 0)
    """
)


def _wait_for(path: Path) -> None:
    import time

    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, "the child never got its memory"
        time.sleep(0.05)


def test_a_stage_peak_counts_every_process_of_its_tree(tmp_path):
    go = tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", TREE, str(go)])
    _wait_for(tmp_path / "go.child")
    import threading

    threading.Timer(1.0, go.touch).start()  # both hold their memory for a second of sampling
    code, peak = memory.wait_measuring(proc, interval_s=0.05)
    assert code == 0 and peak is not None
    # 150 MiB in the parent (the child shares those pages until it writes) + 100 MiB in the child
    assert peak["peak_pss_bytes"] >= 250 * MIB
    assert peak["peak_pss_bytes"] < 250 * MIB + 120 * MIB  # the interpreters' own pages, counted once
    assert peak["peak_rss_bytes"] >= peak["peak_pss_bytes"]  # RSS counts the shared pages twice
    assert peak["processes"] == 2
    assert peak["root_hwm_bytes"] >= 150 * MIB  # wait4's exact peak of the largest process


def test_the_watch_keeps_each_phase_peak_apart():
    watch = memory.PeakWatch(interval_s=0.05, phase_name="small").start()
    watch.phase("big")
    block = bytearray(200 * MIB)
    for i in range(0, len(block), 4096):
        block[i] = 1
    watch.phase("after")
    del block
    figures = watch.drain()
    watch.stop()
    assert set(figures) >= {"small", "big"}
    # this process's exact high-water mark, reset at each phase change: 'big' saw the 200 MiB
    assert figures["big"]["root_hwm_bytes"] - figures["small"]["root_hwm_bytes"] >= 190 * MIB
    assert figures["big"]["peak_rss_bytes"] >= figures["big"]["root_hwm_bytes"]


def test_a_drain_starts_the_next_steps_figures_afresh():
    watch = memory.PeakWatch(interval_s=0.05, phase_name="update").start()
    block = bytearray(150 * MIB)
    for i in range(0, len(block), 4096):
        block[i] = 1
    del block  # gone before the first drain, which still reports the step's peak
    first = watch.drain()["update"]
    second = watch.drain()["update"]
    watch.stop()
    assert first["root_hwm_bytes"] - second["root_hwm_bytes"] >= 140 * MIB


def test_an_ordinary_failure_is_its_exit_code():
    assert exit_reason("grpo", 1, None, 0) == "exit code 1"


def _memory_cgroup() -> Path | None:
    root = Path("/sys/fs/cgroup/memory")
    if os.geteuid() != 0 or not (root / "memory.limit_in_bytes").exists():
        return None
    return root


@pytest.mark.skipif(_memory_cgroup() is None, reason="needs root and a cgroup v1 memory controller")
def test_a_stage_the_oom_killer_ends_is_named_with_what_to_lower(tmp_path):
    """A real OOM kill: the stage runs in a 64 MiB memory cgroup and allocates 512 MiB."""
    group = _memory_cgroup() / f"deepanalyze-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(64 * MIB))
        swap = group / "memory.memsw.limit_in_bytes"
        if swap.exists():
            swap.write_text(str(64 * MIB))
        before = memory.host_oom_kills()
        hog = "b = bytearray(512 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
        proc = subprocess.Popen(
            [sys.executable, "-c", hog],
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
        )
        code, peak = memory.wait_measuring(proc, interval_s=0.05)
        assert code == -9
        reason = exit_reason("grpo", code, peak, before)
        assert reason.startswith("killed by the kernel's out-of-memory killer")
        assert "grpo.set.trl.max_completion_length" in reason
        assert "\n" not in reason
    finally:
        group.rmdir()


def test_a_sigkill_without_an_oom_kill_is_not_called_one():
    before = memory.host_oom_kills()
    proc = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    code, peak = memory.wait_measuring(proc, interval_s=0.05)
    assert code == -9
    assert exit_reason("eval-base", code, peak, before) == (
        "killed by SIGKILL (exit code -9), not by the out-of-memory killer"
    )
