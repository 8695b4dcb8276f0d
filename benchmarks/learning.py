"""Learning benchmark: does SFT warm start + GRPO with this plugin improve a policy on held-out tasks?

Stages, each through the real command (``deepanalyze_env.cli.main``, in this process):

1. ``eval`` of the base model (the embedded SmolLM2-135M-Instruct) on the dev tasks;
2. ``rollout --policy scripted --labels good`` on the train tasks: the reference episodes,
   recorded through the env with the same env config as training (system prompt included);
3. ``train`` with ``recipes/trl_sft_cpu.yaml`` on those records → a model folder;
4. ``eval`` of the SFT model on the dev tasks;
5. ``train`` with ``recipes/trl_cpu_smoke.yaml`` (GRPO) starting from the SFT folder;
6. ``eval`` of the GRPO model on the dev tasks; then, once, on the test tasks if given.

Output: ``<work>/learning.json`` (settings, seconds per stage, each eval's overall metrics,
paired SFT→GRPO and base→SFT comparisons, GRPO per-step training rewards, targets met or not),
``<work>/learning.png`` (the curve) and ``<work>/learning.md`` (a RESULTS.md section).

Reward: without a judge on CPU, ``qa`` tasks are scored by their deterministic components
(``--judge-free-qa``, on by default): a method ``qa_nojudge`` = ``qa_accuracy`` (+ ``qa_exact`` at
weight 0) is registered in this process and the qa tasks are copied with that method. Pass
``--config ENV.yaml`` with a judge and ``--no-judge-free-qa`` to train on the full qa reward.

Until the task bank exists, train and dev default to the same shipped tasks (no held-out
split: the numbers then measure fitting, not generalisation); pass ``--train/--dev/--test``.

Usage: ``python benchmarks/learning.py [--work runs/learning] [--tiny]`` (``--tiny``: a
proof that every stage runs, not a measurement). The defaults are sized for about 90 minutes on
2 idle cores, from the stage times of the ``--tiny`` run (an SFT step on two ~1.5k-token
episodes is ~50 s of CPU; a policy token ~0.1 s): about 25 min of evals, 25 min of SFT and
30 min of GRPO. Reusing ``--work`` resumes the evals and the reference rollout; training reruns.
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from deepanalyze_env.cli import main as cli  # noqa: E402
from deepanalyze_env.core.profiles import PROFILES  # noqa: E402
from deepanalyze_env.core.records import load_run  # noqa: E402
from deepanalyze_env.offline.eval_report import compare_runs  # noqa: E402
from rewards import Method, register_method  # noqa: E402

log = logging.getLogger("benchmarks.learning")
SHIPPED = sorted(str(p) for p in (REPO / "data" / "tasks").glob("*.jsonl"))
JUDGE_FREE_QA = Method("qa_nojudge", ("qa_accuracy", "qa_exact"), weights={"qa_exact": 0.0})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="runs/learning", help="folder for every stage's output")
    p.add_argument("--train", nargs="+", default=SHIPPED, help="train task files")
    p.add_argument("--dev", nargs="+", default=SHIPPED, help="dev task files (evaluated after each stage)")
    p.add_argument("--test", nargs="*", default=[], help="test task files (evaluated once, at the end)")
    p.add_argument("--trajectories", nargs="+", default=[str(REPO / "data" / "trajectories.jsonl")])
    p.add_argument("--config", help="env_config YAML laid over the benchmark's (e.g. a judge)")
    p.add_argument("--no-judge-free-qa", dest="judge_free_qa", action="store_false")
    p.add_argument("--model", default="embedded:smollm2")
    p.add_argument("--samples", type=int, default=2, help="dev episodes per task (pass@k)")
    p.add_argument("--eval-temperature", type=float, default=1.0, help="the GRPO sampling temperature")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-turn-tokens", type=int, default=200)
    p.add_argument("--max-completion", type=int, default=1024, help="GRPO: tokens per whole episode")
    p.add_argument("--sft-steps", type=int, default=30)
    p.add_argument("--sft-lr", type=float, default=5e-5)
    p.add_argument("--grpo-steps", type=int, default=6)
    p.add_argument("--grpo-lr", type=float, default=2e-6)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=1, help="eval episodes in flight")
    p.add_argument(
        "--tiny", action="store_true", help="a few minutes: proves the stages run, measures nothing"
    )
    args = p.parse_args(argv)
    if args.tiny:
        args.samples, args.max_turns, args.max_turn_tokens, args.max_completion = 1, 2, 24, 96
        args.sft_steps, args.grpo_steps, args.num_generations = 3, 1, 2
    return args


def env_config(
    args: argparse.Namespace, work: Path, name: str = "env.yaml", max_turns: int | None = None
) -> Path:
    """One env config for every stage: what the policy sees in eval is what it trained on (the
    reference rollout only gets enough turns for the longest reference trajectory)."""
    config: dict[str, Any] = {
        "workspace_root": str(REPO / "data"),
        "system_prompt": "protocol",
        "max_turns": max_turns or args.max_turns,
        "executor": {"timeout_s": 10},
    }
    if args.config:
        config.update(yaml.safe_load(Path(args.config).read_text()) or {})
    path = work / name
    path.write_text(yaml.safe_dump(config))
    return path


def longest_trajectory(paths: list[str]) -> int:
    return max(
        len(json.loads(x)["turns"]) for p in paths for x in Path(p).read_text().splitlines() if x.strip()
    )


def task_files(paths: list[str], work: Path, name: str, judge_free_qa: bool) -> list[str]:
    """The task files, with qa tasks switched to the judge-free qa method when asked."""
    if not judge_free_qa:
        return list(paths)
    out = work / "tasks" / name
    out.mkdir(parents=True, exist_ok=True)
    copies = []
    for path in paths:
        lines = []
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            task = json.loads(line)
            if (task.get("reward_spec") or {}).get("method") == "qa":
                task["reward_spec"] = {**task["reward_spec"], "method": JUDGE_FREE_QA.name}
                task["method"] = JUDGE_FREE_QA.name
            if PROFILES["v1"].build_plan(task["reward_spec"]).needs_judge:
                log.warning("judge-free run: task %s needs a judge; left out", task.get("id"))
                continue
            lines.append(json.dumps(task, ensure_ascii=False))
        if lines:
            target = out / Path(path).name
            target.write_text("\n".join(lines) + "\n")
            copies.append(str(target))
    if not copies:
        raise SystemExit(f"no {name} task can be scored without a judge; pass --config with a judge")
    return copies


def run(argv: list[str], stage: str, timings: dict[str, float]) -> None:
    start = time.monotonic()
    code = cli(argv)
    timings[stage] = round(time.monotonic() - start, 1)
    if code not in (0, 1):  # eval returns 1 when some episodes did not finish: reported, not fatal
        raise SystemExit(f"stage {stage} failed with exit code {code}: {' '.join(argv)}")


def evaluate(
    args, model: str, tasks: list[str], out: Path, config: Path, stage: str, timings
) -> dict[str, Any]:
    argv = ["eval", "--model", model, "--tasks", *tasks, "--samples", str(args.samples), "--out", str(out)]
    argv += ["--config", str(config), "--max-tokens", str(args.max_turn_tokens)]
    argv += ["--temperature", str(args.eval_temperature), "--concurrency", str(args.concurrency)]
    if (out / "run.json").is_file():
        argv.append("--resume")
    run(argv, stage, timings)
    return json.loads((out / "report.json").read_text())["overall"]


def headline(overall: dict[str, Any]) -> dict[str, Any]:
    return {
        "reward_mean": overall["reward_mean"],
        "reward_ci95": overall["reward_ci95"],
        "format_gate_pass_rate": overall["format_gate_pass_rate"],
        "accuracy": overall["pass_at"]["1"]["value"],
        "episodes": overall["episodes"],
        "status_rates": overall["status_rates"],
    }


def plot(result: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    stages = list(result["dev"])
    x = list(range(len(stages)))
    for key, label in (
        ("reward_mean", "reward"),
        ("format_gate_pass_rate", "format gate"),
        ("accuracy", "accuracy"),
    ):
        values = [result["dev"][s][key] for s in stages]
        left.plot(x, [v if v is not None else float("nan") for v in values], marker="o", label=label)
    left.set_xticks(x, stages)
    left.set_ylim(-1.05, 1.05)
    left.set_title("dev set per stage")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    steps = result["grpo_steps"]
    if steps:
        xs = [s["step"] for s in steps]
        right.plot(xs, [s["reward_mean"] for s in steps], marker="o", linewidth=2, label="reward (trained)")
        for name in sorted({n for s in steps for n in s["components"]}):
            right.plot(xs, [s["components"].get(name) for s in steps], marker=".", alpha=0.8, label=name)
        right.legend(fontsize=8)
    right.set_title("GRPO training reward per step")
    right.set_xlabel("step")
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def markdown(result: dict[str, Any]) -> str:
    def f(v: Any) -> str:
        return "–" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    lines = [
        f"Machine: {result['machine']}; {result['date']}; settings: `{json.dumps(result['settings'])}`",
        "",
        "| stage | seconds | dev reward | 95% CI | format gate | accuracy (pass@1) |",
        "|---|---|---|---|---|---|",
    ]
    for stage, m in result["dev"].items():
        ci = f"{f(m['reward_ci95'][0])} … {f(m['reward_ci95'][1])}" if m["reward_ci95"] else "–"
        lines.append(
            f"| {stage} | {result['seconds'].get('eval_' + stage, '–')} | {f(m['reward_mean'])} "
            f"| {ci} | {f(m['format_gate_pass_rate'])} | {f(m['accuracy'])} |"
        )
    lines += ["", "Stage seconds: " + ", ".join(f"{k} {v}" for k, v in result["seconds"].items()), ""]
    for name, t in result["targets"].items():
        lines.append(f"- {name}: {'met' if t['met'] else 'MISSED'} ({t['value']})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.judge_free_qa:
        register_method(JUDGE_FREE_QA)
    config = env_config(args, work)
    train = task_files(args.train, work, "train", args.judge_free_qa)
    dev = task_files(args.dev, work, "dev", args.judge_free_qa)
    test = task_files(args.test, work, "test", args.judge_free_qa) if args.test else []
    timings: dict[str, float] = {}
    dev_results: dict[str, dict[str, Any]] = {}
    env = yaml.safe_load(config.read_text())
    start = time.monotonic()

    dev_results["base"] = headline(
        evaluate(args, args.model, dev, work / "eval-base", config, "eval_base", timings)
    )

    reference = work / "reference"
    argv = ["rollout", "--policy", "scripted", "--labels", "good", "--trajectories", *args.trajectories]
    turns = max(args.max_turns, longest_trajectory(args.trajectories))
    reference_config = env_config(args, work, "env-reference.yaml", turns)
    argv += ["--tasks", *train, "--config", str(reference_config), "--out", str(reference)]
    argv += ["--keep", 'reward_status in ["scored", "verifier_error"] and format_ok']
    if (reference / "run.json").is_file():
        argv.append("--resume")
    run(argv, "reference_rollout", timings)

    sft_dir = work / "sft"
    argv = [
        "train",
        str(REPO / "recipes" / "trl_sft_cpu.yaml"),
        f"output_dir={sft_dir}",
        f"model={args.model}",
    ]
    argv += [
        f"data=[{reference / 'kept.jsonl'}]",
        f"max_steps={args.sft_steps}",
        f"trl.learning_rate={args.sft_lr}",
    ]
    run(argv, "sft", timings)
    dev_results["sft"] = headline(
        evaluate(args, str(sft_dir), dev, work / "eval-sft", config, "eval_sft", timings)
    )

    grpo_dir = work / "grpo"
    argv = [
        "train",
        str(REPO / "recipes" / "trl_cpu_smoke.yaml"),
        f"output_dir={grpo_dir}",
        f"model={sft_dir}",
    ]
    argv += [
        f"data=[{', '.join(train)}]",
        f"max_steps={args.grpo_steps}",
        f"trl.learning_rate={args.grpo_lr}",
    ]
    argv += [f"env={json.dumps(env)}", f"rollout.max_turn_tokens={args.max_turn_tokens}"]
    argv += [
        f"trl.max_completion_length={args.max_completion}",
        f"trl.num_generations={args.num_generations}",
    ]
    argv += [f"trl.per_device_train_batch_size={args.num_generations}"]
    run(argv, "grpo", timings)
    dev_results["grpo"] = headline(
        evaluate(args, str(grpo_dir), dev, work / "eval-grpo", config, "eval_grpo", timings)
    )
    test_result = None
    if test:
        test_result = headline(
            evaluate(args, str(grpo_dir), test, work / "eval-test", config, "eval_test", timings)
        )

    runs = {name: load_run(work / f"eval-{name}").records for name in ("base", "sft", "grpo")}
    sft_vs_grpo = compare_runs(runs["sft"], runs["grpo"])["metrics"]
    base_vs_sft = compare_runs(runs["base"], runs["sft"])["metrics"]
    metrics_path = grpo_dir / "metrics.jsonl"
    steps = (
        [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
        if metrics_path.is_file()
        else []
    )
    diff = sft_vs_grpo["reward"]
    targets = {
        "dev format gate after SFT >= 0.8": {
            "value": dev_results["sft"]["format_gate_pass_rate"],
            "met": (dev_results["sft"]["format_gate_pass_rate"] or 0) >= 0.8,
        },
        "dev accuracy after SFT >= 0.25": {
            "value": dev_results["sft"]["accuracy"],
            "met": (dev_results["sft"]["accuracy"] or 0) >= 0.25,
        },
        "GRPO beats SFT on dev reward, paired 95% CI above 0": {
            "value": {"mean_diff": diff["mean_diff"], "ci95": diff["diff_ci95"]},
            "met": bool(diff["diff_ci95"] and diff["diff_ci95"][0] > 0),
        },
    }
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the end",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": {k: v for k, v in vars(args).items() if k not in ("train", "dev", "test", "trajectories")}
        | {"train": train, "dev": dev, "test": test},  # the files used (judge-free copies when so)
        "seconds": timings | {"total": round(time.monotonic() - start, 1)},
        "dev": dev_results,
        "test": test_result,
        "sft_vs_grpo": sft_vs_grpo,
        "base_vs_sft": base_vs_sft,
        "grpo_steps": [
            {"step": s["step"], "reward_mean": s["reward_mean"], "components": s["components"]} for s in steps
        ],
        "targets": targets,
    }
    (work / "learning.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, work / "learning.png")
    (work / "learning.md").write_text(markdown(result))
    print(markdown(result))
    print(f"written: {work / 'learning.json'}, {work / 'learning.png'}, {work / 'learning.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
