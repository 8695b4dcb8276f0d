"""GRPO's group size, groups per step and completion budget, chosen by measurement on train (issue 41).

The SFT model of ``benchmarks/sft_sweep.py`` (trained without the held-out train tables) is
sampled ``--samples`` times per held-out train task at GRPO's temperature and turn cap: one
``eval`` (``samples`` K), a stage reused on rerun. Dev and test are never read. From its episodes:

- per task, ``c`` correct (:func:`~deepanalyze_env.offline.correct.is_correct`, RFT's and pass@k's
  rule) of ``n``: the chance that a group of G of its episodes is *accuracy-informative* (some right,
  some wrong; otherwise its advantages come only from gate, code-pass or turn differences), estimated
  without bias by ``1 − C(c,G)/C(n,G) − C(n−c,G)/C(n,G)`` (``C(c,G)/C(n,G)`` is the unbiased estimator
  of ``p^G`` from ``c`` successes in ``n`` trials);
- the chance that a group's rewards differ at all (rows that train), the mean over every G-subset
  of the task's episodes;
- completion tokens as the rollout renders them (``trainers/trl/budgets.measure_budgets``: policy
  turns, observations, the closing EOS) against each candidate ``max_completion_length``;
- seconds per sampled episode (the eval stage's, ``--concurrency`` in flight).

Rules, fixed before the measurement (the script applies them and prints its choice):

- **group size** G in ``--groups`` (2, 4, 8): the most accuracy-informative groups per sampled
  episode (the mean over tasks of P_G, divided by G); a larger G within 10 % of the best wins (its
  baseline, the group mean, is estimated from more episodes);
- **groups per step** T in 1…4: the fewest for which a step holds at least one accuracy-informative
  group with probability ≥ 0.8 (``1 − (1 − P̄_G)^T``, tasks drawn independently);
- **max_completion_length** in ``--budgets``: the smallest that cuts at most 10 % of the measured
  episodes (``CUT_TARGET``; the turn cap counts as a cut too).

Output in ``--work`` (default: the sweep's folder, ``group-size/``): ``group_size.json`` and
``group_size.md`` (a RESULTS.md section).

Usage: ``python benchmarks/group_size.py [--sweep runs/sft-sweep] [--size all] [--tasks 32]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from math import comb
from pathlib import Path
from statistics import mean
from typing import Any, TypedDict

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from deepanalyze_env.core.contracts import JsonObject  # noqa: E402
from deepanalyze_env.generation.models import load_tokenizer  # noqa: E402
from deepanalyze_env.learn.commands import EvalCommand  # noqa: E402
from deepanalyze_env.learn.stages import Stages, eval_gap, model_inputs  # noqa: E402
from deepanalyze_env.learn.tasks import sample_tasks  # noqa: E402
from deepanalyze_env.offline.correct import is_correct  # noqa: E402
from deepanalyze_env.offline.eval_report import FAILED, ReportRecord, load_eval, per_task  # noqa: E402
from deepanalyze_env.trainers.trl.budgets import CUT_TARGET, measure_budgets  # noqa: E402
from deepanalyze_env.trainers.trl.sft_data import load_records  # noqa: E402

STEP_TARGET = 0.8  # a step holds an accuracy-informative group at least this often
TIE = 0.10  # a larger group within this fraction of the best per-episode rate wins


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sweep", default="runs/sft-sweep", help="benchmarks/sft_sweep.py's --work")
    p.add_argument("--size", default="all", help="which of the sweep's SFT models to sample")
    p.add_argument("--work", default=None, help="output folder (default: SWEEP/group-size)")
    p.add_argument("--tasks", type=int, default=32, help="held-out train tasks sampled (0: all)")
    p.add_argument("--samples", type=int, default=8, help="episodes per task (≥ the largest group)")
    p.add_argument("--temperature", type=float, default=0.7, help="GRPO's sampling temperature")
    p.add_argument("--max-tokens", type=int, default=160, help="GRPO's rollout.max_turn_tokens")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--groups", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--budgets", type=int, nargs="+", default=[768, 1024, 1280, 1536])
    p.add_argument("--seed", type=int, default=0, help="the task sample")
    args = p.parse_args(argv)
    if max(args.groups) > args.samples:
        p.error(f"--samples {args.samples} is below the largest group {max(args.groups)}")
    return args


def scored_reward(record: ReportRecord) -> float | None:
    """An episode's reward where the report counts it (scored, or a missing episode's -1)."""
    value = record.get("reward")
    return float(value) if record.get("reward_status") in FAILED and value is not None else None


def p_informative(n: int, c: int, g: int) -> float:
    """Unbiased estimate of 1 − p^g − (1 − p)^g from c successes in n draws (g ≤ n)."""
    return 1.0 - (comb(c, g) + comb(n - c, g)) / comb(n, g)


def p_reward_differs(rewards: list[float], g: int) -> float:
    """The share of g-subsets of a task's episodes whose rewards are not all equal."""
    subsets = list(itertools.combinations(rewards, g))
    return sum(1 for s in subsets if max(s) - min(s) > 1e-9) / len(subsets)


class GroupRow(TypedDict):
    group: int
    informative: float  # mean over tasks of P(accuracy-informative group)
    per_episode: float  # informative groups per sampled episode
    reward_differs: float  # mean over tasks of P(rewards not all equal)
    groups_per_step: int
    step_has_signal: float


def choose_group(rows: list[GroupRow]) -> GroupRow:
    best = max(r["per_episode"] for r in rows)
    return max((r for r in rows if r["per_episode"] >= (1 - TIE) * best), key=lambda r: r["group"])


def groups_per_step(informative: float) -> tuple[int, float]:
    for t in range(1, 5):
        chance = 1 - (1 - informative) ** t
        if chance >= STEP_TARGET:
            return t, chance
    return 4, 1 - (1 - informative) ** 4


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sweep = Path(args.sweep)
    work = Path(args.work) if args.work else sweep / "group-size"
    work.mkdir(parents=True, exist_ok=True)
    model = sweep / f"sft-{args.size}"
    config = sweep / "env.yaml"
    val = [json.loads(x) for x in (sweep / "tasks" / "val.jsonl").read_text().splitlines() if x.strip()]
    chosen: list[JsonObject] = sample_tasks(val, args.tasks, args.seed + 7) if args.tasks else val
    tasks = work / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in chosen))
    stages = Stages(work, fresh=False)
    folder = work / "sampled"
    command = EvalCommand(
        model=str(model),
        tasks=tasks,
        out=folder,
        config=config,
        samples=args.samples,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        concurrency=args.concurrency,
    )
    load = os.getloadavg()[0]
    stages.run(
        "sampled",
        f"{args.samples} episodes per held-out train task at temperature {args.temperature}",
        command,
        folder,
        [tasks, config, *model_inputs(str(model))],
        check=eval_gap,
    )
    by_task = per_task(load_eval(folder)[0])
    counts = {t: (len(rs), sum(is_correct(r) for r in rs)) for t, rs in by_task.items()}
    rewards = {t: [x for x in map(scored_reward, rs) if x is not None] for t, rs in by_task.items()}
    rows: list[GroupRow] = []
    for g in args.groups:
        informative = mean(p_informative(n, c, g) for n, c in counts.values() if n >= g)
        differs = [p_reward_differs(v, g) for v in rewards.values() if len(v) >= g]
        t, chance = groups_per_step(informative)
        rows.append(
            {
                "group": g,
                "informative": round(informative, 4),
                "per_episode": round(informative / g, 4),
                "reward_differs": round(mean(differs), 4) if differs else float("nan"),
                "groups_per_step": t,
                "step_has_signal": round(chance, 3),
            }
        )
    pick = choose_group(rows)
    tokenizer = load_tokenizer(str(model))
    episodes = load_records([folder])
    fits = [
        measure_budgets(
            tokenizer, episodes, max_completion_length=b, max_turn_tokens=args.max_tokens
        ).as_dict()
        for b in sorted(args.budgets)
    ]
    budget = next((f for f in fits if f["cut_fraction"] <= CUT_TARGET), fits[-1])
    correct = sum(c for _, c in counts.values())
    n_all = sum(n for n, _ in counts.values())
    seconds = stages.seconds["sampled"]
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs, "
        f"1-min load {load:.1f} at the start",
        "command": "python benchmarks/group_size.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": str(model),
        "tasks": len(counts),
        "samples": args.samples,
        "temperature": args.temperature,
        "episodes": n_all,
        "correct": correct,
        "tasks_with_correct": sum(1 for _, c in counts.values() if c),
        "tasks_all_correct": sum(1 for n, c in counts.values() if c == n),
        "seconds": seconds,
        "seconds_per_episode": round(seconds / n_all, 2) if n_all else None,
        "memory": stages.memory.get("sampled"),
        "groups": rows,
        "chosen": {"num_generations": pick["group"], "groups_per_step": pick["groups_per_step"]},
        "budgets": fits,
        "max_completion_length": budget["max_completion_length"],
    }
    (work / "group_size.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (work / "group_size.md").write_text(text)
    print(text)
    return 0


def markdown(r: dict[str, Any]) -> str:
    lines = [
        "### GRPO group size, groups per step and completion budget, `benchmarks/group_size.py` "
        f"(issue 41), {r['date']}",
        "",
        f"Machine: {r['machine']}. Command: `{r['command']}`. The sweep's SFT model `{r['model']}` sampled "
        f"{r['samples']} times per task at temperature {r['temperature']} on {r['tasks']} held-out "
        f"train tasks (never dev or test): {r['episodes']} episodes, {r['correct']} correct "
        f"({r['correct'] / max(1, r['episodes']):.3f}); {r['tasks_with_correct']} tasks with a correct "
        f"episode, {r['tasks_all_correct']} with all correct; {r['seconds']} s "
        f"({r['seconds_per_episode']} s an episode).",
        "",
        "| group size G | P(accuracy-informative group) | informative groups per episode | P(rewards differ) "
        "| groups per step for P(step has signal) ≥ 0.8 |",
        "|---|---|---|---|---|",
    ]
    for g in r["groups"]:
        lines.append(
            f"| {g['group']} | {g['informative']:.3f} | {g['per_episode']:.3f} | {g['reward_differs']:.3f} "
            f"| {g['groups_per_step']} ({g['step_has_signal']:.2f}) |"
        )
    lines += [
        "",
        "| max_completion_length | cut (turn or episode) | completion tokens p50 / p90 / max |",
        "|---|---|---|",
    ]
    for f in r["budgets"]:
        c = f["completion_tokens"]
        lines.append(
            f"| {f['max_completion_length']} | {f['cut']} of {f['episodes']} ({f['cut_fraction']:.1%}) "
            f"| {c['p50']} / {c['p90']} / {c['max']} |"
        )
    ch = r["chosen"]
    lines += [
        "",
        f"Chosen by the rules fixed before the run: `num_generations` {ch['num_generations']}, "
        f"{ch['groups_per_step']} groups a step (`gradient_accumulation_steps` "
        f"{ch['num_generations'] * ch['groups_per_step']}), "
        f"`max_completion_length` {r['max_completion_length']}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
