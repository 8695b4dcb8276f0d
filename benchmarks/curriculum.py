"""Success-rate curriculum vs uniform sampling on a toy GRPO learner (a simulation, no model).

The learner holds one success logit per task. Each step draws ``--batch`` tasks, plays a group of
``--group`` episodes per task (each a Bernoulli draw at the task's current success probability)
and, for every group with reward variance (some succeed, some fail), raises that task's logit by
``--lr``: a group without variance teaches nothing, as in GRPO. Initial logits are spread from
hopeless to mastered (uniform in ``[--low, --high]``).

Uniform sampling is TRL's ``RepeatSampler`` order (a fresh permutation per epoch, cut into
batches); the curriculum is ``SuccessRateCurriculum`` fed with the same outcomes the TRL rollout
reports. Measured per seed: the fraction of zero-variance groups over ``--steps`` steps, and the
first step at which the mean success probability over all tasks reaches ``--threshold``.

    python benchmarks/curriculum.py --seeds 5
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.progress import track
from rich.table import Table

from deepanalyze_env.trainers.curriculum import CurriculumConfig, SuccessRateCurriculum


@dataclass
class Run:
    zero_variance_fraction: float  # over all --steps
    zero_variance_to_threshold: float  # over the steps until the threshold (all steps if never)
    steps_to_threshold: int | None


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def uniform_batches(n: int, batch: int, rng: random.Random):
    while True:
        order = list(range(n))
        rng.shuffle(order)
        for start in range(0, n - batch + 1, batch):
            yield order[start : start + batch]


def simulate(args: argparse.Namespace, seed: int, sampler: str) -> Run:
    rng = random.Random(seed)
    logits = [rng.uniform(args.low, args.high) for _ in range(args.tasks)]
    play = random.Random(seed + 1000)  # episode outcomes: same stream for both samplers
    ids = [f"t{i}" for i in range(args.tasks)]
    given = {k: getattr(args, k) for k in ("decay", "floor", "sharpness") if getattr(args, k) is not None}
    config = CurriculumConfig(**given)
    cur = SuccessRateCurriculum(ids, config, seed=seed)
    uniform = uniform_batches(args.tasks, args.batch, random.Random(seed))
    groups = zero = 0
    reached = None
    at_threshold = (0, 0)
    for step in range(1, args.steps + 1):
        if sampler == "curriculum":
            chosen = cur.draw(args.batch)
        elif sampler == "uniform":
            chosen = next(uniform)
        else:  # oracle: the tasks most likely to give variance, from the true probabilities
            informative = [1 - sigmoid(x) ** args.group - (1 - sigmoid(x)) ** args.group for x in logits]
            chosen = sorted(range(args.tasks), key=lambda i: -informative[i])[: args.batch]
        outcomes = []
        for i in chosen:
            p = sigmoid(logits[i])
            wins = [play.random() < p for _ in range(args.group)]
            groups += 1
            if all(wins) or not any(wins):
                zero += 1
            else:
                logits[i] += args.lr
            outcomes += [
                {
                    "task_id": ids[i],
                    "reward": float(w),
                    "reward_status": "scored",
                    "termination": "answer",
                    "reward_components": {"answer_match": float(w)},
                }
                for w in wins
            ]
        cur.observe(outcomes)
        if reached is None and statistics.fmean(sigmoid(x) for x in logits) >= args.threshold:
            reached = step
            at_threshold = (zero, groups)
    zt, gt = at_threshold if reached else (zero, groups)
    return Run(zero / groups, zt / gt, reached)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--batch", type=int, default=8, help="tasks per step")
    parser.add_argument("--group", type=int, default=8, help="episodes per task (num_generations)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=0.1, help="logit gain per informative group")
    parser.add_argument("--low", type=float, default=-6.0)
    parser.add_argument("--high", type=float, default=4.0)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--decay", type=float, help="curriculum setting (default: CurriculumConfig's)")
    parser.add_argument("--floor", type=float, help="curriculum setting (default: CurriculumConfig's)")
    parser.add_argument("--sharpness", type=float, help="curriculum setting (default: CurriculumConfig's)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    args = parser.parse_args()
    console = Console(width=150)
    results: dict[str, list[Run]] = {"uniform": [], "curriculum": [], "oracle": []}
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    for seed in track(seeds, description="seeds", console=console):
        for name in results:
            results[name].append(simulate(args, seed, name))
    table = Table(title=f"{args.tasks} tasks, {args.batch}x{args.group} episodes/step, {args.steps} steps")
    table.add_column("sampler")
    table.add_column("zero-variance groups (mean, per seed)")
    table.add_column("zero-variance until threshold")
    table.add_column(f"steps to mean success {args.threshold} (per seed)")
    for name, runs in results.items():
        zv = [r.zero_variance_fraction for r in runs]
        steps = [r.steps_to_threshold for r in runs]
        zt = statistics.fmean(r.zero_variance_to_threshold for r in runs)
        table.add_row(
            name, f"{statistics.fmean(zv):.3f}  {[round(x, 3) for x in zv]}", f"{zt:.3f}", str(steps)
        )
    console.print(table)
    u = statistics.fmean(r.zero_variance_fraction for r in results["uniform"])
    c = statistics.fmean(r.zero_variance_fraction for r in results["curriculum"])
    console.print(f"zero-variance groups: {100 * (u - c) / u:.1f}% fewer with the curriculum (target >= 30%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
