"""Summary statistics of a run's episode records (``deepanalyze-rl stats``).

Every number is computed from records alone (docs/design.md §9), so a run can be inspected
long after it ended, on another machine, and again after ``rescore``. The definitions are
data (:data:`DEFINITIONS`) and are written into ``stats.md``, so a reader never has to guess
what a rate is a rate of.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NotRequired, TypedDict

import numpy as np

from deepanalyze_env.core.contracts import EpisodeRecord, JsonObject, trainable, verifier_error_rates
from deepanalyze_env.core.records import own_turn_indices
from deepanalyze_env.offline.report import Distribution, distribution, fmt, pct, rate

log = logging.getLogger(__name__)

BUDGET_ENDS = ("length",)
DEFINITIONS = (
    '*valid* episode: `reward_status == "scored"` and not cut by a token budget '
    '(`termination != "length"`) — what a trainer would learn from.',
    "*verifier_error by cause*: the share of all episodes excluded as `verifier_error` for each "
    "`reward_error_cause` (`judge_parse`, `context_length`, `judge_call`, `reward_raised`; a record "
    "from before causes were recorded counts as `reward_raised`).",
    "*format pass rate*: `format_ok` over episodes whose gate ran (status `scored` or `verifier_error`; "
    "an `environment_error` episode never reached the gate).",
    "reward mean ± std (population std) over scored episodes, overall and per `reward_spec.method`; "
    "component means over the scored episodes that have the component.",
    "*code pass rate*: passing cells / all cells, over every episode.",
    '*truncation ratio*: episodes ended by a token budget (`termination == "length"`) or with a policy '
    'turn that hit its token limit (`finish_reason == "length"` in `usage`).',
    "*length*: per episode, the policy's completion tokens from `usage` when every episode has it, else "
    "tokens counted with `--tokenizer`, else characters of the assistant turns.",
    "judge latency percentiles (linear interpolation) over calls that reached the judge; "
    "cache hits excluded.",
    "cost: policy tokens of *all* episodes (failed ones were paid for too) per scored episode; "
    "prices in USD per million tokens.",
)


class RewardStats(TypedDict):
    """Reward over scored episodes, overall and per ``reward_spec.method``."""

    all: Distribution
    by_method: dict[str, Distribution]


class ComponentMean(TypedDict):
    """One reward component's mean over the scored episodes that have it."""

    n: int
    mean: float


class TurnStats(Distribution, total=False):
    """Policy turns per episode, with their histogram."""

    histogram: dict[int, int]  # turns → episodes


class LengthStats(Distribution, total=False):
    """Episode lengths, in the unit ``source`` names (see :func:`_lengths`)."""

    source: str  # the unit: usage completion tokens, tokenizer tokens or characters


class Latency(TypedDict):
    """Judge latency percentiles over the calls that reached the judge."""

    n: int
    p50: float | None
    p95: float | None


class JudgeStats(TypedDict):
    """The judge calls of the run: how many, failed, cached; latency of the live ones."""

    calls: int
    failed: int
    cached: int
    latency_ms: Latency


class UsageStats(TypedDict):
    """Token usage the policy reported; per scored episode and cost when there is some."""

    episodes_with_usage: int
    prompt_tokens: int
    completion_tokens: int
    prompt_tokens_per_scored_episode: NotRequired[float]
    completion_tokens_per_scored_episode: NotRequired[float]
    cost_usd: NotRequired[float]
    cost_per_scored_episode_usd: NotRequired[float]


class RunStats(TypedDict):
    """``stats.json``: every number of :func:`compute_stats` (see :data:`DEFINITIONS`)."""

    episodes: int
    status_counts: dict[str, int]
    verifier_error_rates: dict[str, float]  # reward_error_cause → share of all episodes (every cause)
    termination_counts: dict[str, int]
    valid_episodes: int
    valid_rate: float | None
    format_pass_rate: float | None
    gate_counts: dict[str, int]
    reward: RewardStats
    components: dict[str, ComponentMean]
    code_cells: int
    code_pass_rate: float | None
    exec_status_counts: dict[str, int]
    output_truncated_rate: float | None
    turns: TurnStats
    length: LengthStats
    truncated_episodes: int
    truncation_ratio: float | None
    judge: JudgeStats
    usage: UsageStats
    planned_episodes: NotRequired[int]  # set by the command when the run folder has a plan
    missing_episodes: NotRequired[int]


def _method(record: EpisodeRecord) -> str:
    return str((record.get("reward_spec") or {}).get("method", "?"))


def _assistant_texts(record: EpisodeRecord) -> list[str]:
    """The policy's own turns (a recovered episode's replayed prefix is prompt, not output)."""
    messages = record.get("messages") or []
    return [messages[i].get("content") or "" for i in own_turn_indices(record)]


def _usage_turns(record: EpisodeRecord) -> list[JsonObject]:
    """The per-turn usage the policy reported (``prompt_tokens``, ``completion_tokens``,
    ``finish_reason``; raw, as the policy's endpoint gave it)."""
    usage = record.get("usage") or {}
    return [u for u in usage.get("per_turn") or [] if u]


def compute_stats(
    records: Sequence[EpisodeRecord],
    *,
    price_prompt: float | None = None,
    price_completion: float | None = None,
    count_tokens: Callable[[str], int] | None = None,
) -> RunStats:
    """All ``stats`` numbers for ``records``. Prices are USD per million tokens."""
    n = len(records)
    status = Counter(str(r.get("reward_status")) for r in records)
    termination = Counter(str(r.get("termination")) for r in records)
    scored = [r for r in records if r.get("reward_status") == "scored"]
    valid = [r for r in scored if trainable(r.get("reward_status"), r.get("termination"))]
    gated = [r for r in records if r.get("reward_status") in ("scored", "verifier_error")]
    format_ok = sum(1 for r in gated if r.get("format_ok"))

    by_method: dict[str, list[float]] = defaultdict(list)
    for r in scored:
        by_method[_method(r)].append(float(r["reward"]))
    components: dict[str, list[float]] = defaultdict(list)
    for r in scored:
        for name, value in (r.get("reward_components") or {}).items():
            components[name].append(float(value))

    cells = [p for r in records for p in r.get("code_pass") or []]
    execs = [e for r in records for e in r.get("exec") or []]
    turns = [int(r.get("turns") or 0) for r in records]

    truncated = sum(
        1
        for r in records
        if r.get("termination") in BUDGET_ENDS
        or any(u.get("finish_reason") == "length" for u in _usage_turns(r))
    )

    length_source, lengths = _lengths(records, count_tokens)
    return {
        "episodes": n,
        "status_counts": dict(sorted(status.items())),
        "verifier_error_rates": dict(verifier_error_rates(records)),
        "termination_counts": dict(sorted(termination.items())),
        "valid_episodes": len(valid),
        "valid_rate": rate(len(valid), n),
        "format_pass_rate": rate(format_ok, len(gated)),
        "gate_counts": dict(sorted(Counter(str(r.get("gate")) for r in gated if r.get("gate")).items())),
        "reward": {
            "all": distribution([float(r["reward"]) for r in scored]),
            "by_method": {m: distribution(v) for m, v in sorted(by_method.items())},
        },
        "components": {
            name: {"n": len(v), "mean": float(np.mean(v))} for name, v in sorted(components.items())
        },
        "code_cells": len(cells),
        "code_pass_rate": rate(sum(cells), len(cells)),
        "exec_status_counts": dict(sorted(Counter(str(e.get("status")) for e in execs).items())),
        "output_truncated_rate": rate(sum(1 for e in execs if e.get("truncated")), len(execs)),
        "turns": {**distribution(turns), "histogram": dict(sorted(Counter(turns).items()))},
        "length": {"source": length_source, **distribution(lengths)},
        "truncated_episodes": truncated,
        "truncation_ratio": rate(truncated, n),
        "judge": _judge(records),
        "usage": _usage(records, len(scored), price_prompt, price_completion),
    }


def _lengths(
    records: Sequence[EpisodeRecord], count_tokens: Callable[[str], int] | None
) -> tuple[str, list[int]]:
    """Each episode's length and its unit: the policy's own completion-token counts when every
    record has usage, else the tokenizer's count of the assistant turns, else their characters."""
    if records and all(_usage_turns(r) for r in records):
        return "usage completion tokens", [
            sum(int(u.get("completion_tokens") or 0) for u in _usage_turns(r)) for r in records
        ]
    if count_tokens is not None:
        return "tokenizer tokens", [sum(count_tokens(t) for t in _assistant_texts(r)) for r in records]
    return "characters", [sum(len(t) for t in _assistant_texts(r)) for r in records]


def _judge(records: Sequence[EpisodeRecord]) -> JudgeStats:
    """Judge calls: how many, failed, cached, and the latency of the live (uncached) ones."""
    calls = [c for r in records for c in ((r.get("judge") or {}).get("calls") or [])]
    live = [float(c["latency_ms"]) for c in calls if c.get("latency_ms") is not None and not c.get("cached")]
    return {
        "calls": len(calls),
        "failed": sum(1 for c in calls if c.get("error")),
        "cached": sum(1 for c in calls if c.get("cached")),
        "latency_ms": {
            "n": len(live),
            "p50": float(np.percentile(live, 50)) if live else None,
            "p95": float(np.percentile(live, 95)) if live else None,
        },
    }


def _usage(
    records: Sequence[EpisodeRecord],
    scored: int,
    price_prompt: float | None,
    price_completion: float | None,
) -> UsageStats:
    """Token usage the policy reported, per scored episode, and its cost at the given prices
    (USD per million tokens)."""
    with_usage = [r for r in records if _usage_turns(r)]
    prompt_tokens = sum(int(u.get("prompt_tokens") or 0) for r in with_usage for u in _usage_turns(r))
    completion_tokens = sum(int(u.get("completion_tokens") or 0) for r in with_usage for u in _usage_turns(r))
    usage: UsageStats = {
        "episodes_with_usage": len(with_usage),
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
    }
    if with_usage and scored:
        usage["prompt_tokens_per_scored_episode"] = prompt_tokens / scored
        usage["completion_tokens_per_scored_episode"] = completion_tokens / scored
        if price_prompt is not None or price_completion is not None:
            cost = (
                prompt_tokens * (price_prompt or 0.0) + completion_tokens * (price_completion or 0.0)
            ) / 1e6
            usage["cost_usd"] = cost
            usage["cost_per_scored_episode_usd"] = cost / scored
    return usage


# ---------------------------------------------------------------------------- rendering


def _dist_line(d: Distribution, digits: int) -> str:
    return f"mean {fmt(d['mean'], digits)}, p50 {fmt(d['p50'], 1)}, p90 {fmt(d['p90'], 1)}, max {d['max']:g}"


def summary_rows(stats: RunStats) -> list[tuple[str, str]]:
    """(label, value) lines shared by the console table and ``stats.md``."""
    reward = stats["reward"]["all"]
    episodes = str(stats["episodes"])
    if stats.get("planned_episodes") is not None:
        episodes = (
            f"{stats['episodes']} recorded of {stats['planned_episodes']} planned "
            f"({stats['missing_episodes']} missing: every rate below is over the recorded ones)"
        )
    rows = [
        ("episodes", episodes),
        ("status", ", ".join(f"{k} {v}" for k, v in stats["status_counts"].items())),
        (
            "verifier_error by cause",
            ", ".join(f"{k} {pct(v)}" for k, v in stats["verifier_error_rates"].items()),
        ),
        ("termination", ", ".join(f"{k} {v}" for k, v in stats["termination_counts"].items())),
        ("valid episodes", f"{stats['valid_episodes']} ({pct(stats['valid_rate'])})"),
        ("format pass rate", pct(stats["format_pass_rate"])),
        (
            "reward (scored)",
            f"{fmt(reward.get('mean'))} ± {fmt(reward.get('std'))} (n={reward['n']})" if reward["n"] else "–",
        ),
    ]
    for method, d in stats["reward"]["by_method"].items():
        rows.append((f"  {method}", f"{fmt(d['mean'])} ± {fmt(d['std'])} (n={d['n']})"))
    rows.append(("code pass rate", f"{pct(stats['code_pass_rate'])} of {stats['code_cells']} cells"))
    if stats["turns"]["n"]:
        rows.append(("turns", _dist_line(stats["turns"], 2)))
    length = stats["length"]
    if length["n"]:
        rows.append((f"length ({length['source']})", _dist_line(length, 1)))
    rows.append(("truncation ratio", pct(stats["truncation_ratio"])))
    judge = stats["judge"]
    if judge["calls"]:
        lat = judge["latency_ms"]
        rows.append(
            (
                "judge",
                f"{judge['calls']} calls, {judge['failed']} failed, {judge['cached']} cached; latency p50 "
                f"{fmt(lat['p50'], 1)} ms, p95 {fmt(lat['p95'], 1)} ms",
            )
        )
    usage = stats["usage"]
    if usage["episodes_with_usage"]:
        line = f"{usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion tokens"
        if "completion_tokens_per_scored_episode" in usage:
            line += (
                f"; per scored episode {fmt(usage['prompt_tokens_per_scored_episode'], 1)} + "
                f"{fmt(usage['completion_tokens_per_scored_episode'], 1)}"
            )
        if "cost_per_scored_episode_usd" in usage:
            line += f"; ${usage['cost_per_scored_episode_usd']:.4f} per scored episode"
        rows.append(("policy usage", line))
    return rows


def render_markdown(stats: RunStats, source: str) -> str:
    lines = [f"# Run statistics: {source}", "", "| metric | value |", "|---|---|"]
    lines += [
        f"| {label.strip() if not label.startswith('  ') else '… ' + label.strip()} | {value} |"
        for label, value in summary_rows(stats)
    ]
    if stats["components"]:
        lines += [
            "",
            "## Reward components (scored episodes)",
            "",
            "| component | n | mean |",
            "|---|---|---|",
        ]
        lines += [f"| {k} | {v['n']} | {v['mean']:.4f} |" for k, v in stats["components"].items()]
    hist = stats["turns"].get("histogram") or {}
    if hist:
        lines += ["", "## Turns", "", "| turns | episodes |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in hist.items()]
    lines += ["", "## Definitions", "", *(f"- {d}" for d in DEFINITIONS)]
    return "\n".join(lines) + "\n"


def plot(stats: RunStats, path: Path) -> None:
    """Three panels: mean reward per component, turns histogram, status counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    comps = stats["components"]
    ax = axes[0]
    if comps:
        names = list(comps)
        ax.barh(names, [comps[k]["mean"] for k in names], color="#4c72b0")
        ax.axvline(0, color="black", linewidth=0.8)
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=8)
    ax.set_title("mean reward per component (scored)")
    hist = stats["turns"].get("histogram") or {}
    ax = axes[1]
    if hist:
        ax.bar([int(k) for k in hist], list(hist.values()), color="#55a868")
    ax.set_title("turns per episode")
    ax.set_xlabel("turns")
    ax.set_ylabel("episodes")
    ax = axes[2]
    status = stats["status_counts"]
    colors = {"scored": "#55a868", "verifier_error": "#dd8452", "environment_error": "#c44e52"}
    ax.bar(list(status), list(status.values()), color=[colors.get(k, "#8172b3") for k in status])
    ax.set_title("reward status")
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(stats: RunStats, out: Path, source: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "stats.json", out / "stats.md", out / "stats.png"]
    paths[0].write_text(json.dumps(stats, indent=2) + "\n")
    paths[1].write_text(render_markdown(stats, source))
    plot(stats, paths[2])
    return paths
