"""``rewards`` and ``tools`` keep their top-level names; a package that shadows one of them is
named at import, in one line, instead of failing later inside a run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _import_in(pythonpath: list[Path]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath)}
    return subprocess.run(
        [sys.executable, "-c", "import deepanalyze_env"], capture_output=True, text=True, env=env, cwd="/"
    )


def test_the_project_imports_with_its_own_top_level_packages():
    result = _import_in([ROOT])
    assert result.returncode == 0, result.stderr


def test_a_foreign_tools_package_first_on_the_path_is_named_in_one_line(tmp_path):
    foreign = tmp_path / "other_dist"
    (foreign / "tools").mkdir(parents=True)
    (foreign / "tools" / "__init__.py").write_text("")
    result = _import_in([foreign, ROOT])
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("deepanalyze_env.top_level.ShadowedPackageError:")
    assert str(foreign / "tools") in last and str(ROOT / "tools") in last


def test_a_foreign_rewards_module_file_is_caught_too(tmp_path):
    foreign = tmp_path / "other_dist"
    foreign.mkdir()
    (foreign / "rewards.py").write_text("")
    result = _import_in([foreign, ROOT])
    assert result.returncode != 0
    assert str(foreign / "rewards.py") in result.stderr and "'rewards'" in result.stderr
