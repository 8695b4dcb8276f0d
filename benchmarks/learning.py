"""Learning benchmark: does SFT warm start + GRPO with this plugin improve a policy on held-out tasks?

It runs the ``deepanalyze-rl learn`` pipeline (``deepanalyze_env/learn/``; the README's main job is the same
pipeline at a smaller size) over the whole task bank with the embedded SmolLM2-135M-Instruct on
CPU: dev eval of the base model → SFT on the train tasks' reference episodes → dev eval → GRPO
from the SFT model on the train tasks → dev eval → the test split, once. Train, dev and test
tasks come from tables of their own (the bank splits by table); tasks that need a judge (the
open-research reports) are left out, so every reward is deterministic.

Output in ``--work``: the pipeline's folders and ``learn.json``, plus ``learning.json`` (the
settings, the targets met or missed) and ``learning.md`` (a RESULTS.md section).

Targets (issue 14): dev format-gate pass rate ≥ 0.8 after SFT, dev accuracy ≥ 0.25 after SFT,
GRPO above SFT on dev reward with the paired 95 % interval above 0. One configuration, chosen
before the run and not tuned on dev.

Usage: ``python benchmarks/learning.py [--work runs/learning] [--tiny]`` (``--tiny``: a few
minutes, proves the stages run, measures nothing). Reusing ``--work`` reuses finished stages.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from deepanalyze_env.learn import Pipeline, markdown, run_pipeline  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="runs/learning", help="the pipeline's output folder")
    p.add_argument("--model", default="embedded:smollm2")
    p.add_argument("--train", type=int, default=240, help="train tasks (reference episodes and GRPO)")
    p.add_argument("--dev", type=int, default=24, help="dev tasks (evaluated after each stage)")
    p.add_argument("--test", type=int, default=24, help="test tasks (evaluated once, at the end)")
    p.add_argument("--samples", type=int, default=1, help="eval episodes per task")
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--max-turn-tokens", type=int, default=160)
    p.add_argument("--sft-steps", type=int, default=30)
    p.add_argument("--sft-lr", type=float, default=2e-4)
    p.add_argument("--grpo-steps", type=int, default=5)
    p.add_argument("--grpo-lr", type=float, default=2e-5)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--tasks-per-step", type=int, default=2, help="GRPO groups per step")
    p.add_argument("--fresh", action="store_true", help="rerun every stage")
    p.add_argument("--tiny", action="store_true", help="a few minutes: proves the stages run")
    args = p.parse_args(argv)
    if args.tiny:
        args.train, args.dev, args.test, args.max_turn_tokens = 8, 2, 1, 32
        args.sft_steps, args.grpo_steps, args.num_generations, args.tasks_per_step = 2, 1, 2, 1
    return args


def pipeline(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "output_dir": args.work,
        "model": args.model,
        "bank": {},  # the whole bank (built once into the cache)
        "tasks": {"train": args.train, "dev": args.dev, "test": args.test},
        "seed": 0,
        "env": {"system_prompt": "protocol", "max_turns": args.max_turns, "executor": {"timeout_s": 10}},
        "eval": {
            "samples": args.samples,
            "max_tokens": args.max_turn_tokens,
            "temperature": 0.0,
            "concurrency": 8,  # one batched generate per round (the 2026-12-03 run used 2, unbatched)
        },
        "sft": {
            "recipe": str(REPO / "recipes" / "trl_sft_cpu.yaml"),
            "set": {"max_steps": args.sft_steps, "trl.learning_rate": args.sft_lr},
        },
        "grpo": {
            "recipe": str(REPO / "recipes" / "trl_cpu_smoke.yaml"),
            "set": {
                "max_steps": args.grpo_steps,
                "rollout.max_turn_tokens": args.max_turn_tokens,
                "trl.max_completion_length": args.max_turns * args.max_turn_tokens,
                "trl.num_generations": args.num_generations,
                # the recipe's micro-batch 1, accumulated to the step's episodes
                "trl.gradient_accumulation_steps": args.num_generations * args.tasks_per_step,
                "trl.learning_rate": args.grpo_lr,
            },
        },
    }


def targets(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The issue's targets, read from figures over every planned episode (``learn`` counts one
    that did not finish as a failed gate). A paired target is not met when some task had no
    partner or the stages cover different tasks: its interval would be over the survivors."""
    sft = summary["dev"].get("sft", {})
    pair = summary["comparisons"].get("sft->grpo", {})
    diff = pair.get("reward", {})
    paired = (
        (summary.get("coverage") or {}).get("same_tasks", False)
        and not pair.get("only_in_a")
        and not pair.get("only_in_b")
    )
    return {
        "dev format gate after SFT >= 0.8": {
            "value": sft.get("format_gate_pass_rate"),
            "met": (sft.get("format_gate_pass_rate") or 0) >= 0.8,
        },
        "dev accuracy after SFT >= 0.25": {
            "value": sft.get("accuracy"),
            "met": (sft.get("accuracy") or 0) >= 0.25,
        },
        "GRPO beats SFT on dev reward, paired 95% CI above 0": {
            "value": {
                "mean_diff": diff.get("mean_diff"),
                "ci95": diff.get("diff_ci95"),
                "tasks": diff.get("tasks"),
                "all_tasks_paired": paired,
            },
            "met": bool(paired and diff.get("diff_ci95") and diff["diff_ci95"][0] > 0),
        },
    }


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "pipeline.yaml"
    spec.write_text(yaml.safe_dump(pipeline(args), sort_keys=False))
    load = [os.getloadavg()[0]]
    summary = run_pipeline(Pipeline.load(spec), fresh=args.fresh)
    load.append(os.getloadavg()[0])
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs; 1-min load {load[0]:.1f} at the start, "
        f"{load[1]:.1f} at the end",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": vars(args),
        "summary": summary,
        "targets": targets(summary),
    }
    (work / "learning.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"Machine: {result['machine']}; {result['date']}", "", markdown(summary)]
    if summary.get("test"):
        t = summary["test"]
        lines.append(
            f"Test split (once, last model): reward {t['reward_mean']}, format gate "
            f"{t['format_gate_pass_rate']}, accuracy {t['accuracy']} ({t['finished']} of "
            f"{t['planned']} planned episodes finished; a missing one counts as a failed gate)\n"
        )
    for name, t in result["targets"].items():
        lines.append(f"- {name}: {'met' if t['met'] else 'MISSED'} ({t['value']})")
    (work / "learning.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
