"""``deepanalyze-rl``: the command line (docs/design.md §10).

Each subcommand lives in ``deepanalyze_env.cli.<name>``. User mistakes (a bad flag, a
missing file, a wrong config key) end with one ``error:`` line and exit code 2, never a
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from rich.markup import escape

from deepanalyze_env.cli import COMMANDS
from deepanalyze_env.cli.common import UsageError, console
from deepanalyze_env.core.config import ConfigError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deepanalyze-rl", description="Train and evaluate DeepAnalyze data-analysis agents with RL."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug output")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"deepanalyze_env.cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except (UsageError, ConfigError) as exc:
        # escaped: messages hold literal brackets (pip extras, lists); soft_wrap: one line, always
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
