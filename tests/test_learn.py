"""``deepanalyze-rl learn``: the pipeline file, the task sample, stage reuse, and one real tiny run."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from deepanalyze_env.cli import main
from deepanalyze_env.cli.learn import Pipeline, bank_folder, sample_tasks
from deepanalyze_env.core.config import ConfigError

REPO = Path(__file__).resolve().parent.parent


def _tasks(counts: dict[str, int]) -> list[dict]:
    return [{"id": f"{fam}-{i}", "family": fam} for fam, n in counts.items() for i in range(n)]


def test_task_sample_takes_families_in_turn():
    picked = sample_tasks(_tasks({"a": 5, "b": 1, "c": 2}), 5, seed=3)
    # turns: a, b, c, a, c (b is exhausted after one)
    assert Counter(t["family"] for t in picked) == {"a": 2, "b": 1, "c": 2}
    assert len({t["id"] for t in picked}) == 5


def test_task_sample_is_seeded_and_capped_by_what_exists():
    tasks = _tasks({"a": 6, "b": 6})
    assert sample_tasks(tasks, 4, seed=1) == sample_tasks(tasks, 4, seed=1)
    ids = [{t["id"] for t in sample_tasks(tasks, 4, seed=s)} for s in (1, 2)]
    assert ids[0] != ids[1]
    assert len(sample_tasks(tasks, 100, seed=0)) == 12


def test_a_bank_slice_gets_its_own_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("DEEPANALYZE_CACHE", str(tmp_path))
    whole = bank_folder({})
    a = bank_folder({"families": ["ols"], "tables": ["fair", "wine"]})
    b = bank_folder({"families": ["ols"], "tables": ["wine", "fair"]})  # order does not matter
    c = bank_folder({"families": ["correlation"], "tables": ["fair", "wine"]})
    assert whole == tmp_path / "bank-seed13"
    assert a == b and a != c and a.parent == whole.parent and a.name.startswith("bank-seed13-")


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"output_dir": "x", "stages": []}, "unknown pipeline key 'stages'"),
        ({"model": "m"}, "'output_dir' is required"),
        ({"output_dir": "x", "tasks": {"valid": 3}}, "unknown split tasks.valid"),
        ({"output_dir": "x", "sft": {"set": {}}}, "sft needs a recipe file"),
        ({"output_dir": "x", "grpo": {"recipe": "nope.yaml"}}, "grpo.recipe: no such file"),
        ({"output_dir": "x", "eval": {"sample": 2}}, "eval:"),
        ({"output_dir": "x", "env": {"max_turn": 2}}, "max_turn"),
    ],
)
def test_pipeline_mistakes_name_what_to_fix(tmp_path, tree, message):
    path = tmp_path / "pipe.yaml"
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError, match=message):
        Pipeline.load(path)


def test_shipped_pipeline_loads_and_its_recipes_exist():
    pipe = Pipeline.load(REPO / "recipes" / "learn_cpu.yaml")
    assert Path(pipe.sft.recipe).is_file() and Path(pipe.grpo.recipe).is_file()
    assert pipe.tasks["train"] > 0 and pipe.tasks["dev"] > 0


def test_pipeline_mistake_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "pipe.yaml"
    path.write_text("output_dir: x\nstages: []\n")
    assert main(["learn", str(path)]) == 2
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "stages" in lines[0]


def _headline_by_hand(eval_dir: Path) -> tuple[float, float]:
    records = [json.loads(x) for x in (eval_dir / "episodes.jsonl").read_text().splitlines() if x]
    gate_ran = [r for r in records if r["reward_status"] in ("scored", "verifier_error")]
    scored = [r["reward"] for r in records if r["reward_status"] == "scored"]
    return sum(bool(r["format_ok"]) for r in gate_ran) / len(gate_ran), sum(scored) / len(scored)


def test_tiny_pipeline_runs_every_stage_and_a_rerun_reuses_them(tmp_path):
    """A real run: bank slice, embedded SmolLM2, env + kernel, TRL SFT and GRPO (a few tokens)."""
    pytest.importorskip("trl")
    out = tmp_path / "learn"
    overrides = [
        f"output_dir={out}",
        "bank.families=[filter_count]",
        "bank.tables=[fair, wine]",
        "tasks.train=2",
        "tasks.dev=1",
        "env.max_turns=2",
        "eval.max_tokens=8",
        "eval.after_sft=true",
        "sft.set.max_steps=1",
        "grpo.set.max_steps=1",
        "grpo.set.rollout.max_turn_tokens=8",
        "grpo.set.trl.max_completion_length=16",
        "grpo.set.trl.num_generations=2",
        "grpo.set.trl.per_device_train_batch_size=2",
    ]
    pipe = str(REPO / "recipes" / "learn_cpu.yaml")
    assert main(["learn", pipe, *overrides]) == 0
    summary = json.loads((out / "learn.json").read_text())
    assert list(summary["dev"]) == ["base", "sft", "grpo"]
    assert summary["tasks"] == {"train": 2, "dev": 1}
    for stage in ("base", "sft", "grpo"):
        gate, reward = _headline_by_hand(out / f"eval-{stage}")
        assert summary["dev"][stage]["format_gate_pass_rate"] == pytest.approx(gate)
        assert summary["dev"][stage]["reward_mean"] == pytest.approx(reward)
    assert [s["step"] for s in summary["grpo_steps"]] == [1]
    assert (out / "sft" / "model.safetensors").is_file() and (out / "grpo" / "model.safetensors").is_file()
    kept = (out / "reference" / "kept.jsonl").read_text().splitlines()
    assert len(kept) == 2  # both train tasks' reference episodes pass the gate: the SFT data
    stages = json.loads((out / "stages.json").read_text())
    assert {"eval_base", "reference", "sft", "eval_sft", "grpo", "eval_grpo"} <= set(stages)

    weights = (out / "grpo" / "model.safetensors").stat().st_mtime_ns
    assert main(["learn", pipe, *overrides]) == 0  # nothing changed: every stage is reused
    assert (out / "grpo" / "model.safetensors").stat().st_mtime_ns == weights
    assert json.loads((out / "stages.json").read_text()) == stages
