"""The pipeline's run: which stages, in which order, with which arguments, and the summary
(``learn.json``) built from their reports."""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.rule import Rule

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.learn.outputs import markdown, plot
from deepanalyze_env.learn.settings import Pipeline
from deepanalyze_env.learn.stages import Stages, console, eval_gap, model_inputs, rollout_gap
from deepanalyze_env.learn.tasks import bank_folder, sample_tasks, select_tasks
from deepanalyze_env.trainers.recipes import load_recipe


def eval_argv(
    pipe: Pipeline,
    model: str,
    tasks: Path,
    out: Path,
    config: Path,
    *,
    samples: int | None = None,
    temperature: float | None = None,
    max_tokens: int | None = None,
) -> list[str]:
    e = pipe.eval
    samples = e.samples if samples is None else samples
    temperature = e.temperature if temperature is None else temperature
    max_tokens = e.max_tokens if max_tokens is None else max_tokens
    argv = ["eval", "--model", model, "--tasks", str(tasks), "--samples", str(samples), "--out", str(out)]
    argv += ["--config", str(config), "--max-tokens", str(max_tokens), "--temperature", str(temperature)]
    if pipe.chat_template_kwargs:
        argv += ["--chat-template-kwargs", json.dumps(pipe.chat_template_kwargs, sort_keys=True)]
    if pipe.chat_template:
        argv += ["--chat-template", pipe.chat_template]
    return [*argv, "--concurrency", str(e.concurrency)]


def grpo_inputs(
    pipe: Pipeline, stages: Stages, model: str, files: dict[str, Path], out: Path, config: Path
) -> tuple[Path, list[str]]:
    """The task file GRPO trains on and the recipe overrides the pipeline adds: with a
    ``curriculum`` section, a sampled pass of ``model`` over those tasks (``estimate/``) seeds the
    success-rate curriculum; the budget check measures that pass (else the after-SFT eval, else
    the reference episodes) against GRPO's budgets, unless the recipe names its own."""
    assert pipe.grpo is not None
    pool, extra = files["train"], []
    recipe = load_recipe(pipe.grpo.recipe, pipe.grpo.overrides())
    budget_source = next(
        (p for p in (out / "eval-sft", out / "reference") if (p / "episodes.jsonl").is_file()), None
    )
    cur = pipe.curriculum
    if cur is not None:
        if cur.tasks:
            tasks = [json.loads(x) for x in pool.read_text().splitlines() if x.strip()]
            pool = out / "tasks" / "grpo.jsonl"
            chosen = sample_tasks(tasks, cur.tasks, pipe.seed + 100)
            pool.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in chosen))
        temperature = cur.temperature if cur.temperature is not None else recipe.trl.get("temperature", 1.0)
        max_tokens = cur.max_tokens or recipe.rollout.get("max_turn_tokens") or pipe.eval.max_tokens
        argv = eval_argv(
            pipe,
            model,
            pool,
            out / "estimate",
            config,
            samples=cur.samples,
            temperature=float(temperature),
            max_tokens=int(max_tokens),
        )
        stages.run(
            "estimate",
            "success estimate: the SFT model sampled on GRPO's tasks (seeds the curriculum)",
            argv,
            out / "estimate",
            [pool, config, *model_inputs(model)],
            resumable=True,
            check=eval_gap,
        )
        extra += ["curriculum.kind=success_rate", f"curriculum.from_records={out / 'estimate'}"]
        extra += [f"curriculum.{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in cur.set.items()]
        budget_source = out / "estimate"
    # the budget check reads our rollout_func's budgets; the tools format runs TRL's own tool loop
    if budget_source is not None and not recipe.rollout.get("budget_check") and not pipe.tools:
        extra.append(f"rollout.budget_check={budget_source}")
    return pool, extra


def sampled_eval(
    pipe: Pipeline, stages: Stages, model: str, files: dict[str, Path], config: Path
) -> dict[str, Any]:
    """``eval.sampled_k`` episodes per dev task of ``model`` (the after-SFT one) at the GRPO
    recipe's temperature and turn budget (``eval-sampled/``): its pass@k is what GRPO's groups
    can find, so it bounds the pass@1 that GRPO can sharpen towards."""
    out = Path(pipe.output_dir) / "eval-sampled"
    temperature, max_tokens = pipe.eval.temperature, pipe.eval.max_tokens
    if pipe.grpo is not None:
        recipe = load_recipe(pipe.grpo.recipe, pipe.grpo.overrides())
        temperature = recipe.trl.get("temperature", 1.0)
        max_tokens = recipe.rollout.get("max_turn_tokens") or max_tokens
    argv = eval_argv(
        pipe,
        model,
        files["dev"],
        out,
        config,
        samples=pipe.eval.sampled_k,
        temperature=float(temperature),
        max_tokens=int(max_tokens),
    )
    label = f"dev eval: {pipe.eval.sampled_k} sampled episodes per task at temperature {temperature}"
    stages.run(
        "eval_sampled",
        label,
        argv,
        out,
        [files["dev"], config, *model_inputs(model)],
        resumable=True,
        check=eval_gap,
    )
    return headline(out) | {"temperature": float(temperature), "k": pipe.eval.sampled_k}


def template_override(pipe: Pipeline) -> list[str]:
    """The recipe overrides that make a training stage render prompts as the evals do."""
    out = []
    if pipe.chat_template_kwargs:
        out.append(f"trl.chat_template_kwargs={json.dumps(pipe.chat_template_kwargs, sort_keys=True)}")
    if pipe.chat_template:
        out.append(f"chat_template={pipe.chat_template}")
    return out


def headline(eval_dir: Path) -> dict[str, Any]:
    """A stage's dev figures, over its planned episodes (a missing one counts as a failed gate;
    ``planned``/``finished``/``missing`` say how many there were)."""
    report = json.loads((eval_dir / "report.json").read_text())
    overall = report["overall"]
    counts = report.get("episodes") or {}
    return {
        "reward_mean": overall["reward_mean"],
        "reward_ci95": overall["reward_ci95"],
        "format_gate_pass_rate": overall["format_gate_pass_rate"],
        "accuracy": overall["pass_at"]["1"]["value"] if "1" in overall.get("pass_at", {}) else None,
        "episodes": overall["episodes"],
        "planned": counts.get("planned"),
        "finished": counts.get("finished", overall["episodes"]),
        "missing": counts.get("missing"),
        "missing_tasks": counts.get("missing_tasks", []),
        "task_ids": counts.get("tasks", []),
        "status_rates": overall["status_rates"],
        "pass_at": {k: v["value"] for k, v in overall.get("pass_at", {}).items()},
    }


def coverage(dev: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Whether every stage's figures are over the same tasks (the before/after table is only a
    comparison if they are); otherwise which tasks each stage lacks or adds."""
    sets = {stage: set(m.get("task_ids") or []) for stage, m in dev.items()}
    union = set().union(*sets.values()) if sets else set()
    lacking = {stage: sorted(union - s) for stage, s in sets.items() if union - s}
    return {"same_tasks": not lacking, "tasks": len(union), "lacking": lacking}


@dataclass
class Run:
    """What the stages of one pipeline run share: the run folder, the stage runner, the task
    files and env config every stage reads, and the model the next stage starts from."""

    pipe: Pipeline
    out: Path
    stages: Stages
    bank: Path
    files: dict[str, Path]
    env: dict[str, Any]
    config: Path
    model: str
    dev: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage -> dev headline
    order: list[str] = field(default_factory=list)  # the stages in ``dev``, in run order

    def evaluate(self, name: str, title: str, split: str = "dev") -> dict[str, Any]:
        """A greedy (eval settings) eval of the current model on a split, ``eval-<name>/``; its
        headline, also recorded as a dev stage when the split is dev."""
        folder = self.out / f"eval-{name}"
        tasks = self.files[split]
        self.stages.run(
            f"eval_{name}",
            title,
            eval_argv(self.pipe, self.model, tasks, folder, self.config),
            folder,
            [tasks, self.config, *model_inputs(self.model)],
            resumable=True,
            check=eval_gap,
        )
        figures = headline(folder)
        if split == "dev":
            self.dev[name] = figures
            self.order.append(name)
        return figures


def bank_stage(pipe: Pipeline, stages: Stages) -> Path:
    """The bank slice's folder, built once (a cached bank is reused without a stage)."""
    bank = bank_folder(pipe.bank)
    argv = ["bank", "build", "--out", str(bank)]
    for key in ("families", "tables"):
        if pipe.bank.get(key):
            argv += [f"--{key}", *sorted(pipe.bank[key])]
    if "seed" in pipe.bank:
        argv += ["--seed", str(pipe.bank["seed"])]
    if (bank / "manifest.json").is_file():
        console.print(Rule("[bold]task bank[/bold]"))
        console.print(f"reused: the bank in {bank}")
    else:
        stages.run("bank", "task bank (built once, then cached)", argv)
    return bank


def sft_stages(run: Run) -> None:
    """Reference episodes of the train tasks through the env, SFT on them, the after-SFT eval."""
    pipe, out = run.pipe, run.out
    assert pipe.sft is not None
    reference = out / "reference"
    argv = ["rollout", "--policy", "scripted", "--labels", "good"]
    argv += ["--trajectories", str(run.bank / "trajectories.jsonl"), "--tasks", str(run.files["train"])]
    # the same env as the evals: a reference longer than max_turns is cut before its answer,
    # fails the gate and is not SFT data (it would teach the policy to run out of turns)
    argv += ["--config", str(run.config), "--out", str(reference)]
    argv += ["--keep", 'reward_status == "scored" and format_ok']
    run.stages.run(
        "reference",
        "SFT data: the train tasks' reference episodes through the env",
        argv,
        reference,
        [run.files["train"], run.config, run.bank / "trajectories.jsonl"],
        resumable=True,
        check=rollout_gap,
    )
    sft_dir = out / "sft"
    argv = ["train", pipe.sft.recipe, f"output_dir={sft_dir}", f"model={run.model}"]
    argv += [f"data=[{reference / 'kept.jsonl'}]", *pipe.sft.overrides(), *template_override(pipe)]
    inputs = [Path(pipe.sft.recipe), reference / "kept.jsonl", *model_inputs(run.model)]
    run.stages.run("sft", "SFT warm start", argv, sft_dir, inputs)
    run.model = str(sft_dir)
    if pipe.eval.after_sft or pipe.grpo is None:
        run.evaluate("sft", "dev eval: after SFT")


GRPO_STEP_KEYS = (
    "step",
    "reward_mean",
    "components",
    "status_counts",
    "rollout_seconds",
    "time",
    "teach",
    "memory",
)


def grpo_steps(metrics: Path) -> list[dict[str, Any]]:
    """GRPO's per-step figures from its ``metrics.jsonl`` (none when it wrote no file)."""
    if not metrics.is_file():
        return []
    lines = filter(str.strip, metrics.read_text().splitlines())
    return [{k: s.get(k) for k in GRPO_STEP_KEYS} for s in map(json.loads, lines)]


def grpo_stages(run: Run) -> list[dict[str, Any]]:
    """GRPO from the current model (after the estimate and budget check), then its dev eval;
    returns GRPO's per-step figures."""
    pipe, out = run.pipe, run.out
    assert pipe.grpo is not None
    grpo_dir = out / "grpo"
    pool, extra = grpo_inputs(pipe, run.stages, run.model, run.files, out, run.config)
    argv = ["train", pipe.grpo.recipe, f"output_dir={grpo_dir}", f"model={run.model}"]
    argv += [f"data=[{pool}]", f"env={json.dumps(run.env)}"]
    argv += [*pipe.grpo.overrides(), *extra, *template_override(pipe)]
    inputs = [Path(pipe.grpo.recipe), pool, *model_inputs(run.model)]
    if pipe.curriculum is not None:
        inputs.append(out / "estimate" / "episodes.jsonl")
    run.stages.run("grpo", "GRPO", argv, grpo_dir, inputs)
    run.model = str(grpo_dir)
    run.evaluate("grpo", "dev eval: after GRPO")
    return grpo_steps(grpo_dir / "metrics.jsonl")


def run_pipeline(pipe: Pipeline, fresh: bool = False) -> dict[str, Any]:
    """Run every stage; returns the summary also written to ``learn.json``."""
    out = Path(pipe.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stages = Stages(out, fresh)
    start = time.monotonic()
    bank = bank_stage(pipe, stages)
    files = select_tasks(pipe, bank, out)
    if "dev" not in files or "train" not in files:
        raise ConfigError(f"{pipe.source}: a pipeline needs train and dev tasks")
    env = {"workspace_root": str(bank), **pipe.env}
    config = out / "env.yaml"
    config.write_text(yaml.safe_dump(env))
    run = Run(pipe, out, stages, bank, files, env, config, model=pipe.model)

    if pipe.eval.before:
        run.evaluate("base", "dev eval: the starting model")
    if pipe.sft is not None:
        sft_stages(run)
    sampled = sampled_eval(pipe, stages, run.model, files, config) if pipe.eval.sampled_k else None
    steps = grpo_stages(run) if pipe.grpo is not None else []
    test = run.evaluate("test", "test eval: the last model, once", split="test") if "test" in files else None

    summary = {
        "pipeline": pipe.source,
        "coverage": coverage(run.dev),
        "model": run.model,
        "bank": str(bank),
        "task_files": {k: str(v) for k, v in files.items()},
        "tasks": {k: len(v.read_text().splitlines()) for k, v in files.items()},
        "dev": run.dev,
        "sampled": sampled,
        "test": test,
        "comparisons": compare_stages(out, run.order),
        "grpo_steps": steps,
        "seconds": stages.seconds | {"total": round(time.monotonic() - start, 1)},
        # each stage's peak memory (its whole process tree: kernel workers included); PSS counts
        # a page shared by several processes once
        "memory": stages.memory,
    }
    (out / "learn.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "learn.md").write_text(markdown(summary))
    plot(summary, out / "learn.png")
    return summary


def compare_stages(out: Path, order: list[str]) -> dict[str, Any]:
    """Paired per-task comparisons of each stage with the one before it (dev), over planned
    episodes (missing ones as failures), naming the tasks that had no partner."""
    from deepanalyze_env.offline.eval_report import compare_runs, load_eval

    result = {}
    for a, b in itertools.pairwise(order):
        runs = [load_eval(out / f"eval-{name}")[0] for name in (a, b)]
        compared = compare_runs(*runs)
        result[f"{a}->{b}"] = {
            **compared["metrics"],
            "only_in_a": compared["only_in_a"],
            "only_in_b": compared["only_in_b"],
        }
    return result
