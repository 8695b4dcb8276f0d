"""``python -m deepanalyze_env.cli`` is ``deepanalyze-rl``."""

from __future__ import annotations

import sys

from deepanalyze_env.cli.app import main

sys.exit(main())
