"""GRPO benchmark: does GRPO with this plugin improve an SFT policy on held-out tasks?

Issue 27's benchmark. It runs the ``deepanalyze-rl learn`` pipeline from an SFT checkpoint made
in the same run (the starting model is not evaluated: the question is SFT → GRPO), with the
embedded SmolLM2-135M-Instruct on CPU:

    task bank slice → reference episodes → SFT → dev eval (greedy, pass@1)
    → dev eval of the SFT model, k sampled episodes per task at GRPO's temperature (pass@k:
      what GRPO's groups can find, so the pass@1 it can sharpen towards)
    → success estimate on GRPO's train tasks (seeds the success-rate curriculum)
    → GRPO (≥ 40 steps; budget check first) → dev eval (greedy) → the test split, once.

Train, dev and test tasks come from tables of their own (the bank splits by table); every
reward is deterministic (no judge). The configuration is fixed before the run and written into
benchmarks/RESULTS.md first; nothing is tuned on dev or test.

Output in ``--work``: the pipeline's folders, ``learn.json``/``learn.png``, plus ``grpo.json``
(settings, figures, targets met or missed) and ``grpo.md`` (a RESULTS.md section).

Targets (issue 27): GRPO beats SFT on dev accuracy with the paired 95 % interval's lower bound
above 0; zero-variance groups ≤ 30 %; length-cut GRPO episodes ≤ 10 %; whole run ≤ 120 min.

Usage: ``python benchmarks/grpo.py [--work runs/grpo-bench] [--tiny]`` (``--tiny``: a few
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
    p.add_argument("--work", default="runs/grpo-bench", help="the pipeline's output folder")
    p.add_argument("--model", default="embedded:smollm2")
    p.add_argument("--families", nargs="+", default=["describe_stat", "filter_count"])
    p.add_argument("--train", type=int, default=120, help="train tasks (SFT references; GRPO's pool)")
    p.add_argument("--dev", type=int, default=48, help="dev tasks (tables train never uses)")
    p.add_argument("--test", type=int, default=24, help="test tasks (evaluated once, at the end)")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-turn-tokens", type=int, default=160)
    p.add_argument("--episode-tokens", type=int, default=768, help="GRPO's episode budget")
    p.add_argument("--sft-steps", type=int, default=16)
    p.add_argument("--sft-lr", type=float, default=2e-4)
    p.add_argument("--pass-k", type=int, default=4, help="sampled SFT episodes per dev task")
    p.add_argument("--estimate-tasks", type=int, default=16, help="train tasks GRPO draws from")
    p.add_argument("--estimate-samples", type=int, default=2)
    p.add_argument("--grpo-steps", type=int, default=40)
    p.add_argument("--grpo-lr", type=float, default=1e-5)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--groups-per-step", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.7, help="GRPO's sampling temperature")
    p.add_argument("--concurrency", type=int, default=16, help="eval episodes in flight")
    p.add_argument("--fresh", action="store_true", help="rerun every stage")
    p.add_argument("--tiny", action="store_true", help="a few minutes: proves the stages run")
    args = p.parse_args(argv)
    if args.tiny:
        args.train, args.dev, args.test, args.max_turn_tokens = 8, 2, 1, 32
        args.sft_steps, args.grpo_steps, args.num_generations, args.pass_k = 1, 1, 2, 2
        args.estimate_tasks, args.estimate_samples, args.episode_tokens = 2, 1, 256
    return args


def pipeline(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "output_dir": args.work,
        "model": args.model,
        "bank": {"families": list(args.families)},
        "tasks": {"train": args.train, "dev": args.dev, "test": args.test},
        "seed": 0,
        "env": {
            "system_prompt": "protocol",
            "max_turns": args.max_turns,
            "executor": {"timeout_s": 10, "max_output_chars": 1500},
        },
        "eval": {
            "samples": 1,
            "max_tokens": args.max_turn_tokens,
            "temperature": 0.0,
            "concurrency": args.concurrency,
            "before": False,
            "after_sft": True,
            "sampled_k": args.pass_k,
        },
        "sft": {
            "recipe": str(REPO / "recipes" / "trl_sft_cpu.yaml"),
            "set": {"max_steps": args.sft_steps, "trl.learning_rate": args.sft_lr},
        },
        "curriculum": {
            "tasks": args.estimate_tasks,
            "samples": args.estimate_samples,
            # success = passed the format gate: a 135M model's accuracy on unseen tables is near 0,
            # so an accuracy-based estimate would call every task hopeless
            "set": {"accuracy_components": [], "success_threshold": -0.5},
        },
        "grpo": {
            "recipe": str(REPO / "recipes" / "trl_cpu_smoke.yaml"),
            "set": {
                "max_steps": args.grpo_steps,
                "rollout.max_turn_tokens": args.max_turn_tokens,
                "trl.max_completion_length": args.episode_tokens,
                "trl.num_generations": args.num_generations,
                # the recipe's micro-batch 1, accumulated to the step's episodes
                "trl.gradient_accumulation_steps": args.num_generations * args.groups_per_step,
                "trl.temperature": args.temperature,
                "trl.learning_rate": args.grpo_lr,
            },
        },
    }


def step_counts(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """What GRPO's steps could teach: groups without variance, length-cut episodes, steps with a
    zero loss (from ``metrics.jsonl``'s ``teach`` sections). ``episodes`` counts the trained ones;
    the length-cut fraction is over every episode (trained + cut)."""
    teach = [s.get("teach") or {} for s in steps]
    groups = sum(t.get("groups", 0) for t in teach)
    zero = sum(t.get("zero_variance_groups", 0) for t in teach)
    trained = sum(t.get("episodes_trained", 0) for t in teach)
    cut = sum(t.get("length_cut", 0) for t in teach)
    return {
        "steps": len(steps),
        "groups": groups,
        "zero_variance_groups": zero,
        "zero_variance_fraction": zero / groups if groups else None,
        "episodes": trained,
        "length_cut": cut,
        # of every GRPO episode (a cut one is not trained: trained + cut is the step's episodes)
        "length_cut_fraction": cut / (trained + cut) if trained + cut else None,
        "steps_with_nonzero_loss": sum(1 for t in teach if t.get("loss_nonzero")),
        "step_seconds_mean": (
            sum((s.get("time") or {}).get("step_s", 0.0) for s in steps) / len(steps) if steps else None
        ),
    }


def targets(summary: dict[str, Any], counts: dict[str, Any], minutes: float) -> dict[str, dict[str, Any]]:
    """The issue's targets, read from figures over every planned episode (one that did not finish
    counts as a failed gate). A paired target is not met when some task had no partner."""
    pair = summary["comparisons"].get("sft->grpo", {})
    paired = not pair.get("only_in_a") and not pair.get("only_in_b")
    acc = pair.get("pass@1", {})
    zero, cut = counts["zero_variance_fraction"], counts["length_cut_fraction"]
    return {
        "GRPO beats SFT on dev accuracy (pass@1), paired 95% CI lower bound above 0": {
            "value": {k: acc.get(k) for k in ("mean_diff", "diff_ci95", "tasks", "b_better", "a_better")},
            "met": bool(paired and acc.get("diff_ci95") and acc["diff_ci95"][0] > 0),
        },
        "zero-variance groups <= 30%": {"value": zero, "met": zero is not None and zero <= 0.30},
        "length-cut GRPO episodes <= 10%": {"value": cut, "met": cut is not None and cut <= 0.10},
        "whole run <= 120 min": {"value": round(minutes, 1), "met": minutes <= 120},
    }


def report_lines(result: dict[str, Any]) -> list[str]:
    summary, counts = result["summary"], result["grpo"]
    lines = [f"Machine: {result['machine']}; {result['date']}", "", markdown(summary)]
    sampled = summary.get("sampled")
    if sampled:
        k, at = sampled["k"], sampled["pass_at"]
        lines.append(
            f"SFT model, {sampled['k']} episodes per dev task at temperature {sampled['temperature']}: "
            f"pass@1 {at.get('1')}, pass@{k} {at.get(str(k))}, "
            f"format gate {sampled['format_gate_pass_rate']}, reward {sampled['reward_mean']}\n"
        )
    lines.append(
        f"GRPO: {counts['steps']} steps, {counts['groups']} groups ({counts['zero_variance_groups']} without "
        f"variance), {counts['episodes']} episodes trained ({counts['length_cut']} length-cut), "
        f"{counts['steps_with_nonzero_loss']} steps with a non-zero loss, "
        f"{counts['step_seconds_mean']} s a step\n"
    )
    rewards = [s.get("reward_mean") for s in summary.get("grpo_steps", [])]
    curve = ", ".join("–" if r is None else f"{r:.2f}" for r in rewards)
    lines.append(f"GRPO reward per step: {curve}\n")
    if summary.get("test"):
        t = summary["test"]
        lines.append(
            f"Test split (once, GRPO model): reward {t['reward_mean']}, format gate "
            f"{t['format_gate_pass_rate']}, accuracy {t['accuracy']} ({t['finished']} of "
            f"{t['planned']} planned episodes finished; a missing one counts as a failed gate)\n"
        )
    for name, t in result["targets"].items():
        lines.append(f"- {name}: {'met' if t['met'] else 'MISSED'} ({t['value']})")
    return lines


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "pipeline.yaml"
    spec.write_text(yaml.safe_dump(pipeline(args), sort_keys=False))
    load, start = [os.getloadavg()[0]], time.monotonic()
    summary = run_pipeline(Pipeline.load(spec), fresh=args.fresh)
    minutes = (time.monotonic() - start) / 60
    load.append(os.getloadavg()[0])
    counts = step_counts(summary.get("grpo_steps") or [])
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs; 1-min load {load[0]:.1f} at the start, "
        f"{load[1]:.1f} at the end",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "minutes": round(minutes, 1),
        "settings": vars(args),
        "summary": summary,
        "grpo": counts,
        "targets": targets(summary, counts, minutes),
    }
    (work / "grpo.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = report_lines(result)
    (work / "grpo.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
