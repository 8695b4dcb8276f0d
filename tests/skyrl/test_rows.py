"""Every dataset row is checked before training; a row that still goes bad fails only its episode."""

from __future__ import annotations

import asyncio
import json

from deepanalyze_env.cli.prepare_data import write_parquet
from deepanalyze_env.trainers.skyrl.entrypoint import main
from deepanalyze_env.trainers.skyrl.trainer import DeepAnalyzeTrainer
from tests.conftest import qa_extras
from tests.skyrl.conftest import ScriptedEngine, generator_input, make_cfg, make_generator

ANSWER = "<Analyze>done</Analyze>\n<Answer>Answer: B</Answer>"


def row(**extras):
    return {"prompt": [{"role": "user", "content": "Which store?"}], "env_class": "deepanalyze", **extras}


def mixed_rows():
    """Row 0 and 4 are fine; 1, 2 and 3 are each wrong in one way (known by construction)."""
    return [
        row(**qa_extras(), task_id="ok-1"),
        row(**qa_extras(workspace_id="gone"), task_id="no-workspace"),
        row(**qa_extras(reward_spec={"method": "no_such_method"}), task_id="bad-spec"),
        row(**qa_extras(reward_spec={"method": "qa", "ground_truth": "B"}), task_id="needs-judge"),
        row(**qa_extras(), task_id="ok-2"),
    ]


def test_every_bad_row_is_reported_at_once_with_file_and_index(workspace_root, tmp_path, capsys):
    data = tmp_path / "train.parquet"
    write_parquet(mixed_rows(), data)
    argv = [
        "--check",
        f"data.train_data=['{data}']",
        f"environment.skyrl_gym.deepanalyze.workspace_root={workspace_root}",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 3 of 5 dataset rows cannot be used")
    lines = err.strip().splitlines()[1:]
    assert [line.split(": ", 1)[0].strip() for line in lines] == [f"{data} row {i}" for i in (1, 2, 3)]
    assert "workspace folder does not exist" in lines[0]
    assert "no_such_method" in lines[1]
    assert "needs a judge" in lines[2]


def test_evaluation_rows_are_checked_too(workspace_root, tmp_path, capsys):
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    train.write_text(json.dumps(row(**qa_extras())) + "\n")
    val.write_text(json.dumps(row(**qa_extras(workspace_id="gone"))) + "\n")
    argv = [
        "--check",
        f"data.train_data=['{train}']",
        f"data.val_data=['{val}']",
        f"environment.skyrl_gym.deepanalyze.workspace_root={workspace_root}",
    ]
    assert main(argv) == 2
    assert f"{val} row 0: workspace folder does not exist" in capsys.readouterr().err


def test_a_row_that_goes_bad_after_the_check_fails_only_its_episode(tiny_tokenizer, workspace_root):
    """Through SkyRL's generator: the batch completes; the bad row is an environment_error that
    the trainer keeps out of the loss."""
    rows = [row(**qa_extras()), row(**qa_extras(workspace_id="deleted-mid-run"))]
    cfg = make_cfg(
        "generator.inference_engine.enable_ray_prometheus_stats=false",
        "trainer.enable_ray_gpu_monitor=false",
        workspace_root=workspace_root,
    )
    engine = ScriptedEngine(tiny_tokenizer, {"Which store?": [ANSWER]})
    gen = make_generator(cfg, tiny_tokenizer, engine)
    gen_input, uids = generator_input(rows, 1, cfg)
    output = asyncio.run(gen.generate(gen_input, disable_tqdm=True))
    assert [m["status_environment_error"] for m in output["env_metrics"]] == [0.0, 1.0]
    assert output["env_metrics"][0]["reward"] == 1.0
    trainer = DeepAnalyzeTrainer(
        cfg=cfg, tracker=None, tokenizer=tiny_tokenizer, train_dataset=None,
        inference_engine_client=engine, generator=gen,
    )  # fmt: skip
    output, _ = trainer.postprocess_generator_output(output, uids)
    assert [sum(m) > 0 for m in output["loss_masks"]] == [True, False]


def test_a_missing_data_file_is_named(tmp_path, capsys):
    assert main(["--check", f"data.train_data=['{tmp_path / 'nope.parquet'}']"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nope.parquet'}: no such file" in err
