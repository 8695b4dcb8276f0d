"""``prepare-data``: SkyRL/TRL rows in DeepAnalyze's prompt layout; upstream rows pass through."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from deepanalyze_env.cli import main
from deepanalyze_env.core.env import DeepAnalyzeEnv
from deepanalyze_env.core.tasks import env_extras
from tests.conftest import DATA

SKYRL_COLUMNS = {
    "data_source",
    "prompt",
    "env_class",
    "reward_spec",
    "data",
    "workspace_id",
    "input_seq",
    "extra_info",
}


def test_task_files_become_skyrl_parquet_rows(tmp_path: Path):
    out = tmp_path / "train.parquet"
    tasks = sorted(str(p) for p in (DATA / "tasks").glob("*.jsonl"))
    assert (
        main(
            [
                "prepare-data",
                "--format",
                "skyrl",
                "--tasks",
                *tasks,
                "--workspace-root",
                str(DATA),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    frame = pd.read_parquet(out)
    assert set(frame.columns) >= SKYRL_COLUMNS
    assert set(frame["env_class"]) == {"deepanalyze"}
    n_tasks = sum(len(Path(t).read_text().splitlines()) for t in tasks)
    assert len(frame) == n_tasks


def test_user_message_uses_deepanalyze_layout(tmp_path: Path):
    out = tmp_path / "rows.jsonl"
    assert (
        main(
            [
                "prepare-data",
                "--format",
                "trl",
                "--tasks",
                str(DATA / "tasks" / "qa.jsonl"),
                "--workspace-root",
                str(DATA),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    row = json.loads(out.read_text().splitlines()[0])
    task = json.loads((DATA / "tasks" / "qa.jsonl").read_text().splitlines()[0])
    folder = DATA / task["data"] / task["workspace_id"]
    files = sorted(p for p in folder.iterdir() if p.is_file())
    listing = "\n".join(
        f'File {i}: {{"name": "{p.name}", "size": "{p.stat().st_size / 1024:.1f}KB"}}'
        for i, p in enumerate(files, 1)
    )
    assert row["prompt"] == [
        {"role": "user", "content": f"# Instruction\n{task['instruction']}\n\n# Data\n{listing}"}
    ]
    assert row["extra_info"]["task_id"] == task["id"]
    assert row["input_seq"] == task.get("input_seq", task["instruction"])


def test_parquet_rows_build_an_env(tmp_path: Path):
    out = tmp_path / "train.parquet"
    main(
        [
            "prepare-data",
            "--tasks",
            str(DATA / "tasks" / "qa.jsonl"),
            "--workspace-root",
            str(DATA),
            "--out",
            str(out),
        ]
    )
    row = pd.read_parquet(out).to_dict(orient="records")[1]
    config = {
        "workspace_root": str(DATA),
        "judge": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "j"},
    }
    env = DeepAnalyzeEnv(env_config=config, extras=env_extras(row))
    original = json.loads((DATA / "tasks" / "qa.jsonl").read_text().splitlines()[1])["reward_spec"]
    assert env.reward_spec == original  # the ground truth keeps its type through parquet


def test_deepanalyze_rows_pass_through_unchanged(tmp_path: Path):
    upstream = {
        "prompt": [{"role": "user", "content": "# Instruction\nx"}],
        "env_class": "deepanalyze",
        "reward_spec": {"method": "qa", "ground_truth": "7"},
        "data": "data",
        "workspace_id": "w1",
        "input_seq": "x",
        "extra_info": {"index": 3},
    }
    src = tmp_path / "upstream.json"
    src.write_text(json.dumps([upstream]))
    out = tmp_path / "rows.jsonl"
    assert (
        main(["prepare-data", "--tasks", str(src), "--workspace-root", str(tmp_path), "--out", str(out)]) == 0
    )
    assert json.loads(out.read_text()) == upstream


def test_unknown_output_format_is_a_usage_error(tmp_path: Path, capsys):
    code = main(
        [
            "prepare-data",
            "--tasks",
            str(DATA / "tasks" / "qa.jsonl"),
            "--workspace-root",
            str(DATA),
            "--out",
            str(tmp_path / "rows.csv"),
        ]
    )
    assert code == 2 and "must end in .parquet or .jsonl" in capsys.readouterr().out
