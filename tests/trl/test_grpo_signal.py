"""GRPO settings whose signal counts (issue 41): a length cut costs what a failed gate costs, the
shipped recipes keep their learning rate, and truncating samplers are refused."""

from __future__ import annotations

import pytest

from tests.tiny_llama import tiny_llama

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")

import yaml  # noqa: E402
from datasets import Dataset  # noqa: E402

from deepanalyze_env.core.config import ConfigError  # noqa: E402
from deepanalyze_env.trainers.recipes import load_recipe  # noqa: E402
from deepanalyze_env.trainers.trl.rollout_func import (  # noqa: E402
    DeepAnalyzeRollout,
    environment_reward,
    trl_dataset_rows,
    trl_prompt,
)
from deepanalyze_env.trainers.trl.train import _grpo_config  # noqa: E402
from deepanalyze_env.trainers.trl.turns import Generated  # noqa: E402
from tests.conftest import ROOT as REPO  # noqa: E402
from tests.conftest import qa_extras  # noqa: E402

RIGHT = "<Analyze>a</Analyze><Answer>Answer: B</Answer>"
WRONG = "<Analyze>a</Analyze><Answer>Answer: A</Answer>"
RAMBLE = "<Analyze>" + "and then " * 40  # never closes a tag: the budget cuts it
TURNS = [RIGHT, WRONG, RAMBLE]
BUDGET = 48


def _recipe_path(name: str) -> str:
    return str(REPO / "recipes" / name)


def test_a_length_cut_is_scored_as_a_failed_gate_and_its_advantage_is_below_its_group(
    tiny_tokenizer, workspace_root, tmp_path
):
    """The CPU recipes' setting: the cut episode is −1 with its gate and termination named, and
    TRL's advantage puts it below every finished episode of its group (masked, it would be 0)."""
    assert load_recipe(_recipe_path("trl_cpu_smoke.yaml")).rollout["score_truncated"] is True
    tok = tiny_tokenizer

    def generate(trainer, contexts, max_new):
        return [Generated(tok.encode(TURNS[i], add_special_tokens=False), None) for i in range(len(contexts))]

    row = {
        "prompt": [{"role": "user", "content": "Which store?"}],
        "task_id": "t",
        **qa_extras(reward_spec={"method": "qa_plain", "ground_truth": "B"}),
    }
    rollout = DeepAnalyzeRollout(
        [row], {"workspace_root": str(workspace_root)}, generator=generate, score_truncated=True
    )
    model = tiny_llama(tok, hidden=16)
    config = trl.GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=3,
        num_generations=3,
        max_completion_length=BUDGET,
        mask_truncated_completions=False,  # what _grpo_config sets under score_truncated
        beta=0.0,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[environment_reward],
        args=config,
        processing_class=tok,
        train_dataset=Dataset.from_list(trl_dataset_rows([row]) * 3),
        rollout_func=rollout,
    )
    out = trainer._generate_and_score_completions([{"prompt": trl_prompt(row)} for _ in TURNS])
    stats = rollout.drain()
    assert stats.terminations == {"answer": 2, "length": 1}
    assert stats.rewards == [1.0, 0.0, -1.0]  # the cut trains as the gate's −1, not a silent 0
    assert stats.components["format_gate"] == [-1.0]  # named: the gate's component, on the cut only
    advantages = out["advantages"].tolist()
    assert advantages[2] < min(advantages[:2]) and advantages[2] < 0
    assert out["completion_mask"][2].sum() > 0  # and it is in the loss


def test_the_shipped_grpo_recipes_keep_their_learning_rate():
    """TRL's default schedule decays linearly to 0 over max_steps; every shipped GRPO recipe (and
    the main job's GRPO stage on top of its recipe) is constant, or warms up to constant."""
    recipes = {
        "trl_cpu_smoke.yaml": [],
        "trl_tools_cpu.yaml": [],
        "trl_grpo.yaml": ["trl.bf16=false", "trl.use_vllm=false"],  # built on a CPU here
    }
    learn = yaml.safe_load((REPO / "recipes" / "learn_cpu.yaml").read_text())["grpo"]
    recipes[learn["recipe"]] = [f"{k}={v}" for k, v in learn["set"].items()]
    for name, overrides in recipes.items():
        recipe = load_recipe(_recipe_path(name), overrides)
        config = _grpo_config(recipe, REPO / "runs" / "unused", cuda=False)
        schedule = str(config.lr_scheduler_type).rsplit(".", 1)[-1].lower()
        assert schedule in ("constant", "constant_with_warmup"), name
        if recipe.rollout.get("score_truncated"):
            assert config.mask_truncated_completions is False, name


@pytest.mark.parametrize(
    "override", ["trl.top_p=0.9", "trl.top_k=20", "trl.min_p=0.05", "trl.generation_kwargs.top_p=0.95"]
)
def test_a_truncating_sampler_is_refused_by_name(override):
    key = override.partition("=")[0]
    recipe = load_recipe(_recipe_path("trl_cpu_smoke.yaml"), [override])
    with pytest.raises(ConfigError, match=rf"{key}=\S+ truncates the sampling distribution") as err:
        _grpo_config(recipe, REPO / "runs" / "unused", cuda=False)
    assert len(str(err.value).splitlines()) == 1
    neutral = load_recipe(_recipe_path("trl_cpu_smoke.yaml"), ["trl.top_p=1.0", "trl.top_k=0"])
    assert _grpo_config(neutral, REPO / "runs" / "unused", cuda=False).top_p == 1.0
