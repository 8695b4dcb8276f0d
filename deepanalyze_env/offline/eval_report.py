"""Evaluation reports from episode records: ``deepanalyze-rl eval`` and ``eval --compare``.

Every number comes from the records of an eval folder (docs/design.md §9) plus ``tasks.json``
(each task's method, family and difficulty as the task file gave them), so a report can be
recomputed anywhere. The definitions are data (:data:`DEFINITIONS`) and go into ``report.md``.

Intervals are percentile bootstraps over *tasks* (the samples of one task are correlated: a
bootstrap over episodes would be too narrow), with a fixed seed so a report is reproducible.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, TypedDict

from deepanalyze_env.core.contracts import EpisodeRecord, JsonObject, JsonValue, verifier_error_rates
from deepanalyze_env.core.records import load_run, own_turn_indices
from deepanalyze_env.offline.eval_schema import (
    Comparison,
    EpisodeCounts,
    EvalReport,
    MetricDiff,
    PassAt,
    Summary,
    TaskMeans,
)
from deepanalyze_env.offline.report import bootstrap_ci, mean
from deepanalyze_env.offline.rundir import read_plan
from rewards import ACCURACY_COMPONENTS
from rewards.plan import GATE_PENALTY, spec_accuracy_component

GATE_RAN = ("scored", "verifier_error")  # an environment_error episode never reached the gate
# A planned episode with no record (its job raised, or the run was cut short): counted as a
# failed gate — reward GATE_PENALTY, format gate 0, accuracy 0 — never left out of a rate.
MISSING: Literal["missing"] = "missing"
FAILED = ("scored", MISSING)  # statuses whose reward enters the reward mean
BREAKDOWNS = ("method", "family", "difficulty")
TASKS_FILE = "tasks.json"

DEFINITIONS = (
    "*episodes*: every figure is over the planned episodes (`planned.json`); a planned episode with no "
    f"record (its job raised, or the run stopped) has status `{MISSING}` and counts as a failed format "
    f"gate: reward {GATE_PENALTY}, gate 0, accuracy 0. *finished* / *missing* count them.",
    "*reward*: mean over `scored` and `missing` episodes (a `verifier_error` reward was not computed and "
    "is left out); 95 % interval: percentile bootstrap over tasks (2000 resamples, seed 0).",
    "*format-gate pass rate*: `format_ok` over episodes whose gate ran "
    "(status `scored` or `verifier_error`) and `missing` ones (0).",
    "*accuracy*: the method's accuracy component (a component whose name ends in `accuracy`, or one of "
    f"{', '.join(ACCURACY_COMPONENTS)}; "
    "or `--accuracy-component`); an episode that failed the format gate counts 0; a `verifier_error` "
    "episode counts only if the component was computed; a `missing` one counts 0; `environment_error` "
    "episodes do not count. "
    "Methods without such a component are left out of accuracy and pass@k.",
    "*pass@k*: per task with n measured episodes of which c are correct (accuracy >= threshold), "
    "1 - C(n-c, k) / C(n, k) (the unbiased estimator), averaged over tasks with n >= k; pass@1 = mean c/n.",
    "*component means*: over the scored episodes that have the component.",
    "*verifier_error by cause*: the share of all episodes (`missing` ones included) that are "
    "`verifier_error` for each `reward_error_cause` (`judge_parse`, `context_length`, `judge_call`, "
    "`reward_raised`).",
    "*turns*: policy turns per finished episode; *completion tokens*: from the policy's reported usage "
    "(absent for policies that report none); *assistant chars*: characters of the policy turns.",
    "*compare*: per task present in both folders (planned or recorded), B minus A of the task's mean; "
    "the interval is a paired percentile bootstrap over those tasks; unpaired tasks are named.",
)


# ---------------------------------------------------------------------------- the report's shapes


class Placeholder(TypedDict):
    """The stand-in record of a planned episode that left none (:func:`placeholder`)."""

    episode_id: str
    task_id: str
    reward_spec: JsonValue  # the planned task's reward_spec (None when the plan has none)
    reward_status: Literal["missing"]
    reward: float
    reward_components: dict[str, float]
    format_ok: bool
    termination: Literal["missing"]
    turns: int
    messages: list[JsonObject]


ReportRecord = EpisodeRecord | Placeholder
"""What a report counts: the folder's records, and a placeholder per missing episode."""


class TaskInfo(TypedDict, total=False):
    """One task as ``tasks.json`` describes it (:func:`task_meta`)."""

    method: JsonValue
    family: JsonValue
    difficulty: JsonValue  # a bank task's {"level", "cells", "operations"}, or a plain label


TASK_METRICS = ("reward", "pass@1", "format_gate")


# ---------------------------------------------------------------------------- small statistics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: the chance that k of its n samples, drawn without
    replacement, hold at least one of the c correct ones."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _rate(counter: Counter[str], n: int) -> dict[str, float]:
    return {k: v / n for k, v in sorted(counter.items())} if n else {}


# ---------------------------------------------------------------------------- per-episode facts


def episode_accuracy(record: ReportRecord, component: str | None) -> float | None:
    """The accuracy value the report counts for one episode (see :data:`DEFINITIONS`)."""
    if component is None:
        return None
    status = record.get("reward_status")
    if status == MISSING:
        return 0.0
    comps = record.get("reward_components") or {}
    if component in comps:
        return float(comps[component]) if status in GATE_RAN else None
    if status == "scored" and record.get("format_ok") is False:
        return 0.0
    return None


def completion_tokens(record: ReportRecord) -> int | None:
    usage = record.get("usage") or {}
    value = usage.get("completion_tokens")
    return int(value) if value is not None else None


def assistant_chars(record: ReportRecord) -> int:
    """Characters of the policy's own turns (not a recovered episode's replayed prefix)."""
    messages = record.get("messages") or []
    return sum(len(messages[i].get("content") or "") for i in own_turn_indices(record))


# ---------------------------------------------------------------------------- planned episodes


def placeholder(episode_id: str, task_id: str, reward_spec: JsonValue) -> Placeholder:
    """The stand-in record of a planned episode that left none: a failed gate (see DEFINITIONS)."""
    return Placeholder(
        episode_id=episode_id,
        task_id=task_id,
        reward_spec=reward_spec,
        reward_status=MISSING,
        reward=GATE_PENALTY,
        reward_components={},
        format_ok=False,
        termination=MISSING,
        turns=0,
        messages=[],
    )


def with_plan(
    records: Sequence[ReportRecord], plan: JsonObject | None
) -> tuple[list[ReportRecord], EpisodeCounts]:
    """``records`` plus a placeholder for every planned episode without one, and the counts.

    Without a plan (a folder made before ``planned.json``) the planned count is unknown and says
    so (``planned: None``) rather than being taken as the recorded count."""
    records = list(records)
    if plan is None:
        tasks = sorted({task_key(r) for r in records})
        return records, EpisodeCounts(planned=None, finished=len(records), missing=None, tasks=tasks)
    have = {str(r.get("episode_id")) for r in records}
    specs = plan.get("reward_specs") or {}
    planned = plan.get("episodes") or []
    holes = [e for e in planned if str(e["episode_id"]) not in have]
    ids = {str(e["episode_id"]) for e in planned}
    out = records + [
        placeholder(str(e["episode_id"]), str(e["task_id"]), specs.get(e["task_id"])) for e in holes
    ]
    counts = EpisodeCounts(
        planned=len(planned),
        finished=len(planned) - len(holes),
        missing=len(holes),
        missing_tasks=sorted({str(e["task_id"]) for e in holes}),
        unplanned=sum(1 for r in records if str(r.get("episode_id")) not in ids),
        tasks=sorted({str(e["task_id"]) for e in planned}),
    )
    return out, counts


def load_eval(folder: str | Path, *, rescored: bool = True) -> tuple[list[ReportRecord], EpisodeCounts]:
    """An eval folder's records with its missing episodes as placeholders, and the counts: what
    every report, comparison and ``learn`` table reads, so none of them sees only the survivors."""
    folder = Path(folder)
    return with_plan(load_run(folder, rescored=rescored).records, read_plan(folder))


def episode_line(counts: EpisodeCounts) -> str:
    """One line a reader cannot miss: planned, finished, missing (and what a missing one counts)."""
    if counts.get("planned") is None:
        return f"Episodes: {counts['finished']} recorded; planned unknown (the folder has no planned.json)."
    line = f"Episodes: planned {counts['planned']}, finished {counts['finished']}"
    line += f", missing {counts['missing']}"
    if counts["missing"]:
        line += (
            f" (tasks {', '.join(counts.get('missing_tasks', []))}; each counts as a failed gate: reward "
            f"{GATE_PENALTY}, accuracy 0)"
        )
    return line + "."


# ---------------------------------------------------------------------------- the report


def task_key(record: ReportRecord) -> str:
    return str(record.get("task_id"))


def per_task(records: Sequence[ReportRecord]) -> dict[str, list[ReportRecord]]:
    """The records grouped by task (the unit every interval resamples)."""
    by_task: dict[str, list[ReportRecord]] = defaultdict(list)
    for record in records:
        by_task[task_key(record)].append(record)
    return by_task


def gate_values(records: Sequence[ReportRecord]) -> list[float]:
    """1 or 0 per episode whose format gate ran (or that is missing, a failed gate)."""
    return [
        1.0 if r.get("format_ok") else 0.0 for r in records if r.get("reward_status") in (*GATE_RAN, MISSING)
    ]


def summarize(
    records: Sequence[ReportRecord],
    ks: Sequence[int],
    *,
    accuracy_override: str | None = None,
    threshold: float = 1.0,
) -> Summary:
    """Every metric of one set of episodes (the whole run, or one family/method/difficulty)."""
    n = len(records)
    by_task = per_task(records)
    scored_by_task = [
        [
            float(r["reward"])
            for r in items
            if r.get("reward_status") in FAILED and r.get("reward") is not None
        ]
        for items in by_task.values()
    ]
    rewards = [x for g in scored_by_task for x in g]
    components: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if r.get("reward_status") == "scored":
            for name, value in (r.get("reward_components") or {}).items():
                components[name].append(float(value))
    acc_by_task: dict[str, list[float]] = {}
    for task, items in by_task.items():
        component = accuracy_override or spec_accuracy_component(items[0].get("reward_spec"))
        values = [v for v in (episode_accuracy(r, component) for r in items) if v is not None]
        if component is not None and values:
            acc_by_task[task] = values
    correct = {t: (len(v), sum(1 for x in v if x >= threshold)) for t, v in acc_by_task.items()}
    pass_at: dict[str, PassAt] = {}
    for k in ks:
        eligible = [pass_at_k(nt, ct, k) for nt, ct in correct.values() if nt >= k]
        pass_at[str(k)] = PassAt(value=mean(eligible), tasks=len(eligible))
    acc_values = [x for v in acc_by_task.values() for x in v]
    done = [r for r in records if r.get("reward_status") != MISSING]
    turns = [int(r.get("turns") or 0) for r in done]
    tokens = [t for t in (completion_tokens(r) for r in done) if t is not None]
    return {
        "episodes": n,
        "finished": len(done),
        "missing": n - len(done),
        "tasks": len(by_task),
        "reward_mean": mean(rewards),
        "reward_ci95": bootstrap_ci(scored_by_task),
        "reward_n": len(rewards),
        "format_gate_pass_rate": mean(gate_values(records)),
        "format_gate_ci95": bootstrap_ci([gate_values(items) for items in by_task.values()]),
        "accuracy_mean": mean(acc_values),
        "accuracy_n": len(acc_values),
        "pass_at": pass_at,
        "components": {name: mean(values) for name, values in sorted(components.items())},
        "status_rates": _rate(Counter(str(r.get("reward_status")) for r in records), n),
        "verifier_error_rates": dict(verifier_error_rates(records)),
        "termination_rates": _rate(Counter(str(r.get("termination")) for r in records), n),
        "turns_mean": mean(turns),
        "turns_max": max(turns) if turns else None,
        "completion_tokens_mean": mean(tokens) if len(tokens) == len(done) and done else None,
        "assistant_chars_mean": mean([assistant_chars(r) for r in done]),
    }


def group_value(record: ReportRecord, key: str, tasks: Mapping[str, TaskInfo]) -> str:
    """The group a record falls in for breakdown ``key``: its task's method, family or difficulty
    (``?`` when the task does not say). A bank task's difficulty is an object (level, cells,
    operations) that differs with every operation list; its groups are the levels, the one field
    that orders tasks (``difficulty=medium``), not one group per object printed as a dict."""
    meta = tasks.get(task_key(record)) or TaskInfo()
    if key == "method":
        spec = record.get("reward_spec")
        value = meta.get("method") or (spec.get("method") if isinstance(spec, dict) else None)
    else:
        value = meta.get(key)
    if key == "difficulty" and isinstance(value, dict):
        value = value.get("level")
    return "?" if value is None else str(value)


def build_report(
    records: Sequence[ReportRecord],
    tasks: Mapping[str, TaskInfo],
    samples_per_task: int,
    *,
    accuracy_override: str | None = None,
    threshold: float = 1.0,
    counts: EpisodeCounts | None = None,
) -> EvalReport:
    """The whole report: overall metrics, then the same per method, family and difficulty
    (a dimension appears when at least one task has the field). ``records`` hold the placeholders
    of missing episodes (:func:`with_plan`); ``counts`` are its counts."""
    ks = sorted({1, samples_per_task} | {2**i for i in range(1, 10) if 2**i < samples_per_task})

    def measure(items: Sequence[ReportRecord]) -> Summary:
        return summarize(items, ks, accuracy_override=accuracy_override, threshold=threshold)

    report = EvalReport(
        episodes=counts or with_plan(records, None)[1],
        overall=measure(records),
        samples_per_task=samples_per_task,
        pass_at_ks=ks,
        accuracy_threshold=threshold,
        accuracy_component=accuracy_override,
        breakdowns={},
        definitions=list(DEFINITIONS),
    )
    for key in BREAKDOWNS:
        if key != "method" and not any(key in meta for meta in tasks.values()):
            continue
        groups: dict[str, list[ReportRecord]] = defaultdict(list)
        for record in records:
            groups[group_value(record, key, tasks)].append(record)
        report["breakdowns"][key] = {name: measure(items) for name, items in sorted(groups.items())}
    return report


# ---------------------------------------------------------------------------- compare


def per_task_means(
    records: Sequence[ReportRecord], *, accuracy_override: str | None = None, threshold: float = 1.0
) -> dict[str, TaskMeans]:
    """Per task: mean reward (scored), accuracy rate (pass@1) and format-gate pass rate."""
    by_task = per_task(records)
    out: dict[str, TaskMeans] = {}
    for task, items in by_task.items():
        component = accuracy_override or spec_accuracy_component(items[0].get("reward_spec"))
        acc = [v for v in (episode_accuracy(r, component) for r in items) if v is not None]
        out[task] = {
            "reward": mean([float(r["reward"]) for r in items if r.get("reward_status") in FAILED]),
            "pass@1": mean([1.0 if v >= threshold else 0.0 for v in acc]),
            "format_gate": mean(gate_values(items)),
        }
    return out


def compare_runs(
    a: Sequence[ReportRecord],
    b: Sequence[ReportRecord],
    *,
    accuracy_override: str | None = None,
    threshold: float = 1.0,
) -> Comparison:
    """Paired per-task differences B − A of reward, pass@1 and format-gate rate, with intervals."""
    ta = per_task_means(a, accuracy_override=accuracy_override, threshold=threshold)
    tb = per_task_means(b, accuracy_override=accuracy_override, threshold=threshold)
    common = sorted(set(ta) & set(tb))
    metrics: dict[str, MetricDiff] = {}
    for metric in TASK_METRICS:
        pairs = [
            (t, ta[t][metric], tb[t][metric])
            for t in common
            if ta[t][metric] is not None and tb[t][metric] is not None
        ]
        diffs = [vb - va for _, va, vb in pairs]
        metrics[metric] = MetricDiff(
            tasks=len(pairs),
            mean_a=mean([va for _, va, _ in pairs]),
            mean_b=mean([vb for _, _, vb in pairs]),
            mean_diff=mean(diffs),
            diff_ci95=bootstrap_ci([[d] for d in diffs]),
            b_better=sum(1 for d in diffs if d > 0),
            a_better=sum(1 for d in diffs if d < 0),
            ties=sum(1 for d in diffs if d == 0),
        )
    return Comparison(
        metrics=metrics,
        per_task={t: {"a": ta[t], "b": tb[t]} for t in common},
        only_in_a=sorted(set(ta) - set(tb)),
        only_in_b=sorted(set(tb) - set(ta)),
        definitions=[DEFINITIONS[-1], DEFINITIONS[0], DEFINITIONS[1].split(";")[1].strip()],
    )


# ---------------------------------------------------------------------------- writing


def fmt(value: float | int | str | Sequence[float] | None, signed: bool = False) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:+.3f}" if signed else f"{value:.3f}"
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return f"[{fmt(value[0], signed)}, {fmt(value[1], signed)}]"
    return str(value)


def episodes_cell(s: Summary) -> str:
    """``6`` or ``6 (1 missing)``: the planned episodes a row's figures are over."""
    return f"{s['episodes']} ({s['missing']} missing)" if s.get("missing") else str(s["episodes"])


def summary_row(name: str, s: Summary, ks: Sequence[int]) -> list[str]:
    """One group's row of the report table (markdown here, the console in the commands)."""
    return [
        name,
        episodes_cell(s),
        fmt(s["reward_mean"], True),
        fmt(s["reward_ci95"], True),
        fmt(s["format_gate_pass_rate"]),
        *(fmt(s["pass_at"][str(k)]["value"]) for k in ks),
        fmt(s["turns_mean"]),
    ]


def report_markdown(report: EvalReport, title: str) -> str:
    ks = report["pass_at_ks"]
    head = [
        "group",
        "episodes",
        "reward",
        "reward 95% CI",
        "format gate",
        *(f"pass@{k}" for k in ks),
        "turns",
    ]
    lines = [f"# {title}", "", episode_line(report["episodes"]), ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines.append("| " + " | ".join(summary_row("all", report["overall"], ks)) + " |")
    for key, groups in report["breakdowns"].items():
        for name, s in groups.items():
            lines.append("| " + " | ".join(summary_row(f"{key}={name}", s, ks)) + " |")
    o = report["overall"]
    lines += ["", "## Components (scored episodes)", ""]
    lines += [f"- `{k}`: {fmt(v)}" for k, v in o["components"].items()] or ["- none"]
    lines += ["", "## Status and termination", ""]
    lines += [f"- status `{k}`: {fmt(v)}" for k, v in o["status_rates"].items()]
    lines += [
        f"- `verifier_error` caused by `{k}`: {fmt(v)}" for k, v in o.get("verifier_error_rates", {}).items()
    ]
    lines += [f"- termination `{k}`: {fmt(v)}" for k, v in o["termination_rates"].items()]
    lines += [
        "",
        f"Turns: mean {fmt(o['turns_mean'])}, max {o['turns_max']}; completion tokens mean "
        f"{fmt(o['completion_tokens_mean'])}; assistant chars mean {fmt(o['assistant_chars_mean'])}.",
        "",
        "## Definitions",
        "",
    ]
    lines += [f"- {d}" for d in report["definitions"]]
    return "\n".join(lines) + "\n"


def compare_markdown(result: Comparison, label_a: str, label_b: str) -> str:
    lines = [
        f"# Compare: A = `{label_a}`, B = `{label_b}`",
        "",
        "| metric | tasks | A | B | B − A | 95% CI | B better | A better | ties |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for metric, m in result["metrics"].items():
        lines.append(
            f"| {metric} | {m['tasks']} | {fmt(m['mean_a'])} | {fmt(m['mean_b'])} "
            f"| {fmt(m['mean_diff'], True)} | {fmt(m['diff_ci95'], True)} "
            f"| {m['b_better']} | {m['a_better']} | {m['ties']} |"
        )
    lines += ["", "| task | reward A | reward B | pass@1 A | pass@1 B |", "|---|---|---|---|---|"]
    for task, v in result["per_task"].items():
        lines.append(
            f"| {task} | {fmt(v['a']['reward'], True)} | {fmt(v['b']['reward'], True)} "
            f"| {fmt(v['a']['pass@1'])} | {fmt(v['b']['pass@1'])} |"
        )
    if result["only_in_a"] or result["only_in_b"]:
        lines += ["", f"Unpaired tasks: only in A {result['only_in_a']}, only in B {result['only_in_b']}."]
    lines += ["", "## Definitions", ""] + [f"- {d}" for d in result["definitions"]]
    return "\n".join(lines) + "\n"


def write_json(path: Path, data: Mapping[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    tmp.replace(path)


def task_meta(rows: Sequence[JsonObject]) -> dict[str, TaskInfo]:
    """Per task id: method, family, difficulty — from the rows the eval runs (task fields travel in
    ``extra_info``; DeepAnalyze rows may carry them at the top level)."""
    meta: dict[str, TaskInfo] = {}
    for row in rows:
        info = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
        spec = row.get("reward_spec")
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except ValueError:
                spec = {}
        entry = TaskInfo(method=(spec or {}).get("method") or info.get("method"))
        for key in ("family", "difficulty"):
            value = row.get(key, info.get(key))
            if value is not None:
                entry[key] = value
        meta[str(row["task_id"])] = entry
    return meta


def write_report(
    folder: Path, samples_per_task: int, accuracy_component: str | None = None, threshold: float = 1.0
) -> EvalReport:
    """Build the eval folder's report from its records and planned episodes (a missing one counts
    as a failed gate) and write ``report.json``, ``report.md`` and ``report.png``."""
    records, counts = load_eval(folder)
    tasks_path = folder / TASKS_FILE
    tasks = json.loads(tasks_path.read_text()) if tasks_path.is_file() else {}
    report = build_report(
        records,
        tasks,
        samples_per_task,
        accuracy_override=accuracy_component,
        threshold=threshold,
        counts=counts,
    )
    report["folder"] = str(folder)
    write_json(folder / "report.json", report)
    (folder / "report.md").write_text(report_markdown(report, f"Eval: {folder}"))
    from deepanalyze_env.offline.eval_plots import plot_report  # matplotlib: only when writing

    plot_report(report, folder / "report.png")
    return report


def read_report(folder: Path) -> EvalReport:
    """An eval folder's ``report.json`` as :func:`write_report` wrote it."""
    report: EvalReport = json.loads((folder / "report.json").read_text())
    return report
