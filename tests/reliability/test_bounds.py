"""Per-episode resource bounds, enforced from outside the worker (issue 39).

``executor.memory_mb`` bounds all of an episode's processes together (a memory cgroup per
worker, written by the fork server) and ``executor.disk_mb`` everything it writes (workspace,
/tmp and /dev/shm in one tmpfs). Going past either is the cell's own failure — an error it sees,
or a ``crashed`` turn — never ``environment_error``; an OOM kill in some other cgroup (a hostile
neighbour's) must not turn an episode's own death into ``environment_error`` either, while a
kill because the host (or a limit above the episode) ran out still does.

Each check that needs a writable memory cgroup or the right to mount a tmpfs skips, saying so,
where the machine has neither; the skip is decided here, not by the code under test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import skyrl_gym

from tests.conftest import code, qa_extras, wait_gone

PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]
ANSWER_B = "<Analyze>done</Analyze>\n<Answer>\nAnswer: B\n</Answer>"
NORMAL = "import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum().idxmax())"
MB = 2**20


def _own_cgroup_line(controller: str) -> str | None:
    with open("/proc/self/cgroup") as fh:
        for line in fh.read().splitlines():
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                return path
    return None


def memory_cgroup_dir() -> str | None:
    """This process's memory cgroup folder, when it is a v1 hierarchy we may write."""
    path = _own_cgroup_line("memory")
    if os.geteuid() != 0 or path is None or not os.path.isdir("/sys/fs/cgroup/memory"):
        return None
    folder = os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
    return folder if os.access(folder, os.W_OK) else None


def can_mount_tmpfs(tmp_path: Path) -> bool:
    target = tmp_path / "probe-mount"
    target.mkdir()
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target)], capture_output=True)
    if ok.returncode != 0:
        return False
    subprocess.run(["umount", str(target)], check=True)
    return True


needs_memcg = pytest.mark.skipif(
    memory_cgroup_dir() is None, reason="needs root and a writable cgroup v1 memory hierarchy"
)


@pytest.fixture
def needs_tmpfs(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not can_mount_tmpfs(tmp_path):
        pytest.skip("needs root with the right to mount a tmpfs (disk_mb is not enforced here)")


def make(root: Path, stateful: bool = False, **executor):
    executor = {"timeout_s": 30, **executor}
    config = {"workspace_root": str(root), "stateful_cells": stateful, "executor": executor}
    env = skyrl_gym.make("deepanalyze", env_config=config, extras=qa_extras(task_id="bounds"))
    env.init(PROMPT)
    return env


def observation(out: dict) -> str:
    return out["observations"][0]["content"]


# Three children each touch 160 MB and hold it; the cell reports how many held theirs at once.
def children_attack(each_mb: int) -> str:
    return f"""
import os, select, time
held_r, held_w = os.pipe()
go_r, go_w = os.pipe()
kids = []
for n in range(3):
    pid = os.fork()
    if pid == 0:
        os.close(held_r)
        os.close(go_w)
        block = bytearray({each_mb} * 2 ** 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        os.write(held_w, bytes([n]))
        os.read(go_r, 1)
        os._exit(0)
    kids.append(pid)
os.close(held_w)
os.close(go_r)
held, dead, deadline = set(), set(), time.monotonic() + 20
while len(held | dead) < 3 and time.monotonic() < deadline:
    if select.select([held_r], [], [], 0.05)[0]:
        held.update(os.read(held_r, 8))
    for n, pid in enumerate(kids):
        if n not in dead and os.waitpid(pid, os.WNOHANG)[0]:
            dead.add(n)
print("holding", len(held - dead), "at once")
os.close(go_w)
for n, pid in enumerate(kids):
    if n not in dead:
        os.waitpid(pid, 0)
"""


@needs_memcg
def test_forked_children_together_cannot_pass_the_memory_limit(workspace_root: Path):
    """The red team's attack: 3 x 160 MB under memory_mb 200 were all held (per-process
    RLIMIT_AS). Now the episode's cgroup stops them: the cell fails with the memory message,
    the episode's memory never held two of them, and its next cell runs."""
    env = make(workspace_root, memory_mb=200)
    try:
        out = env.step(code(children_attack(160)))
        text = observation(out)
        assert "holding 3 at once" not in text and "holding 2 at once" not in text, text
        assert out["metadata"]["exec"]["status"] in ("error", "crashed"), text
        assert "exceeded the memory limit of 200 MB" in text, text
        assert out["done"] is False
        peak = _peak_bytes(env.kernel.sandbox.get("memory_cgroup"))
        if peak is not None:  # the worker survived (a child was stopped): its cgroup's peak
            assert peak < 2 * 160 * MB
        nxt = env.step(code(NORMAL))
        assert nxt["metadata"]["exec"]["status"] == "ok" and "B" in observation(nxt)
        final = env.step(ANSWER_B)
        assert final["metadata"]["reward_status"] == "scored" and final["reward"] == 1.0
    finally:
        env.close()
    fresh = make(workspace_root, memory_mb=200)
    try:
        assert fresh.step(code(NORMAL))["metadata"]["exec"]["status"] == "ok"
    finally:
        fresh.close()


def _peak_bytes(folder: str | None) -> int | None:
    try:
        with open(os.path.join(folder or "", "memory.max_usage_in_bytes")) as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return None


@needs_memcg
def test_files_a_worker_writes_count_toward_its_memory(workspace_root: Path, needs_tmpfs):
    """tmpfs pages are charged to the writer's memory cgroup: 96 MB of files under memory_mb 48
    stop the writer (the cell's crash, with the memory message), the next worker starts clean."""
    env = make(workspace_root, memory_mb=48, disk_mb=256)
    try:
        out = env.step(
            code("with open('out.bin', 'wb') as f:\n    for _ in range(96):\n        f.write(b'x' * 2 ** 20)")
        )
        assert out["metadata"]["exec"]["status"] == "crashed", observation(out)
        assert "exceeded the memory limit of 48 MB" in observation(out)
        assert (env.workspace.path / "out.bin").stat().st_size < 96 * MB
        assert env.step(code(NORMAL))["metadata"]["exec"]["status"] == "ok"
        assert env.step(ANSWER_B)["metadata"]["reward_status"] == "scored"
    finally:
        env.close()


DISK_MB = 32
FILLERS = {
    "one_big_file": "with open('big.bin', 'wb') as f:\n"
    "    for _ in range(96):\n        f.write(b'x' * 2 ** 20)",
    "many_files": "for i in range(96):\n    open(f'part{i}.bin', 'wb').write(b'x' * 2 ** 20)",
    "tmp_and_dev_shm": "for i in range(96):\n"
    "    open(f'/tmp/t{i}' if i % 2 else f'/dev/shm/s{i}', 'wb').write(b'x' * 2 ** 20)",
    "workspace_then_tmp": "for i in range(96):\n"
    "    open(f'w{i}.bin' if i < 20 else f'/tmp/t{i}', 'wb').write(b'x' * 2 ** 20)",
    "empty_files": "for i in range(20_000):\n    open(f'e{i}', 'w').close()",
}


def _written(root: Path) -> tuple[int, int]:
    """(bytes, entries) below ``root``, counted from the trainer's side."""
    size = entries = 0
    for folder, dirs, files in os.walk(root):
        entries += len(dirs) + len(files)
        for name in files:
            size += os.lstat(os.path.join(folder, name)).st_size
    return size, entries


@pytest.mark.parametrize("filler", sorted(FILLERS))
def test_disk_fillers_stop_at_disk_mb(workspace_root: Path, filler: str, needs_tmpfs):
    """Whatever a cell fills — one file, many, /tmp and /dev/shm, the workspace and /tmp
    together, or inodes — it stops at disk_mb with ENOSPC, its own error; the episode goes on."""
    env = make(workspace_root, memory_mb=512, disk_mb=DISK_MB)
    try:
        if env.kernel.sandbox.get("fs") != "readonly":
            pytest.skip("no private read-only mount namespace here: /tmp is the host's")
        out = env.step(code(FILLERS[filler]))
        text = observation(out)
        assert out["metadata"]["exec"]["status"] == "error", text
        assert "No space left on device" in text, text
        assert out["done"] is False
        size, entries = _written(env.workspace.path.parent)  # workspace/ and tmp/
        assert size <= (DISK_MB + 1) * MB
        assert entries < 20_000
        nxt = env.step(code(NORMAL))
        assert nxt["metadata"]["exec"]["status"] == "ok", observation(nxt)
        final = env.step(ANSWER_B)
        assert final["metadata"]["reward_status"] == "scored" and final["reward"] == 1.0
    finally:
        env.close()
    assert not env.workspace.path.parent.exists()
    fresh = make(workspace_root, memory_mb=512, disk_mb=DISK_MB)
    try:
        out = fresh.step(code(NORMAL + "\nopen('/tmp/ok', 'w').write('fine')"))
        assert out["metadata"]["exec"]["status"] == "ok", observation(out)
    finally:
        fresh.close()


_VMSTAT_KEY = b"oom_kill "


def host_oom_kills() -> int:
    with open("/proc/vmstat", "rb") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(_VMSTAT_KEY))


def oom_in_a_foreign_cgroup() -> None:
    """An OOM kill in a cgroup of its own (a neighbour at its limit): a process allocating
    96 MB under a 32 MB limit. It moves the host's /proc/vmstat oom_kill."""
    folder = os.path.join(memory_cgroup_dir() or "", f"bounds-test-{os.getpid()}")
    os.mkdir(folder)
    try:
        with open(os.path.join(folder, "memory.limit_in_bytes"), "w") as fh:
            fh.write(str(32 * MB))
        src = "b = bytearray(96 * 2 ** 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1"
        proc = subprocess.Popen(
            [sys.executable, "-c", f"import os\nopen({folder + '/cgroup.procs'!r}, 'w').write('0')\n{src}"]
        )
        assert proc.wait(timeout=60) == -9, "the foreign cgroup's OOM killer did not run"
    finally:
        for _ in range(50):
            try:
                os.rmdir(folder)
                break
            except OSError:
                time.sleep(0.1)


LATER_EXIT = (
    "import _thread, time, os\n"
    "def later():\n    time.sleep(1.0)\n    os._exit(0)\n"
    "_thread.start_new_thread(later, ())\nprint('armed')"
)


@needs_memcg
def test_an_oom_kill_elsewhere_does_not_blame_the_environment(workspace_root: Path):
    """A worker that dies between cells by its own cell's doing is the policy's crash, even
    when some other cgroup's OOM killer ran meanwhile (the host-wide counter moved)."""
    env = make(workspace_root, stateful=True, memory_mb=512)
    try:
        assert env.step(code(LATER_EXIT))["metadata"]["exec"]["status"] == "ok"
        before = host_oom_kills()
        oom_in_a_foreign_cgroup()
        assert host_oom_kills() > before  # the counter the old rule read did move
        assert wait_gone(env.kernel.pid, 15.0)
        out = env.step(code("print(2)"))
        assert out["done"] is False, out["metadata"]
        assert out["metadata"]["exec"]["status"] == "crashed"
        assert env.step(code("print(3)"))["metadata"]["exec"]["status"] == "ok"
        assert env.step(ANSWER_B)["metadata"]["reward_status"] == "scored"
    finally:
        env.close()


@needs_memcg
def test_an_idle_worker_killed_because_memory_ran_out_above_the_episode_is_an_environment_error(
    workspace_root: Path,
):
    """The converse: an idle worker holding 300 MB, well under its own limit, is killed when a
    limit above every episode (the fork server's cgroup, standing in for the host) runs out as
    another episode allocates: that is not the policy's doing."""
    victim = make(workspace_root, stateful=True, memory_mb=1024)
    other = make(workspace_root, memory_mb=1024)
    server_folder = None
    try:
        hold = "x = bytearray(300 * 2 ** 20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\nprint('held')"
        assert victim.step(code(hold))["metadata"]["exec"]["status"] == "ok"
        cgroup = victim.kernel.sandbox.get("memory_cgroup")
        if not cgroup:
            pytest.skip("the kernel workers got no memory cgroup here")
        server_folder = os.path.dirname(cgroup)
        with open(os.path.join(server_folder, "memory.usage_in_bytes")) as fh:
            usage = int(fh.read())
        with open(os.path.join(server_folder, "memory.limit_in_bytes"), "w") as fh:
            fh.write(str(usage + 48 * MB))
        grow = (
            "chunks = []\nfor _ in range(50):\n    chunks.append(bytearray(4 * 2 ** 20))\n"
            "    chunks[-1][::4096] = b'x' * 1024\nprint('grew')"
        )
        assert other.step(code(grow))["metadata"]["exec"]["status"] == "ok"
        assert wait_gone(victim.kernel.pid, 15.0), "the victim's worker was not the one killed"
        out = victim.step(code("print(x[:1])"))
        assert out["done"] is True and out["metadata"]["reward_status"] == "environment_error"
        assert "OOM killer" in out["metadata"]["error"]
    finally:
        if server_folder is not None:
            with open(os.path.join(server_folder, "memory.limit_in_bytes"), "w") as fh:
                fh.write("-1")
        victim.close()
        other.close()


HOSTILE = [
    children_attack(96),
    FILLERS["tmp_and_dev_shm"],
    FILLERS["one_big_file"],
    "print('y' * 5_000_000)",
    children_attack(96),
]


@needs_memcg
def test_a_normal_episode_beside_a_hostile_one_stays_scored(workspace_root: Path, needs_tmpfs):
    hostile = make(workspace_root, memory_mb=128, disk_mb=DISK_MB)
    normal = make(workspace_root, memory_mb=512, disk_mb=DISK_MB)
    statuses: list[str] = []

    def attack() -> None:
        for src in HOSTILE:
            statuses.append(hostile.step(code(src))["metadata"]["exec"]["status"])

    thread = threading.Thread(target=attack)
    try:
        thread.start()
        normal_statuses = []
        while (thread.is_alive() and len(normal_statuses) < 20) or len(normal_statuses) < 3:
            normal_statuses.append(normal.step(code(NORMAL))["metadata"]["exec"]["status"])
            time.sleep(0.1)  # its cells run between and during the hostile ones (30 turns at most)
        thread.join()
        assert set(normal_statuses) == {"ok"}
        final = normal.step(ANSWER_B)
        assert final["metadata"]["reward_status"] == "scored" and final["reward"] == 1.0
        assert statuses[1:3] == ["error", "error"] and {statuses[0], statuses[4]} <= {"error", "crashed"}, (
            statuses
        )
        assert hostile.step(ANSWER_B)["metadata"]["reward_status"] == "scored"  # its failures are its own
    finally:
        thread.join(timeout=300)
        hostile.close()
        normal.close()
