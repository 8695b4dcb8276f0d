"""``DeepAnalyzeTrainer``: SkyRL's ``RayPPOTrainer`` plus the two things our env needs.

1. ``postprocess_generator_output`` (the hook SkyRL keeps for reward and loss-mask post-processing)
   reads each row's env metrics: an episode whose reward is not a measurement
   (``verifier_error`` / ``environment_error``) gets an all-zero loss mask, and so does an
   episode the generator stopped for length (the env never said done) unless
   ``deepanalyze.score_truncated`` is set, in which case it trains as a failed gate (−1.0).
2. ``compute_advantages_and_returns`` shows the estimator a response mask whose rows are zero
   where the loss mask is all zero, which is how ``deepanalyze_grpo`` knows to leave those rows
   out of the group baseline (see ``advantage``). The real mask is put back afterwards.

3. With ``deepanalyze.curriculum`` set, the success-rate curriculum chooses the prompts
   (``_build_train_dataloader_and_compute_training_steps``, SkyRL's hook for the train
   dataloader) and learns from every generation (``generate``); see ``curriculum``.

Counts of excluded rows go to the step's metrics under ``deepanalyze/``, the curriculum's under
``deepanalyze/curriculum/``; ``deepanalyze/suspect`` counts the episodes the reward-hacking watch
flagged (each row's env metric ``suspect``, also logged as the rate ``environment/suspect``).
The ``verifier_error`` rate by cause needs nothing here: every row's env metrics carry
``verifier_error_<cause>`` (0 or 1, ``DeepAnalyzeEnv.get_metrics``), which SkyRL averages into
``environment/verifier_error_<cause>``, the step's rate per cause.
"""

from __future__ import annotations

import logging
from typing import Literal, NotRequired, TypedDict

from skyrl.train.trainer import RayPPOTrainer

from deepanalyze_env.core.contracts import trainable
from deepanalyze_env.trainers.skyrl import curriculum as cur

log = logging.getLogger(__name__)

FAILED_GATE = -1.0
OUTAGE_FRACTION = 0.9  # defaults of deepanalyze.outage_fraction / outage_batches
OUTAGE_BATCHES = 3


Verdict = Literal["train", "infra", "length", "length_scored"]
"""A row's fate: trained; kept out because its reward is not a measurement (``infra``); kept out
because a token limit cut it (``length``); or trained as a failed gate (``length_scored``)."""

EnvMetrics = dict[str, float]
"""A row's env metrics (``DeepAnalyzeEnv.get_metrics``: every value a number)."""


class GeneratorOutput(TypedDict):
    """The fields of SkyRL's ``GeneratorOutput`` read or rewritten here."""

    loss_masks: list[list[int]]
    rewards: list[float | list[float]]  # per episode, or per token (the reward on the last)
    env_metrics: NotRequired[list[EnvMetrics | None] | None]
    stop_reasons: NotRequired[list[str] | None]


def row_verdict(env_metrics: EnvMetrics | None, score_truncated: bool) -> Verdict:
    """:data:`Verdict` of one row, by ``core.contracts.trainable``. An episode SkyRL's generator
    stopped before the env said done (``finished`` 0) has no status yet: the env scores it as a
    length cut, a failed gate, when it closes — a ``scored`` ``length`` episode. A finished episode
    never ends for length under SkyRL (the env says ``length`` only when a trainer asks it to)."""
    metrics = env_metrics or {}
    finished = bool(metrics.get("finished", 1.0))
    measured = not finished or metrics.get("status_scored", 1.0) == 1.0
    status = "scored" if measured else "unmeasured"
    if trainable(status, None if finished else "length", score_truncated=score_truncated):
        return "train" if finished else "length_scored"
    return "infra" if finished else "length"


def _set_final_reward(reward: float | list[float], value: float) -> float | list[float]:
    if isinstance(reward, list):  # token-level: the episode's reward sits on one token
        out = [0.0] * len(reward)
        if out:
            out[-1] = value
        return out
    return value


def row_verdicts(generator_output: GeneratorOutput, score_truncated: bool) -> list[Verdict]:
    """``row_verdict`` of every row. A row the env finished whose last turn still ran out of tokens
    was already masked by SkyRL's overlong filter (``generator.apply_overlong_filtering``): it
    counts as ``length`` too."""
    masks = generator_output["loss_masks"]
    env_metrics = generator_output.get("env_metrics") or [None] * len(masks)
    stop_reasons = generator_output.get("stop_reasons") or ["stop"] * len(env_metrics)
    verdicts = []
    for i, metrics in enumerate(env_metrics):
        verdict = row_verdict(metrics, score_truncated)
        if verdict == "train" and stop_reasons[i] != "stop" and not any(masks[i]):
            verdict = "length"  # SkyRL's overlong filter masked it
        verdicts.append(verdict)
    return verdicts


def exclude_rows(generator_output: GeneratorOutput, score_truncated: bool) -> dict[str, int]:
    """Apply the verdicts in place; returns how many rows each verdict got."""
    env_metrics = generator_output.get("env_metrics") or [None] * len(generator_output["loss_masks"])
    counts = {"train": 0, "infra": 0, "length": 0, "length_scored": 0, "gate_failed": 0}
    masks = generator_output["loss_masks"]
    rewards = generator_output["rewards"]
    for i, verdict in enumerate(row_verdicts(generator_output, score_truncated)):
        metrics = env_metrics[i]
        counts[verdict] += 1
        if verdict == "train" and (metrics or {}).get("format_ok", 1.0) == 0.0:
            counts["gate_failed"] += 1  # scored without any judge: says nothing about an outage
        if verdict in ("infra", "length"):
            masks[i] = [0] * len(masks[i])
        elif verdict == "length_scored":
            rewards[i] = _set_final_reward(rewards[i], FAILED_GATE)
    return counts


class DeepAnalyzeTrainer(RayPPOTrainer):
    """SkyRL's PPO trainer with the env's verdicts applied: unscored episodes masked out of the loss and
    baseline, the dead-judge stop, and the curriculum through SkyRL's own dataloader hook."""

    curriculum = None  # a SuccessRateCurriculum when deepanalyze.curriculum is set

    def _build_train_dataloader_and_compute_training_steps(self):
        config = cur.curriculum_config(getattr(getattr(self.cfg, "deepanalyze", None), "curriculum", None))
        if config is None or self.train_dataset is None:
            return super()._build_train_dataloader_and_compute_training_steps()
        seed = config.seed if config.seed is not None else self.cfg.trainer.seed
        self.curriculum = cur.build_curriculum(config, cur.dataset_task_ids(self.train_dataset), seed)
        self.train_dataloader = cur.curriculum_dataloader(self.cfg, self.train_dataset, self.curriculum)
        # SkyRL's own count (len(dataloader) batches an epoch), capped by max_training_steps
        self.total_training_steps = len(self.train_dataloader) * self.cfg.trainer.epochs
        if self.cfg.trainer.max_training_steps is not None:
            self.total_training_steps = min(self.total_training_steps, self.cfg.trainer.max_training_steps)
        log.info(
            "curriculum: %d tasks, %d batches of %d an epoch%s",
            len(self.curriculum.task_ids),
            len(self.train_dataloader),
            self.cfg.trainer.train_batch_size,
            f", seeded from {config.from_records}" if config.from_records else "",
        )

    async def generate(self, input_batch):
        generator_output = await super().generate(input_batch)
        if self.curriculum is not None:
            groups = [t.instance_id for t in input_batch["trajectory_ids"]]
            verdicts = row_verdicts(generator_output, self._score_truncated())
            self.curriculum.observe(
                cur.outcomes_of(generator_output, groups, self.curriculum.task_ids, verdicts)
            )
        return generator_output

    def _score_truncated(self) -> bool:
        return bool(getattr(getattr(self.cfg, "deepanalyze", None), "score_truncated", False))

    def postprocess_generator_output(self, generator_output, uids, *args, **kwargs):
        if self.curriculum is not None:  # once a step, after every generation of the step
            self.all_metrics.update(cur.step_metrics(self.curriculum.drain()))
        counts = exclude_rows(generator_output, self._score_truncated())
        total = max(1, sum(counts[k] for k in ("train", "infra", "length", "length_scored")))
        live = sum(1 for mask in generator_output["loss_masks"] if sum(mask) > 0)  # after every filter
        self.all_metrics.update(
            {
                "deepanalyze/excluded_infra": counts["infra"],
                "deepanalyze/excluded_length": counts["length"],
                "deepanalyze/scored_length": counts["length_scored"],
                "deepanalyze/trained_fraction": live / total,
                # the reward-hacking watch: episodes whose env metrics flag them (core/hacking.py)
                "deepanalyze/suspect": sum(
                    int((m or {}).get("suspect", 0.0)) for m in generator_output.get("env_metrics") or []
                ),
            }
        )
        # the outage rate among episodes that needed a measured reward: format-gate failures and
        # length-stopped episodes are scored (or masked) without the judge
        self._guard_outage(counts["infra"], counts["infra"] + counts["train"] - counts["gate_failed"])
        return super().postprocess_generator_output(generator_output, uids, *args, **kwargs)

    def _guard_outage(self, infra: int, total: int) -> None:
        """A dead judge (wrong endpoint, missing key on this node) turns every episode that reaches
        it into a verifier_error and trains nothing: warn each time, stop after a few such batches.
        ``total`` counts the episodes that needed a measured reward (format-gate failures are
        scored without a judge, so a dead judge leaves them alone and they are not counted)."""
        adapter = getattr(getattr(self, "cfg", None), "deepanalyze", None)
        threshold = float(getattr(adapter, "outage_fraction", OUTAGE_FRACTION))
        limit = int(getattr(adapter, "outage_batches", OUTAGE_BATCHES))
        fraction = infra / max(1, total)
        outage = infra > 0 and fraction >= threshold
        streak = getattr(self, "_outage_streak", 0)
        self._outage_streak = streak + 1 if outage else 0
        if infra:
            log.warning(
                "%d of %d episodes that needed a measured reward (%.0f%%) got none (verifier/environment "
                "error): kept out of the loss and the baseline; the records say why.%s",
                infra,
                total,
                100 * fraction,
                f" Outage batch {self._outage_streak} of {limit} in a row (>= {threshold:.0%} failed) before "
                "the run stops (deepanalyze.outage_fraction / outage_batches)"
                if outage and limit
                else "",
            )
        if limit and self._outage_streak >= limit:
            raise RuntimeError(
                f"{limit} batches in a row: at least {threshold:.0%} of the episodes that needed a "
                "measured reward got none (verifier_error / environment_error): check the judge endpoint "
                "and its API key on the node running the trainer, and the errors in env.records_dir "
                "(deepanalyze.outage_fraction / outage_batches set this stop)"
            )

    def compute_advantages_and_returns(self, data):
        response_mask = data["response_mask"]
        trainable = (data["loss_mask"].sum(dim=-1, keepdim=True) > 0).to(response_mask.dtype)
        data["response_mask"] = response_mask * trainable
        try:
            out = super().compute_advantages_and_returns(data)
        except BaseException:
            data["response_mask"] = response_mask
            raise
        out["response_mask"] = response_mask.to(out["advantages"].device)
        return out
