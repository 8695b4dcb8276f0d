"""``deepanalyze-rl judge-eval``: check a judge (model, prompts, temperature) before training with it.

Runs every fixture candidate through the judge exactly as the environment would score it and
writes ordering accuracy, noise across repeats, parse-failure rate and latency to ``--out``.
The ``--min-…``/``--max-…`` gates make the exit code 1 when the judge falls short, so a prompt
edit can be checked in CI before anyone spends GPU hours on it. ``--prompt-dir`` given two or
more times scores each prompt set on the same fixtures with the same judge, writes each set's
report under ``--out/<set>/`` and ``compare.{json,md}`` with paired differences from the first
set and 95 % intervals over fixture cases.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from deepanalyze_env.cli.common import (
    SHIPPED_DATA,
    SubParsers,
    UsageError,
    add_shared_flags,
    console,
    load_env_config,
    make_parser,
)
from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.offline.report import fmt, progress_bar

if TYPE_CHECKING:
    from deepanalyze_env.core.config import EnvConfig
    from deepanalyze_env.offline.judge_eval import BadLine, FixtureCase, Sample
    from deepanalyze_env.offline.judge_eval.compare import SetRun
    from rewards.judge import JudgeClient

HEADLINE = (
    "n_cases",
    "n_calls",
    "parse_failure_rate",
    "per_label_mean",
    "ordering_accuracy",
    "score_std_across_repeats",
    "latency_ms_p50",
    "prompt_hash",
    "model",
)


def add_parser(sub: SubParsers) -> None:
    p = make_parser(
        sub,
        "judge-eval",
        "check that a judge ranks good analyses above bad ones, before training with it",
        "deepanalyze-rl judge-eval --judge-base-url http://127.0.0.1:8000/v1 --judge-model judge "
        "--repeats 3 --judge-temperature 0.7 --min-ordering-accuracy 0.8 --out runs/judge-eval",
    )
    p.add_argument(
        "--fixtures",
        nargs="+",
        metavar="FILE",
        help="fixture files or folders of *.jsonl (default: the shipped data/judge_fixtures)",
    )
    p.add_argument("--out", metavar="DIR", help="write report.json, report.md, cases.jsonl, scores.png here")
    p.add_argument(
        "--repeats", type=int, default=1, metavar="N", help="judge samples per candidate (noise; default 1)"
    )
    p.add_argument("--judge-temperature", type=float, metavar="T", help="judge sampling temperature")
    p.add_argument(
        "--prompt-dir",
        action="append",
        metavar="DIR",
        help="rubric prompt files to evaluate instead of the shipped ones ('shipped' names those); "
        "twice or more: compare the sets side by side (paired differences from the first)",
    )
    p.add_argument(
        "--min-ordering-accuracy", type=float, metavar="X", help="exit 1 when ordering accuracy is below X"
    )
    p.add_argument(
        "--max-parse-failure-rate",
        type=float,
        metavar="Y",
        help="exit 1 when the parse-failure rate is above Y",
    )
    add_shared_flags(p)
    p.set_defaults(func=cmd_judge_eval)


def _check_args(args: argparse.Namespace) -> Path:
    if not args.out:
        raise UsageError("--out DIR is required (the report is written there)")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out} exists and is not a folder")
    if args.repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
    for flag, value in (
        ("--min-ordering-accuracy", args.min_ordering_accuracy),
        ("--max-parse-failure-rate", args.max_parse_failure_rate),
    ):
        if value is not None and not 0.0 <= value <= 1.0:
            raise UsageError(f"{flag} must be between 0 and 1, got {value:g}")
    if args.judge_temperature is not None and args.judge_temperature < 0:
        raise UsageError(f"--judge-temperature must be >= 0, got {args.judge_temperature:g}")
    for folder in args.prompt_dir or []:
        if folder != SHIPPED and not Path(folder).is_dir():
            raise UsageError(f"--prompt-dir: no such folder {folder} (or 'shipped' for the shipped prompts)")
    return out


SHIPPED = "shipped"  # the --prompt-dir value naming the shipped prompts (a folder so named: ./shipped)


def prompt_sets(args: argparse.Namespace, judge: JsonObject) -> list[tuple[str, str | None]]:
    """(name, prompt_dir) per set: the --prompt-dir values in order (None for the shipped prompts),
    or the config's judge.prompt_dir alone. Names are folder names, made unique."""
    given = args.prompt_dir or [judge.get("prompt_dir") or SHIPPED]
    sets: list[tuple[str, str | None]] = []
    for folder in given:
        base = SHIPPED if folder == SHIPPED else (Path(folder).resolve().name or "prompts")
        name, n = base, 2
        while name in {s[0] for s in sets}:
            name, n = f"{base}-{n}", n + 1
        sets.append((name, None if folder == SHIPPED else folder))
    return sets


def judge_env_config(args: argparse.Namespace) -> JsonObject:
    """env_config with this command's judge flags layered on the shared ones, validated."""
    from deepanalyze_env.core.config import EnvConfig

    env_config = load_env_config(args)
    judge = dict(env_config.get("judge") or {})
    if args.judge_temperature is not None:
        judge["temperature"] = args.judge_temperature
    if args.prompt_dir and len(args.prompt_dir) == 1:
        judge["prompt_dir"] = None if args.prompt_dir[0] == SHIPPED else args.prompt_dir[0]
    if judge.get("backend") == "transformers" and "concurrency" not in judge:
        # A local model generates one call at a time; queued calls would spend their timeout
        # waiting for the model, so send them one by one unless told otherwise.
        judge["concurrency"] = 1
    env_config["judge"] = judge
    EnvConfig.from_any(env_config)
    return env_config


def _cases(args: argparse.Namespace) -> tuple[list[FixtureCase], list[BadLine], list[str]]:
    """The fixture cases, the lines skipped (printed) and the paths read; none usable is a usage error."""
    from deepanalyze_env.offline.judge_eval import load_fixtures

    fixture_paths = args.fixtures or [str(SHIPPED_DATA / "judge_fixtures")]
    try:
        cases, bad_lines = load_fixtures(fixture_paths)
    except FileNotFoundError as exc:
        raise UsageError(f"--fixtures: {exc}")
    for bad in bad_lines:
        console.print(f"[yellow]skipped[/yellow] {bad.file}:{bad.line}: {bad.error}", highlight=False)
    if not cases:
        first = (
            f"; first problem: {bad_lines[0].file}:{bad_lines[0].line}: {bad_lines[0].error}"
            if bad_lines
            else ""
        )
        raise UsageError(f"no usable fixture case in {', '.join(map(str, fixture_paths))}{first}")
    return cases, bad_lines, fixture_paths


def cmd_judge_eval(args: argparse.Namespace) -> int:
    from deepanalyze_env.core.config import EnvConfig
    from deepanalyze_env.core.profiles import PROFILES
    from deepanalyze_env.offline.judge_eval import prompt_set, run_samples
    from rewards.judge import get_judge_client

    start = time.monotonic()
    out = _check_args(args)
    env_config = judge_env_config(args)
    config = EnvConfig.from_any(env_config)
    if not config.judge.configured:
        raise UsageError(
            "no judge configured: give --judge-base-url and --judge-model (an OpenAI-compatible "
            "endpoint), --judge-backend transformers --judge-model PATH, or a --config with a judge section"
        )
    cases, bad_lines, fixture_paths = _cases(args)
    clients = []
    for name, folder in prompt_sets(args, env_config["judge"]):
        # a bad judge setting, or a missing or broken prompt file, is a one-line error before any call
        client = get_judge_client({**env_config["judge"], "prompt_dir": folder})
        prompt_set(client.settings.prompt_dir, cases, [])
        clients.append((name, client))

    total = sum(len(case.candidates) for case in cases) * args.repeats * len(clients)
    counts = {"scored": 0, "parse_error": 0, "call_error": 0, "error": 0}
    sampled = []
    with progress_bar("judge-eval", total=total, console=console) as (progress, bar):

        def done(sample: Sample) -> None:
            counts[sample.status] += 1
            info = f"parse failures {counts['parse_error']}, errors {counts['call_error'] + counts['error']}"
            progress.update(bar, advance=1, info=info)

        for name, client in clients:
            rule = PROFILES[config.profile].score_rule
            sampled.append(
                (
                    name,
                    client,
                    run_samples(cases, client, repeats=args.repeats, score_rule=rule, on_done=done),
                )
            )

    context = SetContext(config, fixture_paths, bad_lines, start)
    runs = [_report_set(args, name, client, cases, samples, context) for name, client, samples in sampled]
    if len(runs) == 1:
        return _finish_single(args, out, runs[0], sampled[0][2])
    return _finish_compare(args, out, runs, cases)


@dataclass(frozen=True)
class SetContext:
    """What every prompt set's report states alike: the env config, the fixtures read and the
    lines skipped, and when the command started."""

    config: EnvConfig
    fixtures: list[str]
    bad_lines: list[BadLine]
    start: float


def _report_set(
    args: argparse.Namespace,
    name: str,
    client: JudgeClient,
    cases: list[FixtureCase],
    samples: list[Sample],
    context: SetContext,
) -> SetRun:
    """One prompt set's report (report.json's content) and case rows."""
    from deepanalyze_env.offline.judge_eval import check_thresholds, evaluate_cases, prompt_set
    from deepanalyze_env.offline.judge_eval.compare import SetRun

    settings = client.settings
    rows, metrics = evaluate_cases(cases, samples)
    gates = check_thresholds(metrics, args.min_ordering_accuracy, args.max_parse_failure_rate)
    prompts = prompt_set(settings.prompt_dir, cases, samples)
    judge = settings.describe()
    report: dict[str, Any] = {
        **{key: metrics[key] for key in HEADLINE if key in metrics},
        "prompt_hash": prompts["prompt_hash"],
        "model": settings.model,
        **{key: value for key, value in metrics.items() if key not in HEADLINE},
        "prompt_hashes": prompts["prompt_hashes"],
        "prompt_dir": prompts["prompt_dir"],
        "backend": judge["backend"],
        "base_url": judge["base_url"],
        "temperature": judge["temperature"],
        "max_tokens": judge["max_tokens"],
        "profile": context.config.profile,
        "repeats": args.repeats,
        "fixtures": [str(p) for p in context.fixtures],
        "n_bad_lines": len(context.bad_lines),
        "bad_lines": [bad.as_dict() for bad in context.bad_lines],
        "thresholds": gates,
        "passed": all(gate["passed"] for gate in gates.values()),
        "elapsed_s": round(time.monotonic() - context.start, 3),
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    return SetRun(name, settings.prompt_dir, report, rows)


def _finish_single(args: argparse.Namespace, out: Path, run: SetRun, samples: list[Sample]) -> int:
    from deepanalyze_env.offline.judge_eval import write_outputs

    report = run.report
    write_outputs(out, report, run.rows)
    print_summary(report)
    if report["n_scored"] == 0:
        first = next((s.error for s in samples if s.error), "no sample was scored")
        console.print(
            f"[yellow]warning:[/yellow] no candidate got a score; first error: {first}", highlight=False
        )
    console.print(
        f"report written under [bold]{out}[/bold] (report.md, report.json, cases.jsonl, scores.png)"
    )
    return 0 if report["passed"] else 1


def _finish_compare(args: argparse.Namespace, out: Path, runs: list[SetRun], cases: list[FixtureCase]) -> int:
    from deepanalyze_env.offline.judge_eval import write_outputs
    from deepanalyze_env.offline.judge_eval.compare import compare_sets, write_compare

    for run in runs:
        write_outputs(out / run.name, run.report, run.rows)
    first = runs[0].report
    header = {
        "model": first["model"],
        "backend": first["backend"],
        "base_url": first["base_url"],
        "temperature": first["temperature"],
        "repeats": args.repeats,
        "n_cases": len(cases),
        "fixtures": first["fixtures"],
    }
    result = compare_sets(runs)
    write_compare(out, result, header)
    print_comparison(result, header)
    console.print(
        f"written under [bold]{out}[/bold]: compare.md, compare.json, and each set's report in "
        + ", ".join(f"{run.name}/" for run in runs)
    )
    return 0 if all(run.report["passed"] for run in runs) else 1


def print_comparison(result: dict[str, Any], header: dict[str, Any]) -> None:
    table = Table(title=f"prompt sets, judge {header['model']} ({header['backend']})", title_justify="left")
    for col in ("set", "ordering", "parse failures", "std across repeats", "gates"):
        table.add_column(col)
    for s in result["sets"]:
        table.add_row(
            s["name"],
            fmt(s["ordering_accuracy"]),
            fmt(s["parse_failure_rate"]),
            fmt(s["score_std_across_repeats"]),
            "pass" if s["passed"] else "FAIL",
        )
    console.print(table)
    for d in result["differences"]:
        parts = []
        for metric, m in d["metrics"].items():
            if m["diff"] is None:
                parts.append(f"{metric} –")
                continue
            ci = m["ci95"]
            parts.append(f"{metric} {m['diff']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]")
        console.print(
            f"{d['set']} − {d['minus']} (paired, 95 % over cases): " + " · ".join(parts), highlight=False
        )


def print_summary(report: dict[str, Any]) -> None:
    table = Table(title=f"judge {report['model']} ({report['backend']})")
    for col in ("judge", "cases", "ordering", "reference", "perturbed", "wrong"):
        table.add_column(col)
    for judge, stats in report["per_judge"].items():
        means = stats["per_label_mean"]
        table.add_row(
            judge,
            str(stats["n_cases"]),
            fmt(stats["ordering_accuracy"]),
            *(fmt(means.get(label)) for label in ("reference", "perturbed", "wrong")),
        )
    console.print(table)
    console.print(
        f"ordering accuracy {fmt(report['ordering_accuracy'])} over {report['n_pairs']} pairs · "
        f"parse failures {fmt(report['parse_failure_rate'])} of {report['n_replies']} replies · "
        f"std across repeats {fmt(report['score_std_across_repeats'])} · "
        f"latency p50 {fmt(report['latency_ms_p50'])} ms · call errors {report['n_call_errors']}",
        highlight=False,
    )
    for name, gate in report["thresholds"].items():
        verdict = "[green]PASS[/green]" if gate["passed"] else "[red]FAIL[/red]"
        console.print(f"{verdict} {name}: {fmt(gate['value'])} (limit {gate['limit']:g})", highlight=False)
