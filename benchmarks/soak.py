"""Soak run (issue 8): many episodes mixing normal and hostile cells, several in flight.

Each episode: a normal cell, maybe a hostile cell (kinds from tests/reliability: the hostile
cells and the sandbox escape attempts, round robin),
another normal cell, the answer, ``close()`` with a records dir. Reports episodes run, hostile
cells tried and contained per kind, processes / scratch folders / cgroups left behind, this
process's open fds and RSS before and after, and rewards lost (an episode whose final status is
not ``scored``, or whose record is missing).

    .venv/bin/python benchmarks/soak.py --episodes 1000 --concurrency 4 --json soak.json

Exits 1 when a target fails (leaks > 0, fd growth > 0, RSS growth >= 50 MB, rewards lost > 0,
a hostile cell not contained).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import skyrl_gym  # noqa: E402

import deepanalyze_env  # noqa: E402, F401  (registers the env id)
import tools.sandbox  # noqa: E402
from deepanalyze_env.core.records import read_records  # noqa: E402
from tests.reliability.test_escapes import ESCAPE_CASES  # noqa: E402
from tests.reliability.test_hostile_cells import CASES as HOSTILE_CASES  # noqa: E402
from tools.kernel_server import SPARES  # noqa: E402

# Issue 8's hostile cells and issue 17's escape attempts, round robin.
CASES = HOSTILE_CASES + ESCAPE_CASES

TIMEOUT_S = 2.0
NORMAL = "import pandas as pd\ndf = pd.read_csv('sales.csv')\nprint(df.groupby('store').revenue.sum())"
ANSWER = "<Analyze>done</Analyze>\n<Answer>\nAnswer: B\n</Answer>"


def cell(src: str) -> str:
    return f"<Analyze>step</Analyze>\n<Code>\n```python\n{src}\n```\n</Code>"


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def leftover_processes(server_pid: int | None) -> list[int]:
    if server_pid is None:
        return []
    try:
        kids = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    alive = []
    for p in kids:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--hostile-every", type=int, default=2, help="every Nth episode gets a hostile cell")
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args()

    tools.sandbox.DEFAULTS.update(file_size_mb=50, max_processes=64)
    work = Path(tempfile.mkdtemp(prefix="deepanalyze-soak-"))
    scratch = work / "scratch"
    os.environ["DEEPANALYZE_SCRATCH"] = str(scratch)
    (work / "root" / "data" / "ws").mkdir(parents=True)
    source = work / "root" / "data" / "ws" / "sales.csv"
    source.write_text("store,revenue\nA,10\nB,32\nA,5\n")
    original = source.read_bytes()
    records = work / "records"
    config = {
        "workspace_root": str(work / "root"),
        "records_dir": str(records),
        "executor": {"timeout_s": TIMEOUT_S, "memory_mb": 512, "max_output_chars": 4000},
    }
    extras = {
        "reward_spec": {"method": "qa_plain", "ground_truth": "B"},
        "data": "data",
        "workspace_id": "ws",
        "input_seq": "Which store has the highest revenue?",
    }
    from tests.conftest import qa_extras  # noqa: F401  (registers the judge-free qa_plain method)

    tried: collections.Counter = collections.Counter()
    contained: collections.Counter = collections.Counter()
    failures: list[str] = []
    statuses: collections.Counter = collections.Counter()
    outcomes: dict = collections.defaultdict(collections.Counter)
    lock = threading.Lock()
    server_pid: list[int] = []

    def episode(i: int) -> None:
        env = skyrl_gym.make("deepanalyze", env_config=config, extras=dict(extras, task_id=f"soak-{i}"))
        env.init([{"role": "user", "content": "Which store has the highest revenue?"}])
        try:
            if env.kernel is not None and not server_pid:
                server_pid.append(env.kernel.server.proc.pid)
            env.step(cell(NORMAL))
            case = None
            if i % args.hostile_every == 0:
                case = CASES[(i // args.hostile_every) % len(CASES)]
                start = time.monotonic()
                out = env.step(cell(case.src))
                took = time.monotonic() - start
                status = out["metadata"].get("exec", {}).get("status")
                nxt = env.step(cell("print('next')"))
                # Contained: it ended in time as the policy's own failure (under load a slow
                # memory bomb may time out before it reaches its limit) and the next cell runs.
                text = out["observations"][0]["content"] if out["observations"] else ""
                ok = (
                    took < TIMEOUT_S + 2
                    and status in {"ok", "error", "timeout", "crashed"}
                    and nxt["metadata"].get("exec", {}).get("status") == "ok"
                    and "HIT" not in text  # an escape attempt that got through
                )
                with lock:
                    tried[case.name] += 1
                    outcomes[case.name][status] += 1
                    contained[case.name] += ok
                    if not ok:
                        failures.append(
                            f"{case.name}: status={status} took={took:.2f}s next={nxt['metadata']}"
                        )
            final = env.step(ANSWER)
            with lock:
                statuses[final["metadata"]["reward_status"]] += 1
        finally:
            env.close()

    warm = min(20, args.episodes)
    for i in range(warm):
        episode(i)
    fd0, rss0 = fds(), rss_mb()
    start = time.monotonic()
    with ThreadPoolExecutor(args.concurrency) as pool:
        for fut in [pool.submit(episode, i) for i in range(warm, args.episodes)]:
            fut.result()
    wall = time.monotonic() - start
    time.sleep(2.0)  # the fork server reaps and removes cgroups on its 0.5 s housekeeping tick
    spare_and_left = leftover_processes(server_pid[0] if server_pid else None)
    written = sum(len(read_records(p)) for p in records.glob("episodes-*.jsonl"))
    cg_base = tools.sandbox._pids_hierarchy()
    cgroups_left = 0
    if cg_base and server_pid:
        server_dir = Path(cg_base) / f"{tools.sandbox.CGROUP_PREFIX}{server_pid[0]}"
        cgroups_left = sum(1 for p in server_dir.iterdir() if p.is_dir()) if server_dir.exists() else 0
    result = {
        "episodes": args.episodes,
        "concurrency": args.concurrency,
        "wall_s": round(wall, 1),
        "hostile_tried": dict(tried),
        "hostile_contained": dict(contained),
        "hostile_not_contained": failures[:20],
        "hostile_statuses": {k: dict(v) for k, v in outcomes.items()},
        "final_status": dict(statuses),
        "records_written": written,
        "rewards_lost": args.episodes - statuses.get("scored", 0) + max(0, args.episodes - written),
        "leaked_processes": max(0, len(spare_and_left) - SPARES),  # the server keeps spare workers
        "leaked_scratch_dirs": sum(1 for _ in scratch.iterdir()) if scratch.exists() else 0,
        "leaked_cgroups": max(0, cgroups_left - SPARES),  # each spare has its own
        "fds_before": fd0,
        "fds_after": fds(),
        "rss_mb_before": round(rss0, 1),
        "rss_mb_after": round(rss_mb(), 1),
        "source_intact": source.read_bytes() == original,
    }
    result["rss_growth_mb"] = round(result["rss_mb_after"] - result["rss_mb_before"], 1)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    ok = (
        not failures
        and result["rewards_lost"] == 0
        and result["leaked_processes"] == 0
        and result["leaked_scratch_dirs"] == 0
        and result["fds_after"] <= result["fds_before"]
        and result["rss_growth_mb"] < 50
        and result["source_intact"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
