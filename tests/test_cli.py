"""The command line: the scripted rollout over the shipped tasks, and clear one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from deepanalyze_env.cli import main
from rewards.judge.fake_server import FakeJudgeServer, Reply
from tests.conftest import DATA, ROOT


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "deepanalyze_env.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


def test_scripted_rollout_records_every_episode(tmp_path: Path):
    out = tmp_path / "run"
    with FakeJudgeServer(Reply(text="Weaknesses:\n- terse\nSCORE: 3")) as judge:
        args = ["rollout", "--policy", "scripted", "--tasks", str(DATA / "tasks" / "qa.jsonl")]
        args += ["--workspace-root", str(DATA), "--out", str(out)]
        code = main([*args, "--judge-base-url", judge.url, "--judge-model", "scripted-judge"])
    assert code == 0
    lines = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(list((out / "records").glob("episodes-*.jsonl"))) == 1  # the env's per-process file
    tasks = [json.loads(x) for x in (DATA / "tasks" / "qa.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * len(tasks)  # a good and a bad trajectory per task
    assert {r["reward_status"] for r in lines} == {"scored"}
    assert {r["task_id"] for r in lines} == {t["id"] for t in tasks}
    good = [r for r in lines if r["format_ok"] and r["reward_components"].get("qa_accuracy") == 1.0]
    assert good and all(r["reward_components"]["qa_analysis"] == 0.6 for r in good)
    assert all(r["judge"]["calls"][0]["reply"].endswith("SCORE: 3") for r in good)


def test_unknown_config_key_is_one_line_error(tmp_path: Path):
    cfg = tmp_path / "env.yaml"
    cfg.write_text("executor:\n  timeout: 3\n")
    result = run_cli("rollout", "--config", str(cfg))
    assert result.returncode == 2
    assert result.stdout.strip().splitlines() == [
        "error: unknown key env_config.executor.timeout (known keys: disk_mb, max_output_chars, memory_mb, "
        "preload, python, sandbox, timeout_s)"
    ]
    assert "Traceback" not in result.stderr


def test_missing_task_file_is_one_line_error():
    result = run_cli("rollout", "--tasks", "no/such/tasks.jsonl")
    assert result.returncode == 2 and "no such file no/such/tasks.jsonl" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_help_shows_an_example():
    result = run_cli("rollout", "--help")
    assert result.returncode == 0 and "example: deepanalyze-rl rollout" in result.stdout
