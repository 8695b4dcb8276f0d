"""The figures of an eval report (``report.png``) and of ``eval --compare`` (``compare.png``).

Apart from :mod:`deepanalyze_env.offline.eval_report` so that matplotlib is imported only when a
figure is drawn, and the report's numbers stay readable without the drawing code.
"""

from __future__ import annotations

from pathlib import Path

from deepanalyze_env.offline.eval_report import Comparison, EvalReport


def plot_report(report: EvalReport, png: Path) -> None:
    """One panel per dimension (all, method, family, difficulty): reward with its interval,
    format-gate pass rate and pass@1 side by side per group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("all", {"all": report["overall"]}), *report["breakdowns"].items()]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), squeeze=False)
    for ax, (key, groups) in zip(axes[0], panels, strict=True):
        names = list(groups)
        x = list(range(len(names)))  # plain floats: matplotlib's bar warns on numpy positions
        width = 0.27
        reward = [groups[g]["reward_mean"] for g in names]
        ci = [groups[g]["reward_ci95"] for g in names]
        err = [
            [max(r - c[0], 0.0) if r is not None and c else 0.0 for r, c in zip(reward, ci, strict=True)],
            [max(c[1] - r, 0.0) if r is not None and c else 0.0 for r, c in zip(reward, ci, strict=True)],
        ]
        left = [i - width for i in x]
        ax.bar(left, [r if r is not None else 0.0 for r in reward], width, label="reward")
        ax.errorbar(
            left, [r if r is not None else 0.0 for r in reward], yerr=err, fmt="none", capsize=3, color="k"
        )
        ax.bar(x, [groups[g]["format_gate_pass_rate"] or 0.0 for g in names], width, label="format gate")
        right = [i + width for i in x]
        ax.bar(right, [groups[g]["pass_at"]["1"]["value"] or 0.0 for g in names], width, label="pass@1")
        ax.set_xticks(x, names, rotation=20, fontsize=8)
        ax.set_ylim(-1.05, 1.05)
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_title(key)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def plot_compare(result: Comparison, png: Path, label_a: str, label_b: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(result["metrics"].items())
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, (name, m) in enumerate(metrics):
        diffs = [
            v["b"][name] - v["a"][name]
            for v in result["per_task"].values()
            if v["a"][name] is not None and v["b"][name] is not None
        ]
        ax.scatter([i] * len(diffs), diffs, alpha=0.4, s=12)
        if m["mean_diff"] is not None and m["diff_ci95"]:
            low, high = m["diff_ci95"]
            ax.errorbar(
                [i + 0.15],
                [m["mean_diff"]],
                yerr=[[m["mean_diff"] - low], [high - m["mean_diff"]]],
                fmt="o",
                color="black",
                capsize=4,
            )
    ax.axhline(0, color="gray", linewidth=0.8)
    ax.set_xticks(range(len(metrics)), [name for name, _ in metrics])
    ax.set_ylabel(f"per task: {label_b} − {label_a}")
    ax.set_title("paired differences (dots: tasks; bar: mean, 95% CI)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
