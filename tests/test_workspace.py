"""Scratch workspaces: private copies, removal, and the sweep of folders left by dead processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tools.workspace import Workspace, scratch_root, sweep_stale


def test_workspace_is_a_private_copy(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.csv").write_text("x\n1\n")
    ws = Workspace(src)
    (ws.path / "a.csv").write_text("changed")
    assert (src / "a.csv").read_text() == "x\n1\n"
    ws.remove()
    assert not ws.path.exists()


def test_remove_copes_with_read_only_files(tmp_path: Path):
    ws = Workspace(None)
    sub = ws.path / "locked"
    sub.mkdir()
    (sub / "f").write_text("x")
    (sub / "f").chmod(0o400)
    sub.chmod(0o500)
    ws.remove()
    assert not ws.path.exists()


def test_folders_of_dead_processes_are_swept_and_live_ones_kept(_scratch: Path):
    # A child process creates a workspace and dies without cleaning up.
    code = (
        "from tools.workspace import Workspace; import os; "
        "print(Workspace(None).root, flush=True); os._exit(0)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    orphan = Path(out.stdout.strip())
    assert orphan.parent == scratch_root() and orphan.is_dir()
    mine = Workspace(None)  # the first workspace of a process sweeps the scratch root
    assert not orphan.exists() and mine.path.is_dir()  # unmounted first where it was a tmpfs
    orphan.mkdir()  # a second stale folder with the same dead owner
    assert sweep_stale(scratch_root()) == 1
    assert not orphan.exists() and mine.path.is_dir()
    mine.remove()
    assert not mine.root.exists()
