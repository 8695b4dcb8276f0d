"""Per-episode bounds under attack (issue 39): what a hostile episode holds, and a soak.

Part 1, one hostile episode at a time: each hostile cell (memory fork bomb, gradual memory bomb,
disk fillers in the workspace, /tmp and /dev/shm, an inode filler,
an output flood) runs in its own episode; for each, the peak of the worker's memory cgroup, the
peak of the episode's storage (its tmpfs, from the trainer's side), the cell's status, and this
process's (the trainer's) RSS.

Part 2, a soak of ``--seconds``: ``--hostile`` threads run episodes of hostile cells (drawn in
turn from part 1's) beside ``--normal`` threads running normal episodes (two pandas cells and
the answer), while a sampler reads the host's MemAvailable and the free space of the scratch
root's filesystem and of ``/``, the trainer's RSS and the host's OOM kills every 0.1 s. Checks:
every normal episode ``scored`` with reward 1; no hostile cell ``environment_error``; the host's
free memory never below its starting level minus the configured bounds of the episodes in
flight (Σ memory_mb + disk_mb); free disk never below its start minus 1 GB (the tmpfs writes
no disk; other processes on a shared machine do).

    .venv/bin/python benchmarks/bounds.py --seconds 60 --json bounds.json

Needs root (memory cgroup, tmpfs mounts); prints what is not in force otherwise.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import skyrl_gym  # noqa: E402

import deepanalyze_env  # noqa: E402, F401  (registers the env id)
import tools.sandbox  # noqa: E402
from tests.conftest import qa_extras  # noqa: E402  (registers the judge-free qa_plain method)
from tests.reliability.test_bounds import FILLERS, children_attack  # noqa: E402

MB = 2**20
HOSTILE_MEMORY_MB, HOSTILE_DISK_MB = 256, 128
NORMAL_MEMORY_MB, NORMAL_DISK_MB = 512, 128
NORMAL = "import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum().idxmax())"
ANSWER = "<Analyze>done</Analyze>\n<Answer>\nAnswer: B\n</Answer>"
HOSTILE = {
    "fork_bomb_of_memory_3x160": children_attack(160),
    "gradual_memory_bomb": "chunks = []\nwhile True:\n    chunks.append(bytearray(8 * 2 ** 20))\n"
    "    chunks[-1][::4096] = b'x' * 2048",
    "disk_one_big_file": FILLERS["one_big_file"].replace("96", "400"),
    "disk_many_files": FILLERS["many_files"].replace("96", "400"),
    "disk_tmp_and_dev_shm": FILLERS["tmp_and_dev_shm"].replace("96", "400"),
    "disk_inodes": FILLERS["empty_files"],
    "output_flood": "import sys\nfor _ in range(200):\n    sys.stdout.write('y' * 100_000)",
}


def cell(src: str) -> str:
    return f"<Analyze>step</Analyze>\n<Code>\n```python\n{src}\n```\n</Code>"


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / MB


def mem_available_mb() -> float:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0.0


def free_mb(path: str) -> float:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize / MB


def host_oom_kills() -> int:
    with open("/proc/vmstat") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("oom_kill "))


def storage_used_mb(env) -> float | None:
    ws = env.workspace
    if ws is None or not ws.bounded:
        return None
    st = os.statvfs(ws.root)
    return (st.f_blocks - st.f_bfree) * st.f_frsize / MB


def worker_peak_mb(env, pid: int | None) -> float | None:
    """Peak of the worker's memory cgroup: read live, or from the fork server's exit report."""
    kernel = env.kernel
    found = tools.sandbox.memory_events(kernel.memory_cgroup, sizes=True) if kernel.memory_cgroup else None
    if found is None and pid is not None:
        report = kernel.server.exit_report(pid, 3.0)
        found = (report or {}).get("memory")
    return round(found["peak"] / MB, 1) if found and "peak" in found else None


def make(config: dict, task: str):
    env = skyrl_gym.make("deepanalyze", env_config=config, extras=qa_extras(task_id=task))
    env.init([{"role": "user", "content": "Which store has the highest revenue?"}])
    return env


def part_one(hostile_config: dict) -> dict:
    rows = {}
    for name, src in HOSTILE.items():
        env = make(hostile_config, f"peak-{name}")
        try:
            pid = env.kernel.pid
            rss0 = rss_mb()
            start = time.monotonic()
            out = env.step(cell(src))
            took = time.monotonic() - start
            rows[name] = {
                "status": out["metadata"]["exec"]["status"],
                "seconds": round(took, 2),
                "worker_cgroup_peak_mb": worker_peak_mb(env, pid),
                "storage_used_mb": storage_used_mb(env),
                "trainer_rss_mb": round(rss_mb(), 1),
                "trainer_rss_growth_mb": round(rss_mb() - rss0, 1),
                "says": [
                    s
                    for s in ("memory limit", "No space left", "output truncated")
                    if s in out["observations"][0]["content"]
                ],
            }
            nxt = env.step(cell(NORMAL))
            rows[name]["next_cell"] = nxt["metadata"]["exec"]["status"]
        finally:
            env.close()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--normal", type=int, default=2, help="threads running normal episodes")
    ap.add_argument("--hostile", type=int, default=2, help="threads running hostile episodes")
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="deepanalyze-bounds-"))
    scratch = work / "scratch"
    os.environ["DEEPANALYZE_SCRATCH"] = str(scratch)
    (work / "root" / "data" / "ws").mkdir(parents=True)
    (work / "root" / "data" / "ws" / "sales.csv").write_text("store,revenue\nA,10\nB,32\nA,5\n")

    def config(memory_mb: int, disk_mb: int) -> dict:
        executor = {"timeout_s": 10, "memory_mb": memory_mb, "disk_mb": disk_mb, "max_output_chars": 4000}
        return {"workspace_root": str(work / "root"), "executor": executor}

    hostile_config = config(HOSTILE_MEMORY_MB, HOSTILE_DISK_MB)
    normal_config = config(NORMAL_MEMORY_MB, NORMAL_DISK_MB)
    probe = make(normal_config, "probe")
    in_force = {k: probe.kernel.sandbox.get(k) for k in ("memory_cgroup", "storage", "fs", "pid_ns")}
    probe.step(cell(NORMAL))
    probe.close()

    peaks = part_one(hostile_config)

    # ---- the soak
    stop = threading.Event()
    lock = threading.Lock()
    samples = {"mem_available_mb": [], "scratch_free_mb": [], "root_free_mb": [], "trainer_rss_mb": []}
    normal_results: collections.Counter = collections.Counter()
    normal_bad: list[str] = []
    hostile_statuses: dict = collections.defaultdict(collections.Counter)
    hostile_final: collections.Counter = collections.Counter()
    counter = itertools.count()
    kinds = itertools.cycle(sorted(HOSTILE))

    def sampler() -> None:
        while not stop.is_set():
            with lock:
                samples["mem_available_mb"].append(mem_available_mb())
                samples["scratch_free_mb"].append(free_mb(str(scratch)))
                samples["root_free_mb"].append(free_mb("/"))
                samples["trainer_rss_mb"].append(rss_mb())
            time.sleep(0.1)

    def normal_loop() -> None:
        while not stop.is_set():
            env = make(normal_config, f"normal-{next(counter)}")
            try:
                statuses = [env.step(cell(NORMAL))["metadata"]["exec"]["status"] for _ in range(2)]
                final = env.step(ANSWER)["metadata"]
                ok = statuses == ["ok", "ok"] and final["reward_status"] == "scored"
                with lock:
                    normal_results["scored" if ok else "not scored"] += 1
                    if not ok:
                        normal_bad.append(f"{statuses} {final['reward_status']} {final.get('error')}")
            finally:
                env.close()

    def hostile_loop() -> None:
        while not stop.is_set():
            env = make(hostile_config, f"hostile-{next(counter)}")
            try:
                for _ in range(3):
                    with lock:
                        kind = next(kinds)
                    out = env.step(cell(HOSTILE[kind]))
                    meta = out["metadata"]
                    status = meta["exec"]["status"] if not out["done"] else meta.get("reward_status")
                    with lock:
                        hostile_statuses[kind][status] += 1
                    if out["done"]:
                        break
                else:
                    final = env.step(ANSWER)["metadata"]["reward_status"]
                    with lock:
                        hostile_final[final] += 1
            finally:
                env.close()

    time.sleep(1.0)
    start = {
        "mem_available_mb": mem_available_mb(),
        "scratch_free_mb": free_mb(str(scratch)),
        "root_free_mb": free_mb("/"),
        "trainer_rss_mb": rss_mb(),
        "oom_kills": host_oom_kills(),
    }
    threads = [threading.Thread(target=sampler)]
    threads += [threading.Thread(target=normal_loop) for _ in range(args.normal)]
    threads += [threading.Thread(target=hostile_loop) for _ in range(args.hostile)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(args.seconds)
    stop.set()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    bound_mb = args.hostile * (HOSTILE_MEMORY_MB + HOSTILE_DISK_MB) + args.normal * (
        NORMAL_MEMORY_MB + NORMAL_DISK_MB
    )
    lowest = {k: min(v) for k, v in samples.items() if k != "trainer_rss_mb"}
    result = {
        "machine": f"{os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.1f} GiB RAM, kernel "
        f"{os.uname().release}",
        "in_force": in_force,
        "hostile_bounds": {"memory_mb": HOSTILE_MEMORY_MB, "disk_mb": HOSTILE_DISK_MB},
        "hostile_peaks": peaks,
        "soak_seconds": round(wall, 1),
        "normal_episodes": dict(normal_results),
        "normal_not_scored": normal_bad[:10],
        "hostile_cells": {k: dict(v) for k, v in hostile_statuses.items()},
        "hostile_episodes_final": dict(hostile_final),
        "start": {k: round(v, 1) for k, v in start.items()},
        "lowest": {k: round(v, 1) for k, v in lowest.items()},
        "trainer_rss_mb_max": round(max(samples["trainer_rss_mb"]), 1),
        "configured_bound_in_flight_mb": bound_mb,
        "host_oom_kills_during_soak": host_oom_kills() - start["oom_kills"],
        "scratch_left": sum(1 for _ in scratch.iterdir()) if scratch.exists() else 0,
    }
    result["mem_floor_held"] = lowest["mem_available_mb"] >= start["mem_available_mb"] - bound_mb
    result["disk_floor_held"] = (
        min(lowest["scratch_free_mb"], lowest["root_free_mb"])
        >= min(start["scratch_free_mb"], start["root_free_mb"]) - 1024
    )
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    env_errors = sum(v.get("environment_error", 0) for v in hostile_statuses.values())
    ok = (
        normal_results.get("not scored", 0) == 0
        and normal_results.get("scored", 0) > 0
        and env_errors == 0
        and result["mem_floor_held"]
        and result["disk_floor_held"]
        and result["scratch_left"] == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
