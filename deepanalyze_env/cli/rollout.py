"""``deepanalyze-rl rollout``: run episodes with a policy outside a trainer and record them.

Collects SFT/eval data with a teacher (``--policy openai``), a local model
(``--policy transformers``) or the shipped reference trajectories (``--policy scripted``).
With ``--out DIR`` every finished episode is a record (docs/design.md §9) the moment it ends,
so a killed run loses only the episodes in flight and ``--resume`` finishes it.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from typing import TYPE_CHECKING

from rich.table import Table

from deepanalyze_env.cli.common import (
    SHIPPED_DATA,
    SubParsers,
    UsageError,
    add_shared_flags,
    console,
    load_env_config,
    make_parser,
    task_files,
    template_kwargs,
)
from deepanalyze_env.core.contracts import JsonObject

if TYPE_CHECKING:
    from deepanalyze_env.core.filters import RecordFilter
    from deepanalyze_env.offline.policies import Policy
    from deepanalyze_env.offline.rollout import EpisodeOutcome
    from deepanalyze_env.offline.rundir import RunDir
    from deepanalyze_env.offline.runner import RunOutcome

TABLE_LIMIT = 40  # print one row per episode up to this many, else a per-method summary


def add_parser(sub: SubParsers) -> None:
    p = make_parser(
        sub,
        "rollout",
        "run episodes with a policy and record them",
        "deepanalyze-rl rollout --policy openai --policy-base-url http://127.0.0.1:8000/v1 "
        "--policy-model DeepAnalyze-8B --tasks data/tasks/qa.jsonl --workspace-root data --samples 4 "
        "--concurrency 8 --judge-base-url http://127.0.0.1:8001/v1 --judge-model judge --out runs/teacher "
        "--keep 'reward_status == \"scored\" and reward >= 0.5'",
    )
    p.add_argument(
        "--tasks",
        nargs="+",
        metavar="FILE",
        help="task files or dataset rows (JSONL); default: the shipped tasks",
    )
    p.add_argument("--out", metavar="DIR", help="run folder for the episode records (see --resume)")
    p.add_argument("--samples", type=int, default=1, metavar="N", help="episodes per task (and label)")
    p.add_argument(
        "--concurrency", type=int, default=1, metavar="N", help="episodes in flight at once (default 1)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="finish the run in --out: skip the episodes it has, run the missing ones",
    )
    p.add_argument(
        "--keep",
        metavar="EXPR",
        help="also write the episodes matching EXPR to kept.jsonl, e.g. "
        "'reward_status == \"scored\" and reward >= 0.5' (fields of the record; method = reward_spec.method)",
    )
    p.add_argument("--run-id", metavar="ID", help="id of a new run (default: date and random suffix)")
    pol = p.add_argument_group("policy")
    pol.add_argument(
        "--policy", default="scripted", choices=["scripted", "openai", "transformers"], help="who acts"
    )
    pol.add_argument("--policy-base-url", metavar="URL", help="openai: the endpoint (…/v1)")
    pol.add_argument(
        "--policy-model",
        metavar="NAME",
        help="openai: served model name; transformers: path, hub id or embedded:smollm2 (the default)",
    )
    pol.add_argument("--policy-temperature", type=float, metavar="T", help="sampling temperature (0)")
    pol.add_argument("--policy-max-tokens", type=int, metavar="N", help="tokens per turn (4096 / 512)")
    pol.add_argument(
        "--policy-api-key-env",
        default="OPENAI_API_KEY",
        metavar="VAR",
        help="openai: environment variable holding the API key (never pass the key itself)",
    )
    pol.add_argument("--policy-timeout", type=float, metavar="S", help="openai: seconds per request (600)")
    pol.add_argument(
        "--policy-layout",
        choices=["chat", "continue"],
        help="chat: observations as user turns (openai default); continue: the episode as one "
        "assistant message to continue, DeepAnalyze's layout (transformers default; vLLM for openai)",
    )
    pol.add_argument(
        "--policy-chat-template",
        metavar="FILE|trl:NAME",
        help="transformers: a chat template replacing the tokenizer's, as the recipes' chat_template",
    )
    pol.add_argument(
        "--policy-chat-template-kwargs",
        metavar="JSON",
        help="transformers: chat template arguments, as the recipes' trl.chat_template_kwargs "
        "(e.g. '{\"enable_thinking\": false}' for Qwen3)",
    )
    pol.add_argument(
        "--trajectories",
        nargs="+",
        metavar="FILE",
        help="scripted: trajectory files (default: data/trajectories.jsonl)",
    )
    pol.add_argument("--labels", default="good,bad", help="scripted: which trajectories to replay")
    add_shared_flags(p)
    p.set_defaults(func=cmd_rollout)


def build_policy(args: argparse.Namespace, action_format: str = "tags") -> Policy:
    from deepanalyze_env.generation.chat_templates import chat_template_text
    from deepanalyze_env.offline.policies import make_policy

    return make_policy(
        args.policy,
        trajectories=args.trajectories or [str(SHIPPED_DATA / "trajectories.jsonl")],
        action_format=action_format,
        model=args.policy_model,
        base_url=args.policy_base_url,
        api_key=os.environ.get(args.policy_api_key_env) if args.policy_api_key_env else None,
        temperature=args.policy_temperature,
        max_tokens=args.policy_max_tokens,
        timeout_s=args.policy_timeout,
        layout=args.policy_layout,
        max_batch=args.concurrency,  # transformers: concurrent episodes' turns share one generate call
        chat_template_kwargs=template_kwargs(
            args.policy_chat_template_kwargs, "--policy-chat-template-kwargs"
        ),
        chat_template=(
            chat_template_text(args.policy_chat_template, None, "--policy-chat-template")
            if args.policy_chat_template
            else None
        ),
    )


def cmd_rollout(args: argparse.Namespace) -> int:
    from deepanalyze_env.core.filters import FilterError, RecordFilter
    from deepanalyze_env.core.tasks import load_task_files
    from deepanalyze_env.offline.rundir import RunDirError, RunSettings, task_fingerprint
    from deepanalyze_env.offline.runner import NothingToRun, open_run, run_planned, scripted_labels

    if args.samples < 1:
        raise UsageError("--samples must be >= 1")
    if args.concurrency < 1:
        raise UsageError("--concurrency must be >= 1")
    if (args.resume or args.keep) and not args.out:
        raise UsageError("--resume and --keep need --out DIR")
    keep = None
    if args.keep:
        try:
            keep = RecordFilter(args.keep)
        except FilterError as exc:
            raise UsageError(f"--keep: {exc}")
    env_config = load_env_config(args)
    files = task_files(args, env_config)
    rows = load_task_files(files, env_config.get("workspace_root"))
    policy = build_policy(args, env_config.get("action_format", "tags"))
    labels, labels_for = scripted_labels(policy, args.labels) if args.policy == "scripted" else ([], None)
    run: RunDir | None = None
    try:
        if args.out:
            settings = RunSettings(
                kind="rollout",
                tasks=[str(p) for p in files],
                task_fingerprint=task_fingerprint(rows),
                samples=args.samples,
                labels=labels or None,
                policy=policy.policy_id,
                policy_settings=_policy_settings(args),
                keep=args.keep,
            )
            run = open_run(args.out, settings, rows, env_config, resume=args.resume, run_id=args.run_id)
            if keep is None and run.manifest.get("keep"):
                keep = RecordFilter(run.manifest["keep"])
        outcome = run_planned(
            rows,
            env_config,
            policy,
            samples=args.samples,
            labels_for=labels_for,
            run=run,
            run_id=run.run_id if run is not None else (args.run_id or "local"),
            concurrency=args.concurrency,
            label="rollout",
            console=console,
            eta=True,
        )
    except (NothingToRun, RunDirError) as exc:
        raise UsageError(str(exc))
    return _finish(outcome, run, keep)


def _finish(outcome: RunOutcome, run: RunDir | None, keep: RecordFilter | None) -> int:
    """Print what the run did, consolidate its folder, and choose the exit code."""
    jobs, results, failed = outcome.jobs, outcome.results, outcome.failed
    if outcome.done_before == len(jobs):
        console.print(f"nothing left to run: all {len(jobs)} episodes are recorded")
    elif len(results) <= TABLE_LIMIT:
        print_results(results)
    else:
        print_summary(results)
    if run is not None:
        n, kept = run.consolidate(outcome.episode_ids, keep)
        missing = run.missing(outcome.episode_ids)
        line = f"{n} episode records in [bold]{run.path / 'episodes.jsonl'}[/bold]"
        if kept is not None:
            line += f", {kept} kept in [bold]{run.path / 'kept.jsonl'}[/bold]"
        console.print(line + f" (run {run.run_id})")
        if missing:
            console.print(
                f"[yellow]{missing} of {len(jobs)} episodes are missing[/yellow]; run the same command "
                "with --resume to finish the run"
            )
    if failed:
        first = failed[0]
        console.print(
            f"[red]{len(failed)} episodes did not finish[/red] (not recorded); first: "
            f"{first.task_id}: {first.error}",
            highlight=False,
        )
    if outcome.interrupted:
        console.print("[yellow]interrupted[/yellow]: episodes in flight were dropped")
        return 130
    return 1 if failed else 0


def _policy_settings(args: argparse.Namespace) -> JsonObject:
    return {
        "kind": args.policy,
        "model": args.policy_model,
        "base_url": args.policy_base_url,
        "temperature": args.policy_temperature,
        "max_tokens": args.policy_max_tokens,
        "layout": args.policy_layout,
    }


def print_results(results: list[EpisodeOutcome]) -> None:
    table = Table(title="episodes", show_lines=False)
    for col in ("task", "label", "reward", "status", "gate", "end", "turns", "code_pass", "components"):
        table.add_column(col, overflow="fold")
    for r in results:
        meta = r.metadata
        comps = ", ".join(f"{k}={v:.2f}" for k, v in meta.get("reward_components", {}).items())
        passes = meta.get("code_pass", [])
        table.add_row(
            r.task_id,
            r.label or "",
            "" if r.reward is None else f"{r.reward:+.3f}",
            r.status,
            str(meta.get("gate") or ""),
            str(meta.get("termination") or ""),
            str(meta.get("turns", "")),
            f"{sum(passes)}/{len(passes)}" if passes else "",
            comps or (r.error or meta.get("error") or ""),
        )
    console.print(table)
    counts = Counter(r.status for r in results)
    console.print("status counts: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))


def print_summary(results: list[EpisodeOutcome]) -> None:
    """Per task: episodes, mean reward over scored ones, statuses — for runs too long to list."""
    table = Table(title="episodes per task")
    for col in ("task", "episodes", "mean reward (scored)", "statuses"):
        table.add_column(col, overflow="fold")
    by_task: dict[str, list[EpisodeOutcome]] = {}
    for r in results:
        by_task.setdefault(r.task_id, []).append(r)
    for task, items in by_task.items():
        scored = [r.reward for r in items if r.status == "scored" and r.reward is not None]
        counts = Counter(r.status for r in items)
        table.add_row(
            task,
            str(len(items)),
            f"{sum(scored) / len(scored):+.3f}" if scored else "",
            ", ".join(f"{k}={v}" for k, v in sorted(counts.items())),
        )
    console.print(table)
    counts = Counter(r.status for r in results)
    console.print("status counts: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
