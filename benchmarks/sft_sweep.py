"""SFT data-size sweep: what do more reference episodes buy the SFT policy? (issue 41)

For each size (32, 96 and every reference, one epoch each) the embedded SmolLM2-135M-Instruct is
fine-tuned from the base model on that many reference episodes of the chosen families (a
seeded, family-stratified sample; the sizes are nested: the 32 are among the 96), then evaluated
greedily on **train-split validation tasks only**: the train tasks of a few train tables held
out of SFT (seeded). Dev and test are never read, so a setting chosen from this sweep is chosen
on train. Each size reuses the ``learn`` pipeline's pieces: ``bank build``, the reference
rollout through the env (``max_turns`` 3, as the policy is evaluated), ``sample_references``
(``sft.references``), ``train`` of ``recipes/trl_sft_cpu.yaml`` and ``eval``, each a stage in
its own process (reused on a rerun with the same arguments and inputs, ``stages.json``).

Reported per size: accuracy (pass@1, a missing episode counts as wrong) and format-gate pass
rate, overall, per family and per difficulty level, with Wilson 95 % intervals (one greedy
episode per task: independent pass/fail per task); SFT steps, seconds a step and per episode,
eval seconds per episode, stage memory peaks.

Output in ``--work``: the stages' folders, ``sft_sweep.json`` and ``sft_sweep.md`` (a
RESULTS.md section).

Usage: ``python benchmarks/sft_sweep.py [--work runs/sft-sweep] [--tiny]`` (``--tiny``: a few
minutes on 2 cores, sizes 2 / 4 / all of 6 references and 2 validation tasks: proves the stages
run and measures the per-step and per-episode times an estimate of the full sweep needs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import TypedDict

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from deepanalyze_env.core.contracts import JsonObject  # noqa: E402
from deepanalyze_env.learn.commands import BankCommand, EvalCommand, RolloutCommand, TrainCommand  # noqa: E402
from deepanalyze_env.learn.run import SFT_SAMPLE_SEED, sample_references  # noqa: E402
from deepanalyze_env.learn.settings import BankSlice  # noqa: E402
from deepanalyze_env.learn.stages import Stages, eval_gap, model_inputs, rollout_gap  # noqa: E402
from deepanalyze_env.learn.tasks import bank_folder, needs_judge, sample_tasks  # noqa: E402
from deepanalyze_env.offline.eval_report import read_report  # noqa: E402
from deepanalyze_env.offline.eval_schema import Summary  # noqa: E402

RECIPE = REPO / "recipes" / "trl_sft_cpu.yaml"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="runs/sft-sweep", help="the stages' output folder")
    p.add_argument("--model", default="embedded:smollm2")
    p.add_argument("--families", nargs="+", default=["describe_stat", "filter_count"])
    p.add_argument("--sizes", nargs="+", default=["32", "96", "all"], help="references per SFT run")
    p.add_argument("--val-tables", type=int, default=4, help="train tables held out of SFT for validation")
    p.add_argument("--fit-tasks", type=int, default=0, help="cap on the SFT pool's tasks (0: all)")
    p.add_argument("--val-tasks", type=int, default=0, help="cap on the validation tasks (0: all)")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-turn-tokens", type=int, default=160)
    p.add_argument("--sft-lr", type=float, default=2e-4, help="the main job's and the GRPO benchmark's")
    p.add_argument("--concurrency", type=int, default=16, help="eval episodes in flight")
    p.add_argument("--seed", type=int, default=0, help="held-out tables, task caps, reference samples")
    p.add_argument("--fresh", action="store_true", help="rerun every stage")
    p.add_argument("--tiny", action="store_true", help="a few minutes: proves the stages run")
    args = p.parse_args(argv)
    if args.tiny:
        args.sizes, args.val_tables, args.fit_tasks, args.val_tasks = ["2", "4", "all"], 1, 6, 2
    for size in args.sizes:
        if size != "all" and not (size.isdigit() and int(size) > 0):
            p.error(f"--sizes: {size!r} is neither a positive count nor 'all'")
    return args


def rows(path: Path) -> list[JsonObject]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def write_rows(path: Path, items: list[JsonObject]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in items), encoding="utf-8")
    return path


def split_train(
    train: list[JsonObject], val_tables: int, seed: int
) -> tuple[list[JsonObject], list[JsonObject], list[str]]:
    """(SFT pool, validation tasks, the held-out tables): ``val_tables`` train tables, drawn with
    ``seed``, whose tasks SFT never sees (the bank splits by table; so does this)."""
    tables = sorted({str(t["tables"][0]) for t in train})
    if not 0 < val_tables < len(tables):
        raise SystemExit(
            f"--val-tables must be between 1 and {len(tables) - 1} (train has {len(tables)} tables)"
        )
    held = sorted(random.Random(seed).sample(tables, val_tables))
    fit = [t for t in train if t["tables"][0] not in held]
    val = [t for t in train if t["tables"][0] in held]
    return fit, val, held


def wilson(successes: int, n: int) -> tuple[float, float] | None:
    """The Wilson score 95 % interval of a proportion (None without trials)."""
    if n == 0:
        return None
    z, p = 1.959964, successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (round(max(0.0, centre - half), 3), round(min(1.0, centre + half), 3))


class Figures(TypedDict):
    """One group's greedy eval figures: accuracy and gate as counts over its tasks, with intervals."""

    tasks: int
    correct: int
    accuracy: float | None
    accuracy_ci95: tuple[float, float] | None
    gate_passed: int
    format_gate: float | None
    format_gate_ci95: tuple[float, float] | None


def figures(s: Summary) -> Figures:
    """A report group's figures over every planned task: a missing episode is a wrong answer and a
    failed gate (one greedy episode per task)."""
    tasks = s["tasks"]
    at1 = s["pass_at"].get("1") or {"value": None, "tasks": 0}
    correct = round((at1["value"] or 0.0) * at1["tasks"])
    gate = round((s["format_gate_pass_rate"] or 0.0) * s["episodes"])
    return {
        "tasks": tasks,
        "correct": correct,
        "accuracy": round(correct / tasks, 3) if tasks else None,
        "accuracy_ci95": wilson(correct, tasks),
        "gate_passed": gate,
        "format_gate": round(gate / s["episodes"], 3) if s["episodes"] else None,
        "format_gate_ci95": wilson(gate, s["episodes"]),
    }


class SizeResult(TypedDict):
    """One SFT run of the sweep and its validation eval."""

    size: str
    references: int
    sft_steps: int
    sft_seconds: float | None
    sft_seconds_per_step: float | None
    sft_seconds_per_episode: float | None
    policy_tokens: int | None
    eval_seconds: float | None
    eval_seconds_per_episode: float | None
    memory_gib: dict[str, float | None]
    overall: Figures
    family: dict[str, Figures]
    difficulty: dict[str, Figures]


def sft_steps(folder: Path) -> tuple[int, float | None]:
    """(steps, seconds from the first to the last logged step's end): the training loop's own time,
    without loading the model (the stage's seconds include it)."""
    path = folder / "metrics.jsonl"
    lines = rows(path) if path.is_file() else []
    return len(lines), (float(lines[-1]["elapsed_seconds"]) if lines else None)


def peak_gib(stages: Stages, name: str) -> float | None:
    peak = stages.memory.get(name)
    return round(peak["peak_pss_bytes"] / 2**30, 2) if peak else None


def run_size(
    args: argparse.Namespace, stages: Stages, size: str, kept: Path, fit: Path, val: Path, config: Path
) -> SizeResult:
    work = Path(args.work)
    n = None if size == "all" else int(size)
    data = sample_references(kept, fit, n, args.seed + SFT_SAMPLE_SEED, work / f"references-{size}.jsonl")
    references = len(rows(data))
    sft_dir = work / f"sft-{size}"
    train = TrainCommand(
        str(RECIPE), sft_dir, args.model, data, overrides=(f"trl.learning_rate={args.sft_lr}",)
    )
    stages.run(
        f"sft_{size}",
        f"SFT on {references} references, one epoch",
        train,
        sft_dir,
        [RECIPE, data, *model_inputs(args.model)],
    )
    folder = work / f"eval-{size}"
    command = EvalCommand(
        model=str(sft_dir),
        tasks=val,
        out=folder,
        config=config,
        samples=1,
        max_tokens=args.max_turn_tokens,
        temperature=0.0,
        concurrency=args.concurrency,
    )
    title = f"train-split validation eval (greedy) of the {size}-reference SFT model"
    stages.run(
        f"eval_{size}", title, command, folder, [val, config, *model_inputs(str(sft_dir))], check=eval_gap
    )
    report = read_report(folder)
    steps, loop_s = sft_steps(sft_dir)
    info = json.loads((sft_dir / "sft_data.json").read_text())
    sft_s, eval_s = stages.seconds.get(f"sft_{size}"), stages.seconds.get(f"eval_{size}")
    episodes = report["overall"]["episodes"]
    return {
        "size": size,
        "references": references,
        "sft_steps": steps,
        "sft_seconds": sft_s,
        "sft_seconds_per_step": round(loop_s / steps, 2) if loop_s and steps else None,
        "sft_seconds_per_episode": round(loop_s / references, 2) if loop_s and references else None,
        "policy_tokens": info.get("policy_tokens"),
        "eval_seconds": eval_s,
        "eval_seconds_per_episode": round(eval_s / episodes, 2) if eval_s and episodes else None,
        "memory_gib": {"sft": peak_gib(stages, f"sft_{size}"), "eval": peak_gib(stages, f"eval_{size}")},
        "overall": figures(report["overall"]),
        "family": {k: figures(v) for k, v in report["breakdowns"].get("family", {}).items()},
        "difficulty": {k: figures(v) for k, v in report["breakdowns"].get("difficulty", {}).items()},
    }


def cell(f: Figures) -> str:
    """``accuracy (k/n) [lo … hi]; gate …`` for one table cell."""

    def one(value: float | None, count: int, n: int, ci: tuple[float, float] | None) -> str:
        if value is None or ci is None:
            return "–"
        return f"{value:.3f} ({count}/{n}) [{ci[0]:.2f} … {ci[1]:.2f}]"

    return (
        one(f["accuracy"], f["correct"], f["tasks"], f["accuracy_ci95"])
        + " · "
        + one(f["format_gate"], f["gate_passed"], f["tasks"], f["format_gate_ci95"])
    )


class SweepResult(TypedDict):
    """``sft_sweep.json``: the settings, the split and every size's figures."""

    date: str
    machine: str
    command: str
    model: str
    families: list[str]
    val_tables: list[str]
    val_tasks: int
    fit_tasks: int
    references_passed: int
    max_turns: int
    max_turn_tokens: int
    sft_lr: float
    reference_seconds: float | None
    minutes: float
    sizes: list[SizeResult]


def markdown(r: SweepResult) -> str:
    sizes = r["sizes"]
    lines = [
        f"### SFT data-size sweep, `benchmarks/sft_sweep.py` (issue 41), {r['date']}",
        "",
        f"Machine: {r['machine']}. Command: `{r['command']}`. Families: {', '.join(r['families'])}; "
        f"validation: the {r['val_tasks']} train tasks of the held-out train tables "
        f"{', '.join(r['val_tables'])} (never dev or test); SFT pool: {r['fit_tasks']} train tasks "
        f"of the other train tables, {r['references_passed']} references passed at max_turns "
        f"{r['max_turns']}. Each size: SFT from {r['model']} (`recipes/trl_sft_cpu.yaml`, one epoch, "
        f"lr {r['sft_lr']}), then one greedy episode per validation task "
        f"({r['max_turn_tokens']} tokens a turn).",
        "",
        "Cells: accuracy (pass@1; correct/tasks) [Wilson 95 %] · format gate (passed/tasks) [Wilson 95 %]; "
        "a missing episode is wrong and fails the gate.",
        "",
    ]
    groups = ["overall", *(f"family={k}" for k in sizes[0]["family"])]
    groups += [f"difficulty={k}" for k in sizes[0]["difficulty"]]
    lines.append("| references | " + " | ".join(groups) + " |")
    lines.append("|---" * (len(groups) + 1) + "|")
    for s in sizes:
        figs = [s["overall"], *s["family"].values(), *s["difficulty"].values()]
        lines.append(f"| {s['size']} ({s['references']}) | " + " | ".join(cell(f) for f in figs) + " |")
    lines += [
        "",
        "| references | SFT steps | SFT stage s | s/step | s/episode | policy tokens | eval s "
        "| eval s/episode | peak PSS GiB (SFT / eval) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in sizes:
        mem = s["memory_gib"]
        lines.append(
            f"| {s['references']} | {s['sft_steps']} | {s['sft_seconds']} | {s['sft_seconds_per_step']} | "
            f"{s['sft_seconds_per_episode']} | {s['policy_tokens']} | {s['eval_seconds']} | "
            f"{s['eval_seconds_per_episode']} | {mem['sft']} / {mem['eval']} |"
        )
    lines += ["", f"Whole sweep: {r['minutes']} min (reference rollout {r['reference_seconds']} s)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    stages = Stages(work, args.fresh)
    bank = bank_folder(BankSlice(families=tuple(args.families)))
    if not (bank / "manifest.json").is_file():
        stages.run("bank", "task bank (built once, then cached)", BankCommand(bank, tuple(args.families)))
    train = [t for t in rows(bank / "tasks" / "train.jsonl") if not needs_judge(t)]
    fit_rows, val_rows, held = split_train(train, args.val_tables, args.seed)
    if args.fit_tasks:
        fit_rows = sample_tasks(fit_rows, args.fit_tasks, args.seed)
    if args.val_tasks:
        val_rows = sample_tasks(val_rows, args.val_tasks, args.seed + 1)
    fit, val = (
        write_rows(work / "tasks" / "fit.jsonl", fit_rows),
        write_rows(work / "tasks" / "val.jsonl", val_rows),
    )
    env = {
        "workspace_root": str(bank),
        "system_prompt": "protocol",
        "max_turns": args.max_turns,
        "executor": {"timeout_s": 10, "max_output_chars": 1500},
    }
    config = work / "env.yaml"
    config.write_text(yaml.safe_dump(env))
    trajectories = bank / "trajectories.jsonl"
    reference = work / "reference"
    stages.run(
        "reference",
        "SFT pool: the held-in train tasks' reference episodes through the env",
        RolloutCommand(trajectories, fit, config, reference),
        reference,
        [fit, config, trajectories],
        check=rollout_gap,
    )
    kept = reference / "kept.jsonl"
    results = [run_size(args, stages, size, kept, fit, val, config) for size in args.sizes]
    machine = f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs"
    result: SweepResult = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{machine}, python {platform.python_version()}",
        "command": "python benchmarks/sft_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": args.model,
        "families": list(args.families),
        "val_tables": held,
        "val_tasks": len(val_rows),
        "fit_tasks": len(fit_rows),
        "references_passed": len(rows(kept)),
        "max_turns": args.max_turns,
        "max_turn_tokens": args.max_turn_tokens,
        "sft_lr": args.sft_lr,
        "reference_seconds": stages.seconds.get("reference"),
        "minutes": round((time.monotonic() - start) / 60, 1),
        "sizes": results,
    }
    (work / "sft_sweep.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (work / "sft_sweep.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
