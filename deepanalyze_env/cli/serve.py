"""``deepanalyze-rl serve``: the env as an MCP server (stdio or streamable HTTP) or an
OpenEnv-compatible server (docs/design.md §15). Parses flags, then calls ``serve.run.serve``."""

from __future__ import annotations

import argparse
import sys

from deepanalyze_env.cli.common import (
    SubParsers,
    add_limit_flags,
    add_shared_flags,
    limits_from,
    load_env_config,
    make_parser,
    require_serve_extra,
    task_files,
)


def add_parser(sub: SubParsers) -> None:
    p = make_parser(
        sub,
        "serve",
        "serve episodes to outside clients: MCP (stdio, streamable HTTP) or OpenEnv",
        "deepanalyze-rl serve --transport stdio --tasks data/tasks/qa.jsonl --task-id qa-retail-001 "
        "--workspace-root data --judge-base-url URL --judge-model NAME --records runs/served",
    )
    p.add_argument(
        "--transport",
        choices=["stdio", "http", "openenv"],
        default="stdio",
        help="stdio (default): one MCP episode over stdin/stdout; http: MCP at /mcp, a session per "
        "episode (/mcp?task_id=ID); openenv: OpenEnv's WebSocket protocol at /ws",
    )
    p.add_argument(
        "--tasks", nargs="+", metavar="FILE", help="task files (JSONL); default: the shipped tasks"
    )
    p.add_argument(
        "--task-id",
        metavar="ID",
        help="the task every session plays (stdio: required); tasks whose reward plan needs a judge "
        "need --judge-base-url and --judge-model",
    )
    p.add_argument("--host", default="127.0.0.1", help="http/openenv: address to listen on (loopback)")
    p.add_argument(
        "--port",
        type=int,
        default=8765,
        help="http/openenv: port (default 8765; 0 takes any free one, printed at start)",
    )
    p.add_argument(
        "--records",
        metavar="DIR",
        help="write every served episode's record here (default: none are written)",
    )
    add_limit_flags(p)
    add_shared_flags(p)
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    require_serve_extra()
    from deepanalyze_env.serve.stopping import end_process

    try:
        _serve(args)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM, start-up included: what ran is recorded
        pass
    # The records are written; threads still blocked in a cell or a kernel start do not hold the
    # process, nor does the interpreter's teardown (docs/design.md section 15).
    end_process(0)


def _serve(args: argparse.Namespace) -> None:
    from deepanalyze_env.core.tasks import load_task_files
    from deepanalyze_env.serve.run import ServeSettings, serve

    limits = limits_from(args)
    env_config = load_env_config(args)
    files = task_files(args, env_config)
    if args.records:
        env_config["records_dir"] = args.records
    settings = ServeSettings(
        transport=args.transport,
        rows=load_task_files(files, env_config.get("workspace_root")),
        env_config=env_config,
        task_id=args.task_id,
        host=args.host,
        port=args.port,
        limits=limits,
        announce=lambda url: print(
            f"serving {args.transport} at {url} (Ctrl-C stops)", file=sys.stderr, flush=True
        ),
    )
    serve(settings)
