"""Long run of the answer-matcher properties (issue 39): the CI suite's properties, millions of examples.

Runs every property of ``tests/matcher_oracle.py`` (the same strategies, oracle and checks as
``tests/test_matcher_properties.py``) round-robin, in chunks of ``--chunk`` examples per
property, each chunk a Hypothesis run with its own seed (generation only, no example database,
no shrinking: a failure is reported as found and the run goes on), until ``--examples``
examples have run or ``--minutes`` have passed, in ``--workers`` processes (each its own seeds).
Prints the count per property, the failures and the seconds; ``--json`` also writes them.

    nice -n 10 python benchmarks/matcher_properties.py --examples 1000000 [--workers 2] [--minutes 60]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, Phase, given, seed, settings

from tests.matcher_oracle import PROPERTIES, Property

log = logging.getLogger("matcher_properties")


def run_chunk(prop: Property, examples: int, chunk_seed: int, counts: Counter) -> str | None:
    """``examples`` examples of ``prop``; the failure's first line, or None when all passed."""

    @seed(chunk_seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(prop.cases)
    def run(case):
        counts[prop.name] += 1
        prop.check(case)

    try:
        run()
    except Exception as exc:  # a property failed: keep it and go on
        return f"{prop.name} (seed {chunk_seed}): {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    return None


def worker(job: tuple[int, int, int, float | None, int]) -> tuple[Counter, list[str]]:
    """One process's share: ``examples`` examples round-robin over the properties, seeds from
    ``base_seed``, until done or past ``deadline`` (a ``time.time()``)."""
    index, examples, chunk, deadline, base_seed = job
    counts: Counter = Counter()
    failures: list[str] = []
    start, round_no = time.monotonic(), 0
    while sum(counts.values()) < examples and (deadline is None or time.time() < deadline):
        for i, prop in enumerate(PROPERTIES):
            left = examples - sum(counts.values())
            if left <= 0 or (deadline is not None and time.time() >= deadline):
                break
            chunk_seed = base_seed * 1_000_003 + index * 100_003 + round_no * 101 + i
            failure = run_chunk(prop, min(chunk, left), chunk_seed, counts)
            if failure:
                failures.append(failure)
                log.info("FAILURE %s", failure)
        round_no += 1
        log.info("worker %d round %d: %d examples, %d failures, %.0f s", index, round_no,
                 sum(counts.values()), len(failures), time.monotonic() - start)  # fmt: skip
    return counts, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1_000_000, help="stop after this many examples")
    parser.add_argument("--minutes", type=float, default=None, help="or after this long")
    parser.add_argument("--chunk", type=int, default=5_000, help="examples per property per Hypothesis run")
    parser.add_argument("--workers", type=int, default=1, help="processes, each with its own seeds")
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    start = time.monotonic()
    deadline = time.time() + args.minutes * 60 if args.minutes else None
    load_before = os.getloadavg()
    share = -(-args.examples // args.workers)
    jobs = [(i, share, args.chunk, deadline, args.seed) for i in range(args.workers)]
    if args.workers == 1:
        results = [worker(jobs[0])]
    else:
        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
            results = pool.map(worker, jobs)
    counts: Counter = Counter()
    failures: list[str] = []
    for part_counts, part_failures in results:
        counts.update(part_counts)
        failures += part_failures
    seconds = time.monotonic() - start
    result = {
        "examples": sum(counts.values()),
        "per_property": dict(counts),
        "failures": failures,
        "seconds": round(seconds, 1),
        "examples_per_second": round(sum(counts.values()) / seconds, 1) if seconds else None,
        "workers": args.workers,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
