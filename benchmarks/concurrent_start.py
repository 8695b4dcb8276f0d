"""A batch of episodes started at once, as SkyRL's generator does: make + init + first cell.

Measures, in one run:
1. ``--episodes`` episodes (default 1,024) started concurrently from ``--threads`` threads:
   the wall time until every first ``print(1)`` cell has returned, and the fork server's CPU
   per episode (its own, ``/proc/<server>/stat`` utime+stime, and separately the children it
   reaped, cutime+cstime);
2. ``--serial`` episodes back to back (make + init + first cell + close): fork-server CPU per
   episode and the median wall time;
3. ``env.step`` ``print(1)`` median over ``--cells`` cells in one warm episode;
4. leaks after every episode closed: processes under the fork server beyond its spares,
   scratch folders, worker cgroups, and the trainer's open descriptors.

Usage: ``python benchmarks/concurrent_start.py [--episodes 1024] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PRINT_CELL = "<Analyze>a</Analyze>\n<Code>\n```python\nprint(1)\n```\n</Code>"
TARGET_ALL_FIRST_CELLS_S = 30.0
TARGET_SERVER_CPU_MS = 15.0
TARGET_STEP_MS = 0.3


def _server_cpu_s(pid: int) -> tuple[float, float]:
    """(the fork server's own CPU, CPU of the children it reaped): seconds. Forking is charged
    to the parent; the reaped children are intermediate spare processes (none as root since
    issue 26) and exited workers (their own setup and cells)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def _per_episode_ms(before: tuple[float, float], after: tuple[float, float], n: int) -> dict:
    own, children = ((a - b) * 1000.0 / n for a, b in zip(after, before, strict=True))
    return {"own": own, "reaped_children": children}


def _make(root: Path):
    import skyrl_gym

    import deepanalyze_env  # noqa: F401  (registers the env)

    extras = {
        "reward_spec": {"method": "datatask", "ground_truth": "1", "function": ["qa_accuracy"]},
        "data": "data",
        "workspace_id": "ws",
        "input_seq": "q",
        "max_turns": 100000,
    }
    env = skyrl_gym.make("deepanalyze", env_config={"workspace_root": str(root)}, extras=extras)
    env.init([{"role": "user", "content": "q"}])
    return env


def _first_cell(env) -> float:
    start = time.monotonic()
    out = env.step(PRINT_CELL)
    if out["done"] or out["metadata"]["exec"]["status"] != "ok":
        raise RuntimeError(f"first cell failed: {out['metadata']}")
    return time.monotonic() - start


def _leaks(server_pid: int, scratch: Path, cgroup: str | None, fds_before: int) -> dict:
    import psutil

    try:
        procs = len(psutil.Process(server_pid).children(recursive=True))
    except psutil.Error:
        procs = -1
    groups = 0
    if cgroup and os.path.isdir(cgroup):
        groups = sum(1 for e in os.scandir(cgroup) if e.is_dir())
    return {
        "processes_under_server": procs,
        "scratch_folders": sum(1 for _ in scratch.iterdir()),
        "worker_cgroups": groups,
        "trainer_fds_added": len(os.listdir("/proc/self/fd")) - fds_before,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--serial", type=int, default=30)
    parser.add_argument("--cells", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from tools.fork_server import KernelServer

    tmp = Path(tempfile.mkdtemp(prefix="deepanalyze-bench-"))
    scratch = tmp / "scratch"
    scratch.mkdir()
    os.environ["DEEPANALYZE_SCRATCH"] = str(scratch)
    root = tmp / "root"
    (root / "data" / "ws").mkdir(parents=True)
    (root / "data" / "ws" / "sales.csv").write_text("store,revenue\nA,10\nB,32\n")

    warm = _make(root)  # the fork server starts here, outside every measurement
    _first_cell(warm)
    server = warm.kernel.server
    server_pid = server.proc.pid
    cgroup = os.path.dirname(warm.kernel.cgroup) if warm.kernel.cgroup else None
    steps = []
    for _ in range(args.cells):
        start = time.perf_counter()
        warm.step(PRINT_CELL)
        steps.append((time.perf_counter() - start) * 1000.0)
    warm.close()
    time.sleep(1.0)
    fds_before = len(os.listdir("/proc/self/fd"))

    # 2. back to back
    cpu0 = _server_cpu_s(server_pid)
    serial = []
    for _ in range(args.serial):
        start = time.monotonic()
        env = _make(root)
        _first_cell(env)
        env.close()
        serial.append((time.monotonic() - start) * 1000.0)
    serial_cpu_ms = _per_episode_ms(cpu0, _server_cpu_s(server_pid), args.serial)

    # 1. all at once
    envs: list = []
    lock = threading.Lock()
    cpu0 = _server_cpu_s(server_pid)
    load0 = os.getloadavg()[0]
    start = time.monotonic()

    def one(_i: int) -> float:
        env = _make(root)
        with lock:
            envs.append(env)
        _first_cell(env)
        return time.monotonic() - start

    with ThreadPoolExecutor(args.threads) as pool:
        done_at = list(pool.map(one, range(args.episodes)))
    all_first_s = time.monotonic() - start
    batch_cpu_ms = _per_episode_ms(cpu0, _server_cpu_s(server_pid), args.episodes)
    close_start = time.monotonic()
    for env in envs:
        env.close()
    close_s = time.monotonic() - close_start
    time.sleep(3.0)  # namespaces tear down in the background
    leaks = _leaks(server_pid, scratch, cgroup, fds_before)
    KernelServer.shutdown_all()

    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_at_batch_start": load0,
        },
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "episodes": args.episodes,
        "threads": args.threads,
        "all_first_cells_s": all_first_s,
        "first_cell_done_median_s": statistics.median(done_at),
        "batch_server_cpu_ms_per_episode": batch_cpu_ms,
        "batch_close_s": close_s,
        "serial_episode_ms_median": statistics.median(serial),
        "serial_server_cpu_ms_per_episode": serial_cpu_ms,
        "step_print_ms_median": statistics.median(steps),
        "step_print_ms_p90": sorted(steps)[int(len(steps) * 0.9)],
        "leaks_after_close": leaks,
        "targets": {
            "all_first_cells_s": TARGET_ALL_FIRST_CELLS_S,
            "server_cpu_ms_per_episode": TARGET_SERVER_CPU_MS,
            "step_print_ms_median": TARGET_STEP_MS,
        },
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    from tools.tree import remove_tree

    remove_tree(tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
