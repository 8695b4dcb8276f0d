"""``deepanalyze-rl learn PIPELINE``: the learning pipeline, stage by stage, with a before/after table.

Stages (each one is an ordinary command run in its own process, so a user can rerun any of them
by hand with the arguments saved in ``stages.json``, and a stage's memory is freed when it ends):

1. ``bank build`` of the pipeline's tables and families (skipped when the bank exists) and the
   train / dev / test task files: a seeded, family-stratified sample of each split, judge-free
   methods only unless ``env.judge`` is set;
2. ``eval`` of the starting model on the dev tasks (``eval-base/``);
3. ``rollout --policy scripted`` of the train tasks' reference trajectories through the env with
   the pipeline's env config (``reference/``): the SFT data, rendered as the trainers see episodes;
4. ``train`` of the SFT recipe on those records (``sft/``, a model folder), then ``eval-sft/``;
5. ``train`` of the GRPO recipe from the SFT model on the train tasks (``grpo/``), then ``eval-grpo/``;
6. ``eval`` of the last model on the test tasks, once, when the pipeline has test tasks.

Why a command that chains commands rather than a recipe backend: every stage already exists as
a command with its own output folder, resume and report; chaining them keeps one implementation
of each, and ``stages.json`` makes the chain reproducible by hand.

Resume: a finished stage is recorded in ``stages.json`` with its arguments; rerunning the
pipeline reuses it when the arguments are unchanged, and reruns it and every later stage when
they differ (``--fresh`` reruns everything). Evals resume episode by episode. A stage is done only
when it is complete: an eval that wrote its report with no planned episode missing, a rollout
whose ``episodes.jsonl`` holds every planned episode. An incomplete one is tried once more at
once (``--resume`` when it left a run folder, else in a clean folder); if it is still incomplete
it is recorded as not done (``incomplete`` in ``stages.json``, so the next run resumes it), and
the pipeline goes on only when what it left is readable (an eval's report, which counts the
missing episodes as failures), else it stops with the stage named.

Output: ``learn.json`` (per-stage dev metrics, stage seconds, paired comparisons, GRPO steps),
``learn.md`` (the before/after table) and ``learn.png`` (the curve).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml
from rich.rule import Rule
from rich.table import Table

from deepanalyze_env.cli.common import UsageError, console, make_parser
from deepanalyze_env.core.config import ConfigError, EnvConfig
from deepanalyze_env.trainers.recipes import load_recipe

SPLITS = ("train", "dev", "test")


@dataclass
class EvalSettings:
    """How every dev/test eval of the pipeline runs."""

    samples: int = 1  # episodes per task (pass@k uses them)
    max_tokens: int = 160  # tokens per policy turn
    temperature: float = 0.0  # 0: greedy, one deterministic episode per task and model
    concurrency: int = 8  # episodes in flight; a local model generates their turns as one batch
    after_sft: bool = True  # also evaluate between SFT and GRPO (off: before and after only)
    before: bool = True  # evaluate the starting model (off: a run that starts from a tuned checkpoint)
    sampled_k: int = 0  # k episodes per dev task of the after-SFT model at GRPO's temperature: its pass@k
    # bounds what GRPO can sharpen towards (0: no such eval)


@dataclass
class CurriculumSettings:
    """Seed GRPO's success-rate curriculum from a sampled pass of the SFT model (``estimate/``).

    The pass samples the SFT model on the tasks GRPO will draw from, at the temperature GRPO
    samples at, so the curriculum starts from estimates instead of a flat prior and draws tasks
    whose groups can differ; its records are also what the budget check measures.
    """

    tasks: int = 0  # train tasks GRPO draws from, family-stratified (0: every train task)
    samples: int = 4  # episodes per task in the pass
    temperature: float | None = None  # None: the GRPO recipe's trl.temperature (TRL's default 1.0)
    max_tokens: int | None = None  # per turn; None: the GRPO recipe's rollout.max_turn_tokens, else eval's
    set: dict[str, Any] = field(default_factory=dict)  # curriculum fields (kind: success_rate implied)


@dataclass
class StageRecipe:
    """A training stage: a recipe file (relative to the pipeline file) and overrides on top."""

    recipe: str
    set: dict[str, Any] = field(default_factory=dict)  # dotted recipe key -> value

    def overrides(self) -> list[str]:
        """``key=value`` arguments for ``train``: one per leaf, so an override changes one key
        and never replaces a whole recipe section."""
        return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in self.set.items()]


def flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"trl": {"beta": 0}, "trl.lr": 1}`` -> ``{"trl.beta": 0, "trl.lr": 1}``: a stage's ``set``
    may be written nested (YAML) or dotted (the file, or ``grpo.set.trl.beta=0`` on the command
    line, which arrives nested)."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


@dataclass
class Pipeline:
    """A ``learn`` pipeline file (``recipes/learn_cpu.yaml`` documents every key)."""

    output_dir: str
    model: str = "embedded:smollm2"
    bank: dict[str, Any] = field(default_factory=dict)  # seed, families, tables (none: all)
    tasks: dict[str, int] = field(default_factory=dict)  # split -> how many tasks (0: none)
    env: dict[str, Any] = field(default_factory=dict)
    eval: EvalSettings = field(default_factory=EvalSettings)
    sft: StageRecipe | None = None
    grpo: StageRecipe | None = None
    curriculum: CurriculumSettings | None = None  # None: GRPO samples tasks as its recipe says
    seed: int = 0  # the task sample
    # chat template arguments for every stage's prompts (SFT, evals, GRPO): Qwen3's enable_thinking
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    @classmethod
    def load(cls, path: str | Path, overrides: list[str] | None = None) -> Pipeline:
        from deepanalyze_env.trainers.recipes import apply_override

        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"pipeline file not found: {path}")
        tree = yaml.safe_load(path.read_text()) or {}
        if not isinstance(tree, dict):
            raise ConfigError(f"{path}: a pipeline is a mapping at the top level")
        for assignment in overrides or []:
            apply_override(tree, assignment)
        known = [f.name for f in fields(cls) if f.name != "source"]
        unknown = [k for k in tree if k not in known]
        if unknown:
            raise ConfigError(f"{path}: unknown pipeline key {unknown[0]!r} (known: {', '.join(known)})")
        if "output_dir" not in tree:
            raise ConfigError(f"{path}: pipeline key 'output_dir' is required")
        bad = [k for k in tree.get("tasks") or {} if k not in SPLITS]
        if bad:
            raise ConfigError(f"{path}: unknown split tasks.{bad[0]} (known: {', '.join(SPLITS)})")
        stages = {}
        for name in ("sft", "grpo"):
            section = tree.get(name)
            if section is None:
                stages[name] = None
                continue
            if not isinstance(section, dict) or "recipe" not in section:
                raise ConfigError(
                    f"{path}: {name} needs a recipe file: {name}: {{recipe: FILE, set: {{...}}}}"
                )
            recipe = Path(section["recipe"])
            if not recipe.is_absolute():
                recipe = (path.parent / recipe).resolve()
            if not recipe.is_file():
                raise ConfigError(f"{path}: {name}.recipe: no such file {recipe}")
            overrides = section.get("set") or {}
            if not isinstance(overrides, dict):
                raise ConfigError(f"{path}: {name}.set must be a mapping of recipe keys to values")
            stages[name] = StageRecipe(str(recipe), flatten(overrides))
        try:
            settings = EvalSettings(**(tree.get("eval") or {}))
        except TypeError as exc:
            raise ConfigError(f"{path}: eval: {exc}")
        curriculum = None
        if tree.get("curriculum") is not None:
            section = tree["curriculum"]
            if not isinstance(section, dict):
                raise ConfigError(f"{path}: curriculum must be a mapping (tasks, samples, temperature, set)")
            if stages["grpo"] is None:
                raise ConfigError(f"{path}: curriculum seeds GRPO's sampling; the pipeline has no grpo stage")
            try:
                curriculum = CurriculumSettings(**section)
            except TypeError as exc:
                raise ConfigError(f"{path}: curriculum: {exc}")
            if curriculum.samples < 1 or curriculum.tasks < 0:
                raise ConfigError(f"{path}: curriculum needs samples >= 1 and tasks >= 0")
            curriculum.set = {k: v for k, v in flatten(dict(curriculum.set or {})).items() if k != "kind"}
        env = dict(tree.get("env") or {})
        EnvConfig.from_any(env)
        kwargs = tree.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise ConfigError(
                f"{path}: chat_template_kwargs must be a mapping, e.g. {{enable_thinking: false}}"
            )
        pipe = cls(
            output_dir=str(tree["output_dir"]),
            model=str(tree.get("model", cls.model)),
            bank=dict(tree.get("bank") or {}),
            tasks={k: int(v) for k, v in (tree.get("tasks") or {}).items()},
            env=env,
            eval=settings,
            sft=stages["sft"],
            grpo=stages["grpo"],
            curriculum=curriculum,
            seed=int(tree.get("seed", 0)),
            chat_template_kwargs=dict(kwargs),
            source=str(path),
        )
        pipe.chat_template_kwargs = template_kwargs(pipe)
        return pipe


# ---------------------------------------------------------------------------- tasks


def bank_folder(bank: dict[str, Any]) -> Path:
    """The whole bank's cache folder, or a sibling keyed by the selected families and tables."""
    from deepanalyze_env.offline.bank.build import DEFAULT_SEED, cache_folder

    seed = int(bank.get("seed", DEFAULT_SEED))
    base = cache_folder(seed)
    picks = {k: sorted(bank[k]) for k in ("families", "tables") if bank.get(k)}
    if not picks:
        return base
    key = hashlib.sha256(json.dumps(picks, sort_keys=True).encode()).hexdigest()[:10]
    return base.with_name(f"{base.name}-{key}")


def needs_judge(task: dict[str, Any]) -> bool:
    from deepanalyze_env.core.profiles import PROFILES

    return PROFILES["v1"].build_plan(task["reward_spec"]).needs_judge


def sample_tasks(tasks: list[dict[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` tasks, family-stratified: families take turns, each in a seeded shuffled order."""
    by_family: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for task in tasks:
        by_family[str(task.get("family", ""))].append(task)
    rng = random.Random(seed)
    queues = []
    for family in sorted(by_family):
        items = list(by_family[family])
        rng.shuffle(items)
        queues.append(items)
    picked: list[dict[str, Any]] = []
    while len(picked) < n and any(queues):
        for queue in queues:
            if queue and len(picked) < n:
                picked.append(queue.pop())
    return picked


def select_tasks(pipe: Pipeline, bank: Path, out: Path) -> dict[str, Path]:
    """Write each split's sample into ``out/tasks/<split>.jsonl``; the files used by every stage."""
    with_judge = bool(pipe.env.get("judge"))
    files = {}
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        n = pipe.tasks.get(split, 0 if split == "test" else 10**9)
        if n <= 0:
            continue
        rows = [json.loads(x) for x in (bank / "tasks" / f"{split}.jsonl").read_text().splitlines() if x]
        usable = [t for t in rows if with_judge or not needs_judge(t)]
        chosen = sample_tasks(usable, n, pipe.seed + SPLITS.index(split))
        if not chosen:
            raise ConfigError(f"{pipe.source}: the bank's {split} split has no task for this pipeline")
        path = out / "tasks" / f"{split}.jsonl"
        path.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in chosen))
        files[split] = path
    return files


# ---------------------------------------------------------------------------- stages


def _key(argv: list[str]) -> list[str]:
    """A stage's arguments less ``--resume`` (added when a folder holds part of the same stage,
    which does not change what the stage produces)."""
    return [a for a in argv if a != "--resume"]


FULL_HASH_BYTES = 64 * 2**20  # files up to this size are hashed whole
EDGE_BYTES = 2**20  # of a larger file (weights): its first and last MiB, with its size and mtime


def content_digest(path: Path) -> str:
    """A digest of a file or a whole folder (a model: weights, config, tokenizer, checkpoints).

    Every file's relative path and size enter it; files up to :data:`FULL_HASH_BYTES` (configs,
    weight indexes, tokenizers, task files, rewritten by every ``learn`` run) are hashed whole,
    larger ones (weights) by their mtime and first and last MiB. A model rewritten in place
    changes its mtime (and almost always its edges), so a stage that read it reruns; the cost
    stays a few milliseconds per model instead of seconds per GB (``benchmarks/RESULTS.md``).
    """
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        st = file.stat()
        name = file.name if file == path else file.relative_to(path).as_posix()
        h.update(f"{name}\0{st.st_size}\0".encode())
        with open(file, "rb") as fh:
            if st.st_size <= FULL_HASH_BYTES:
                h.update(fh.read())  # its content is its identity (rewritten unchanged: the same)
            else:
                h.update(f"{st.st_mtime_ns}\0".encode())
                h.update(fh.read(EDGE_BYTES))
                fh.seek(st.st_size - EDGE_BYTES)
                h.update(fh.read(EDGE_BYTES))
    return h.hexdigest()[:16]


def model_inputs(ref: str) -> list[Path]:
    """What a stage reading model ``ref`` reads from disk: a local folder or file, or an embedded
    model's packaged GGUF (its conversion is a function of it). A hub id has no local content
    before it is downloaded; its name in the arguments is its identity."""
    from deepanalyze_env.core.models import embedded_gguf

    if ref.startswith("embedded:"):
        try:
            folder, filename = embedded_gguf(ref.split(":", 1)[1])
        except ValueError:
            return []  # the stage itself says what is wrong
        return [folder / filename]
    path = Path(ref)
    return [path] if path.exists() else []


def _digests(inputs: Sequence[Path]) -> dict[str, str]:
    """Content digests of everything a stage reads: same arguments over changed task files, env
    config, recipe, SFT data or model (folder) are different work."""
    return {str(p): content_digest(p) for p in inputs if p.exists()}


class Stages:
    """Runs commands as stages, reusing those whose arguments are unchanged (``stages.json``).

    A stage is identified by its arguments and its input files' contents. It is reused when it
    finished with the same identity and no earlier stage reran; an eval or rollout interrupted
    with the same identity resumes episode by episode; anything else starts in a clean folder
    (resuming a folder made with other arguments or from an earlier model would mix episodes).
    """

    def __init__(self, out: Path, fresh: bool) -> None:
        self.path = out / "stages.json"
        self.done: dict[str, Any] = (
            {} if fresh or not self.path.is_file() else json.loads(self.path.read_text())
        )
        self.seconds: dict[str, float] = {}
        self.stale = False  # once one stage reruns, every later stage reruns too

    def run(
        self,
        name: str,
        title: str,
        argv: list[str],
        outputs: Path | None = None,
        inputs: Sequence[Path] = (),
        resumable: bool = False,
        check: Callable[[Path, float], Gap | None] | None = None,
    ) -> None:
        console.print(Rule(f"[bold]{title}[/bold]"))
        digests = _digests(inputs)
        previous = self.done.get(name)
        same = (
            previous is not None
            and _key(previous["argv"]) == _key(argv)
            and previous.get("inputs", {}) == digests
        )
        finished = same and previous.get("seconds") is not None
        if not self.stale and finished and (outputs is None or outputs.exists()):
            console.print(f"reused: {name} (finished earlier with the same arguments and inputs)")
            self.seconds[name] = previous["seconds"]
            return
        resume = (
            resumable and not self.stale and same and outputs is not None and (outputs / "run.json").is_file()
        )
        self.stale = True
        if outputs is not None and outputs.exists() and not resume:
            shutil.rmtree(outputs)  # another stage's arguments, inputs or model made it: start clean
        if resume:
            argv = [*argv, "--resume"]
            console.print(f"resuming: {name} (started earlier with the same identity, not complete)")
        self.done[name] = {"argv": _key(argv), "inputs": digests, "seconds": None}  # started
        self._save()
        start = time.monotonic()
        gap = self._execute(argv, outputs, check)
        if gap is not None and resumable and outputs is not None:
            # an incomplete or crashed stage is not done: one more try, resuming what it has
            if (outputs / "run.json").is_file():
                console.print(
                    f"[yellow]stage {name} is incomplete[/yellow] ({gap.reason}): resuming its missing "
                    "episodes (--resume)",
                    highlight=False,
                )
                argv = argv if "--resume" in argv else [*argv, "--resume"]
            else:
                console.print(
                    f"[yellow]stage {name} did not start a run[/yellow] ({gap.reason}): rerunning it in a "
                    "clean folder",
                    highlight=False,
                )
                if outputs.exists():
                    shutil.rmtree(outputs)
            gap = self._execute(argv, outputs, check)
        seconds = round(time.monotonic() - start, 1)
        self.seconds[name] = seconds
        if gap is None:
            self.done[name]["seconds"] = seconds
            self._save()
            return
        # still incomplete: not recorded as done, so the next ``learn`` resumes it
        self.done[name]["incomplete"] = gap.reason
        self._save()
        if not gap.usable:
            raise UsageError(f"stage {name} failed ({gap.reason}): deepanalyze-rl {' '.join(argv)}")
        console.print(
            f"[red]stage {name} is still incomplete[/red] ({gap.reason}); its figures count what is "
            "missing as failures, and the next learn run resumes it",
            highlight=False,
        )

    def _save(self) -> None:
        self.path.write_text(json.dumps(self.done, indent=1) + "\n")

    def _execute(
        self, argv: list[str], outputs: Path | None, check: Callable[[Path, float], Gap | None] | None
    ) -> Gap | None:
        """Run the stage's command once; what is missing from its result, or None when complete."""
        console.print("deepanalyze-rl " + " ".join(argv), style="dim", markup=False, highlight=False)
        since = time.time()
        # its own process: every stage loads a model, and memory a finished stage held (a trainer,
        # an eval policy) goes back to the system before the next one starts
        code = subprocess.run([sys.executable, "-m", "deepanalyze_env.cli", *argv], check=False).returncode
        if check is not None and outputs is not None:
            gap = check(outputs, since)
            if gap is not None or code == 0:
                return gap
        if code != 0:
            return Gap(f"exit code {code}", usable=False)
        return None


@dataclass(frozen=True)
class Gap:
    """Why a stage is not complete, and whether what it left can still be read (an eval's report
    over its planned episodes, missing ones counted as failures)."""

    reason: str
    usable: bool


def eval_gap(folder: Path, since: float) -> Gap | None:
    """An eval is complete when it wrote its report in this run and no planned episode is missing."""
    report = folder / "report.json"
    if not report.is_file() or report.stat().st_mtime < since:
        return Gap("it wrote no report: it crashed", usable=False)
    counts = json.loads(report.read_text()).get("episodes") or {}
    if counts.get("missing"):
        return Gap(f"{counts['missing']} of {counts['planned']} planned episodes did not finish", usable=True)
    return None


def rollout_gap(folder: Path, since: float) -> Gap | None:
    """A rollout is complete when it rebuilt ``episodes.jsonl`` in this run with every planned
    episode in it (the SFT data of a partial reference run is what it kept, and says so)."""
    from deepanalyze_env.offline.eval_report import load_eval

    episodes = folder / "episodes.jsonl"
    if not episodes.is_file() or episodes.stat().st_mtime < since:
        return Gap("it wrote no episodes.jsonl: it crashed", usable=False)
    counts = load_eval(folder)[1]
    if counts.get("missing"):
        return Gap(f"{counts['missing']} of {counts['planned']} planned episodes did not finish", usable=True)
    return None


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
    if budget_source is not None and not recipe.rollout.get("budget_check"):
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
    if not pipe.chat_template_kwargs:
        return []
    return [f"trl.chat_template_kwargs={json.dumps(pipe.chat_template_kwargs, sort_keys=True)}"]


def template_kwargs(pipe: Pipeline) -> dict[str, Any]:
    """The chat template arguments every stage renders prompts with: the pipeline's
    ``chat_template_kwargs``, else the one its SFT and GRPO recipes set (``trl.chat_template_kwargs``;
    two different ones are an error), so SFT, the evals and the GRPO rollout see the same prompts."""

    if pipe.chat_template_kwargs:
        return pipe.chat_template_kwargs
    found = {}
    for name in ("sft", "grpo"):
        stage = getattr(pipe, name)
        if stage is not None:
            value = load_recipe(stage.recipe, stage.overrides()).trl.get("chat_template_kwargs")
            if value:
                found[name] = value
    if len({json.dumps(v, sort_keys=True) for v in found.values()}) > 1:
        raise ConfigError(
            f"{pipe.source}: the sft and grpo recipes set different trl.chat_template_kwargs "
            f"({found['sft']} vs {found['grpo']}); set the pipeline's chat_template_kwargs for both"
        )
    return next(iter(found.values()), {})


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


def run_pipeline(pipe: Pipeline, fresh: bool = False) -> dict[str, Any]:
    """Run every stage; returns the summary also written to ``learn.json``."""
    out = Path(pipe.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stages = Stages(out, fresh)
    start = time.monotonic()

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
    files = select_tasks(pipe, bank, out)
    if "dev" not in files or "train" not in files:
        raise ConfigError(f"{pipe.source}: a pipeline needs train and dev tasks")

    env = {"workspace_root": str(bank), **pipe.env}
    config = out / "env.yaml"
    config.write_text(yaml.safe_dump(env))

    dev: dict[str, dict[str, Any]] = {}
    model, order = pipe.model, []
    if pipe.eval.before:
        stages.run(
            "eval_base",
            "dev eval: the starting model",
            eval_argv(pipe, model, files["dev"], out / "eval-base", config),
            out / "eval-base",
            [files["dev"], config, *model_inputs(model)],
            resumable=True,
            check=eval_gap,
        )
        dev["base"] = headline(out / "eval-base")
        order.append("base")

    if pipe.sft is not None:
        reference = out / "reference"
        argv = ["rollout", "--policy", "scripted", "--labels", "good"]
        argv += ["--trajectories", str(bank / "trajectories.jsonl"), "--tasks", str(files["train"])]
        # the same env as the evals: a reference longer than max_turns is cut before its answer,
        # fails the gate and is not SFT data (it would teach the policy to run out of turns)
        argv += ["--config", str(config), "--out", str(reference)]
        argv += ["--keep", 'reward_status == "scored" and format_ok']
        stages.run(
            "reference",
            "SFT data: the train tasks' reference episodes through the env",
            argv,
            reference,
            [files["train"], config, bank / "trajectories.jsonl"],
            resumable=True,
            check=rollout_gap,
        )
        sft_dir = out / "sft"
        argv = ["train", pipe.sft.recipe, f"output_dir={sft_dir}", f"model={model}"]
        argv += [f"data=[{reference / 'kept.jsonl'}]", *pipe.sft.overrides(), *template_override(pipe)]
        inputs = [Path(pipe.sft.recipe), reference / "kept.jsonl", *model_inputs(model)]
        stages.run("sft", "SFT warm start", argv, sft_dir, inputs)
        model = str(sft_dir)
        if pipe.eval.after_sft or pipe.grpo is None:
            argv = eval_argv(pipe, model, files["dev"], out / "eval-sft", config)
            stages.run(
                "eval_sft",
                "dev eval: after SFT",
                argv,
                out / "eval-sft",
                [files["dev"], config, *model_inputs(model)],
                resumable=True,
                check=eval_gap,
            )
            dev["sft"] = headline(out / "eval-sft")
            order.append("sft")
    sampled = sampled_eval(pipe, stages, model, files, config) if pipe.eval.sampled_k else None

    grpo_steps: list[dict[str, Any]] = []
    if pipe.grpo is not None:
        grpo_dir = out / "grpo"
        pool, extra = grpo_inputs(pipe, stages, model, files, out, config)
        argv = ["train", pipe.grpo.recipe, f"output_dir={grpo_dir}", f"model={model}"]
        argv += [f"data=[{pool}]", f"env={json.dumps(env)}"]
        argv += [*pipe.grpo.overrides(), *extra, *template_override(pipe)]
        inputs = [Path(pipe.grpo.recipe), pool, *model_inputs(model)]
        if pipe.curriculum is not None:
            inputs.append(out / "estimate" / "episodes.jsonl")
        stages.run("grpo", "GRPO", argv, grpo_dir, inputs)
        model = str(grpo_dir)
        stages.run(
            "eval_grpo",
            "dev eval: after GRPO",
            eval_argv(pipe, model, files["dev"], out / "eval-grpo", config),
            out / "eval-grpo",
            [files["dev"], config, *model_inputs(model)],
            resumable=True,
            check=eval_gap,
        )
        dev["grpo"] = headline(out / "eval-grpo")
        order.append("grpo")
        metrics = grpo_dir / "metrics.jsonl"
        if metrics.is_file():
            grpo_steps = [
                {
                    k: s.get(k)
                    for k in (
                        "step",
                        "reward_mean",
                        "components",
                        "status_counts",
                        "rollout_seconds",
                        "time",
                        "teach",
                    )
                }
                for s in map(json.loads, filter(str.strip, metrics.read_text().splitlines()))
            ]

    test = None
    if "test" in files:
        stages.run(
            "eval_test",
            "test eval: the last model, once",
            eval_argv(pipe, model, files["test"], out / "eval-test", config),
            out / "eval-test",
            [files["test"], config, *model_inputs(model)],
            resumable=True,
            check=eval_gap,
        )
        test = headline(out / "eval-test")

    summary = {
        "pipeline": pipe.source,
        "coverage": coverage(dev),
        "model": model,
        "bank": str(bank),
        "task_files": {k: str(v) for k, v in files.items()},
        "tasks": {k: len(v.read_text().splitlines()) for k, v in files.items()},
        "dev": dev,
        "sampled": sampled,
        "test": test,
        "comparisons": compare_stages(out, order),
        "grpo_steps": grpo_steps,
        "seconds": stages.seconds | {"total": round(time.monotonic() - start, 1)},
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


# ---------------------------------------------------------------------------- output


def _f(value: Any) -> str:
    return "–" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _ci(interval: Any) -> str:
    return f"{_f(interval[0])} … {_f(interval[1])}" if interval else "–"


def comparison_lines(summary: dict[str, Any]) -> list[str]:
    """One line per pair of consecutive stages: the paired reward difference on dev."""
    lines = []
    for pair, metrics in summary["comparisons"].items():
        r = metrics["reward"]
        line = (
            f"{pair}: paired reward difference {_f(r['mean_diff'])} (95% CI {_ci(r.get('diff_ci95'))}, "
            f"{r.get('tasks')} tasks; later stage better on {r.get('b_better')}, "
            f"earlier on {r.get('a_better')})"
        )
        only_a, only_b = metrics.get("only_in_a") or [], metrics.get("only_in_b") or []
        if only_a or only_b:
            line += f"; UNPAIRED tasks left out: only earlier {only_a}, only later {only_b}"
        lines.append(line)
    return lines


def warning_lines(summary: dict[str, Any]) -> list[str]:
    """What makes the table less than a like-for-like comparison, said above it."""
    lines = []
    cov = summary.get("coverage") or {}
    if cov and not cov["same_tasks"]:
        lines.append(
            "NOT COMPARABLE: the stages cover different dev tasks ("
            + "; ".join(f"{stage} lacks {tasks}" for stage, tasks in cov["lacking"].items())
            + "); read the paired comparisons below, not the table's rows"
        )
    for stage, m in {**summary["dev"], **({"test": summary["test"]} if summary.get("test") else {})}.items():
        if m.get("missing"):
            lines.append(
                f"{stage}: {m['missing']} of {m['planned']} planned episodes did not finish (tasks "
                f"{', '.join(m['missing_tasks'])}); its figures count each as a failed gate (reward -1, "
                "accuracy 0)"
            )
        elif m.get("planned") is None:
            lines.append(f"{stage}: planned episodes unknown (its eval folder has no planned.json)")
    return lines


def _episodes(m: dict[str, Any]) -> str:
    if m.get("planned") is None:
        return f"{m['finished']} (planned ?)"
    return f"{m['finished']}/{m['planned']}"


def table(summary: dict[str, Any]) -> Table:
    t = Table(title="dev set, before and after training", title_justify="left")
    for name, justify in (("stage", "left"), ("finished/planned", "right"), ("format gate", "right")):
        t.add_column(name, justify=justify)
    for name in ("reward", "reward 95% CI", "accuracy"):
        t.add_column(name, justify="right")
    for stage, m in summary["dev"].items():
        ci = _ci(m.get("reward_ci95"))
        t.add_row(
            stage,
            _episodes(m),
            _f(m["format_gate_pass_rate"]),
            _f(m["reward_mean"]),
            ci,
            _f(m["accuracy"]),
        )
    return t


def markdown(summary: dict[str, Any]) -> str:
    lines = [f"**{line}**\n" for line in warning_lines(summary)]
    lines += [
        "Figures are over every planned episode; one that did not finish counts as a failed gate.\n",
        "| stage | finished/planned | format gate | reward | reward 95% CI | accuracy (pass@1) |",
        "|---|---|---|---|---|---|",
    ]
    for stage, m in summary["dev"].items():
        ci = _ci(m.get("reward_ci95"))
        lines.append(
            f"| {stage} | {_episodes(m)} | {_f(m['format_gate_pass_rate'])} | {_f(m['reward_mean'])} | {ci} "
            f"| {_f(m['accuracy'])} |"
        )
    lines += ["\n" + line for line in comparison_lines(summary)]
    lines.append("\nStage seconds: " + ", ".join(f"{k} {v}" for k, v in summary["seconds"].items()))
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    stages = list(summary["dev"])
    x = list(range(len(stages)))
    for key, label in (
        ("reward_mean", "reward"),
        ("format_gate_pass_rate", "format gate"),
        ("accuracy", "accuracy"),
    ):
        values = [summary["dev"][s][key] for s in stages]
        left.plot(x, [v if v is not None else float("nan") for v in values], marker="o", label=label)
    left.set_xticks(x, stages)
    left.set_ylim(-1.05, 1.05)
    left.set_title("dev set per stage")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    steps = summary["grpo_steps"]
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


# ---------------------------------------------------------------------------- command


def add_parser(sub: Any) -> None:
    p = make_parser(
        sub,
        "learn",
        "the learning pipeline: dev eval → SFT warm start → dev eval → GRPO → dev eval",
        "deepanalyze-rl learn recipes/learn_cpu.yaml eval.samples=2",
    )
    p.add_argument("pipeline", metavar="PIPELINE", help="pipeline YAML (recipes/learn_cpu.yaml)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. tasks.dev=20")
    p.add_argument("--fresh", action="store_true", help="rerun every stage (default: reuse finished ones)")
    p.set_defaults(func=cmd_learn)


def cmd_learn(args: argparse.Namespace) -> int:
    pipe = Pipeline.load(args.pipeline, args.overrides)
    summary = run_pipeline(pipe, fresh=args.fresh)
    console.print(Rule("[bold]result[/bold]"))
    for line in warning_lines(summary):
        console.print(line, style="bold red", highlight=False)
    console.print(table(summary))
    for line in comparison_lines(summary):
        console.print(line, highlight=False)
    out = Path(pipe.output_dir)
    console.print(f"run folder: {out} (learn.json, learn.md, learn.png, stages.json, one folder per stage)")
    return 0
