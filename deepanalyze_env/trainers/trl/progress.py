"""What a TRL run shows on the console: our per-step output and one rich progress bar.

``transformers.Trainer`` installs ``ProgressCallback`` (a tqdm bar that also writes every log
dictionary as a raw ``{'loss': …, 'grad_norm': …}`` line) or ``PrinterCallback`` (the raw lines
alone). Those dictionaries are kept in ``metrics.jsonl`` by our reporters; on the console they
drown the per-step table. :func:`quiet_console` swaps both for :class:`StepProgress`, a rich bar
over the run's optimizer steps, shown only on the main process.

Usage::

    trainer = trl.GRPOTrainer(...)
    quiet_console(trainer, console, "GRPO")
    trainer.train()
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from transformers import Trainer


def _callback_class() -> type:
    from transformers import TrainerCallback

    class StepProgress(TrainerCallback):
        """A rich progress bar over optimizer steps (printing above it stays readable)."""

        def __init__(self, console: Console, label: str) -> None:
            self.console = console
            self.label = label
            self.progress: Progress | None = None
            self.task: TaskID | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            if not getattr(state, "is_world_process_zero", True):
                return
            self.progress = Progress(
                TextColumn(f"[bold]{self.label}[/bold]"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("steps"),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self.progress.start()
            self.task = self.progress.add_task(self.label, total=state.max_steps or None)

        def on_step_end(self, args, state, control, **kwargs):
            if self.progress is not None:
                self.progress.update(self.task, completed=state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            if self.progress is not None:
                self.progress.update(self.task, completed=state.global_step)
                self.progress.stop()
                self.progress = None

    return StepProgress


class _NoneRewardFilter(logging.Filter):
    """Drops GRPOTrainer's "All reward functions returned None" warning, which prints the whole
    episode: a None reward is this plugin's deliberate signal (length cut, verifier_error,
    environment_error) and is counted in the per-step table's status and termination rows."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "All reward functions returned None" not in record.getMessage()


def quiet_console(trainer: Trainer, console: Console, label: str) -> None:
    """Remove the trainer's raw-dict printers and add the rich step bar."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    grpo_log = logging.getLogger("trl.trainer.grpo_trainer")
    if not any(isinstance(f, _NoneRewardFilter) for f in grpo_log.filters):
        grpo_log.addFilter(_NoneRewardFilter())

    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(_callback_class()(console, label))
