"""Benchmark: the full task-bank build, including the full self-check, timed.

Builds every family over every table into a temporary folder (or ``--out``), which plays every
kept task's reference episode through ``DeepAnalyzeEnv`` (the self-check), then prints the
counts per split and family, the drops per reason, the bank's size on disk, the wall time per
stage and the machine's load (target: the whole build ≤ 10 minutes on 2 cores).

    python benchmarks/bank.py [--out DIR] [--workers 2] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deepanalyze_env.offline.bank.build import build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="keep the bank here (default: a temporary folder)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args(argv)
    stages: dict[str, float] = {}
    start = time.monotonic()

    def tick(stage: str, done: int, total: int) -> None:
        if done == total:
            stages.setdefault(stage, time.monotonic() - start)

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp) / "bank"
        result = build(out, seed=args.seed, workers=args.workers, progress=tick)
        total = time.monotonic() - start
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        files = sum(1 for p in out.rglob("*") if p.is_file())
    numbers = {
        "seconds_total": round(total, 1),
        "seconds_at_stage_end": {k: round(v, 1) for k, v in stages.items()},
        "tasks_per_split": result.manifest["counts"]["per_split"],
        "per_family": {
            fam: {s: sum(m.values()) for s, m in splits.items()}
            for fam, splits in result.manifest["counts"]["family_split_method"].items()
        },
        "dropped": result.dropped,
        "self_check": result.self_check,
        "failures": result.failures[:20],
        "bytes": size,
        "files": files,
        "cpus": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(numbers, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(numbers, indent=1) + "\n")
    return 0 if not result.failures else 1


if __name__ == "__main__":
    sys.exit(main())
