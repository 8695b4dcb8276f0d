"""The curriculum inside the real TRL pieces: recipe → curriculum → ``GRPOTrainer``'s train sampler,
fed by the real rollout (real env episodes, scripted policy turns), logged into ``metrics.jsonl``.

The trainer is built on the embedded SmolLM2 (no download); no training step is taken: drawing
the dataloader's indices is the contract with TRL.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402

from deepanalyze_env.core.config import ConfigError  # noqa: E402
from deepanalyze_env.trainers.recipes import load_recipe  # noqa: E402
from deepanalyze_env.trainers.trl.curriculum_sampler import CurriculumSampler, curriculum_trainer_class  # noqa: E402
from deepanalyze_env.trainers.trl.rollout_func import (  # noqa: E402
    DeepAnalyzeRollout,
    environment_reward,
    trl_dataset_rows,
    trl_prompt,
)
from deepanalyze_env.trainers.trl.train import _make_callback, build_curriculum  # noqa: E402
from deepanalyze_env.trainers.trl.turns import Generated  # noqa: E402
from tests.conftest import qa_extras  # noqa: E402

BASE = {
    "backend": "trl",
    "output_dir": "out",
    "max_steps": 1,
    "model": "some/model",
    "data": ["tasks.jsonl"],
    "env": {"workspace_root": "data"},
}


def recipe_file(tmp_path: Path, tree: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_curriculum_is_off_unless_set(tmp_path):
    assert load_recipe(recipe_file(tmp_path, BASE)).curriculum is None


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"curriculum": {"kind": "success_rate", "flor": 0.1}}, r"unknown key curriculum\.flor"),
        ({"curriculum": {"kind": "uniform"}}, "kind must be success_rate"),
        ({"backend": "trl-sft", "curriculum": {"kind": "success_rate"}}, "backends trl and skyrl"),
    ],
)
def test_bad_curriculum_section_is_a_one_line_error(tmp_path, tree, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_recipe(recipe_file(tmp_path, {**BASE, **tree}))
    assert "\n" not in str(info.value)


def test_curriculum_overrides_reach_the_config(tmp_path):
    recipe = load_recipe(
        recipe_file(tmp_path, BASE), ["curriculum.kind=success_rate", "curriculum.floor=0.2"]
    )
    assert recipe.curriculum.kind == "success_rate" and recipe.curriculum.floor == 0.2


def _rows():
    # a: the scripted answer "B" is right; b: the same answer is wrong
    return [
        {"prompt": [{"role": "user", "content": "Which store?"}], "task_id": "a", **qa_extras()},
        {
            "prompt": [{"role": "user", "content": "Which store?"}],
            "task_id": "b",
            **qa_extras(reward_spec={"method": "qa_plain", "ground_truth": "A"}),
        },
        {"prompt": [{"role": "user", "content": "Which store?"}], "task_id": "c", **qa_extras()},
        {"prompt": [{"role": "user", "content": "Which store?"}], "task_id": "d", **qa_extras()},
    ]


def test_grpo_trainer_draws_its_groups_from_the_curriculum(smollm2_dir, workspace_root, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = load_recipe(
        recipe_file(tmp_path, {**BASE, "curriculum": {"kind": "success_rate", "seed": 5, "decay": 1.0}})
    )
    rows = _rows()
    curriculum = build_curriculum(recipe, rows, seed=0)
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    answer = tok.encode("<Analyze>a</Analyze><Answer>Answer: B</Answer>", add_special_tokens=False)
    rollout = DeepAnalyzeRollout(
        rows,
        {"workspace_root": str(workspace_root)},
        generator=lambda trainer, contexts, caps: [Generated(answer, None) for _ in contexts],
    )
    rollout.listeners.append(curriculum.observe)
    config = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=64,
        seed=0,
    )
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    trainer = curriculum_trainer_class(trl.GRPOTrainer, curriculum)(
        model=model,
        reward_funcs=[environment_reward],
        args=config,
        train_dataset=Dataset.from_list(trl_dataset_rows(rows)),
        processing_class=tok,
        rollout_func=rollout,
    )
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, CurriculumSampler)
    # TRL's layout: 2 tasks per generation batch, each repeated num_generations=2 times in a row
    first = list(sampler)
    assert len(first) == len(sampler) == 8
    assert first[0] == first[1] and first[2] == first[3] and first[0] != first[2]

    # The dataloader TRL trains from yields the prompts of those tasks, in groups.
    batch = next(iter(trainer.get_train_dataloader()))
    ids = [example["prompt"][0]["task_id"] for example in batch]
    assert len(ids) == 4 and ids[0] == ids[1] and ids[2] == ids[3]

    # One rollout of a group per task: a succeeds, b fails → both leave the prior.
    args = SimpleNamespace(max_completion_length=256)
    fake = SimpleNamespace(processing_class=tok, args=args, eos_token_ids=[tok.eos_token_id])
    rollout([trl_prompt(rows[0])] * 2 + [trl_prompt(rows[1])] * 2, fake)
    assert curriculum.estimate("a") == pytest.approx(3 / 4)  # prior (1, 1) + 2 successes
    assert curriculum.estimate("b") == pytest.approx(1 / 4)
    assert curriculum.estimate("c") == pytest.approx(1 / 2)

    # The step line in metrics.jsonl carries the curriculum's log.
    out = tmp_path / "run"
    out.mkdir()
    reporter = _make_callback(rollout, out, curriculum)
    reporter.on_log(None, SimpleNamespace(global_step=1), None, logs={"loss": 0.5})
    line = json.loads((out / "metrics.jsonl").read_text())
    log = line["curriculum"]
    assert (log["groups"], log["zero_variance_groups"], log["zero_variance_fraction"]) == (2, 2, 1.0)
    assert log["success_histogram"] == [0, 0, 1, 0, 0, 2, 0, 1, 0, 0]
    assert log["tasks"] == 4 and log["sampling_entropy"] > 0


def test_train_with_a_curriculum_logs_it_every_step(tiny_tokenizer, workspace_root, tmp_path):
    """The whole ``deepanalyze-rl train`` path: two real GRPO steps drawing from the curriculum."""
    from deepanalyze_env.cli import main
    from tests.trl.test_grpo_integration import tiny_policy

    model_dir = tmp_path / "policy"
    tiny_policy(tiny_tokenizer).save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    tasks = tmp_path / "tasks.jsonl"
    task = {"method": "qa_plain", "instruction": "Which store?", "data": "data", "workspace_id": "ws"}
    tasks.write_text(
        "".join(
            json.dumps({**task, "id": f"q{i}", "reward_spec": {"method": "qa_plain", "ground_truth": "B"}})
            + "\n"
            for i in range(3)
        )
    )
    out = tmp_path / "run"
    tree = {
        **BASE,
        "output_dir": str(out),
        "max_steps": 2,
        "model": str(model_dir),
        "data": [str(tasks)],
        "env": {"workspace_root": str(workspace_root), "max_turns": 2},
        "rollout": {"max_turn_tokens": 40},
        "curriculum": {"kind": "success_rate"},
        "trl": {
            "per_device_train_batch_size": 4,
            "num_generations": 2,
            "max_completion_length": 64,
            "beta": 0.0,
            "seed": 0,
            "gradient_checkpointing": False,
        },
    }
    assert main(["train", str(recipe_file(tmp_path, tree))]) == 0
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        log = m["curriculum"]
        # 4 episodes a step = 2 tasks x 2 generations; each task's pair is one group
        assert log["episodes_counted"] + log["episodes_excluded"] == 4
        assert log["tasks"] == 3 and sum(log["success_histogram"]) == 3
    episodes = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    per_step_tasks = Counter(e["task_id"] for e in episodes)
    assert sum(per_step_tasks.values()) == 8 and all(n % 2 == 0 for n in per_step_tasks.values())
