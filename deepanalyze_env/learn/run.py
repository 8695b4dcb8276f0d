"""The pipeline's run: which stages, in which order, with which settings (``commands.py`` turns
them into command lines), and the summary (``learn.json``) built from their reports."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from rich.rule import Rule

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.learn.commands import BankCommand, EvalCommand, RolloutCommand, TrainCommand
from deepanalyze_env.learn.outputs import markdown, plot
from deepanalyze_env.learn.settings import Pipeline
from deepanalyze_env.learn.stages import Stages, console, eval_gap, model_inputs, rollout_gap
from deepanalyze_env.learn.summary import (
    GrpoStep,
    Headline,
    LearnSummary,
    RftRound,
    SampledHeadline,
    compare_stages,
    coverage,
    grpo_steps,
    headline,
)
from deepanalyze_env.learn.tasks import bank_folder, sample_tasks, select_tasks
from deepanalyze_env.trainers.recipes import load_recipe


def eval_command(
    pipe: Pipeline,
    model: str,
    tasks: Path,
    out: Path,
    config: Path,
    *,
    samples: int | None = None,
    temperature: float | None = None,
    max_tokens: int | None = None,
) -> EvalCommand:
    """An eval of ``model`` with the pipeline's eval settings (``samples``, ``temperature`` and
    ``max_tokens`` replace them for a sampled pass) and its chat template."""
    e = pipe.eval
    return EvalCommand(
        model=model,
        tasks=tasks,
        out=out,
        config=config,
        samples=e.samples if samples is None else samples,
        max_tokens=e.max_tokens if max_tokens is None else max_tokens,
        temperature=e.temperature if temperature is None else temperature,
        concurrency=e.concurrency,
        chat_template_kwargs=pipe.chat_template_kwargs,
        chat_template=pipe.chat_template,
    )


@dataclass(frozen=True)
class GrpoSampling:
    """How the GRPO recipe samples (the one lookup of its temperature and turn budget): a sampled
    pass that should see what GRPO's groups see uses the same."""

    temperature: float  # the recipe's trl.temperature (TRL's default 1.0)
    max_tokens: int  # the recipe's rollout.max_turn_tokens, else the pipeline's eval budget
    budget_check: bool  # whether the recipe names its own rollout.budget_check

    @classmethod
    def of(cls, pipe: Pipeline) -> GrpoSampling:
        if pipe.grpo is None:
            return cls(float(pipe.eval.temperature), int(pipe.eval.max_tokens), False)
        recipe = load_recipe(pipe.grpo.recipe, pipe.grpo.overrides())
        return cls(
            temperature=float(recipe.trl.get("temperature", 1.0)),
            max_tokens=int(recipe.rollout.get("max_turn_tokens") or pipe.eval.max_tokens),
            budget_check=bool(recipe.rollout.get("budget_check")),
        )


def grpo_inputs(
    pipe: Pipeline, stages: Stages, model: str, files: dict[str, Path], out: Path, config: Path
) -> tuple[Path, list[str]]:
    """The task file GRPO trains on and the recipe overrides the pipeline adds: with a
    ``curriculum`` section, a sampled pass of ``model`` over those tasks (``estimate/``) seeds the
    success-rate curriculum; the budget check measures that pass (else the after-SFT eval, else
    the reference episodes) against GRPO's budgets, unless the recipe names its own."""
    assert pipe.grpo is not None
    pool, extra = files["train"], []
    sampling = GrpoSampling.of(pipe)
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
        command = eval_command(
            pipe,
            model,
            pool,
            out / "estimate",
            config,
            samples=cur.samples,
            temperature=float(cur.temperature if cur.temperature is not None else sampling.temperature),
            max_tokens=int(cur.max_tokens or sampling.max_tokens),
        )
        stages.run(
            "estimate",
            "success estimate: the SFT model sampled on GRPO's tasks (seeds the curriculum)",
            command,
            out / "estimate",
            [pool, config, *model_inputs(model)],
            check=eval_gap,
        )
        extra += ["curriculum.kind=success_rate", f"curriculum.from_records={out / 'estimate'}"]
        extra += [f"curriculum.{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in cur.set.items()]
        budget_source = out / "estimate"
    # the budget check reads our rollout_func's budgets; the tools format runs TRL's own tool loop
    if budget_source is not None and not sampling.budget_check and not pipe.tools:
        extra.append(f"rollout.budget_check={budget_source}")
    return pool, extra


def sampled_eval(
    pipe: Pipeline, stages: Stages, model: str, files: dict[str, Path], config: Path
) -> SampledHeadline:
    """``eval.sampled_k`` episodes per dev task of ``model`` (the after-SFT one) at the GRPO
    recipe's temperature and turn budget (``eval-sampled/``): its pass@k is what GRPO's groups
    can find, so it bounds the pass@1 that GRPO can sharpen towards."""
    out = Path(pipe.output_dir) / "eval-sampled"
    sampling = GrpoSampling.of(pipe)
    command = eval_command(
        pipe,
        model,
        files["dev"],
        out,
        config,
        samples=pipe.eval.sampled_k,
        temperature=sampling.temperature,
        max_tokens=sampling.max_tokens,
    )
    label = f"dev eval: {pipe.eval.sampled_k} sampled episodes per task at temperature {sampling.temperature}"
    stages.run(
        "eval_sampled",
        label,
        command,
        out,
        [files["dev"], config, *model_inputs(model)],
        check=eval_gap,
    )
    return {**headline(out), "temperature": sampling.temperature, "k": pipe.eval.sampled_k}


def template_override(pipe: Pipeline) -> list[str]:
    """The recipe overrides that make a training stage render prompts as the evals do."""
    out = []
    if pipe.chat_template_kwargs:
        out.append(f"trl.chat_template_kwargs={json.dumps(pipe.chat_template_kwargs, sort_keys=True)}")
    if pipe.chat_template:
        out.append(f"chat_template={pipe.chat_template}")
    return out


@dataclass
class Run:
    """What the stages of one pipeline run share: the run folder, the stage runner, the task
    files and env config every stage reads, and the model the next stage starts from."""

    pipe: Pipeline
    out: Path
    stages: Stages
    bank: Path
    files: dict[str, Path]
    env: JsonObject
    config: Path
    model: str
    dev: dict[str, Headline] = field(default_factory=dict)  # stage -> dev headline
    order: list[str] = field(default_factory=list)  # the stages in ``dev``, in run order

    def evaluate(self, name: str, title: str, split: str = "dev") -> Headline:
        """A greedy (eval settings) eval of the current model on a split, ``eval-<name>/``; its
        headline, also recorded as a dev stage when the split is dev."""
        folder = self.out / f"eval-{name}"
        tasks = self.files[split]
        self.stages.run(
            f"eval_{name}",
            title,
            eval_command(self.pipe, self.model, tasks, folder, self.config),
            folder,
            [tasks, self.config, *model_inputs(self.model)],
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
    command = BankCommand(bank, pipe.bank.families, pipe.bank.tables, pipe.bank.seed)
    if (bank / "manifest.json").is_file():
        console.print(Rule("[bold]task bank[/bold]"))
        console.print(f"reused: the bank in {bank}")
    else:
        stages.run("bank", "task bank (built once, then cached)", command)
    return bank


SFT_SAMPLE_SEED = 200  # added to the pipeline's seed: the SFT sample is not the curriculum's (+100)


def sample_references(kept: Path, tasks: Path, n: int | None, seed: int, out: Path) -> Path:
    """The records SFT trains on: every reference episode that passed (``kept``), or with ``n`` a
    seeded, family-stratified sample of ``n`` of them (families take turns over ``tasks``, as
    the task samples do; a smaller sample of the same seed is a prefix of a larger one, so a
    data-size sweep's sizes are nested), written to ``out``. When fewer than ``n`` passed, every
    one is taken and the console says so."""
    if n is None:
        return kept
    lines = [x for x in kept.read_text(encoding="utf-8").splitlines() if x.strip()]
    by_task = {str(json.loads(x)["task_id"]): x for x in lines}
    rows = [json.loads(x) for x in tasks.read_text(encoding="utf-8").splitlines() if x.strip()]
    chosen = sample_tasks([t for t in rows if t["id"] in by_task], n, seed)
    if len(chosen) < n:
        console.print(
            f"{n} references asked: only {len(chosen)} reference episodes passed; SFT trains on them all"
        )
    out.write_text("".join(by_task[str(t["id"])] + "\n" for t in chosen), encoding="utf-8")
    return out


def sft_stages(run: Run) -> None:
    """Reference episodes of the train tasks through the env, SFT on them, the after-SFT eval."""
    pipe, out = run.pipe, run.out
    assert pipe.sft is not None
    reference = out / "reference"
    trajectories = run.bank / "trajectories.jsonl"
    # the same env as the evals: a reference longer than max_turns is cut before its answer,
    # fails the gate and is not SFT data (it would teach the policy to run out of turns)
    command = RolloutCommand(trajectories, run.files["train"], run.config, reference)
    run.stages.run(
        "reference",
        "SFT data: the train tasks' reference episodes through the env",
        command,
        reference,
        [run.files["train"], run.config, trajectories],
        check=rollout_gap,
    )
    sft_dir = out / "sft"
    data = sample_references(
        reference / "kept.jsonl",
        run.files["train"],
        pipe.sft.references,
        pipe.seed + SFT_SAMPLE_SEED,
        out / "sft-references.jsonl",
    )
    train = TrainCommand(
        pipe.sft.recipe,
        sft_dir,
        run.model,
        data,
        overrides=(*pipe.sft.overrides(), *template_override(pipe)),
    )
    inputs = [Path(pipe.sft.recipe), data, *model_inputs(run.model)]
    run.stages.run("sft", "SFT warm start", train, sft_dir, inputs)
    run.model = str(sft_dir)
    if pipe.eval.after_sft or pipe.grpo is None:
        run.evaluate("sft", "dev eval: after SFT")


def rft_pool(run: Run) -> Path:
    """The train tasks RFT samples: every one, or ``rft.tasks`` of them, family-stratified."""
    assert run.pipe.rft is not None
    pool = run.files["train"]
    if not run.pipe.rft.tasks:
        return pool
    tasks = [json.loads(x) for x in pool.read_text().splitlines() if x.strip()]
    chosen = sample_tasks(tasks, run.pipe.rft.tasks, run.pipe.seed + 200)
    pool = run.out / "tasks" / "rft.jsonl"
    pool.parent.mkdir(parents=True, exist_ok=True)
    pool.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in chosen))
    return pool


def rft_stages(run: Run) -> list[RftRound]:
    """Rejection-sampling fine-tuning: per round, ``k`` sampled episodes per task of the current
    model (stage ``rft_sampleN``, an ``eval`` in ``rft/roundN/sample``), its correct episodes
    (``rft/roundN/kept.jsonl``, selected here: a file filter, no model) and SFT on them from the
    current model (stage ``rft_sftN``, ``rft/roundN/model``); then a dev eval after every round
    (``eval-rftN/``, with ``rft.eval_rounds``) or after the last trained one (``eval-rft/``). A
    round that keeps nothing trains nothing and ends the rounds (none trained: no RFT eval, the
    model is unchanged)."""
    pipe, out = run.pipe, run.out
    rft = pipe.rft
    assert rft is not None
    from deepanalyze_env.offline.correct import write_correct

    pool = rft_pool(run)
    rounds: list[RftRound] = []
    for number in range(1, rft.rounds + 1):
        folder = out / "rft" / f"round{number}"
        sample = eval_command(
            pipe,
            run.model,
            pool,
            folder / "sample",
            run.config,
            samples=rft.k,
            temperature=rft.temperature,
            max_tokens=rft.max_tokens,
        )
        names = {"sample": f"rft_sample{number}", "sft": f"rft_sft{number}"}
        run.stages.run(
            names["sample"],
            f"RFT round {number}: {rft.k} episodes per task sampled at temperature {rft.temperature}",
            sample,
            folder / "sample",
            [pool, run.config, *model_inputs(run.model)],
            check=eval_gap,
        )
        kept = folder / "kept.jsonl"
        counts = write_correct(folder / "sample", kept, rft.threshold)
        console.print(
            f"RFT round {number}: kept {counts['kept']} of {counts['episodes']} episodes (correct: gate and "
            f"accuracy >= {rft.threshold}), {counts['tasks_correct']} of {counts['tasks']} tasks",
            highlight=False,
        )
        trained = counts["kept"] > 0
        if trained:
            train = TrainCommand(
                rft.recipe,
                folder / "model",
                run.model,
                kept,
                overrides=(*rft.overrides(), *template_override(pipe)),
            )
            inputs = [Path(rft.recipe), kept, *model_inputs(run.model)]
            title = f"RFT round {number}: SFT on the correct episodes"
            run.stages.run(names["sft"], title, train, folder / "model", inputs)
            run.model = str(folder / "model")
        rounds.append(
            {
                "round": number,
                "model": run.model,
                "sample": headline(folder / "sample"),
                "episodes": counts["episodes"],
                "kept": counts["kept"],
                "tasks": counts["tasks"],
                "tasks_correct": counts["tasks_correct"],
                "trained": trained,
                "seconds": {k: run.stages.seconds[v] for k, v in names.items() if v in run.stages.seconds},
                "memory": {k: run.stages.memory[v] for k, v in names.items() if v in run.stages.memory},
            }
        )
        if not trained:
            console.print(f"RFT round {number} kept no episode: the rounds stop, the model stays {run.model}")
            break
        if rft.eval_rounds:
            run.evaluate(f"rft{number}", f"dev eval: after RFT round {number}")
    if not rft.eval_rounds and any(r["trained"] for r in rounds):
        run.evaluate("rft", f"dev eval: after RFT ({len(rounds)} rounds)")
    return rounds


def grpo_stages(run: Run) -> list[GrpoStep]:
    """GRPO from the current model (after the estimate and budget check), then its dev eval;
    returns GRPO's per-step figures."""
    pipe, out = run.pipe, run.out
    assert pipe.grpo is not None
    grpo_dir = out / "grpo"
    pool, extra = grpo_inputs(pipe, run.stages, run.model, run.files, out, run.config)
    train = TrainCommand(
        pipe.grpo.recipe,
        grpo_dir,
        run.model,
        pool,
        env=run.env,
        overrides=(*pipe.grpo.overrides(), *extra, *template_override(pipe)),
    )
    inputs = [Path(pipe.grpo.recipe), pool, *model_inputs(run.model)]
    if pipe.curriculum is not None:
        inputs.append(out / "estimate" / "episodes.jsonl")
    run.stages.run("grpo", "GRPO", train, grpo_dir, inputs)
    run.model = str(grpo_dir)
    run.evaluate("grpo", "dev eval: after GRPO")
    return grpo_steps(grpo_dir / "metrics.jsonl")


def run_pipeline(pipe: Pipeline, fresh: bool = False) -> LearnSummary:
    """Run every stage; returns the summary also written to ``learn.json``."""
    out = Path(pipe.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stages = Stages(out, fresh)
    start = time.monotonic()
    bank = bank_stage(pipe, stages)
    files = select_tasks(pipe, bank, out)
    if "dev" not in files or "train" not in files:
        raise ConfigError(f"{pipe.source}: a pipeline needs train and dev tasks")
    env: JsonObject = {"workspace_root": str(bank), **pipe.env}
    config = out / "env.yaml"
    config.write_text(yaml.safe_dump(env))
    run = Run(pipe, out, stages, bank, files, env, config, model=pipe.model)

    if pipe.eval.before:
        run.evaluate("base", "dev eval: the starting model")
    if pipe.sft is not None:
        sft_stages(run)
    sampled = sampled_eval(pipe, stages, run.model, files, config) if pipe.eval.sampled_k else None
    rounds = rft_stages(run) if pipe.rft is not None else []
    steps = grpo_stages(run) if pipe.grpo is not None else []
    test = run.evaluate("test", "test eval: the last model, once", split="test") if "test" in files else None

    summary: LearnSummary = {
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
        "rft": rounds,
        "seconds": stages.seconds | {"total": round(time.monotonic() - start, 1)},
        "memory": stages.memory,
    }
    (out / "learn.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "learn.md").write_text(markdown(summary))
    plot(summary, out / "learn.png")
    return summary
