"""``deepanalyze-rl eval``: every task k times through the env, then a report; ``--compare A B``.

The episodes run with the rollout machinery (``rollout.run_jobs``, a ``RunDir`` with records,
``--resume``, ``--concurrency``), so an eval folder is also a rollout folder that ``stats`` and
``rescore`` read. The report (``report.json``, ``report.md``, ``report.png``) is computed from
the folder's records and ``tasks.json`` alone (:mod:`deepanalyze_env.offline.eval_report`).
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path
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
    print_report,
    task_files,
    template_kwargs,
)

if TYPE_CHECKING:
    from deepanalyze_env.offline.policies import Policy


def add_parser(sub: SubParsers) -> None:
    p = make_parser(
        sub,
        "eval",
        "evaluate a model or endpoint on tasks (reward, pass@k, format gate), or compare two evals",
        "deepanalyze-rl eval --model runs/trl_sft_cpu --tasks data/tasks/qa.jsonl --samples 4 "
        "--out runs/eval-sft   |   deepanalyze-rl eval --compare runs/eval-base runs/eval-sft",
    )
    who = p.add_argument_group("policy (one of)")
    who.add_argument("--model", metavar="PATH", help="a local model folder, hub id or embedded:smollm2")
    who.add_argument("--policy-base-url", metavar="URL", help="an OpenAI-compatible endpoint (…/v1)")
    who.add_argument("--policy-model", metavar="NAME", help="with --policy-base-url: the served model name")
    who.add_argument(
        "--policy",
        choices=["scripted"],
        help="scripted: replay reference trajectories (tests, demos; see --trajectories, --labels)",
    )
    p.add_argument(
        "--tasks", nargs="+", metavar="FILE", help="task files (JSONL); default: the shipped tasks"
    )
    p.add_argument("--samples", type=int, default=1, metavar="K", help="episodes per task (pass@K)")
    p.add_argument("--out", metavar="DIR", help="eval folder (records, report); --compare: where to write")
    p.add_argument("--concurrency", type=int, default=1, metavar="N", help="episodes in flight at once")
    p.add_argument("--resume", action="store_true", help="finish the eval in --out, then report")
    p.add_argument(
        "--temperature",
        type=float,
        metavar="T",
        help="sampling temperature (default 0 for --samples 1, else 1.0: pass@k needs distinct samples)",
    )
    p.add_argument("--max-tokens", type=int, metavar="N", help="tokens per policy turn")
    p.add_argument(
        "--layout", choices=["chat", "continue"], help="prompt layout (see rollout --policy-layout)"
    )
    p.add_argument(
        "--chat-template-kwargs",
        metavar="JSON",
        help="--model: chat template arguments, as the recipes' trl.chat_template_kwargs "
        "(e.g. '{\"enable_thinking\": false}' for Qwen3): evaluate prompts as training rendered them",
    )
    p.add_argument(
        "--chat-template",
        metavar="FILE|trl:NAME",
        help="--model: a chat template replacing the tokenizer's, as the recipes' chat_template "
        "(e.g. trl:qwen3 for tool calls)",
    )
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR", help="endpoint API key variable")
    p.add_argument("--trajectories", nargs="+", metavar="FILE", help="scripted: trajectory files")
    p.add_argument("--labels", default="good", help="scripted: trajectory labels to replay (default good)")
    p.add_argument(
        "--accuracy-component",
        metavar="NAME",
        help="the component pass@k counts (default: the method's component ending in 'accuracy')",
    )
    p.add_argument(
        "--pass-threshold", type=float, default=1.0, metavar="X", help="accuracy >= X is correct (1.0)"
    )
    p.add_argument("--compare", nargs=2, metavar=("DIR_A", "DIR_B"), help="paired comparison of two evals")
    add_shared_flags(p)
    p.set_defaults(func=cmd_eval)


def _policy(args: argparse.Namespace, temperature: float, action_format: str = "tags") -> Policy:
    from deepanalyze_env.generation.chat_templates import chat_template_text
    from deepanalyze_env.offline.policies import make_policy

    chosen = [x for x in (args.model, args.policy_base_url, args.policy) if x]
    if len(chosen) != 1:
        raise UsageError("give exactly one policy: --model PATH, --policy-base-url URL, or --policy scripted")
    if args.policy == "scripted":
        trajectories = args.trajectories or [str(SHIPPED_DATA / "trajectories.jsonl")]
        return make_policy("scripted", trajectories=trajectories, action_format=action_format)
    if args.policy_base_url:
        if not args.policy_model:
            raise UsageError("--policy-base-url needs --policy-model (the served model's name)")
        return make_policy(
            "openai",
            model=args.policy_model,
            base_url=args.policy_base_url,
            api_key=os.environ.get(args.api_key_env) if args.api_key_env else None,
            temperature=temperature,
            max_tokens=args.max_tokens,
            layout=args.layout,
        )
    return make_policy(
        "transformers",
        chat_template_kwargs=template_kwargs(args.chat_template_kwargs, "--chat-template-kwargs") or {},
        chat_template=(
            chat_template_text(args.chat_template, None, "--chat-template") if args.chat_template else None
        ),
        action_format=action_format,
        model=args.model,
        temperature=temperature,
        max_tokens=args.max_tokens,
        layout=args.layout,
        max_batch=args.concurrency,  # concurrent episodes' turns share one generate call
    )


def cmd_eval(args: argparse.Namespace) -> int:
    if args.compare:
        return cmd_compare(args)
    from deepanalyze_env.core.tasks import load_task_files
    from deepanalyze_env.offline.eval_report import write_report
    from deepanalyze_env.offline.rundir import RunDirError, RunSettings, task_fingerprint
    from deepanalyze_env.offline.runner import NothingToRun, open_run, run_planned, scripted_labels

    if not args.out:
        raise UsageError("eval needs --out DIR (the eval folder)")
    if args.samples < 1 or args.concurrency < 1:
        raise UsageError("--samples and --concurrency must be >= 1")
    temperature = args.temperature if args.temperature is not None else (0.0 if args.samples == 1 else 1.0)
    env_config = load_env_config(args)
    files = task_files(args, env_config)
    rows = load_task_files(files, env_config.get("workspace_root"))
    policy = _policy(args, temperature, env_config.get("action_format", "tags"))
    labels, labels_for = scripted_labels(policy, args.labels) if args.policy == "scripted" else ([], None)
    settings = RunSettings(
        kind="eval",
        tasks=files,
        task_fingerprint=task_fingerprint(rows),
        samples=args.samples,
        labels=labels or None,
        policy=policy.policy_id,
        policy_settings={
            "temperature": temperature,
            "max_tokens": args.max_tokens,
            "layout": args.layout,
            "chat_template_kwargs": args.chat_template_kwargs,
        },
    )
    try:
        run = open_run(args.out, settings, rows, env_config, resume=args.resume)
        outcome = run_planned(
            rows,
            env_config,
            policy,
            samples=args.samples,
            labels_for=labels_for,
            run=run,
            run_id=run.run_id,
            concurrency=args.concurrency,
            label="eval",
            console=console,
        )
    except (NothingToRun, RunDirError) as exc:
        raise UsageError(str(exc))
    if outcome.interrupted:
        console.print("[yellow]interrupted[/yellow]: rerun with --resume to finish the eval")
        return 130
    jobs, results = outcome.jobs, outcome.results
    run.consolidate([job.episode_id for job in jobs])
    per_task = max(Counter(job.task_index for job in jobs).values())  # pass@k up to this k
    report = write_report(run.path, per_task, args.accuracy_component, args.pass_threshold)
    print_report(report, str(run.path))
    missing = run.missing([job.episode_id for job in jobs])
    if missing:
        first = next((r for r in results if not r.finished), None)
        console.print(
            f"[red]{missing} of {len(jobs)} episodes did not finish[/red] (first: "
            f"{first.task_id if first else '?'}: {first.error if first else '?'}); the report counts each "
            "as a failed gate (reward -1, accuracy 0); rerun with --resume to run them",
            highlight=False,
        )
        return 1
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from deepanalyze_env.offline.eval_plots import plot_compare
    from deepanalyze_env.offline.eval_report import (
        compare_markdown,
        compare_runs,
        fmt,
        load_eval,
        write_json,
    )

    folders = [Path(p) for p in args.compare]
    loaded = []
    for folder in folders:
        if not folder.is_dir():
            raise UsageError(f"--compare: no such eval folder {folder}")
        try:
            records, _ = load_eval(folder)
        except ValueError as exc:
            raise UsageError(f"--compare {folder}: {exc}")
        if not records:
            raise UsageError(f"--compare: {folder} holds no episode records")
        loaded.append(records)
    result = compare_runs(*loaded, accuracy_override=args.accuracy_component, threshold=args.pass_threshold)
    if not result["per_task"]:
        raise UsageError("--compare: the two folders share no task")
    label_a, label_b = str(folders[0]), str(folders[1])
    result.update({"a": label_a, "b": label_b})
    table = Table(title=f"B − A per task: A = {label_a}, B = {label_b}", title_justify="left")
    for col in ("metric", "tasks", "A", "B", "B − A", "95% CI", "B better", "A better", "ties"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for metric, m in result["metrics"].items():
        table.add_row(
            metric,
            str(m["tasks"]),
            fmt(m["mean_a"]),
            fmt(m["mean_b"]),
            fmt(m["mean_diff"], True),
            fmt(m["diff_ci95"], True),
            str(m["b_better"]),
            str(m["a_better"]),
            str(m["ties"]),
        )
    console.print(table)
    if result["only_in_a"] or result["only_in_b"]:
        console.print(
            f"[yellow]unpaired tasks[/yellow] (not in the differences): only in A {result['only_in_a']}, "
            f"only in B {result['only_in_b']}",
            highlight=False,
        )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "compare.json", result)
        (out / "compare.md").write_text(compare_markdown(result, label_a, label_b))
        plot_compare(result, out / "compare.png", label_a, label_b)
        console.print(f"written: {out}/compare.md (compare.json, compare.png)", highlight=False)
    return 0
