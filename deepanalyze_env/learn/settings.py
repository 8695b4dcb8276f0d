"""A ``learn`` pipeline file as typed settings: the splits, the evals, the training stages and the
curriculum seed, validated when the file is loaded so a wrong key fails before any stage runs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from deepanalyze_env.core.config import ConfigError, EnvConfig
from deepanalyze_env.core.contracts import JsonObject, JsonValue
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
    set: dict[str, JsonValue] = field(default_factory=dict)  # curriculum fields (kind: success_rate implied)


@dataclass
class StageRecipe:
    """A training stage: a recipe file (relative to the pipeline file) and overrides on top."""

    recipe: str
    set: dict[str, JsonValue] = field(default_factory=dict)  # dotted recipe key -> value

    def overrides(self) -> list[str]:
        """``key=value`` arguments for ``train``: one per leaf, so an override changes one key
        and never replaces a whole recipe section."""
        return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in self.set.items()]


@dataclass
class RftSettings(StageRecipe):
    """Rejection-sampling fine-tuning (expert iteration), stage ``rft``: each round samples ``k``
    episodes per train task from the current model, keeps the correct ones (scored, through the
    format gate, accuracy at or above ``threshold``: ``offline/correct.py``, the eval report's
    accuracy) and fine-tunes the model on them with the SFT recipe (``recipe`` and ``set``, as an
    ``sft`` stage); the next round starts from that model."""

    k: int = 4
    """Episodes sampled per task and round (more finds a correct episode on harder tasks)."""
    temperature: float = 0.7
    """Sampling temperature of the rounds' samples (0 would give k copies of one episode)."""
    max_tokens: int | None = None
    """Tokens per policy turn in the samples; None: the pipeline's ``eval.max_tokens``."""
    tasks: int = 0
    """Train tasks sampled each round, family-stratified and seeded (0: every train task)."""
    rounds: int = 1
    """Sample-select-fine-tune rounds, each from the previous round's model; a round that keeps
    no episode ends them (the next would sample the same model again)."""
    threshold: float = 1.0
    """An episode is correct when its accuracy is at or above this (eval's ``--pass-threshold``);
    0 keeps every scored episode that passed the gate of a method with an accuracy component."""
    eval_rounds: bool = False
    """Evaluate on dev after every round (``eval-rft1/`` …); off: only after the last (``eval-rft/``)."""

    def check(self, where: str) -> None:
        """Bounds, one line each; a YAML integer temperature or threshold becomes a float here."""
        self.temperature, self.threshold = float(self.temperature), float(self.threshold)
        if self.k < 1 or self.rounds < 1 or self.tasks < 0:
            raise ConfigError(f"{where}: rft needs k >= 1, rounds >= 1 and tasks >= 0")
        if self.temperature < 0:
            raise ConfigError(f"{where}: rft.temperature must be >= 0")


RFT_KEYS = tuple(f.name for f in fields(RftSettings) if f.name not in ("recipe", "set"))


def flatten(mapping: JsonObject, prefix: str = "") -> dict[str, JsonValue]:
    """``{"trl": {"beta": 0}, "trl.lr": 1}`` -> ``{"trl.beta": 0, "trl.lr": 1}``: a stage's ``set``
    may be written nested (YAML) or dotted (the file, or ``grpo.set.trl.beta=0`` on the command
    line, which arrives nested)."""
    out: dict[str, JsonValue] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


@dataclass(frozen=True)
class BankSlice:
    """Which part of the task bank the pipeline builds and samples from (``bank build``'s flags)."""

    families: tuple[str, ...] = ()  # none: every family
    tables: tuple[str, ...] = ()  # none: every table
    seed: int | None = None  # None: the bank's default seed

    @classmethod
    def load(cls, section: JsonValue, where: str) -> BankSlice:
        if not isinstance(section, dict):
            raise ConfigError(f"{where}: bank must be a mapping (families, tables, seed)")
        unknown = [k for k in section if k not in ("families", "tables", "seed")]
        if unknown:
            raise ConfigError(f"{where}: unknown key bank.{unknown[0]} (known: families, tables, seed)")
        names = {}
        for key in ("families", "tables"):
            value = section.get(key) or []
            if not isinstance(value, list):
                raise ConfigError(f"{where}: bank.{key} must be a list of names")
            names[key] = tuple(str(v) for v in value)
        seed = section.get("seed")
        if seed is not None and not isinstance(seed, int):
            raise ConfigError(f"{where}: bank.seed must be an integer")
        return cls(names["families"], names["tables"], seed)


@dataclass
class SftStage(StageRecipe):
    """The SFT stage: its recipe, and how many of the train tasks' reference episodes it trains on
    (``references``: a seeded, family-stratified sample; ``all``, the default: every one that passed)."""

    references: int | None = None  # None: all

    @classmethod
    def of(cls, stage: StageRecipe | None, section: JsonValue, where: str) -> SftStage | None:
        """The ``sft`` section's stage (``stage``: its recipe and ``set``, read as every stage's)."""
        if stage is None or not isinstance(section, dict):
            return None
        if unknown := [k for k in section if k not in SFT_KEYS]:
            raise ConfigError(f"{where}: unknown key sft.{unknown[0]} (known: {', '.join(SFT_KEYS)})")
        value = section.get("references", "all")
        if value == "all":
            return cls(stage.recipe, stage.set)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"{where}: sft.references must be a positive number of episodes or 'all', got {value!r}"
            )
        return cls(stage.recipe, stage.set, value)


SFT_KEYS = ("recipe", "set", "references")  # the sft section's keys


@dataclass
class Pipeline:
    """A ``learn`` pipeline file (``recipes/learn_cpu.yaml`` documents every key)."""

    output_dir: str
    model: str = "embedded:smollm2"
    bank: BankSlice = field(default_factory=BankSlice)
    tasks: dict[str, int] = field(default_factory=dict)  # split -> how many tasks (0: none)
    env: JsonObject = field(default_factory=dict)  # the env config (EnvConfig's keys), checked on load
    eval: EvalSettings = field(default_factory=EvalSettings)
    sft: SftStage | None = None
    grpo: StageRecipe | None = None
    rft: RftSettings | None = None  # rejection-sampling fine-tuning after SFT, before GRPO
    curriculum: CurriculumSettings | None = None  # None: GRPO samples tasks as its recipe says
    seed: int = 0  # the task sample
    # chat template arguments for every stage's prompts (SFT, evals, GRPO): Qwen3's enable_thinking
    chat_template_kwargs: JsonObject = field(default_factory=dict)
    # a chat template for every stage (``trl:NAME`` or a file, relative to the pipeline file):
    # ``env.action_format: tools`` needs one that renders tool calls
    chat_template: str | None = None
    source: str = ""

    @property
    def tools(self) -> bool:
        """Whether the pipeline's episodes are played in the tools format."""
        return self.env.get("action_format") == "tools"

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
        for name in ("sft", "grpo", "rft"):
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
        sft = SftStage.of(stages["sft"], tree.get("sft"), str(path))
        rft = _rft(tree.get("rft"), stages.pop("rft"), path)
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
            bank=BankSlice.load(tree.get("bank") or {}, str(path)),
            tasks={k: int(v) for k, v in (tree.get("tasks") or {}).items()},
            env=env,
            eval=settings,
            sft=sft,
            grpo=stages["grpo"],
            rft=rft,
            curriculum=curriculum,
            seed=int(tree.get("seed", 0)),
            chat_template_kwargs=dict(kwargs),
            chat_template=_template_ref(tree.get("chat_template"), path),
            source=str(path),
        )
        if pipe.tools and curriculum is not None:
            raise ConfigError(
                f"{path}: curriculum seeds our rollout_func's sampler; with env.action_format: tools GRPO "
                "runs through TRL's environment_factory, which it cannot seed yet"
            )
        pipe.chat_template_kwargs = template_kwargs(pipe)
        return pipe


def _rft(section: JsonValue, stage: StageRecipe | None, path: Path) -> RftSettings | None:
    """The ``rft`` section: its recipe and ``set`` read as any stage's, then its own keys."""
    if stage is None or not isinstance(section, dict):
        return None
    unknown = [k for k in section if k not in ("recipe", "set", *RFT_KEYS)]
    if unknown:
        raise ConfigError(f"{path}: unknown key rft.{unknown[0]} (known: recipe, set, {', '.join(RFT_KEYS)})")
    try:
        rft = RftSettings(stage.recipe, stage.set, **{k: section[k] for k in RFT_KEYS if k in section})
    except TypeError as exc:
        raise ConfigError(f"{path}: rft: {exc}")
    rft.check(str(path))
    return rft


def _template_ref(ref: JsonValue, path: Path) -> str | None:
    """The pipeline's ``chat_template`` as the stages take it: ``trl:NAME`` as is, a file made
    absolute against the pipeline file's folder (the stages run elsewhere); checked now."""
    if ref is None:
        return None
    from deepanalyze_env.generation.chat_templates import chat_template_text

    ref = str(ref)
    chat_template_text(ref, path.parent, f"{path}: chat_template")
    return ref if ref.startswith("trl:") else str((path.parent / Path(ref).expanduser()).resolve())


def template_kwargs(pipe: Pipeline) -> JsonObject:
    """The chat template arguments every stage renders prompts with: the pipeline's
    ``chat_template_kwargs``, else the one its SFT, GRPO and RFT recipes set (``trl.chat_template_kwargs``;
    two different ones are an error), so SFT, the evals and the GRPO rollout see the same prompts."""

    if pipe.chat_template_kwargs:
        return pipe.chat_template_kwargs
    found = {}
    for name in ("sft", "grpo", "rft"):
        stage = getattr(pipe, name)
        if stage is not None:
            value = load_recipe(stage.recipe, stage.overrides()).trl.get("chat_template_kwargs")
            if value:
                found[name] = value
    if len({json.dumps(v, sort_keys=True) for v in found.values()}) > 1:
        raise ConfigError(
            f"{pipe.source}: the {' and '.join(found)} recipes set different trl.chat_template_kwargs "
            f"({' vs '.join(str(v) for v in found.values())}); set the pipeline's chat_template_kwargs"
        )
    return next(iter(found.values()), {})


def is_pipeline_file(path: str | Path) -> bool:
    """Whether ``path`` is a ``learn`` pipeline file (no ``backend``, only pipeline keys): what
    ``train`` says when it is given one instead of a recipe."""
    try:
        tree = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return False
    known = {f.name for f in fields(Pipeline)} - {"source"}
    return isinstance(tree, dict) and "backend" not in tree and bool(tree) and set(tree) <= known
