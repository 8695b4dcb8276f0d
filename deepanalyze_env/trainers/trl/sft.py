"""``deepanalyze-rl train`` with ``backend: trl-sft``: the SFT warm start through ``trl.SFTTrainer``.

Records named by ``data`` are selected (``sft.statuses``, ``sft.keep``), rendered as the GRPO
trainers see an episode (:mod:`deepanalyze_env.trainers.trl.sft_data`) and trained on with loss
on policy tokens only. ``output_dir`` ends as a model folder (weights, config, tokenizer) that a GRPO recipe
accepts as ``model``, plus ``metrics.jsonl`` (one line per logged step), ``sft_data.json``
(which records, how many tokens carried loss) and ``loss_curve.png``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from rich.console import Console
from rich.table import Table

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.core.filters import FilterError
from deepanalyze_env.generation.models import load_tokenizer, resolve_model
from deepanalyze_env.trainers.recipes import Recipe
from deepanalyze_env.trainers.trl.policy import load_trainable
from deepanalyze_env.trainers.trl.progress import quiet_console
from deepanalyze_env.trainers.trl.sft_data import (
    IGNORE_INDEX,
    USABLE_STATUSES,
    SFTDataError,
    load_records,
    render_episode,
    select_records,
)

if TYPE_CHECKING:
    from datasets import Dataset
    from trl import SFTConfig

log = logging.getLogger(__name__)
console = Console()


def _sft_config(recipe: Recipe, out: Path, cuda: bool):
    import trl

    from deepanalyze_env.trainers.trl.train import trainer_args

    args = trainer_args(recipe, out, cuda)
    args.setdefault("max_length", None)  # never cut an episode silently; set it to bound memory
    args.setdefault("dataset_num_proc", None)
    # GRPOConfig's chat_template_kwargs (SFTConfig has none): SFT renders its prompts with the
    # same arguments, so the prompts it trains on end as the GRPO rollout's and the eval's do
    template_kwargs = args.pop("chat_template_kwargs", None) or {}
    if not isinstance(template_kwargs, dict):
        raise ConfigError(
            f"{recipe.source}: trl.chat_template_kwargs must be a mapping, got {template_kwargs!r}"
        )
    try:
        return trl.SFTConfig(**args), template_kwargs
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{recipe.source}: bad trl setting: {exc}")


def _selection(recipe: Recipe):
    statuses = recipe.sft.get("statuses") or list(USABLE_STATUSES)
    if isinstance(statuses, str):
        statuses = [statuses]
    try:
        records = load_records(recipe.data)
        selection = select_records(records, recipe.sft.get("keep"), statuses)
    except (SFTDataError, FilterError) as exc:
        raise ConfigError(f"{recipe.source}: {exc}")
    if not selection.records:
        raise ConfigError(f"{recipe.source}: no record to train on ({selection.describe()})")
    return selection, statuses


def _make_callback(out: Path):
    from transformers import TrainerCallback

    class LossReporter(TrainerCallback):
        """Writes ``metrics.jsonl`` and prints one line per logged step (TRL's dicts stay in the file)."""

        def __init__(self) -> None:
            self.path = out / "metrics.jsonl"
            self.started = time.monotonic()

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = {k: v for k, v in (logs or {}).items() if isinstance(v, int | float)}
            if "loss" not in logs or not getattr(state, "is_world_process_zero", True):  # one writer
                return
            line = {
                "step": state.global_step,
                "loss": logs["loss"],
                "elapsed_seconds": round(time.monotonic() - self.started, 3),
                "trainer": logs,
            }
            with open(self.path, "a") as fh:
                fh.write(json.dumps(line) + "\n")
            extra = " ".join(
                f"{k}={logs[k]:.3g}"
                for k in ("grad_norm", "learning_rate", "mean_token_accuracy")
                if k in logs
            )
            console.print(f"step {state.global_step:>4}  loss {logs['loss']:.4f}  {extra}", highlight=False)

    return LossReporter()


def plot_loss(metrics_path: Path, png_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    if not lines:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([x["step"] for x in lines], [x["loss"] for x in lines], marker="o")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (policy tokens)")
    ax.set_title("SFT warm start")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


class TrainedCounts(TypedDict):
    """What TRL trains on, as ``sft_data.json`` reports it."""

    examples_trained: int
    examples_dropped_by_trl: int | None  # None with packing (rows are regrouped)
    policy_tokens: int
    masked_tokens: int


def trained_counts(dataset: Dataset, rendered: int, config: SFTConfig) -> TrainedCounts:
    """What TRL will train on, read from its prepared dataset (after it cut episodes to
    ``max_length`` and dropped those left without a policy token): ``sft_data.json``'s figures,
    so they never overstate the training data."""
    labels = dataset["labels"]
    policy = sum(sum(1 for t in row if t != IGNORE_INDEX) for row in labels)
    total = sum(len(row) for row in labels)
    packed = bool(getattr(config, "packing", False))
    return {
        "examples_trained": len(labels),
        "examples_dropped_by_trl": None if packed else rendered - len(labels),  # packing regroups rows
        "policy_tokens": policy,
        "masked_tokens": total - policy,
    }


def _summary_table(info: JsonObject) -> Table:
    table = Table(title="SFT data (as TRL trains it)", title_justify="left")
    table.add_column("")
    table.add_column("value", justify="right")
    keys = ("records_total", "records_selected", "examples_trained", "examples_dropped_by_trl")
    for key in (*keys, "policy_tokens", "rendered_policy_tokens", "masked_tokens", "longest_sequence"):
        table.add_row(key.replace("_", " "), str(info[key]))
    for reason, n in sorted(info["dropped"].items()):
        table.add_row(f"dropped: {reason}", str(n))
    return table


def train_sft(recipe: Recipe, check: bool = False) -> int:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    try:
        import torch
        import trl
        from datasets import Dataset
    except ImportError as exc:
        raise ConfigError(f"backend trl-sft needs the trl extra: pip install -e '.[trl]' ({exc})")

    out = Path(recipe.output_dir)
    cuda = torch.cuda.is_available()
    config, template_kwargs = _sft_config(recipe, out, cuda)  # the cheapest checks first
    selection, statuses = _selection(recipe)
    if check:
        console.print(selection.describe())
        console.print_json(
            data={"sft": {"statuses": statuses, "keep": recipe.sft.get("keep")}, "data": recipe.data}
        )
        return 0
    model_dir = resolve_model(recipe.model)
    tokenizer = load_tokenizer(recipe.model, where=recipe.source)
    template = recipe.chat_template_text()
    if template is not None:  # saved with the model, so GRPO and evals render with it too
        tokenizer.chat_template = template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    rendered = [render_episode(tokenizer, r, template_kwargs=template_kwargs) for r in selection.records]
    rows = [{"input_ids": e.input_ids, "labels": e.labels} for e in rendered]
    policy_tokens = sum(sum(e.completion_mask) for e in rendered)
    info = {
        "data": recipe.data,
        "statuses": statuses,
        "keep": recipe.sft.get("keep"),
        "records_total": selection.total,
        "records_selected": len(selection.records),
        "dropped": dict(selection.dropped),
        "episode_ids": [e.episode_id for e in rendered],
        "chat_template_kwargs": template_kwargs,
        "rendered_policy_tokens": policy_tokens,
        "rendered_masked_tokens": sum(len(e.input_ids) for e in rendered) - policy_tokens,
        "longest_sequence": max(len(e.input_ids) for e in rendered),
        "model": recipe.model,
    }
    if config.max_length is not None and info["longest_sequence"] > config.max_length:
        log.warning(
            "%d-token episodes exceed trl.max_length=%d: TRL cuts them (truncation_mode=%s)",
            info["longest_sequence"],
            config.max_length,
            config.truncation_mode,
        )
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("metrics.jsonl", "loss_curve.png"):
        (out / stale).unlink(missing_ok=True)

    model = load_trainable(model_dir, cuda)
    trainer = trl.SFTTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[_make_callback(out)],
    )
    info.update(trained_counts(trainer.train_dataset, len(rows), config))
    info["policy_tokens_cut_by_trl"] = info["rendered_policy_tokens"] - info["policy_tokens"]
    if not info["examples_trained"]:
        raise ConfigError(
            f"{recipe.source}: trl.max_length={config.max_length} leaves no episode with a policy token "
            f"(the longest is {info['longest_sequence']} tokens); raise it or leave it unset"
        )
    (out / "sft_data.json").write_text(json.dumps(info, indent=2) + "\n")
    console.print(_summary_table(info))
    quiet_console(trainer, console, "SFT")
    trainer.train()
    trainer.save_model(str(out))  # weights + config + tokenizer: a folder GRPO recipes take as `model`
    if not trainer.is_world_process_zero():
        return 0
    tokenizer.save_pretrained(str(out))
    metrics = out / "metrics.jsonl"
    if metrics.is_file():
        plot_loss(metrics, out / "loss_curve.png")
        losses = [json.loads(x)["loss"] for x in metrics.read_text().splitlines() if x.strip()]
        if losses and not all(math.isfinite(x) for x in losses):
            console.print("[red]warning:[/red] the loss was not finite at some step")
    console.print(f"done: model in {out} (use it as `model: {out}` in a GRPO recipe); loss in {metrics}")
    return 0
