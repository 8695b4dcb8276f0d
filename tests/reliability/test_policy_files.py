"""Scored files the policy wrote are read by ``tools.policy_files`` only (issue 26).

Each attack runs as a real episode (a cell shapes ``clean.csv``, then the policy answers) and
must end ``scored`` with every ``file_match`` component 0 and the reason in
``metadata["reward_notes"]`` — never a hang, never ``verifier_error``, never credit for a file
the policy did not write. Expected scores are by hand; a correct file written by the cell is
the control (1.0 on every component).
"""

from __future__ import annotations

import os
import threading
import tracemalloc
from pathlib import Path

import pytest
import skyrl_gym

from rewards.files import compare_file
from tests.conftest import code, qa_extras
from tools.policy_files import read_policy_file

PROMPT = [{"role": "user", "content": "Clean the table into clean.csv."}]
CORRECT = "id,city,temp\n1,Oslo,3.5\n2,Lima,19.25\n3,Pune,\n"
EXPECTED = {
    "name": "clean.csv",
    "columns": ["id", "city", "temp"],
    "rows": [[1, "Oslo", 3.5], [2, "Lima", 19.25], [3, "Pune", None]],
}
ANSWER = "<Analyze>written</Analyze>\n<Answer>\nAnswer: 3\n</Answer>"
ZERO = {"file_schema": 0.0, "file_rows": 0.0, "file_values": 0.0}
FULL = {"file_schema": 1.0, "file_rows": 1.0, "file_values": 1.0}


def _episode(workspace_root: Path, cell: str, name: str = "clean.csv") -> dict:
    spec = {
        "method": "datatask",
        "ground_truth": "3",
        "function": ["file_match"],
        "expected_file": {**EXPECTED, "name": name},
    }
    env = skyrl_gym.make(
        "deepanalyze",
        env_config={"workspace_root": str(workspace_root), "executor": {"timeout_s": 10}},
        extras=qa_extras(reward_spec=spec),
    )
    env.init(PROMPT)
    done: dict = {}

    def run() -> None:
        try:
            done["cell"] = env.step(code(cell))["metadata"]["exec"]["status"]
            done["final"] = env.step(ANSWER)["metadata"]
        finally:
            env.close()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "scoring hung"
    return done


def _components(meta: dict) -> dict:
    return {k: v for k, v in meta["reward_components"].items() if k.startswith("file_")}


def test_control_a_file_the_policy_wrote_scores_full(workspace_root: Path):
    done = _episode(workspace_root, f"open('clean.csv', 'w').write({CORRECT!r})")
    assert done["cell"] == "ok"
    assert done["final"]["reward_status"] == "scored" and _components(done["final"]) == FULL
    assert "reward_notes" not in done["final"]


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("link_to_correct_host_file", "is a symbolic link"),
        ("link_to_proc_kmsg", "is a symbolic link"),
        ("link_to_dev_zero", "is a symbolic link"),
        ("fifo", "is not a regular file (a FIFO)"),
        ("folder", "is not a regular file (a folder)"),
        ("unix_socket", "is not a regular file (a socket)"),
        ("hard_link", "is a hard link"),
        ("oversized", "over the 16777216-byte cap"),
        ("missing", "was not written"),
    ],
)
def test_shaped_files_score_zero_with_a_reason(workspace_root: Path, tmp_path: Path, kind: str, reason: str):
    host = tmp_path / "answer.csv"
    host.write_text(CORRECT)
    host.chmod(0o644)
    cells = {
        "link_to_correct_host_file": f"import os\nos.symlink({str(host)!r}, 'clean.csv')",
        "link_to_proc_kmsg": "import os\nos.symlink('/proc/kmsg', 'clean.csv')",
        "link_to_dev_zero": "import os\nos.symlink('/dev/zero', 'clean.csv')",
        "fifo": "import os\nos.mkfifo('clean.csv')",
        "folder": "import os\nos.mkdir('clean.csv')",
        "unix_socket": "import socket\ns = socket.socket(socket.AF_UNIX)\ns.bind('clean.csv')",
        "hard_link": f"import os\nopen('real.csv', 'w').write({CORRECT!r})\nos.link('real.csv', 'clean.csv')",
        "oversized": f"open('clean.csv', 'w').write({CORRECT!r} + 'x' * (17 * 1024 * 1024))",
        "missing": "print('nothing written')",
    }
    done = _episode(workspace_root, cells[kind])
    assert done["cell"] == "ok"
    final = done["final"]
    assert final["reward_status"] == "scored", final.get("error")
    assert _components(final) == ZERO
    assert reason in final["reward_notes"]["file_match"]


def test_a_link_on_the_way_to_the_file_is_refused(workspace_root: Path, tmp_path: Path):
    hostdir = tmp_path / "hostdir"
    hostdir.mkdir()
    (hostdir / "clean.csv").write_text(CORRECT)
    cell = f"import os\nos.symlink({str(hostdir)!r}, 'out')"
    done = _episode(workspace_root, cell, name="out/clean.csv")
    final = done["final"]
    assert final["reward_status"] == "scored" and _components(final) == ZERO
    assert "out is not a folder" in final["reward_notes"]["file_match"]


def test_twenty_mib_of_newlines_is_refused_by_the_cap(tmp_path: Path):
    (tmp_path / "clean.csv").write_bytes(b"\n" * (20 * 1024 * 1024))
    diff = compare_file(tmp_path, "clean.csv", EXPECTED)
    assert (diff.schema, diff.rows, diff.values) == (0.0, 0.0, 0.0)
    assert "over the 16777216-byte cap" in diff.problems[0]


def test_newlines_under_the_cap_are_scored_in_bounded_memory(tmp_path: Path):
    """15 MiB of newlines is 15,728,640 empty rows; as lists of rows they took ~80x the file.
    The reader keeps the bytes and counts the rows."""
    size = 15 * 1024 * 1024
    (tmp_path / "clean.csv").write_bytes(b"id,city,temp\n" + b"\n" * size)
    tracemalloc.start()
    try:
        diff = compare_file(tmp_path, "clean.csv", EXPECTED)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * size  # the file's bytes once, its decoded lines one at a time
    assert diff.schema == 1.0
    assert diff.rows == pytest.approx(3 / size)  # min(size, 3) / max(size, 3)
    assert diff.values == 0.0
    assert f"{size} rows, expected 3" in diff.problems


def test_a_line_longer_than_the_cap_is_unreadable_not_an_error(tmp_path: Path):
    (tmp_path / "clean.csv").write_text("id,city,temp\n" + "," * (300 * 1024) + "\n")
    diff = compare_file(tmp_path, "clean.csv", EXPECTED)
    assert (diff.schema, diff.rows, diff.values) == (0.0, 0.0, 0.0)
    assert "longer than" in diff.problems[0]


@pytest.mark.parametrize("name", ["../clean.csv", "/etc/passwd", "", "."])
def test_names_outside_the_workspace_are_refused(tmp_path: Path, name: str):
    (tmp_path / "ws").mkdir()
    (tmp_path / "clean.csv").write_text(CORRECT)
    found = read_policy_file(tmp_path / "ws", name)
    assert found.data is None and "is not a path inside the workspace" in found.refused


def test_a_file_growing_past_the_cap_is_refused(tmp_path: Path):
    path = tmp_path / "clean.csv"
    path.write_bytes(b"x" * 100)
    assert read_policy_file(tmp_path, "clean.csv", max_bytes=100).data == b"x" * 100
    assert "over the 99-byte cap" in read_policy_file(tmp_path, "clean.csv", max_bytes=99).refused
    os.truncate(path, 10)
    assert read_policy_file(tmp_path, "clean.csv", max_bytes=10).data == b"x" * 10
