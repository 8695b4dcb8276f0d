"""Generate the small synthetic data shipped with deepanalyze-env.

Why this script exists
----------------------
The project ships a handful of tasks so that the environment, the reward methods, the CPU
smoke recipe and the tests have something real to run against without downloading anything:

* ``workspaces/<workspace_id>/`` -- four tiny synthetic data folders (CSV, XLSX, SQLite),
* ``tasks/{qa,datatask,openresearch}.jsonl`` -- task files in the layout of docs/design.md §4
  (``data`` = ``"workspaces"``, so a workspace lives at ``<workspace_root>/workspaces/<id>``
  with ``workspace_root`` = this ``data/`` folder),
* ``trajectories.jsonl`` -- for every task one ``good`` reference trajectory (assistant turns
  that run cleanly and answer correctly) and one ``bad`` one with a labelled defect.

All of these outputs are committed. This script and the modules under ``gen/`` are the single
source of truth for them: edit them, rerun ``python data/generate.py`` and commit the changed
files. ``tests/test_shipped_data.py`` regenerates into a temporary folder and checks the result is
byte-identical to what is committed.

Determinism rules (keep them when editing):

* only the standard library and ``openpyxl`` are used -- no numpy/pandas, so the output does not
  depend on their versions;
* every random draw comes from ``random.Random(seed)`` using only integer-based methods
  (``randint``, ``choice``, ``choices``, ``sample``, ``random``); nothing calls libm
  (``gauss``, ``sin`` ...), whose last bits may differ between platforms;
* money is generated in integer cents and measurements in integer tenths, and ground truths are
  computed with exact ``Fraction`` arithmetic; a value that would sit on a rounding tie is
  rejected, so pandas' float arithmetic rounds to the same printed digits;
* the XLSX zip is rewritten with fixed timestamps, fixed metadata and stored (uncompressed)
  entries so that neither the clock nor the zlib build matters;
* the SQLite file is written in one transaction, VACUUMed, and its header's change counters and
  library-version field are set to fixed values.

Layout: ``gen/common.py`` holds the number formatting, the writers and the turn helpers; one
module per workspace (``gen/retail.py``, ``gen/inventory.py``, ``gen/clinic.py``,
``gen/sensors.py``) holds its constants, its ``build_<name>`` and its reference trajectories
``traj_*_<name>``; ``gen/tasks.py`` builds the task files and collects the trajectories. ``data/``
is not a Python package, so this script puts its own folder on ``sys.path`` and imports ``gen``.

Usage: ``python data/generate.py [--out DIR]`` (default: the folder this file lives in).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # run by path from anywhere: ``gen`` lives beside this file

from gen.clinic import build_clinic  # noqa: E402
from gen.common import write_jsonl  # noqa: E402
from gen.inventory import build_inventory  # noqa: E402
from gen.retail import build_retail  # noqa: E402
from gen.sensors import build_sensors  # noqa: E402
from gen.tasks import build_tasks, build_trajectories  # noqa: E402


# --------------------------------------------------------------------------------------------
def generate(out: Path) -> None:
    out = Path(out)
    R = build_retail(out)
    inv = build_inventory(out)
    C = build_clinic(out)
    S = build_sensors(out)
    tasks = build_tasks(R, inv, C, S)
    for name, records in tasks.items():
        write_jsonl(out / "tasks" / f"{name}.jsonl", records)
    write_jsonl(out / "trajectories.jsonl", build_trajectories(R, inv, C, S))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", default=str(HERE), help="output folder (default: the data/ folder holding this script)"
    )
    args = parser.parse_args(argv)
    generate(Path(args.out))
    print(f"wrote shipped data under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
