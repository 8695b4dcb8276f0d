"""The RESULTS.md section of ``learning2.py``: the pre-registered configuration, each seed's
tables, the per-family table, RFT against GRPO at equal minutes, the targets met or MISSED over
the seeds (a target read over seeds not yet run is PENDING, never met), and the plot.

It reads only the configuration and the seeds' ``result.json`` (plain JSON), so the section can
be rewritten from finished runs without running anything (``learning2.py --report``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from grpo import step_counts

from deepanalyze_env.core.memory import gib
from deepanalyze_env.offline.report import fmt

Json = dict[str, Any]


def _ci(ci: Sequence[float] | None) -> str:
    return f"{fmt(ci[0])} … {fmt(ci[1])}" if ci else "–"


def _acc(a: Json | None) -> str:
    return "–" if not a else f"{fmt(a['accuracy'])} ({_ci(a['ci95'])})"


def _paired(t: Json) -> str:
    p = "–" if t["mcnemar_p"] is None else f"{t['mcnemar_p']:.4f}"
    line = (
        f"{fmt(t['accuracy_a'])} → {fmt(t['accuracy_b'])}, paired {fmt(t['mean_diff'])} "
        f"(95% CI {_ci(t['ci95'])}; later right where earlier wrong on {t['b_better']} tasks, the "
        f"reverse on {t['a_better']}, {t['ties']} ties; exact McNemar p = {p})"
    )
    return line + (f"; {t['unpaired']} UNPAIRED tasks" if t["unpaired"] else "")


# ------------------------------------------------------------------ configuration


def config_lines(cfg: Json) -> list[str]:
    t = cfg["tasks"]

    def count(n: int) -> str:
        return "all" if n >= 10**6 else str(n)

    lines = [
        f"### Round two, task set `{cfg['task_set']}`: configuration (written before the first run)",
        "",
        f"- command: `python benchmarks/learning2.py --task-set {cfg['task_set']} --seed N` for N in "
        f"{', '.join(map(str, cfg['seeds']))}; the configuration below is `learning2.py`'s `Config`;",
        f"- model: `{cfg['model']}`, full fine-tuning in fp32 on the CPU;",
        f"- tasks: {t['about']}; families: {', '.join(t['families']) or 'all of the bank'}; "
        f"train {count(t['train'])} / dev {count(t['dev'])} / test {count(t['test'])} (split by table; "
        f"samples seeded {cfg['task_seed']}, the same in every seed; the seed is the training seed);",
        f"- env: `{json.dumps(cfg['env'])}`;",
        f"- evals: `{json.dumps(cfg['eval'])}` (greedy: pass@1 is one episode per task); the test split "
        "once per model, after all training;",
        f"- SFT: `{json.dumps(cfg['sft'])}`;",
        f"- GRPO branch (from the SFT model): `{json.dumps(cfg['grpo'])}`, curriculum "
        f"`{json.dumps(cfg['curriculum'])}`;",
    ]
    if cfg["rft"] is None:
        lines.append("- RFT branch: **not configured** (no `rft` stage section): not run;")
    else:
        lines.append(
            f"- RFT branch (from the SFT model): `{json.dumps(cfg['rft'])}` a round; rounds until their "
            f"training seconds reach the GRPO branch's (equal CPU minutes), at most {cfg['rft_max_rounds']};"
        )
    lines += [
        f"- measured outside the timed budget: pass@{cfg['pass_k']} of the SFT model ({cfg['pass_k']} "
        "episodes per dev task at GRPO's temperature), the test evals, the per-family tables;",
        "- timed: a branch's minutes are SFT's stages (reference, SFT, its dev eval) plus the branch's "
        "(estimate, training, dev evals);",
        "",
        "Targets: " + targets_text(cfg),
    ]
    if cfg.get("chosen"):
        lines += ["", "How the settings were chosen (on train; never dev or test):"]
        lines += [f"- {c}" for c in cfg["chosen"]]
    if cfg["pending"]:
        lines += ["", "**PENDING — to be fixed before the first run:**"]
        lines += [f"- {p}" for p in cfg["pending"]]
    return lines


def targets_text(cfg: Json) -> str:
    if cfg["task_set"] == "two":
        return (
            f"dev accuracy ≥ {cfg['accuracy_target']} after the whole pipeline, the RL stage above SFT "
            f"on dev accuracy with the paired 95 % lower bound above 0, ≤ {cfg['budget_minutes']:.0f} "
            f"min per seed on 2 cores — in every seed ({len(cfg['seeds'])})."
        )
    return (
        "dev accuracy above 0 with its 95 % interval (lower bound above 0) after the whole pipeline, "
        "in every seed, and a per-family table saying where the model does not learn at this budget."
    )


# ------------------------------------------------------------------ one seed


def seed_lines(cfg: Json, r: Json) -> list[str]:
    names = list(r["dev"])
    lines = [
        f"#### Seed {r['seed']} ({r['date']}; {r['machine']})",
        "",
        "| model | dev format gate | dev reward | dev accuracy (95% CI) | test accuracy (95% CI), once "
        "| timed minutes |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        d = r["dev"][name]
        minutes = r["sft"]["timed_minutes"] if name == "sft" else r["branches"][name]["timed_minutes"]
        lines.append(
            f"| {name} | {fmt(d['format_gate_pass_rate'])} | {fmt(d['reward_mean'])} "
            f"| {_acc(r['dev_accuracy'][name])} | {_acc(r['test_accuracy'].get(name))} | {minutes} |"
        )
    lines.append("")
    if r.get("branches_not_run"):
        lines.append(f"- **not run in this seed:** {', '.join(r['branches_not_run'])} (configured)")
    for split in ("dev", "test"):
        for pair, t in r["paired"][split].items():
            lines.append(f"- {split}, {pair}: {_paired(t)}")
    k = r["pass_k"]
    lines.append(
        f"- SFT model sampled {k['k']} times per dev task at temperature {k['temperature']} "
        f"(outside the budget): pass@1 {fmt(k['pass_at'].get('1'))}, pass@{k['k']} "
        f"{fmt(k['pass_at'].get(str(k['k'])))}, format gate {fmt(k['format_gate_pass_rate'])}"
    )
    grpo = r["branches"].get("grpo")
    if grpo:
        c = step_counts(grpo["steps"])
        lines.append(
            f"- GRPO: {c['steps']} steps, {c['groups']} groups ({c['zero_variance_groups']} without "
            f"variance), {c['episodes']} episodes trained ({c['length_cut']} length-cut), "
            f"{c['steps_with_nonzero_loss']} steps with a non-zero loss; training "
            f"{grpo['train_seconds'] / 60:.1f} min"
        )
    rft = r["branches"].get("rft")
    if rft:
        rounds = ", ".join(
            f"round {x['round']}: {x['train_seconds'] / 60:.1f} min, dev accuracy "
            f"{fmt((x['dev'] or {}).get('accuracy'))}"
            for x in rft["rounds"]
        )
        lines.append(
            f"- RFT: {len(rft['rounds'])} rounds, training {rft['train_seconds'] / 60:.1f} min ({rounds})"
        )
    lines.append(
        f"- stage minutes: pipelines {r['pipeline_minutes']}, measurement {r['measure_minutes']} (this "
        f"invocation's wall {r.get('wall_minutes')}); "
        f"run's peak memory (PSS of a stage's process tree) {gib(peak_memory(r))}"
    )
    return lines


def peak_memory(r: Json) -> int | None:
    found = [dict(r["sft"].get("memory") or {})]
    for b in r["branches"].values():
        found.append(b.get("memory") or {})
        found += [x.get("memory") or {} for x in b.get("rounds", [])]
    peaks = [v.get("peak_pss_bytes") or 0 for m in found for v in m.values()]
    return max(peaks) if peaks else None


# ------------------------------------------------------------------ over the seeds


def family_table(results: list[Json]) -> tuple[list[str], Json]:
    """Dev accuracy per family and model, the mean over seeds; a family no model answers once and
    whose SFT samples never find an answer is where the model does not learn at this budget."""
    columns = sorted({c for r in results for c in r["families"]}, key=lambda c: (c != "sft", "pass@" in c, c))
    fams = sorted({f for r in results for c in r["families"].values() for f in c})
    table: Json = {}
    for fam in fams:
        row = {}
        for col in columns:
            vals = [r["families"].get(col, {}).get(fam) for r in results]
            vals = [v for v in vals if v is not None]
            row[col] = sum(vals) / len(vals) if vals else None
        row["learned"] = any(v for v in row.values())
        table[fam] = row
    lines = ["| family | " + " | ".join(columns) + " | verdict |", "|---" * (len(columns) + 2) + "|"]
    for fam, row in table.items():
        verdict = "some" if row["learned"] else "**none: not learned at this budget**"
        lines.append(f"| {fam} | " + " | ".join(fmt(row[c]) for c in columns) + f" | {verdict} |")
    return lines, table


def _verdict(values: dict[int, Any], ok: list[bool], missing: list[int]) -> Json:
    """Met only when met in every configured seed; PENDING while seeds are missing and none failed."""
    state = "PENDING" if missing and all(ok) else "met" if all(ok) and ok else "MISSED"
    return {"values": values, "state": state, "seeds_missing": missing}


def targets(cfg: Json, results: list[Json]) -> Json:
    """Each target per branch: its value in each seed, met only when met in every configured seed."""
    out: Json = {}
    done = {r["seed"]: r for r in results}
    branches = sorted({b for r in results for b in r["branches"]})

    for b in branches:
        # a seed run in parts (``--branches``) is missing for the branches it has not run yet
        missing = [s for s in cfg["seeds"] if s not in done or b not in done[s]["branches"]]
        verdict = partial(_verdict, missing=missing)
        rs = [r for r in results if b in r["branches"]]
        acc = {r["seed"]: r["dev_accuracy"][b] for r in rs}
        if cfg["task_set"] == "two":
            out[f"{b}: dev accuracy >= {cfg['accuracy_target']}"] = verdict(
                acc, [(a["accuracy"] or 0) >= cfg["accuracy_target"] for a in acc.values()]
            )
            pairs = {r["seed"]: r["paired"]["dev"][f"sft->{b}"] for r in rs}
            out[f"{b} above SFT on dev accuracy, paired 95% lower bound > 0"] = verdict(
                pairs,
                [t["unpaired"] == 0 and t["ci95"] is not None and t["ci95"][0] > 0 for t in pairs.values()],
            )
            minutes = {r["seed"]: r["branches"][b]["timed_minutes"] for r in rs}
            out[f"{b}: <= {cfg['budget_minutes']:.0f} min per seed (timed stages)"] = verdict(
                minutes, [m <= cfg["budget_minutes"] for m in minutes.values()]
            )
        else:
            out[f"{b}: dev accuracy above 0 (95% lower bound > 0)"] = verdict(
                acc, [a["ci95"] is not None and a["ci95"][0] > 0 for a in acc.values()]
            )
    return out


def equal_minutes_lines(results: list[Json]) -> list[str]:
    lines = []
    for r in results:
        g, f = r["branches"].get("grpo"), r["branches"].get("rft")
        if g and f:
            t = r["paired"]["dev"].get("rft->grpo")
            lines.append(
                f"- seed {r['seed']}: GRPO {g['train_seconds'] / 60:.1f} training min, RFT "
                f"{f['train_seconds'] / 60:.1f} ({len(f['rounds'])} rounds); dev RFT → GRPO: "
                + (_paired(t) if t else "–")
            )
    return lines


def report(
    cfg: Json, results: list[Json], *, png: Path | None = None, config_only: bool = False
) -> tuple[str, Json]:
    lines = config_lines(cfg)
    if config_only:
        return "\n".join(lines) + "\n", {}
    lines += ["", f"### Round two, task set `{cfg['task_set']}`: results", ""]
    if not results:
        lines.append("No seed has run yet.")
    for r in sorted(results, key=lambda x: x["seed"]):
        lines += [*seed_lines(cfg, r), ""]
    summary: Json = {"config": cfg, "seeds": [r["seed"] for r in results]}
    if results:
        fam_lines, fams = family_table(results)
        lines += ["Dev accuracy per family (mean over the seeds run):", "", *fam_lines, ""]
        eq = equal_minutes_lines(results)
        if eq:
            lines += ["RFT against GRPO at equal CPU minutes:", "", *eq, ""]
        found = targets(cfg, results)
        lines.append("Targets (" + targets_text(cfg) + "):")
        lines.append("")
        for name, t in found.items():
            extra = f"; seeds not run yet: {t['seeds_missing']}" if t["seeds_missing"] else ""
            lines.append(f"- {name}: **{t['state']}** ({json.dumps(t['values'])}{extra})")
        summary.update(families=fams, targets=found)
        if png is not None:
            plot(results, fams, png)
            lines += [
                "",
                f"Plot: `{png.name}` (dev accuracy per stage, GRPO train reward per step, per family).",
            ]
    return "\n".join(lines) + "\n", summary


def plot(results: list[Json], fams: Json, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(16, 4.5))
    # GRPO and RFT are parallel branches from the SFT model: each is its own line from "sft"
    rounds = max((len(r["branches"].get("rft", {}).get("rounds", [])) for r in results), default=0)
    labels = ["sft", *(f"rft {k}" for k in range(1, rounds + 1)), "grpo"]
    for i, r in enumerate(results):
        color = f"C{i}"
        sft = r["dev_accuracy"]["sft"]["accuracy"]
        rft = [(x["dev"] or {}).get("accuracy") for x in r["branches"].get("rft", {}).get("rounds", [])]
        if rft:
            left.plot(
                range(len(rft) + 1),
                [sft, *(v if v is not None else float("nan") for v in rft)],
                marker="o",
                color=color,
                label=f"seed {r['seed']}: sft → rft rounds",
            )
        if "grpo" in r["branches"]:
            left.plot(
                [0, len(labels) - 1],
                [sft, r["dev_accuracy"]["grpo"]["accuracy"]],
                marker="s",
                linestyle="--",
                color=color,
                label=f"seed {r['seed']}: sft → grpo",
            )
        steps = r["branches"].get("grpo", {}).get("steps", [])
        if steps:
            mid.plot(
                [s["step"] for s in steps],
                [s["reward_mean"] for s in steps],
                marker=".",
                label=f"seed {r['seed']}",
            )
    left.set_xticks(range(len(labels)), labels)
    left.set_title("dev accuracy (pass@1) per stage")
    left.set_ylim(-0.02, 1.02)
    mid.set_title("GRPO train reward per step")
    mid.set_xlabel("step")
    names = list(fams)
    columns = [c for c in next(iter(fams.values()), {}) if c != "learned"]
    width = 0.8 / max(len(columns), 1)
    for i, col in enumerate(columns):
        right.bar(
            [j + i * width for j in range(len(names))],
            [fams[n][col] or 0 for n in names],
            width=width,
            label=col,
        )
    right.set_xticks(
        [j + 0.4 - width / 2 for j in range(len(names))], names, rotation=60, ha="right", fontsize=7
    )
    right.set_title("dev accuracy per family (mean over seeds)")
    right.set_ylim(0, 1.02)
    for ax in (left, mid, right):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
