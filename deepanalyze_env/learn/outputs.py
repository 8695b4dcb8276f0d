"""What the pipeline shows: the before/after table (console and markdown), the paired
comparisons, the warnings that make a table less than like-for-like, and the plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from deepanalyze_env.core.memory import gib
from deepanalyze_env.learn.summary import Headline, LearnSummary


def _f(value: float | int | str | None) -> str:
    return "–" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _ci(interval: Sequence[float] | None) -> str:
    return f"{_f(interval[0])} … {_f(interval[1])}" if interval else "–"


def comparison_lines(summary: LearnSummary) -> list[str]:
    """One line per pair of consecutive stages: the paired reward difference on dev."""
    lines = []
    for pair, metrics in summary["comparisons"].items():
        r = metrics["reward"]
        line = (
            f"{pair}: paired reward difference {_f(r['mean_diff'])} (95% CI {_ci(r.get('diff_ci95'))}, "
            f"{r.get('tasks')} tasks; later stage better on {r.get('b_better')}, "
            f"earlier on {r.get('a_better')})"
        )
        only_a, only_b = metrics.get("only_in_a") or [], metrics.get("only_in_b") or []
        if only_a or only_b:
            line += f"; UNPAIRED tasks left out: only earlier {only_a}, only later {only_b}"
        lines.append(line)
    return lines


def rft_lines(summary: LearnSummary) -> list[str]:
    """One line per rejection-sampling round: what its sample found, what it kept, its cost."""
    lines = []
    for r in summary.get("rft") or []:
        sample = r["sample"]
        peaks = ", ".join(f"{k} {gib(v.get('peak_pss_bytes'))}" for k, v in r["memory"].items())
        seconds = ", ".join(f"{k} {v} s" for k, v in r["seconds"].items())
        line = (
            f"RFT round {r['round']}: {r['episodes']} sampled episodes, sampled accuracy "
            f"{_f(sample['accuracy'])}, gate {_f(sample['format_gate_pass_rate'])}; kept {r['kept']} correct "
            f"episodes from {r['tasks_correct']} of {r['tasks']} tasks"
        )
        line += f"; {seconds}" if seconds else ""
        line += f"; peak memory {peaks}" if peaks else ""
        lines.append(line if r["trained"] else line + "; nothing kept: no SFT, the rounds stopped")
    return lines


def warning_lines(summary: LearnSummary) -> list[str]:
    """What makes the table less than a like-for-like comparison, said above it."""
    lines = []
    cov = summary.get("coverage")
    if cov and not cov["same_tasks"]:
        lines.append(
            "NOT COMPARABLE: the stages cover different dev tasks ("
            + "; ".join(f"{stage} lacks {tasks}" for stage, tasks in cov["lacking"].items())
            + "); read the paired comparisons below, not the table's rows"
        )
    shown = dict(summary["dev"])
    test = summary.get("test")
    if test:
        shown["test"] = test
    for stage, m in shown.items():
        if m.get("missing"):
            lines.append(
                f"{stage}: {m['missing']} of {m['planned']} planned episodes did not finish (tasks "
                f"{', '.join(m['missing_tasks'])}); its figures count each as a failed gate (reward -1, "
                "accuracy 0)"
            )
        elif m.get("planned") is None:
            lines.append(f"{stage}: planned episodes unknown (its eval folder has no planned.json)")
    return lines


def _episodes(m: Headline) -> str:
    if m.get("planned") is None:
        return f"{m['finished']} (planned ?)"
    return f"{m['finished']}/{m['planned']}"


def table(summary: LearnSummary) -> Table:
    t = Table(title="dev set, before and after training", title_justify="left")
    for name, justify in (("stage", "left"), ("finished/planned", "right"), ("format gate", "right")):
        t.add_column(name, justify=justify)
    for name in ("reward", "reward 95% CI", "accuracy"):
        t.add_column(name, justify="right")
    for stage, m in summary["dev"].items():
        ci = _ci(m.get("reward_ci95"))
        t.add_row(
            stage,
            _episodes(m),
            _f(m["format_gate_pass_rate"]),
            _f(m["reward_mean"]),
            ci,
            _f(m["accuracy"]),
        )
    return t


def memory_line(summary: LearnSummary) -> str | None:
    """Each stage's peak memory (PSS of its process tree) and the run's largest, in one line."""
    memory = summary.get("memory") or {}
    if not memory:
        return None
    peaks = ", ".join(f"{k} {gib(v.get('peak_pss_bytes'))}" for k, v in memory.items())
    top = max(v.get("peak_pss_bytes") or 0 for v in memory.values())
    return f"Stage peak memory (PSS of the process tree): {peaks}; the run's peak {gib(top)}"


def markdown(summary: LearnSummary) -> str:
    lines = [f"**{line}**\n" for line in warning_lines(summary)]
    lines += [
        "Figures are over every planned episode; one that did not finish counts as a failed gate.\n",
        "| stage | finished/planned | format gate | reward | reward 95% CI | accuracy (pass@1) |",
        "|---|---|---|---|---|---|",
    ]
    for stage, m in summary["dev"].items():
        ci = _ci(m.get("reward_ci95"))
        lines.append(
            f"| {stage} | {_episodes(m)} | {_f(m['format_gate_pass_rate'])} | {_f(m['reward_mean'])} | {ci} "
            f"| {_f(m['accuracy'])} |"
        )
    lines += ["\n" + line for line in comparison_lines(summary)]
    lines += ["\n" + line for line in rft_lines(summary)]
    lines.append("\nStage seconds: " + ", ".join(f"{k} {v}" for k, v in summary["seconds"].items()))
    memory = memory_line(summary)
    if memory:
        lines.append("\n" + memory)
    return "\n".join(lines) + "\n"


def plot(summary: LearnSummary, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    stages = list(summary["dev"])
    x = list(range(len(stages)))
    for key, label in (
        ("reward_mean", "reward"),
        ("format_gate_pass_rate", "format gate"),
        ("accuracy", "accuracy"),
    ):
        values = [summary["dev"][s][key] for s in stages]
        left.plot(x, [v if v is not None else float("nan") for v in values], marker="o", label=label)
    left.set_xticks(x, stages)
    left.set_ylim(-1.05, 1.05)
    left.set_title("dev set per stage")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    steps = summary["grpo_steps"]
    if steps:
        xs = [s["step"] for s in steps]
        right.plot(xs, [s["reward_mean"] for s in steps], marker="o", linewidth=2, label="reward (trained)")
        for name in sorted({n for s in steps for n in s["components"]}):
            right.plot(xs, [s["components"].get(name) for s in steps], marker=".", alpha=0.8, label=name)
        right.legend(fontsize=8)
    right.set_title("GRPO training reward per step")
    right.set_xlabel("step")
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
