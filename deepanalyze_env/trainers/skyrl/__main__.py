"""``python -m deepanalyze_env.trainers.skyrl [key=value …]``."""

from __future__ import annotations

import sys

from deepanalyze_env.trainers.skyrl import INSTALL_HINT, skyrl_available

if __name__ == "__main__":
    if not skyrl_available():
        sys.stderr.write(f"error: {INSTALL_HINT}\n")
        raise SystemExit(2)
    from deepanalyze_env.trainers.skyrl.entrypoint import main

    raise SystemExit(main(sys.argv[1:]))
