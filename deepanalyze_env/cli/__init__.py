"""The ``deepanalyze-rl`` command line: one module per subcommand, each with ``add_parser(subparsers)``.

``main`` (in :mod:`deepanalyze_env.cli.app`) builds the parser from :data:`COMMANDS`; shared
flags, the console and :class:`UsageError` live in :mod:`deepanalyze_env.cli.common`. Nothing
outside this folder imports it: library code raises ``ConfigError`` and the CLI prints it.
"""

from __future__ import annotations

# modules under deepanalyze_env.cli, in --help order
COMMANDS = (
    "train",
    "learn",
    "rollout",
    "eval",
    "judge_eval",
    "rewards",
    "stats",
    "rescore",
    "recover",
    "view",
    "serve",
    "collect",
    "export",
    "prepare_data",
    "bank",
)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point (``deepanalyze-rl``)."""
    from deepanalyze_env.cli.app import main as _main

    return _main(argv)
