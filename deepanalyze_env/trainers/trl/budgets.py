"""Do the episodes fit the GRPO budgets? Measured before training, from episodes like the ones to come.

An episode cut by the token budget is masked (it carries no gradient), and a turn cut by the
per-turn cap is stepped without its closing tag; a run whose budgets are smaller than what its
policy writes trains on almost nothing (the main job once had 5 of 6 episodes cut). So before a
GRPO run starts, episodes the policy wrote — the SFT model's own eval episodes, or the reference
episodes it was trained on — are rendered exactly as the rollout builds them
(:func:`~deepanalyze_env.trainers.trl.sft_data.render_record`: policy turns, observations and the
closing EOS) and measured against ``rollout.max_turn_tokens`` and ``max_completion_length``, and
their observations against the env's output cap (the records say which cells were capped).
A turn that reached the per-turn cap of the run that wrote it is measured at that cap, so use
records written with a cap at least as large as ``max_turn_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TypedDict

from deepanalyze_env.core.contracts import EpisodeRecord
from deepanalyze_env.core.records import own_turn_indices
from deepanalyze_env.generation.interfaces import Tokenizer
from deepanalyze_env.trainers.trl.sft_data import render_record

CUT_TARGET = 0.10  # the share of episodes a run may lose to its budgets before we warn


def _quantiles(values: Sequence[int]) -> dict[str, int]:
    if not values:
        return {"p50": 0, "p90": 0, "max": 0}
    ordered = sorted(values)

    def at(q: float) -> int:
        return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]

    return {"p50": at(0.5), "p90": at(0.9), "max": ordered[-1]}


class BudgetReport(TypedDict):
    """``budgets.json``: :class:`BudgetFit`'s fields, its cut fraction and the target it is held to."""

    episodes: int
    max_turn_tokens: int | None
    max_completion_length: int
    turn_cut: int
    episode_cut: int
    cut: int
    cells: int
    output_capped: int
    turn_tokens: dict[str, int]
    completion_tokens: dict[str, int]
    cut_fraction: float
    cut_target: float


@dataclass
class BudgetFit:
    """What the budgets would cut of the measured episodes (``as_dict`` is ``budgets.json``)."""

    episodes: int
    max_turn_tokens: int | None
    max_completion_length: int
    turn_cut: int  # episodes with a policy turn longer than max_turn_tokens
    episode_cut: int  # episodes whose completion does not fit max_completion_length
    cut: int  # episodes with either cut
    cells: int
    output_capped: int  # cells whose output the env capped at executor.max_output_chars
    turn_tokens: dict[str, int]
    completion_tokens: dict[str, int]

    @property
    def cut_fraction(self) -> float:
        return self.cut / self.episodes if self.episodes else 0.0

    def as_dict(self) -> BudgetReport:
        fields = asdict(self)
        return BudgetReport(**fields, cut_fraction=round(self.cut_fraction, 4), cut_target=CUT_TARGET)

    def lines(self) -> list[str]:
        """What will be cut, in words (the console and the learn pipeline print these)."""
        if not self.episodes:
            return ["budget check: no episodes to measure"]
        return [
            f"budget check over {self.episodes} episodes: {self.cut} ({self.cut_fraction:.0%}) would be cut "
            f"(target ≤ {CUT_TARGET:.0%})",
            f"  episode: completion tokens p50 {self.completion_tokens['p50']}, p90 "
            f"{self.completion_tokens['p90']}, max {self.completion_tokens['max']} against "
            f"max_completion_length {self.max_completion_length}: {self.episode_cut} over",
            f"  turn: policy-turn tokens p50 {self.turn_tokens['p50']}, p90 {self.turn_tokens['p90']}, "
            f"max {self.turn_tokens['max']} against max_turn_tokens {self.max_turn_tokens or 'none'}: "
            f"{self.turn_cut} episodes with a turn over",
            f"  cells: {self.output_capped} of {self.cells} outputs were capped by executor.max_output_chars",
        ]


def turn_lengths(mask: Sequence[int]) -> list[int]:
    """Lengths of the policy turns in a completion mask (the runs of 1s)."""
    lengths, run = [], 0
    for m in [*mask, 0]:
        if m:
            run += 1
        elif run:
            lengths.append(run)
            run = 0
    return lengths


def measure_budgets(
    tokenizer: Tokenizer,
    records: Sequence[EpisodeRecord],
    *,
    max_completion_length: int,
    max_turn_tokens: int | None = None,
) -> BudgetFit:
    """Render each record as the rollout would and count what the budgets would cut."""
    all_turns: list[int] = []
    completions: list[int] = []
    turn_cut = episode_cut = cut = cells = capped = 0
    for record in records:
        if not own_turn_indices(record):  # nothing the policy wrote (an episode that never started)
            continue
        rendered = render_record(tokenizer, record)
        turns = turn_lengths(rendered.completion_mask)
        all_turns += turns
        completions.append(len(rendered.completion_ids))
        over_turn = max_turn_tokens is not None and max(turns, default=0) > max_turn_tokens
        over_episode = len(rendered.completion_ids) > max_completion_length
        turn_cut += over_turn
        episode_cut += over_episode
        cut += over_turn or over_episode
        for info in record.get("exec") or []:
            if info.get("status") in ("no_code", "skipped"):
                continue
            cells += 1
            capped += bool(info.get("truncated"))
    return BudgetFit(
        episodes=len(completions),
        max_turn_tokens=max_turn_tokens,
        max_completion_length=max_completion_length,
        turn_cut=turn_cut,
        episode_cut=episode_cut,
        cut=cut,
        cells=cells,
        output_capped=capped,
        turn_tokens=_quantiles(all_turns),
        completion_tokens=_quantiles(completions),
    )
