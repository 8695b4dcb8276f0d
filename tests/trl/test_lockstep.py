"""Two real CPU processes (torch.distributed over gloo) generating through TRL's server-mode vLLM
path, whose gather and per-rank slicing need every rank in every call with equally long lists.
The ranks' episodes need different numbers of turns; the rollout must keep them in lockstep and
hand each episode its own completions. vLLM itself is scripted (``lockstep_worker.py``)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ranks_with_uneven_episodes_generate_in_lockstep(tmp_path):
    port = free_port()
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONPATH": str(ROOT),
            "DEEPANALYZE_SCRATCH": str(tmp_path / f"scratch{rank}"),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.trl.lockstep_worker", str(tmp_path)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=600)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("the ranks hung (a rank waited in a collective the other never joined)")
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-3000:] for log in logs)
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    for result in (rank0, rank1):
        assert result["termination"] == ["answer"] * len(result["markers"])
        assert result["env_reward"] == [1.0] * len(result["markers"])
        for marker, text in zip(result["markers"], result["texts"], strict=True):
            assert set(re.findall(r"r\de\d", text)) == {marker}  # its own completions only
    # r1e0 ran two code turns, r1e1 one, r0e0 none (outputs 40, 41 are the code's prints)
    assert [t.count("</Execute>") for t in rank1["texts"]] == [2, 1]
    assert "40" in rank1["texts"][0] and "41" in rank1["texts"][0]
    assert rank0["texts"][0].count("</Execute>") == 0
    # three turns in all; every request held the same number of prompts from each rank
    assert [r["n_prompts"] for r in rank0["requests"]] == [4, 2, 2]
