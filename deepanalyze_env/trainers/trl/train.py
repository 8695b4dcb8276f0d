"""``deepanalyze-rl train`` with ``backend: trl``: GRPO on one node through ``trl.GRPOTrainer``.

Everything the trainer needs comes from the recipe; what it produces lands in ``output_dir``:
trainer logs, ``metrics.jsonl`` (one line per step), the episode records as ``episodes.jsonl``,
``reward_curves.png`` and the trained weights with the tokenizer (a model folder).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

from rich.console import Console
from rich.table import Table

from deepanalyze_env.core import tool_calls
from deepanalyze_env.core.config import ConfigError, EnvConfig
from deepanalyze_env.core.contracts import JsonObject, verifier_error_rates
from deepanalyze_env.core.hacking import SuspectSummary, summarize
from deepanalyze_env.core.memory import PeakFigures, PeakWatch, gib
from deepanalyze_env.core.records import load_run, write_jsonl_atomic
from deepanalyze_env.core.row_check import BadRowsError, check_rows
from deepanalyze_env.core.tasks import load_rows, with_task_ids
from deepanalyze_env.generation.interfaces import Tokenizer
from deepanalyze_env.generation.models import load_tokenizer, resolve_model
from deepanalyze_env.generation.turn_end import turn_stops
from deepanalyze_env.trainers.curriculum import SuccessRateCurriculum, accuracy_tasks
from deepanalyze_env.trainers.recipes import Recipe
from deepanalyze_env.trainers.trl.budgets import CUT_TARGET, BudgetFit, measure_budgets
from deepanalyze_env.trainers.trl.policy import load_trainable
from deepanalyze_env.trainers.trl.progress import quiet_console
from deepanalyze_env.trainers.trl.rollout_func import (
    DeepAnalyzeRollout,
    RolloutStats,
    environment_reward,
    trl_dataset_rows,
)
from deepanalyze_env.trainers.trl.sft_data import load_records
from deepanalyze_env.trainers.trl.skip_rows import SkippedRows, skip_inert_rows

if TYPE_CHECKING:
    from transformers import Trainer
    from trl import GRPOConfig

log = logging.getLogger(__name__)
console = Console()

TrainerLogs = dict[str, float]
"""What ``Trainer.log`` hands its callbacks for a step: TRL's scalars by name."""


class StepTime(TypedDict):
    """Where a step's wall time went (seconds)."""

    step_s: float
    rollout_s: float
    generate_s: float
    env_s: float
    scoring_s: float
    update_s: float  # the rest of the step: log-probs, loss, backward and the optimizer step


class StepTeach(TypedDict):
    """Whether the step could teach."""

    episodes_trained: int
    length_cut: int
    groups: int
    zero_variance_groups: int
    loss_nonzero: bool | None  # None: the step logged no loss
    update_rows: NotRequired[int]  # rows the update saw (trainers/trl/skip_rows.py)
    update_rows_skipped: NotRequired[int]  # of them, rows whose forward/backward was skipped (inert)


class StepLine(TypedDict):
    """One line of ``metrics.jsonl`` (docs/design.md §11)."""

    step: int
    reward_mean: float | None
    reward_std: float | None
    components: dict[str, float]
    status_counts: dict[str, int]
    verifier_error_rates: dict[str, float]  # cause → share of the step's episodes (every cause)
    termination_counts: dict[str, int]
    episodes: int
    rollout_seconds: float
    elapsed_seconds: float
    time: StepTime
    teach: StepTeach
    trainer: dict[str, float]
    suspect: SuspectSummary
    memory: NotRequired[dict[str, PeakFigures]]
    curriculum: NotRequired[dict[str, object]]  # SuccessRateCurriculum.drain()


def _judge_defaults(env: JsonObject, policy_dir: str) -> None:
    """``judge.model: policy`` (or none) on the transformers backend means the policy's weights;
    a ``judge.base_url`` given on the command line switches the backend to ``openai``."""
    judge = env.get("judge")
    if not judge or not isinstance(judge, dict):  # a mapping: the recipe's env passed EnvConfig
        return
    if judge.get("base_url") and judge.get("backend") in (None, "transformers"):
        judge["backend"] = "openai"
    if judge.get("backend") == "transformers" and judge.get("model") in (None, "policy"):
        judge["model"] = policy_dir


def trainer_args(recipe: Recipe, out: Path, cuda: bool) -> JsonObject:
    """The recipe's ``trl:`` section with the defaults every TRL backend applies (GRPO and SFT):
    CPU without bf16 when there is no GPU, no external loggers, a log line per step, no
    intermediate checkpoints (the final model is saved in ``output_dir``)."""
    args = dict(recipe.trl)
    args["output_dir"] = str(out)
    args["max_steps"] = recipe.max_steps
    if not cuda:
        args.setdefault("use_cpu", True)
        args.setdefault("bf16", False)
    args.setdefault("report_to", "none")
    args.setdefault("logging_steps", 1)
    args.setdefault("save_strategy", "no")
    return args


TRUNCATING = {"top_k": (0, -1), "top_p": (1.0,), "min_p": (0.0,)}
"""Sampling options that cut the distribution's tail, with their values that cut nothing."""


def refuse_truncated_sampling(args: JsonObject, where: str) -> None:
    """GRPO's loss scores each sampled token under the full (tempered) distribution; a turn
    sampled from a truncated one (``top_k``, ``top_p``, ``min_p``) is then scored under a
    distribution it was not drawn from, a silent bias in every ratio and gradient. So a GRPO
    recipe that truncates (as a ``GRPOConfig`` field or in ``generation_kwargs``) is refused."""
    gen = args.get("generation_kwargs")
    places = [("trl", args), ("trl.generation_kwargs", gen if isinstance(gen, dict) else {})]
    for prefix, section in places:
        for key, neutral in TRUNCATING.items():
            value = section.get(key)
            if value is not None and value not in neutral:
                raise ConfigError(
                    f"{where}: {prefix}.{key}={value} truncates the sampling distribution, but GRPO's "
                    "loss scores the full one: remove it (only temperature is allowed)"
                )


def _grpo_config(recipe: Recipe, out: Path, cuda: bool) -> GRPOConfig:
    import trl

    args = trainer_args(recipe, out, cuda)
    refuse_truncated_sampling(args, recipe.source)
    args.setdefault("mask_truncated_completions", not recipe.rollout.get("score_truncated", False))
    if args.get("use_vllm"):
        gen = dict(args.get("generation_kwargs") or {})
        if "max_tokens" in gen:
            raise ConfigError(
                f"{recipe.source}: trl.generation_kwargs.max_tokens would override every turn's cap; "
                "set rollout.max_turn_tokens (per turn) and trl.max_completion_length (per episode)"
            )
        gen.setdefault("stop", list(turn_stops().strings))
        gen.setdefault("include_stop_str_in_output", True)
        args["generation_kwargs"] = gen
    try:
        return trl.GRPOConfig(**args)
    except TypeError as exc:
        raise ConfigError(f"{recipe.source}: bad trl setting: {exc}")


def add_stop_token_ids(config: GRPOConfig, tokenizer: Tokenizer) -> None:
    """Closing tags that are special tokens (DeepAnalyze's tokenizer) end a vLLM turn by id: vLLM
    matches stop strings against text that skips special tokens, so ``</Code>`` would never fire.
    Raises ValueError for a tokenizer whose stop tags cannot end a turn at all."""
    stop_ids = turn_stops(tokenizer).token_ids
    if getattr(config, "use_vllm", False) and stop_ids:
        gen = dict(config.generation_kwargs or {})
        gen["stop_token_ids"] = list(dict.fromkeys([*(gen.get("stop_token_ids") or []), *stop_ids]))
        config.generation_kwargs = gen


def _step_table(step: int, stats: RolloutStats, logs: TrainerLogs, line: StepLine) -> Table:
    table = Table(
        title=f"step {step}: {stats.episodes} episodes in {stats.seconds:.1f}s", title_justify="left"
    )
    table.add_column("reward / component")
    table.add_column("mean", justify="right")
    table.add_column("n", justify="right")
    if stats.rewards:
        table.add_row(
            "reward (trained)", f"{sum(stats.rewards) / len(stats.rewards):+.3f}", str(len(stats.rewards))
        )
    for name, values in sorted(stats.components.items()):
        table.add_row(name, f"{sum(values) / len(values):.3f}", str(len(values)))
    for kind, counts in (("status", stats.statuses), ("termination", stats.terminations)):
        table.add_row(kind, ", ".join(f"{k}={v}" for k, v in sorted(counts.items())), "")
    excluded = {k: v for k, v in line["verifier_error_rates"].items() if v}
    if excluded:
        table.add_row("verifier_error by cause", ", ".join(f"{k}={v:.0%}" for k, v in excluded.items()), "")
    if "loss" in logs:
        table.add_row("loss", f"{logs['loss']:.4f}", "")
    time_, teach = line["time"], line["teach"]
    loss_word = {True: "non-zero", False: "zero", None: "n/a"}[teach["loss_nonzero"]]
    table.add_row(
        "time (s)",
        f"rollout {time_['rollout_s']:.1f} (generate {time_['generate_s']:.1f}, env {time_['env_s']:.1f}, "
        f"scoring {time_['scoring_s']:.1f}), update {time_['update_s']:.1f}",
        "",
    )
    memory = line.get("memory") or {}
    if memory:
        table.add_row(
            "peak memory",
            ", ".join(
                f"{phase} {gib(f['peak_pss_bytes'])} PSS / {gib(f['peak_rss_bytes'])} RSS"
                for phase, f in memory.items()
            ),
            "",
        )
    table.add_row(
        "can teach",
        f"trained {teach['episodes_trained']}/{stats.episodes}, length-cut {teach['length_cut']}, "
        f"zero-variance groups {teach['zero_variance_groups']}/{teach['groups']}, "
        f"update skipped {teach.get('update_rows_skipped', 0)}/{teach.get('update_rows', 0)} rows, "
        f"loss {loss_word}",
        "",
    )
    if line["suspect"]["count"]:
        watch = line["suspect"]
        reasons = ", ".join(f"{k}={v}" for k, v in watch["reasons"].items())
        table.add_row("suspect", f"{watch['count']} ({reasons}): {' '.join(watch['episode_ids'][:3])}", "")
    return table


def read_step_lines(path: Path) -> list[StepLine]:
    """A GRPO run's ``metrics.jsonl`` (none when it wrote no file)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def step_line(
    step: int, stats: RolloutStats, logs: TrainerLogs, step_seconds: float, elapsed: float
) -> StepLine:
    """One ``metrics.jsonl`` line: rewards and counts, where the step's time went, and whether it
    could teach (trained episodes, length cuts, zero-variance groups, a non-zero loss)."""
    rewards = stats.rewards
    mean = sum(rewards) / len(rewards) if rewards else None
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if rewards else None
    loss = logs.get("loss")
    return {
        "step": step,
        "reward_mean": mean,
        "reward_std": std,
        "components": {k: sum(v) / len(v) for k, v in stats.components.items()},
        "status_counts": dict(stats.statuses),
        # exclusions by cause, every cause present: a rising line is a policy learning to be excluded
        "verifier_error_rates": dict(verifier_error_rates(stats.ended)),
        "termination_counts": dict(stats.terminations),
        "episodes": stats.episodes,
        "rollout_seconds": round(stats.seconds, 3),
        "elapsed_seconds": round(elapsed, 3),
        "time": {
            "step_s": round(step_seconds, 3),
            "rollout_s": round(stats.seconds, 3),
            "generate_s": round(stats.generate_seconds, 3),
            "env_s": round(stats.env_seconds, 3),
            "scoring_s": round(stats.scoring_seconds, 3),
            # the rest of the step: log-probs, loss, backward and the optimizer step
            "update_s": round(max(step_seconds - stats.seconds, 0.0), 3),
        },
        "teach": {
            "episodes_trained": len(rewards),
            "length_cut": stats.terminations.get("length", 0),
            "groups": stats.groups,
            "zero_variance_groups": stats.zero_variance_groups,
            "loss_nonzero": (abs(float(loss)) > 0.0) if isinstance(loss, int | float) else None,
        },
        "trainer": {k: v for k, v in logs.items() if isinstance(v, int | float)},
        "suspect": summarize(stats.suspects),  # the reward-hacking watch (core/hacking.py)
    }


def build_curriculum(recipe: Recipe, rows: list[JsonObject], seed: int) -> SuccessRateCurriculum | None:
    """The recipe's curriculum over the rows in dataset order, seeded from earlier records; the
    rows whose plan has an accuracy component are judged on accuracy (``accuracy_tasks``)."""
    config = recipe.curriculum
    if config is None:
        return None
    task_ids = [str(r["task_id"]) for r in rows]
    accuracy = accuracy_tasks(rows, config)
    if config.from_records:
        return SuccessRateCurriculum.from_records(config.from_records, task_ids, config, seed, accuracy)
    return SuccessRateCurriculum(task_ids, config, seed, accuracy)


def step_memory(watch: PeakWatch | None) -> dict[str, PeakFigures]:
    """The step's peak memory per phase (``rollout``, ``update``; ``setup`` in the first step: model
    loading and the trainer's construction), of the whole process tree (kernel workers included)."""
    return watch.drain() if watch is not None else {}


def _make_callback(
    rollout: DeepAnalyzeRollout,
    out: Path,
    curriculum: SuccessRateCurriculum | None = None,
    watch: PeakWatch | None = None,
    skipped: SkippedRows | None = None,
):
    from transformers import TrainerCallback

    class StepReporter(TrainerCallback):
        """Writes ``metrics.jsonl`` and prints the per-step table of components and statuses."""

        def __init__(self) -> None:
            self.path = out / "metrics.jsonl"
            self.started = time.monotonic()
            self.step_started: float | None = None
            self.step_seconds = 0.0  # wall time of the steps since the last logged line

        def on_step_begin(self, args, state, control, **kwargs):
            self.step_started = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if self.step_started is not None:
                self.step_seconds += time.monotonic() - self.step_started
                self.step_started = None

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = dict(logs or {})
            if "reward" not in logs and "loss" not in logs:
                return
            stats = rollout.drain()
            step_seconds, self.step_seconds = self.step_seconds, 0.0
            if not getattr(state, "is_world_process_zero", True):  # one writer under accelerate launch
                return
            line = step_line(state.global_step, stats, logs, step_seconds, time.monotonic() - self.started)
            line["memory"] = step_memory(watch)
            if skipped is not None:
                line["teach"]["update_rows_skipped"], line["teach"]["update_rows"] = skipped.drain()
            if curriculum is not None:
                line["curriculum"] = curriculum.drain()
            with open(self.path, "a") as fh:
                fh.write(json.dumps(line) + "\n")
            console.print(_step_table(state.global_step, stats, logs, line))

    return StepReporter()


def _collect_records(records_dir: Path, out: Path) -> int:
    """``episodes.jsonl`` from every process's records file (deduplicated by episode id)."""
    if not any(records_dir.glob("episodes-*.jsonl")):
        return 0
    return write_jsonl_atomic(out / "episodes.jsonl", load_run(records_dir).records)


def plot_reward_curves(metrics_path: Path, png_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    if not lines:
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    steps = [line["step"] for line in lines]
    ax.plot(steps, [line["reward_mean"] for line in lines], marker="o", linewidth=2, label="reward (trained)")
    names = sorted({name for line in lines for name in line["components"]})
    for name in names:
        ax.plot(steps, [line["components"].get(name) for line in lines], marker=".", label=name, alpha=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("mean over the step's episodes")
    ax.set_title("reward and components per step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def budget_check(recipe: Recipe, tokenizer: Tokenizer, max_completion_length: int) -> BudgetFit | None:
    """``rollout.budget_check``: measure those records against the run's budgets and say what
    would be cut (a warning past ``CUT_TARGET``, never a refusal: the user may mean it)."""
    source = recipe.rollout.get("budget_check")
    if not source:
        return None
    try:
        records = load_records([str(source)])
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{recipe.source}: rollout.budget_check {source}: {exc}")
    fit = measure_budgets(
        tokenizer,
        records,
        max_completion_length=max_completion_length,
        max_turn_tokens=recipe.rollout.get("max_turn_tokens"),
    )
    style = "yellow" if fit.cut_fraction > CUT_TARGET else "green"
    for line in fit.lines():
        console.print(line, style=style, markup=False, highlight=False)
    return fit


def train_trl(recipe: Recipe, check: bool = False) -> int:
    """Run a ``backend: trl`` recipe; ``check`` validates everything (GRPOConfig, rows, tokenizer)
    and prints what would run, touching nothing on disk. ``env.action_format: tools`` trains
    through TRL's ``environment_factory`` (:func:`train_with_tools`), tags through our
    ``rollout_func``."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental; we know
    try:
        import torch
        import trl
        from datasets import Dataset

        from deepanalyze_env.trainers.trl.curriculum_sampler import curriculum_trainer_class
    except ImportError as exc:
        raise ConfigError(f"backend trl needs the trl extra: pip install -e '.[trl]' ({exc})")

    out = Path(recipe.output_dir)
    cuda = torch.cuda.is_available()
    config = _grpo_config(recipe, out, cuda)  # the cheapest check first
    model_dir = resolve_model(recipe.model)
    env_config = dict(recipe.env)
    own_records = not env_config.get("records_dir")
    if own_records:
        env_config["records_dir"] = str(out / "records")
    records_dir = Path(str(env_config["records_dir"]))
    _judge_defaults(env_config, model_dir)
    rows = with_task_ids(load_rows(recipe.data, env_config.get("workspace_root")))
    if not rows:
        raise ConfigError(f"{recipe.source}: the data files hold no tasks")
    env = EnvConfig.from_any(env_config)
    bad, checked = check_rows(((", ".join(recipe.data), i, row) for i, row in enumerate(rows)), env)
    if bad:  # every bad row at once, before any model is loaded
        raise BadRowsError(bad, checked)
    tokenizer = load_tokenizer(recipe.model, where=recipe.source)
    template = recipe.chat_template_text()
    if template is not None:
        tokenizer.chat_template = template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if env.action_format == "tools":
        return train_with_tools(recipe, check, config, rows, env_config, tokenizer, checked, own_records)
    rollout_args = {k: v for k, v in recipe.rollout.items() if k != "budget_check"}
    rollout = DeepAnalyzeRollout(rows, env_config, **rollout_args)
    curriculum = build_curriculum(recipe, rows, config.seed)
    if curriculum is not None:
        rollout.listeners.append(curriculum.observe)
    try:
        add_stop_token_ids(config, tokenizer)
    except ValueError as exc:
        raise ConfigError(f"{recipe.source}: {exc}")
    fit = budget_check(recipe, tokenizer, config.max_completion_length)
    if check:
        console.print_json(
            data={
                "recipe": dataclasses.asdict(recipe),
                "rows_checked": checked,
                "stop_token_ids": (config.generation_kwargs or {}).get("stop_token_ids"),
                "max_completion_length": config.max_completion_length,
                "num_generations": config.num_generations,
                "budget_check": fit.as_dict() if fit is not None else None,
            },
            default=str,
        )
        return 0

    # Everything is validated: only now does the run touch its output folder.
    _clean_output(out, own_records)
    if fit is not None:
        (out / "budgets.json").write_text(json.dumps(fit.as_dict(), indent=1) + "\n")
    skipped = SkippedRows()
    trainer_class = skip_inert_rows(trl.GRPOTrainer, skipped)
    if curriculum is not None:
        trainer_class = curriculum_trainer_class(trainer_class, curriculum)
    watch = PeakWatch(phase_name="setup").start()
    rollout.memory = watch
    trainer = trainer_class(
        model=load_trainable(model_dir, cuda),
        reward_funcs=[environment_reward],
        args=config,
        train_dataset=Dataset.from_list(trl_dataset_rows(rows)),
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=[_make_callback(rollout, out, curriculum, watch, skipped)],
    )
    try:
        return _train_and_save(trainer, tokenizer, out, records_dir)
    finally:
        watch.stop()


def train_with_tools(
    recipe: Recipe,
    check: bool,
    config: GRPOConfig,
    rows: list[JsonObject],
    env_config: JsonObject,
    tokenizer: Tokenizer,
    checked: int,
    own_records: bool,
) -> int:
    """The ``tools`` action format on TRL: ``GRPOTrainer(environment_factory=…)``, the env owning
    the reward through ``get_reward`` (no ``rollout_func``, no reward function of ours). TRL runs
    the tool loop, so the ``rollout`` section and the curriculum (which listens to our rollout)
    do not apply; the tokenizer's chat template must render tool calls (``chat_template``)."""
    import torch
    import trl
    from datasets import Dataset
    from trl.chat_template_utils import supports_tool_calling

    from deepanalyze_env.trainers.trl.environment import (
        environment_factory,
        episode_metrics,
        tool_dataset_rows,
    )

    where = recipe.source
    if recipe.curriculum is not None:
        raise ConfigError(f"{where}: curriculum is not supported with env.action_format: tools yet")
    if recipe.rollout:
        raise ConfigError(f"{where}: rollout settings are for our rollout_func; with tools TRL runs the loop")
    if recipe.trl.get("reward_weights") is not None:
        raise ConfigError(f"{where}: with tools the env owns the reward (get_reward): no trl.reward_weights")
    if not supports_tool_calling(tokenizer):
        raise ConfigError(
            f"{where}: env.action_format: tools needs a chat template that renders tool calls; "
            "set chat_template (e.g. chat_template: trl:qwen3)"
        )
    out = Path(recipe.output_dir)
    if check:
        console.print_json(
            data={
                "recipe": dataclasses.asdict(recipe),
                "rows_checked": checked,
                "action_format": "tools",
                "trainer": "GRPOTrainer(environment_factory=…)",
                "tools": [s["function"]["name"] for s in tool_calls.tool_schemas()],
                "max_completion_length": config.max_completion_length,
                "num_generations": config.num_generations,
            },
            default=str,
        )
        return 0
    _clean_output(out, own_records)
    factory = environment_factory(env_config)
    config.reward_weights = [0.0]  # episode_metrics only logs; get_reward (weight 1) is the reward
    trainer = trl.GRPOTrainer(
        model=load_trainable(resolve_model(recipe.model), torch.cuda.is_available()),
        reward_funcs=[episode_metrics],
        args=config,
        train_dataset=Dataset.from_list(tool_dataset_rows(rows, env_config)),
        processing_class=tokenizer,
        environment_factory=factory,
    )
    records_dir = Path(str(env_config["records_dir"]))
    return _train_and_save(trainer, tokenizer, out, records_dir, before_records=factory.close)


def _clean_output(out: Path, own_records: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("metrics.jsonl", "episodes.jsonl"):
        (out / stale).unlink(missing_ok=True)
    if own_records:  # our own folder: start it empty so runs never mix
        for old in (out / "records").glob("episodes-*.jsonl"):
            old.unlink()


def _train_and_save(
    trainer: Trainer,
    tokenizer: Tokenizer,
    out: Path,
    records_dir: Path,
    before_records: Callable[[], None] | None = None,
) -> int:
    quiet_console(trainer, console, "GRPO")
    trainer.train()
    if before_records is not None:  # e.g. the environment_factory's last open episodes
        before_records()
    trainer.save_model(str(out))  # the trained policy: a model folder for `eval --model` or another recipe
    if not trainer.is_world_process_zero():  # the other ranks' episodes are in their records files
        return 0
    tokenizer.save_pretrained(str(out))
    n = _collect_records(records_dir, out)
    if (out / "metrics.jsonl").is_file():
        plot_reward_curves(out / "metrics.jsonl", out / "reward_curves.png")
    console.print(f"done: {n} episodes in {out / 'episodes.jsonl'}; curves in {out / 'reward_curves.png'}")
    return 0
