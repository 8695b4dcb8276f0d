"""``deepanalyze-rl collect``: run an outside agent per task against the served env, with its model
calls recorded by a proxy; the folder is a run folder with an eval report (docs/design.md §15).
Parses flags, then calls ``serve.collect.collect``."""

from __future__ import annotations

import argparse
import os

from deepanalyze_env.cli.common import (
    SubParsers,
    UsageError,
    add_limit_flags,
    add_shared_flags,
    console,
    limits_from,
    load_env_config,
    make_parser,
    print_report,
    require_serve_extra,
    task_files,
)


def add_parser(sub: SubParsers) -> None:
    p = make_parser(
        sub,
        "collect",
        "run an outside agent (MCP and/or an OpenAI-compatible model) on tasks; the env scores and records",
        "deepanalyze-rl collect --agent 'python examples/replay_agent.py' --tasks data/tasks/qa.jsonl "
        "--workspace-root data --judge-base-url URL --judge-model NAME --out runs/collect-replay",
    )
    p.add_argument(
        "--agent",
        required=True,
        metavar="CMD",
        help="the agent command line, split as a shell would but run without one; {mcp_url}, "
        "{openai_base_url}, {task_id}, {episode_id} are replaced per episode (also in its environment: "
        "DEEPANALYZE_MCP_URL, DEEPANALYZE_TASK_ID, DEEPANALYZE_EPISODE_ID, OPENAI_BASE_URL/API_KEY/MODEL)",
    )
    p.add_argument(
        "--tasks", nargs="+", metavar="FILE", help="task files (JSONL); default: the shipped tasks"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="run folder (records, episodes.jsonl, report)")
    p.add_argument("--samples", type=int, default=1, metavar="N", help="episodes per task (default 1)")
    p.add_argument(
        "--concurrency", type=int, default=1, metavar="N", help="agents running at once (default 1)"
    )
    p.add_argument("--resume", action="store_true", help="run what the folder has not recorded yet")
    p.add_argument("--run-id", metavar="ID", help="id of a new run (default: date and random suffix)")
    p.add_argument(
        "--agent-timeout", type=float, default=600.0, metavar="S", help="seconds per episode (600)"
    )
    p.add_argument("--keep", metavar="EXPR", help="also write kept.jsonl with the records this selects (SFT)")
    up = p.add_argument_group("the agent's model (behind the recording proxy)")
    up.add_argument("--upstream-base-url", metavar="URL", help="an OpenAI-compatible endpoint (…/v1)")
    up.add_argument(
        "--upstream-model", metavar="NAME", help="the model name sent upstream (else the agent's)"
    )
    up.add_argument(
        "--api-key-env", default="OPENAI_API_KEY", metavar="VAR", help="upstream API key variable"
    )
    add_limit_flags(p)
    add_shared_flags(p)
    p.set_defaults(func=cmd_collect)


def cmd_collect(args: argparse.Namespace) -> int:
    require_serve_extra()
    from deepanalyze_env.serve.stopping import end_process

    try:
        return _collect(args)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM, start-up included: the agents are killed
        console.print("[yellow]interrupted[/yellow] (--resume runs what was not recorded)", highlight=False)
        # Threads still blocked in a cell or a kernel start do not hold the process, nor does the
        # interpreter's teardown (docs/design.md section 15).
        end_process(130)


def _collect(args: argparse.Namespace) -> int:
    from deepanalyze_env.core.filters import RecordFilter
    from deepanalyze_env.core.tasks import load_task_files
    from deepanalyze_env.offline.rundir import RunDirError, RunSettings, task_fingerprint
    from deepanalyze_env.offline.runner import open_run
    from deepanalyze_env.serve.collect import AgentSpec, collect
    from deepanalyze_env.serve.proxy import Upstream

    if args.samples < 1 or args.concurrency < 1 or args.agent_timeout <= 0:
        raise UsageError("--samples and --concurrency must be >= 1, --agent-timeout > 0")
    check_agent_command(args.agent)
    keep = None
    if args.keep:
        try:
            keep = RecordFilter(args.keep)
        except ValueError as exc:
            raise UsageError(f"--keep: {exc}")
    limits = limits_from(args)
    env_config = load_env_config(args)
    files = task_files(args, env_config)
    rows = load_task_files(files, env_config.get("workspace_root"))
    upstream = None
    if args.upstream_base_url:
        key = os.environ.get(args.api_key_env) if args.api_key_env else None
        upstream = Upstream(args.upstream_base_url, key, args.upstream_model, api_key_env=args.api_key_env)
    spec = AgentSpec(args.agent, args.agent_timeout, upstream)
    settings = RunSettings(
        kind="collect",
        tasks=files,
        task_fingerprint=task_fingerprint(rows),
        samples=args.samples,
        labels=None,
        policy=spec.policy_id,
        policy_settings={
            "agent": args.agent,
            "upstream": args.upstream_base_url,
            "model": args.upstream_model,
        },
        keep=args.keep,
    )
    try:
        run = open_run(args.out, settings, rows, env_config, resume=args.resume, run_id=args.run_id)
    except RunDirError as exc:
        raise UsageError(str(exc))
    outcome = collect(
        spec,
        rows,
        env_config,
        run,
        samples=args.samples,
        concurrency=args.concurrency,
        limits=limits,
        keep=keep,
        console=console,
    )
    print_report(outcome.report, str(outcome.folder))
    if outcome.failed:
        first = outcome.failed[0]
        console.print(
            f"[red]{len(outcome.failed)} episode(s) not recorded[/red] "
            f"(first: {first.task_id}: {first.error}); rerun with --resume to run them again",
            highlight=False,
        )
        return 1
    return 0


def check_agent_command(command: str) -> None:
    """The agent's program must exist before any episode is planned around it."""
    import shlex
    import shutil
    from pathlib import Path

    try:
        parts = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"--agent: {exc}")
    if not parts:
        raise UsageError("--agent: the command is empty")
    program = parts[0]
    found = Path(program).is_file() if "/" in program else shutil.which(program) is not None
    if not found:
        raise UsageError(f"--agent: command not found: {program}")
