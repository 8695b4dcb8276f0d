"""The success-rate curriculum as ``GRPOTrainer``'s train sampler.

TRL 1.x builds its train dataloader with ``GRPOTrainer._get_train_sampler``, a ``RepeatSampler``
whose index stream is: pick ``batch_size`` prompts (one generation batch), repeat each
``mini_repeat_count`` (= ``num_generations``) times in a row, and yield that block
``repeat_count`` (= ``num_iterations * steps_per_generation``) times. :class:`CurriculumSampler`
keeps exactly that layout and only changes *which* prompts form each generation batch: they are
drawn from the curriculum when the dataloader asks for the batch (lazily), so each draw uses the
outcomes of every rollout finished by then. The dataloader prefetches one batch, so a draw lags
the newest rollout by one generation batch.

Every process iterates its own copy with one seed (as ``RepeatSampler`` does) and every process
feeds it the outcomes of all processes (the rollout gathers them), so the draws agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from torch.utils.data import Sampler

from deepanalyze_env.trainers.curriculum import SuccessRateCurriculum

if TYPE_CHECKING:
    from datasets import Dataset
    from trl import GRPOTrainer


class CurriculumSampler(Sampler[int]):
    """GRPOTrainer's train sampler with TRL's ``RepeatSampler`` layout, whose tasks are drawn from the
    success-rate curriculum when the dataloader asks (not once per epoch)."""

    def __init__(
        self,
        curriculum: SuccessRateCurriculum,
        *,
        mini_repeat_count: int,
        batch_size: int = 1,
        repeat_count: int = 1,
    ):
        self.curriculum = curriculum
        self.mini_repeat_count = mini_repeat_count
        self.batch_size = batch_size
        self.repeat_count = repeat_count
        self.num_samples = len(curriculum.task_ids)

    def __iter__(self) -> Iterator[int]:
        # As many generation batches per epoch as RepeatSampler yields (full batches only).
        for _ in range(self.num_samples // self.batch_size):
            chunk = self.curriculum.draw(self.batch_size)
            for _ in range(self.repeat_count):
                for index in chunk:
                    for _ in range(self.mini_repeat_count):
                        yield index

    def __len__(self) -> int:
        batches = self.num_samples // self.batch_size
        return batches * self.batch_size * self.mini_repeat_count * self.repeat_count


def curriculum_trainer_class(base: type[GRPOTrainer], curriculum: SuccessRateCurriculum) -> type[GRPOTrainer]:
    """A ``GRPOTrainer`` subclass whose train sampler is the curriculum (TRL itself unpatched)."""

    class CurriculumGRPOTrainer(base):
        """The user's trainer class with one change: tasks are drawn by the curriculum's
        weights, so GRPO's groups come from tasks whose episodes can differ."""

        def _get_train_sampler(self, dataset: Dataset | None = None) -> Sampler:
            dataset = self.train_dataset if dataset is None else dataset
            if len(dataset) != len(curriculum.task_ids):
                raise ValueError(
                    f"the curriculum knows {len(curriculum.task_ids)} tasks, the dataset has {len(dataset)}"
                )
            return CurriculumSampler(
                curriculum,
                mini_repeat_count=self.num_generations,
                batch_size=self.args.generation_batch_size // self.num_generations,
                repeat_count=self.num_iterations * self.args.steps_per_generation,
            )

    return CurriculumGRPOTrainer
