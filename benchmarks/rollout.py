"""Rollout benchmark: scripted-policy episodes per second at several ``--concurrency`` levels.

Why this exists: ``rollout`` collects SFT/eval data with episodes in flight on threads; its
throughput with a free policy (the scripted replay of the shipped reference trajectories) is
the ceiling the env, the executor, the judge client and record writing put on any teacher.
Each level runs the same job list — every shipped task, good and bad trajectory, ``--samples``
times — through :func:`deepanalyze_env.offline.rollout.run_jobs` exactly as the command does (records
written by the env on ``close()``), against the scripted OpenAI-compatible judge
(``rewards.judge.fake_server``) in its own process so its CPU does not compete for our GIL.
A warm-up round (kernel fork server start, imports, judge connections) is not timed.

Usage: ``python benchmarks/rollout.py [--levels 1,8,32] [--samples 4] [--repeat 2]
[--judge-latency 0] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from deepanalyze_env.core.tasks import load_rows  # noqa: E402
from deepanalyze_env.offline.policies import ScriptedPolicy  # noqa: E402
from deepanalyze_env.offline.rollout import plan_jobs, run_jobs  # noqa: E402

log = logging.getLogger("benchmarks.rollout")
VERDICT = (
    '```json\n{"usefulness": 5, "richness": 4, "soundness": 4, "interpretability": 3, "readability": 5}\n```'
)


def start_judge(latency: float) -> tuple[subprocess.Popen, str]:
    """The scripted judge in its own process. One reply text serves every rubric: a SCORE line
    for the two score rubrics and a fenced JSON verdict for the five-dimension one."""
    reply = "Weaknesses:\n- none\n" + VERDICT + "\nSCORE: 4"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rewards.judge.fake_server", "--delay", str(latency), "--reply", reply],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline().strip() if proc.stdout else ""
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"fake judge server did not start: {line!r}")
    return proc, line.split(" ", 1)[1]


def one_round(rows, policy, env_config: dict[str, Any], samples: int, concurrency: int, tag: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        config = {**env_config, "records_dir": tmp}
        labels = ["good", "bad"]
        jobs = plan_jobs(rows, tag, samples, lambda t: [x for x in labels if x in policy.labels_for(t)])
        start = time.perf_counter()
        results = run_jobs(jobs, config, policy, concurrency=concurrency)
        wall = time.perf_counter() - start
        written = sum(1 for p in Path(tmp).glob("episodes-*.jsonl") for _ in p.open())
    statuses = Counter(r.status for r in results)
    if written != len(jobs) or statuses.get("scored") != len(jobs):
        raise RuntimeError(f"round {tag}: {written} records for {len(jobs)} jobs, statuses {dict(statuses)}")
    per_task: dict[str, list[float]] = {}
    for r in results:
        per_task.setdefault(f"{r.task_id}/{r.label}", []).append(r.seconds)
    return {
        "per_task_s_median": {k: round(statistics.median(v), 3) for k, v in sorted(per_task.items())},
        "episodes": len(jobs),
        "wall_s": round(wall, 3),
        "episodes_per_s": round(len(jobs) / wall, 2),
        "episode_s_median": round(statistics.median(r.seconds for r in results), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,8,32", help="concurrency levels, comma-separated")
    parser.add_argument("--samples", type=int, default=4, help="episodes per task and label")
    parser.add_argument("--repeat", type=int, default=2, help="timed rounds per level (median reported)")
    parser.add_argument("--judge-latency", type=float, default=0.0, help="injected judge latency, seconds")
    parser.add_argument("--json", type=Path, help="write all numbers to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)

    data = REPO / "data"
    rows = load_rows(sorted((data / "tasks").glob("*.jsonl")), str(data))
    policy = ScriptedPolicy.from_files([data / "trajectories.jsonl"])
    proc, url = start_judge(args.judge_latency)
    env_config = {
        "workspace_root": str(data),
        "judge": {"backend": "openai", "base_url": url, "model": "bench-judge", "max_retries": 0},
    }
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_start": os.getloadavg(),
        },
        "settings": vars(args) | {"json": str(args.json) if args.json else None},
        "levels": {},
    }
    try:
        warm = one_round(rows, policy, env_config, 1, max(levels), "warm")
        log.info("warm-up: %d episodes in %.2f s (not counted)", warm["episodes"], warm["wall_s"])
        for level in levels:
            rounds = [
                one_round(rows, policy, env_config, args.samples, level, f"c{level}r{i}")
                for i in range(args.repeat)
            ]
            best = max(r["episodes_per_s"] for r in rounds)
            median = round(statistics.median(r["episodes_per_s"] for r in rounds), 2)
            report["levels"][level] = {"rounds": rounds, "episodes_per_s_median": median, "best": best}
            log.info(
                "concurrency %3d: %d episodes, %s episodes/s (rounds: %s)",
                level,
                rounds[0]["episodes"],
                median,
                ", ".join(str(r["episodes_per_s"]) for r in rounds),
            )
    finally:
        proc.kill()
        proc.wait()
    report["machine"]["load_avg_end"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
