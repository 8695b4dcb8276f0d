"""The success-rate curriculum inside SkyRL 0.4, through the hooks SkyRL's trainer keeps for it.

SkyRL's ``RayPPOTrainer`` builds its train dataloader in
``_build_train_dataloader_and_compute_training_steps`` ("subclasses can override this to customize
dataloader behavior"): a ``StatefulDataLoader`` over the ``PromptDataset`` with a seeded shuffle,
``train_batch_size`` prompts per batch, incomplete batches dropped. ``DeepAnalyzeTrainer``
overrides that hook when ``deepanalyze.curriculum`` is set and hands the loader
:class:`CurriculumBatchSampler` instead: the same number of batches per epoch and the same batch
size, but each batch is ``train_batch_size`` distinct dataset indices drawn from
:class:`~deepanalyze_env.trainers.curriculum.SuccessRateCurriculum` when the trainer asks for the
batch. SkyRL repeats every prompt ``generator.n_samples_per_prompt`` times itself
(``prepare_generator_input``), so one batch index is one GRPO group.

The loader runs in the trainer's process (``num_workers=0``): worker processes would prefetch
``2 × num_workers`` batches and every draw would lag that many steps behind the outcomes. With
it, the draw for step t has seen every episode of steps 1 … t−1.

Outcomes come from the trainer's ``generate`` (overridden), right after SkyRL's generator returns:
each row's env metrics (``finished``, ``status_*``, ``termination_*``, ``reward``, ``reward/*``,
from ``DeepAnalyzeEnv.get_metrics``) and its group id, which SkyRL sets to the dataset index of
its prompt. Every generation is seen, also those that ``trainer.algorithm.dynamic_sampling``
later drops (the zero-variance groups are exactly the evidence the curriculum needs).

The batch sampler's iterator is ``Stateful``: SkyRL's checkpoints save the dataloader's state
(``data.pt``), and with it the curriculum's estimates and the draw generator, so a resumed run
continues with what it had learnt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, TypedDict

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.contracts import REWARD_STATUSES, TERMINATIONS, JsonObject
from deepanalyze_env.core.tasks import with_task_ids
from deepanalyze_env.trainers.curriculum import (
    HISTOGRAM_BINS,
    CurriculumConfig,
    CurriculumMetrics,
    CurriculumState,
    Outcome,
    SuccessRateCurriculum,
)

if TYPE_CHECKING:
    from skyrl.train.dataset.dataset import PromptDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    from deepanalyze_env.trainers.skyrl.config import DeepAnalyzeSkyRLConfig
    from deepanalyze_env.trainers.skyrl.trainer import GeneratorOutput

SECTION = "deepanalyze.curriculum"
METRIC_PREFIX = "deepanalyze/curriculum/"
FAILED_GATE = -1.0  # what a length-stopped episode trains as under deepanalyze.score_truncated


def curriculum_config(tree: JsonObject | None) -> CurriculumConfig | None:
    """``deepanalyze.curriculum`` (a mapping, or None when off) → the trainer-neutral config;
    every bad key or value is a one-line ``ConfigError``."""
    if tree is None:
        return None
    return CurriculumConfig.from_mapping(dict(tree), source="deepanalyze")


def as_mapping(config: CurriculumConfig) -> JsonObject:
    """The config as plain YAML-able values (what the SkyRL config tree holds and Ray ships)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}


def dataset_task_ids(dataset: PromptDataset) -> list[str]:
    """Task ids of a SkyRL ``PromptDataset`` in its index order (after SkyRL dropped over-long
    prompts), by the rule every other command uses (``with_task_ids``)."""
    frame = dataset.dataframe
    columns = [c for c in ("task_id", "extra_info") if c in frame.column_names]
    light = [dict(r) for r in frame.select_columns(columns)] if columns else [{} for _ in range(len(frame))]
    return [str(r["task_id"]) for r in with_task_ids(light)]


def build_curriculum(config: CurriculumConfig, task_ids: list[str], seed: int) -> SuccessRateCurriculum:
    """The curriculum over ``task_ids`` (dataset order), seeded from ``from_records`` when set."""
    seen: set[str] = set()
    dupes = [t for t in task_ids if t in seen or seen.add(t)]
    if dupes:
        raise ConfigError(
            f"{SECTION}: the training data holds task {dupes[0]!r} more than once "
            f"({len(dupes)} repeated ids); the curriculum keeps one estimate per task id"
        )
    if config.from_records:
        return SuccessRateCurriculum.from_records(config.from_records, task_ids, config, seed)
    return SuccessRateCurriculum(task_ids, config, seed)


class DrawState(TypedDict):
    """A dataloader checkpoint's share of the curriculum: batches drawn this epoch, the estimates."""

    yielded: int
    curriculum: CurriculumState


class _Draws:
    """One epoch of batches, drawn one at a time; ``Stateful`` for SkyRL's dataloader checkpoint."""

    def __init__(self, sampler: CurriculumBatchSampler):
        self.sampler = sampler
        self.yielded = 0

    def __iter__(self) -> _Draws:
        return self

    def __next__(self) -> list[int]:
        if self.yielded >= len(self.sampler):
            raise StopIteration
        self.yielded += 1
        return self.sampler.curriculum.draw(self.sampler.batch_size)

    def state_dict(self) -> DrawState:
        return {"yielded": self.yielded, "curriculum": self.sampler.curriculum.state_dict()}

    def load_state_dict(self, state: DrawState) -> None:
        self.yielded = int(state["yielded"])
        self.sampler.curriculum.load_state_dict(state["curriculum"])


class CurriculumBatchSampler:
    """A batch sampler (``Iterable[list[int]]`` with ``len``) for ``StatefulDataLoader``:
    ``len(dataset) // batch_size`` batches an epoch (SkyRL's count with ``drop_last``), each of
    ``batch_size`` distinct indices drawn by the curriculum when the loader asks for it."""

    def __init__(self, curriculum: SuccessRateCurriculum, batch_size: int):
        if batch_size > len(curriculum.task_ids):
            raise ConfigError(
                f"trainer.train_batch_size={batch_size} is larger than the {len(curriculum.task_ids)} "
                "training tasks: a batch would hold a task twice (two GRPO groups under one id)"
            )
        self.curriculum = curriculum
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[list[int]]:
        return _Draws(self)

    def __len__(self) -> int:
        return len(self.curriculum.task_ids) // self.batch_size


def curriculum_dataloader(
    cfg: DeepAnalyzeSkyRLConfig, dataset: PromptDataset, curriculum: SuccessRateCurriculum
) -> StatefulDataLoader:
    """SkyRL's train dataloader (same class, collate function and batch size as
    ``trainer_utils.build_dataloader``) with the curriculum choosing the prompts, in-process."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(
        dataset,
        batch_sampler=CurriculumBatchSampler(curriculum, cfg.trainer.train_batch_size),
        collate_fn=dataset.collate_fn,
        num_workers=0,
    )


def outcomes_of(
    generator_output: GeneratorOutput, group_ids: list[str], task_ids: list[str], verdicts: Sequence[str]
) -> list[Outcome]:
    """One outcome per row of a SkyRL generator output, read from its env metrics.

    ``group_ids`` are SkyRL's per-row instance ids (the dataset index of the row's prompt) and
    ``verdicts`` the trainer's per-row verdicts (``trainer.row_verdicts``). The outcome's
    ``reward`` is the reward GRPO trains on (as in the TRL rollout): the env's reward for a
    trained row, −1 for a length-stopped row under ``score_truncated``, None for a row kept out
    of the loss (not scored, stopped for length, or masked by SkyRL's overlong filter).
    """
    env_metrics = generator_output.get("env_metrics") or [{}] * len(group_ids)
    outcomes: list[Outcome] = []
    for metrics, group, verdict in zip(env_metrics, group_ids, verdicts, strict=True):
        metrics = metrics or {}
        index = int(group)
        if not 0 <= index < len(task_ids):
            raise ValueError(
                f"generator row names prompt {group!r}, not an index of the {len(task_ids)} tasks"
            )
        finished = bool(metrics.get("finished", 0.0))
        status = next((s for s in REWARD_STATUSES if metrics.get(f"status_{s}") == 1.0), "scored")
        termination = next((t for t in TERMINATIONS if metrics.get(f"termination_{t}") == 1.0), "length")
        if verdict == "train":
            reward: float | None = float(metrics["reward"])
        elif verdict == "length_scored":
            reward = FAILED_GATE
        else:
            reward = None
        components = {k[len("reward/") :]: float(v) for k, v in metrics.items() if k.startswith("reward/")}
        outcomes.append(
            {
                "task_id": task_ids[index],
                "reward": reward,
                # an episode SkyRL stopped before the env said done has no status yet: the env
                # scores it as a length cut when it closes (a failure for the curriculum)
                "reward_status": status if finished else "scored",
                "termination": termination if finished else "length",
                "reward_components": components if finished else {},
            }
        )
    return outcomes


def step_metrics(drained: CurriculumMetrics) -> dict[str, float]:
    """``SuccessRateCurriculum.drain()`` as scalar tracker metrics under ``deepanalyze/curriculum/``
    (the histogram as one metric per bin, ``success_histogram/0.0-0.1`` …; a fraction with no
    groups behind it is left out rather than logged as 0; ``success_basis`` as one count per basis,
    ``success_basis/accuracy`` and ``success_basis/reward``)."""
    out: dict[str, float] = {}
    for key, value in drained.items():
        if key == "success_histogram":
            for b, count in enumerate(value):
                out[f"{METRIC_PREFIX}{key}/{b / HISTOGRAM_BINS:.1f}-{(b + 1) / HISTOGRAM_BINS:.1f}"] = count
        elif key == "success_basis":
            for basis, count in value.items():
                out[f"{METRIC_PREFIX}{key}/{basis}"] = count
        elif value is not None:
            out[f"{METRIC_PREFIX}{key}"] = value
    return out
