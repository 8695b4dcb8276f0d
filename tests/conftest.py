"""Shared fixtures: real kernels, real workspaces, the shipped data."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from rewards import Method, register_method

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"


@pytest.fixture
def workspace_root(tmp_path: Path) -> Path:
    """A workspace_root with one task folder ``data/ws`` holding a small CSV."""
    folder = tmp_path / "root" / "data" / "ws"
    folder.mkdir(parents=True)
    (folder / "sales.csv").write_text("store,revenue\nA,10\nB,32\nA,5\n")
    return tmp_path / "root"


@pytest.fixture(autouse=True)
def _scratch(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    scratch = tmp_path_factory.mktemp("scratch")
    monkeypatch.setenv("DEEPANALYZE_SCRATCH", str(scratch))
    return scratch


# The built-in qa method includes the analysis judge; tests that are not about judges use this
# judge-free variant (same deterministic components) so they need no judge server.
register_method(Method("qa_plain", ("qa_accuracy", "qa_exact"), weights={"qa_exact": 0.0}))


def qa_extras(**over) -> dict:
    extras = {
        "reward_spec": {"method": "qa_plain", "ground_truth": "B"},
        "data": "data",
        "workspace_id": "ws",
        "input_seq": "Which store has the highest revenue?",
    }
    extras.update(over)
    return extras


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    """True once ``pid`` no longer exists (or is only a zombie awaiting its reaper)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def code(src: str) -> str:
    return f"<Analyze>step</Analyze>\n<Code>\n```python\n{src}\n```\n</Code>"
