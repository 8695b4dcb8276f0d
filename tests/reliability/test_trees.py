"""Workspaces a policy shaped (issue 26): deep, wide, linked and unreadable trees.

Python 3.11 recurses once per folder level in ``os.walk``/``shutil.rmtree``; a cell's 1,200-deep
tree used to raise ``RecursionError`` out of ``close()``, leave its folder, and make every
later ``init()`` that swept the scratch root fail. Here each shape goes through the real
removal, sweep and (for the env tests) a real kernel; the autouse ``_scratch`` fixture gives
every test its own ``DEEPANALYZE_SCRATCH``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import skyrl_gym

import tools.sandbox
from tests.conftest import ROOT, code, qa_extras
from tools.tree import remove_tree, walk
from tools.workspace import Workspace, sweep_stale

DEPTH = 1200  # past Python's default recursion limit (1,000)
PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """Deep trees live outside pytest's basetemp: its own cleanup recurses per level and would
    fail on a tree a failed test left (for every later session on the machine)."""
    path = Path(tempfile.mkdtemp(prefix="deepanalyze-trees-"))
    yield path
    assert remove_tree(path)


@pytest.fixture(autouse=True)
def _scratch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This module's own ``DEEPANALYZE_SCRATCH`` (the conftest one lives in pytest's basetemp)."""
    path = Path(tempfile.mkdtemp(prefix="deepanalyze-trees-scratch-"))
    monkeypatch.setenv("DEEPANALYZE_SCRATCH", str(path))
    yield path
    assert remove_tree(path)


def deep_tree(top: Path, depth: int = DEPTH, name: str = "d") -> None:
    """``top/d/d/.../d`` ``depth`` levels down with a file at the bottom, made through
    descriptors (``os.makedirs`` itself recurses per level)."""
    top.mkdir(exist_ok=True)
    fd = os.open(top, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir(name, dir_fd=fd)
        child = os.open(name, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(os.open("bottom.txt", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    os.close(fd)


def stale_name() -> str:
    """A scratch folder name whose owner is gone: our pid with a start time it never had."""
    return f"{os.getpid()}-0-{os.urandom(6).hex()}"


def test_deep_tree_is_removed(tmp_path: Path):
    deep_tree(tmp_path / "t")
    assert remove_tree(tmp_path / "t") is True
    assert not (tmp_path / "t").exists()


def test_wide_tree_is_removed(tmp_path: Path):
    top = tmp_path / "t"
    top.mkdir()
    for i in range(200):
        sub = top / f"s{i}"
        sub.mkdir()
        for j in range(20):
            (sub / f"f{j}").write_bytes(b"x")
    assert remove_tree(top) is True and not top.exists()


def test_links_are_removed_never_followed(tmp_path: Path):
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    (host_dir / "keep.txt").write_text("keep")
    host_dir.chmod(0o555)
    top = tmp_path / "t"
    top.mkdir()
    (top / "to_dir").symlink_to(host_dir)
    (top / "to_file").symlink_to(host_dir / "keep.txt")
    (top / "dangling").symlink_to(tmp_path / "nothing")
    (top / "loop").symlink_to(top / "loop")
    assert remove_tree(top) is True and not top.exists()
    assert (host_dir / "keep.txt").read_text() == "keep"
    assert host_dir.stat().st_mode & 0o777 == 0o555  # never chmodded through the link
    host_dir.chmod(0o755)


def test_unreadable_and_read_only_folders_are_removed(tmp_path: Path):
    top = tmp_path / "t"
    deep_tree(top, depth=30)
    locked = top / "locked"
    (locked / "inner").mkdir(parents=True)
    (locked / "inner" / "f").write_text("x")
    (locked / "inner").chmod(0)
    locked.chmod(0o500)
    top.chmod(0o500)
    assert remove_tree(top) is True and not top.exists()


# Run as uid 65534 so that folders of another owner really are unremovable (root ignores modes).
AS_NOBODY = r"""
import logging, os, sys
sys.path.insert(0, sys.argv[1])
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")
from collections.abc import Iterator
from pathlib import Path
from tools.tree import remove_tree
from tools.workspace import sweep_stale
os.setgid(65534); os.setuid(65534)  # after the imports: the interpreter may live under /root
root = Path(sys.argv[2])
print("RESULT", remove_tree(root / sys.argv[3]), sweep_stale(root))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make folders of another owner")
def test_what_cannot_be_removed_is_logged_and_left():
    root = Path(tempfile.mkdtemp(prefix="deepanalyze-trees-"))  # pytest's tmp is root-only
    root.chmod(0o777)
    try:
        _unremovable_left(root)
    finally:
        assert remove_tree(root)


def _unremovable_left(root: Path) -> None:
    mine, stale_ok, stale_bad = (root / n for n in ("mine", stale_name(), stale_name()))
    for folder in (mine, stale_ok, stale_bad):
        folder.mkdir()
    # Owned by nobody (the remover): its own mode-000 folders are made removable.
    deep_tree(mine, depth=DEPTH)
    (mine / "secret").mkdir()
    (mine / "secret" / "f").write_text("x")
    deep_tree(stale_ok, depth=50)
    (stale_bad / "rootowned").mkdir()
    (stale_bad / "rootowned" / "f").write_text("x")
    (stale_bad / "other").write_text("x")
    for folder in (mine, stale_ok, stale_bad):
        subprocess.run(["chown", "-R", "65534:65534", str(folder)], check=True)
    os.chown(stale_bad / "rootowned", 0, 0)
    os.chown(stale_bad / "rootowned" / "f", 0, 0)
    (mine / "secret").chmod(0)
    out = subprocess.run(
        [sys.executable, "-c", AS_NOBODY, str(ROOT), str(root), "mine"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "RESULT True 1" in out.stdout  # `mine` gone; one stale folder swept, the other skipped
    assert "ERROR" in out.stdout and "rootowned" in out.stdout  # logged, named
    assert not mine.exists() and not stale_ok.exists()
    assert (stale_bad / "rootowned" / "f").exists() and not (stale_bad / "other").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")
def test_a_mount_point_in_the_tree_is_emptied_and_left_without_looping(tmp_path: Path):
    """A folder that is a mount point (an episode's bounded storage, issue 39) cannot be removed:
    its parent lists the inode under the mount, not the mounted root's, so the removal keys what
    it could not remove by name. It used to spin forever on it."""
    import threading

    mnt = tmp_path / "tree" / "storage"
    mnt.mkdir(parents=True)
    (tmp_path / "tree" / "beside.txt").write_text("x")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
    try:
        (mnt / "sub").mkdir()
        (mnt / "sub" / "f").write_text("x")
        result: list[bool] = []
        worker = threading.Thread(target=lambda: result.append(remove_tree(tmp_path / "tree")), daemon=True)
        worker.start()
        worker.join(timeout=30)
        assert result == [False], "the removal did not return"
        assert mnt.is_dir() and os.listdir(mnt) == []  # emptied, left in place
        assert not (tmp_path / "tree" / "beside.txt").exists()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_sweep_removes_deep_stale_folders_and_skips_links(_scratch: Path, tmp_path: Path):
    deep_tree(_scratch / stale_name())
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    (_scratch / stale_name()).symlink_to(outside)  # looks stale, is a link: not ours
    assert sweep_stale(_scratch) == 1
    assert (outside / "keep").read_text() == "keep"
    assert [p.is_symlink() for p in _scratch.iterdir()] == [True]


def test_walk_is_iterative_and_does_not_follow_links(tmp_path: Path):
    deep_tree(tmp_path / "t", depth=DEPTH)
    (tmp_path / "t" / "up").symlink_to(tmp_path)
    levels = list(walk(tmp_path / "t"))
    assert len(levels) == DEPTH + 1  # t itself and one per level; the link is a name, not a level
    assert "up" in levels[0][2] and levels[-1][2] == ["bottom.txt"]


def test_workspace_copy_of_a_deep_task_folder(tmp_path: Path):
    deep_tree(tmp_path / "task", depth=DEPTH)
    ws = Workspace(tmp_path / "task")
    assert sum(1 for _ in walk(ws.path)) == DEPTH + 1
    assert ws.remove() is True and not ws.path.exists()


def _env(workspace_root: Path, **over):
    config = {"workspace_root": str(workspace_root), "executor": {"timeout_s": 20}, **over}
    env = skyrl_gym.make("deepanalyze", env_config=config, extras=qa_extras())
    env.init(PROMPT)
    return env


DEEP_CELL = (
    "import os\nfd = os.open('.', os.O_RDONLY)\n"
    f"for _ in range({DEPTH}):\n"
    "    os.mkdir('d', dir_fd=fd)\n"
    "    c = os.open('d', os.O_RDONLY, dir_fd=fd)\n"
    "    os.close(fd)\n"
    "    fd = c\n"
    "os.chmod('d', 0)\n"
)


@pytest.mark.parametrize("stateful", [False, True])
def test_worker_respawns_after_a_deep_tree_and_os_exit(workspace_root: Path, _scratch: Path, stateful: bool):
    env = _env(workspace_root, stateful_cells=stateful)
    try:
        first = env.step(code(DEEP_CELL + "os._exit(1)"))
        assert first["metadata"]["exec"]["status"] == "crashed"
        second = env.step(code("import os\nprint(sorted(os.listdir('.')))"))
        assert second["metadata"]["exec"]["status"] == "ok"  # the replacement said hello
        assert "['d', 'sales.csv']" in second["observations"][0]["content"]
        workspace = env.workspace.path
    finally:
        env.close()  # must not raise
    assert not workspace.exists() and list(_scratch.iterdir()) == []


def test_a_deep_stale_folder_does_not_break_later_episodes(workspace_root: Path, _scratch: Path):
    stale = _scratch / stale_name()
    deep_tree(stale)
    (stale / "d").chmod(0)
    env = _env(workspace_root)
    try:
        out = env.step(code("print(1)"))
        assert out["metadata"]["exec"]["status"] == "ok"
    finally:
        env.close()
    assert list(_scratch.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_workspace_handover_to_the_cells_uid_walks_deep_trees_once(tmp_path: Path):
    """What a replacement worker runs before its hello when cells run as ``sandbox.uid``
    (here the interpreter may be unreadable to that uid, so the env test above runs as 0)."""
    top = tmp_path / "ws"
    deep_tree(top)
    (top / "up").symlink_to(tmp_path)
    tools.sandbox._chown_tree(str(top), 65534, 65534)
    owners = {os.lstat(os.path.join(d, n)).st_uid for d, dirs, files in walk(top) for n in dirs + files}
    assert owners == {65534} and os.lstat(top).st_uid == 65534
    assert os.lstat(tmp_path).st_uid == 0  # the link was chowned, not its target
    (top / "by_root").write_text("x")  # a file the cells' uid could never have made
    tools.sandbox._chown_tree(str(top), 65534, 65534)  # the respawn: already handed over
    assert os.lstat(top / "by_root").st_uid == 0
