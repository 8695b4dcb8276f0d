"""Episodes SkyRL stops for length (input outgrew max_input_length): masked by default, or scored
as a failed gate when asked; the env records them with ``termination: "length"``."""

from __future__ import annotations

import asyncio
import json

from deepanalyze_env.core.tasks import env_extras
from deepanalyze_env.trainers.skyrl.trainer import exclude_rows
from tests.conftest import qa_extras
from tests.skyrl.conftest import ScriptedEngine, make_cfg, make_generator

LONG = "<Analyze>print a lot</Analyze>\n<Code>\n```python\nprint('x' * 3000)\n```\n</Code>"


def stopped_for_length(tok, workspace_root, tmp_path):
    records = tmp_path / "records"
    cfg = make_cfg(
        f"environment.skyrl_gym.deepanalyze.records_dir={records}",
        "generator.max_input_length=600",
        workspace_root=workspace_root,
    )
    row = {"prompt": [{"role": "user", "content": "Which store?"}], "task_id": "t-len", **qa_extras()}
    engine = ScriptedEngine(tok, {"Which store?": [LONG]})
    gen = make_generator(cfg, tok, engine)
    out = asyncio.run(gen.agent_loop(row["prompt"], "deepanalyze", env_extras(row), 4096, 600))
    record = [json.loads(x) for f in records.glob("*.jsonl") for x in f.read_text().splitlines()]
    return out, engine, record


def as_batch(out):
    return {
        "loss_masks": [list(out.loss_mask)],
        "rewards": [list(out.reward)],
        "env_metrics": [out.env_metrics],
    }


def test_the_generator_stops_and_the_env_records_a_length_termination(
    tiny_tokenizer, workspace_root, tmp_path
):
    out, engine, record = stopped_for_length(tiny_tokenizer, workspace_root, tmp_path)
    assert out.stop_reason == "length" and len(engine.calls) == 1
    assert out.env_metrics["finished"] == 0.0
    assert len(record) == 1 and record[0]["termination"] == "length"


def test_a_length_stopped_episode_is_masked_by_default(tiny_tokenizer, workspace_root, tmp_path):
    out, _, _ = stopped_for_length(tiny_tokenizer, workspace_root, tmp_path)
    batch = as_batch(out)
    assert sum(batch["loss_masks"][0]) > 0
    counts = exclude_rows(batch, score_truncated=False)
    assert counts["length"] == 1 and sum(batch["loss_masks"][0]) == 0


def test_score_truncated_trains_it_as_a_failed_gate(tiny_tokenizer, workspace_root, tmp_path):
    out, _, _ = stopped_for_length(tiny_tokenizer, workspace_root, tmp_path)
    assert sum(out.reward) == 0.0  # what SkyRL alone would train on: a reward nobody computed
    batch = as_batch(out)
    counts = exclude_rows(batch, score_truncated=True)
    assert counts["length_scored"] == 1
    assert sum(batch["rewards"][0]) == -1.0 and batch["rewards"][0][-1] == -1.0
    assert sum(batch["loss_masks"][0]) > 0
