"""Rows that cannot move the weights skip the update: no forward, no backward.

A GRPO row's loss is its advantage times a function of its log-probs (every TRL ``loss_type``:
clipped ratio, CISPO, SAPO, VESPO, LUSPO), masked by its loss mask, plus ``beta`` × KL and, for
router models, an auxiliary loss. With ``beta`` 0 and no auxiliary loss, a row whose advantage
is 0 (every member of a zero-variance group; TRL's 0 for a row no reward function scored) or
whose loss mask is empty (our rollout zeroes ``env_mask`` of an untrained row) adds exactly 0 to
the loss and to every gradient — yet TRL pays its full forward and backward (on CPU about as
long as generating it). :func:`skip_inert_rows` makes a micro-batch of such rows return a zero
loss with no graph instead.

The gradient is unchanged: each micro-batch's loss is a sum over its rows divided by a
normaliser that does not depend on the other micro-batches' values (``dapo``: the generation
batch's token count ``num_items_in_batch``, counted before any row is skipped, so it still
counts the skipped rows' tokens as TRL does; ``grpo``/``bnpo``/``dr_grpo``/``luspo``: a mean
within the micro-batch, divided by the accumulation steps). A micro-batch is skipped only when
*every* row in it is inert, so its contribution was 0 and no normaliser changes; with the
recipes' micro-batch of 1 that is row by row. One correction makes "advantage 0" exact: TRL
computes a zero-variance group's advantage as ``(r − mean) / (std + 1e-4)`` with std 0, so
float rounding of the mean can leave ~1e-4 instead of 0; a group whose members' advantages are
all equal has zero variance (they sum to 0), so those advantages are set to exactly 0 first.

Only on one process (DDP and DeepSpeed expect every rank's backward to reach every weight) and
only in training; TRL's own logs of per-token figures (entropy, clip ratios) then average over
the micro-batches that ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from trl import GRPOTrainer

TrlBatch = dict[str, "torch.Tensor | object"]
"""A batch as ``GRPOTrainer`` passes it between its methods: tensors by name, plus a few scalars."""


@dataclass
class SkippedRows:
    """Rows of the update that took no forward/backward since the last ``drain()``, and why
    skipping is off when it is (``reason``; None while it is on)."""

    rows: int = 0
    rows_seen: int = 0
    reason: str | None = None

    def drain(self) -> tuple[int, int]:
        out = (self.rows, self.rows_seen)
        self.rows = self.rows_seen = 0
        return out


def loss_mask(batch: TrlBatch) -> torch.Tensor:
    """The tokens that carry loss, as TRL's ``_compute_loss`` reads them."""
    mask = batch["completion_mask"]
    tool_mask = batch.get("tool_mask")
    return mask if tool_mask is None else mask * tool_mask


def exact_zero_variance(advantages: torch.Tensor, mask: torch.Tensor, group: int) -> torch.Tensor:
    """``advantages`` (one per row, groups of ``group`` consecutive rows) with every group whose
    trained rows (a non-empty mask) share one advantage set to exactly 0 (see the module doc)."""
    import torch

    out = advantages.clone()
    if out.dim() != 1 or group < 2 or out.numel() % group:
        return out  # a layout this rule does not know: leave TRL's values alone
    trained = mask.sum(dim=1) > 0
    for start in range(0, out.numel(), group):
        rows = torch.arange(start, start + group)[trained[start : start + group]]
        if len(rows) >= 2 and torch.all(out[rows] == out[rows[0]]):
            out[rows] = 0.0
    return out


def inert_rows(batch: TrlBatch) -> torch.Tensor:
    """Per row: True when its loss term is 0 whatever the weights (advantage 0 or empty mask),
    given ``beta`` 0 and no auxiliary loss."""
    advantages = batch["advantages"]
    zero_adv = (advantages == 0).reshape(advantages.shape[0], -1).all(dim=1)
    return zero_adv | (loss_mask(batch).sum(dim=1) == 0)


def skip_reason(trainer: GRPOTrainer) -> str | None:
    """Why a trainer must run every row (None: inert rows can skip)."""
    from accelerate.utils import DistributedType

    if trainer.beta != 0.0:
        return f"beta={trainer.beta}: the KL term has a gradient on every row"
    if getattr(trainer, "aux_loss_enabled", False):
        return "the router's auxiliary loss has a gradient on every row"
    if trainer.accelerator.num_processes != 1 or trainer.accelerator.distributed_type != DistributedType.NO:
        return "several processes: every rank's backward must reach every weight"
    return None


def skip_inert_rows(base: type[GRPOTrainer], log: SkippedRows | None = None) -> type[GRPOTrainer]:
    """A ``GRPOTrainer`` subclass whose micro-batches of inert rows skip the forward and backward
    (TRL unpatched); ``log`` counts them for the step report."""
    counter = log if log is not None else SkippedRows()

    class SkipInertRowsTrainer(base):
        """The user's trainer class, minus the forward and backward of rows that add nothing."""

        skipped = counter

        def _skipping(self) -> bool:
            if not self.model.training:
                return False
            counter.reason = skip_reason(self)
            return counter.reason is None

        def _generate_and_score_completions(self, inputs):
            batch = super()._generate_and_score_completions(inputs)
            if self._skipping():
                batch["advantages"] = exact_zero_variance(
                    batch["advantages"], loss_mask(batch), self.num_generations
                )
            return batch

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if not return_outputs and self._skipping():
                inert = inert_rows(inputs)
                counter.rows_seen += int(inert.numel())
                if bool(inert.all()):
                    import torch

                    counter.rows += int(inert.numel())
                    # a leaf: the trainer's backward runs on it and touches no weight
                    return torch.zeros((), device=self.accelerator.device, requires_grad=True)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    return SkipInertRowsTrainer
