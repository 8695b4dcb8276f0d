"""``deepanalyze-rl train``: recipe parsing, and a whole TRL run on a tiny local model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from deepanalyze_env.cli import main
from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.trainers.recipes import load_recipe

BASE = {
    "backend": "trl",
    "output_dir": "out",
    "max_steps": 1,
    "model": "some/model",
    "data": ["tasks.jsonl"],
    "env": {"workspace_root": "data"},
}


def write(tmp_path: Path, tree: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_dotted_overrides_reach_nested_settings(tmp_path):
    recipe = load_recipe(
        write(tmp_path, BASE),
        ["max_steps=3", "env.judge.base_url=http://127.0.0.1:9/v1", "trl.learning_rate=1e-5"],
    )
    assert recipe.max_steps == 3
    assert recipe.env["judge"]["base_url"] == "http://127.0.0.1:9/v1"
    assert recipe.trl["learning_rate"] == 1e-5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["max_step=3"], "unknown recipe key 'max_step'"),
        (["env.judge.base_ur=x"], r"unknown key env_config\.judge\.base_ur"),
        (["rollout.max_turn_token=5"], r"unknown key rollout\.max_turn_token"),
        (["backend=keras"], "backend must be one of"),
        (["max_steps"], "must look like key=value"),
    ],
)
def test_bad_recipe_settings_name_the_key(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(write(tmp_path, BASE), overrides)


def test_unknown_trl_setting_is_one_line_error(tmp_path, capsys):
    code = main(["train", str(write(tmp_path, {**BASE, "trl": {"learnin_rate": 1}}))])
    assert code == 2
    assert "learnin_rate" in capsys.readouterr().out


def test_train_writes_metrics_records_and_curves(tiny_tokenizer, workspace_root, tmp_path):
    from tests.trl.test_grpo_integration import tiny_policy

    model_dir = tmp_path / "policy"
    tiny_policy(tiny_tokenizer).save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps(
            {
                "id": "q1",
                "method": "qa_plain",
                "instruction": "Which store?",
                "data": "data",
                "workspace_id": "ws",
                "reward_spec": {"method": "qa_plain", "ground_truth": "B"},
            }
        )
        + "\n"
    )
    out = tmp_path / "run"
    recipe = write(
        tmp_path,
        {
            **BASE,
            "output_dir": str(out),
            "max_steps": 2,
            "model": str(model_dir),
            "data": [str(tasks)],
            "env": {"workspace_root": str(workspace_root), "max_turns": 2},
            "rollout": {"max_turn_tokens": 40},
            "trl": {
                "per_device_train_batch_size": 4,
                "num_generations": 4,
                "max_completion_length": 64,
                "learning_rate": 1e-3,
                "beta": 0.0,
                "seed": 0,
                "gradient_checkpointing": False,
            },
        },
    )
    assert main(["train", str(recipe)]) == 0
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["episodes"] == 4 and sum(m["status_counts"].values()) == 4 for m in metrics)
    for m in metrics:  # one micro-batch of 4 rows a step, skipped only when none of them can teach
        assert m["teach"]["update_rows"] == 4 and m["teach"]["update_rows_skipped"] in (0, 4)
    episodes = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 8 and {e["task_id"] for e in episodes} == {"q1"}
    assert len({e["episode_id"] for e in episodes}) == 8
    assert (out / "reward_curves.png").stat().st_size > 1000
    assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()  # a model folder


@pytest.mark.parametrize("name", ["trl_cpu_smoke.yaml", "trl_grpo.yaml"])
def test_shipped_trl_recipes_are_valid(name):
    from deepanalyze_env.trainers.trl.train import _grpo_config

    root = Path(__file__).resolve().parents[2]
    recipe = load_recipe(root / "recipes" / name, ["trl.bf16=false", "trl.use_vllm=false"])
    config = _grpo_config(recipe, root / "runs" / "unused", cuda=False)
    assert config.num_generations >= 4 and config.temperature == 1.0
    # a length cut is masked unless the recipe scores it as a failed gate (the CPU recipe does)
    assert config.mask_truncated_completions is not recipe.rollout.get("score_truncated", False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"trl": {"learnin_rate": 1}}, "learnin_rate"),
        ({"env": {"workspace_root": "no/such/root"}}, "workspace folder does not exist"),
        ({"trl": {"use_vllm": True, "generation_kwargs": {"max_tokens": 512}}}, "max_turn_tokens"),
    ],
)
def test_a_bad_recipe_leaves_no_output_folder(tmp_path, capsys, change, message):
    tasks = _tasks(tmp_path, [{"method": "qa_plain", "ground_truth": "B"}])
    out = tmp_path / "run"
    tree = {**BASE, "output_dir": str(out), "data": [str(tasks)], **change}
    assert main(["train", str(write(tmp_path, tree))]) == 2
    assert message in capsys.readouterr().out
    assert not out.exists()


def test_recipe_chat_template_kwargs_reach_the_episode_prompt(fresh_smollm2_tokenizer, workspace_root):
    from types import SimpleNamespace

    from deepanalyze_env.trainers.trl.rollout_func import DeepAnalyzeRollout, trl_prompt
    from deepanalyze_env.trainers.trl.turns import Generated
    from tests.conftest import qa_extras

    tok = fresh_smollm2_tokenizer
    tok.chat_template = (  # Qwen3's switch, reduced to what matters here
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}"
        "<think>\n\n</think>\n\n{% endif %}"
    )
    row = {"prompt": [{"role": "user", "content": "Which store?"}], "task_id": "t", **qa_extras()}
    answer = tok.encode("<Analyze>a</Analyze><Answer>Answer: B</Answer>", add_special_tokens=False)
    rollout = DeepAnalyzeRollout(
        [row],
        {"workspace_root": str(workspace_root)},
        generator=lambda trainer, contexts, caps: [Generated(answer, None) for _ in contexts],
    )
    trainer = SimpleNamespace(
        processing_class=tok,
        args=SimpleNamespace(max_completion_length=256),
        eos_token_ids=[tok.eos_token_id],
        chat_template_kwargs={"enable_thinking": False},  # GRPOTrainer's copy of the recipe's setting
    )
    out = rollout([trl_prompt(row)], trainer)
    assert tok.decode(out["prompt_ids"][0]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_special_tag_tokens_become_vllm_stop_token_ids(fresh_smollm2_tokenizer):
    from types import SimpleNamespace

    from deepanalyze_env.trainers.trl.train import add_stop_token_ids

    tok = fresh_smollm2_tokenizer
    tok.add_special_tokens({"additional_special_tokens": ["<Code>", "</Code>", "<Answer>", "</Answer>"]})
    config = SimpleNamespace(use_vllm=True, generation_kwargs={"stop": ["</Code>", "</Answer>"]})
    add_stop_token_ids(config, tok)
    expected = [tok.convert_tokens_to_ids("</Code>"), tok.convert_tokens_to_ids("</Answer>")]
    assert config.generation_kwargs == {"stop": ["</Code>", "</Answer>"], "stop_token_ids": expected}
    plain = SimpleNamespace(use_vllm=True, generation_kwargs={"stop": ["</Code>"]})
    add_stop_token_ids(plain, fresh_smollm2_tokenizer.__class__.from_pretrained(tok.name_or_path))
    assert plain.generation_kwargs == {"stop": ["</Code>"]}  # ordinary tags: stop strings suffice


def test_stop_tag_split_across_special_and_ordinary_tokens_is_refused(fresh_smollm2_tokenizer):
    from types import SimpleNamespace

    from deepanalyze_env.trainers.trl.train import add_stop_token_ids

    tok = fresh_smollm2_tokenizer
    tok.add_special_tokens({"additional_special_tokens": ["</Co"]})
    with pytest.raises(ValueError, match="splits the stop tag '</Code>'"):
        add_stop_token_ids(SimpleNamespace(use_vllm=True, generation_kwargs={}), tok)


def _tasks(tmp_path: Path, specs: list[dict]) -> Path:
    path = tmp_path / "tasks.jsonl"
    task = {"method": "qa_plain", "instruction": "Which store?", "data": "data", "workspace_id": "ws"}
    lines = [{"id": f"q{i}", **task, "reward_spec": spec} for i, spec in enumerate(specs)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_check_validates_every_row_and_touches_nothing(smollm2_dir, workspace_root, tmp_path, capsys):
    good = {"method": "qa_plain", "ground_truth": "B"}
    tasks = _tasks(tmp_path, [good, good, good])
    out = tmp_path / "run"
    tree = {**BASE, "model": smollm2_dir, "output_dir": str(out), "data": [str(tasks)],
            "env": {"workspace_root": str(workspace_root)}}  # fmt: skip
    assert main(["train", str(write(tmp_path, tree)), "--check"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed[printed.index("{") :])["rows_checked"] == 3
    assert not out.exists()


def test_check_reports_every_bad_row_at_once(smollm2_dir, workspace_root, tmp_path, capsys):
    good = {"method": "qa_plain", "ground_truth": "B"}
    bad = {**good, "function": ["no_such_reward"]}
    tasks = _tasks(tmp_path, [good, bad, bad])
    out = tmp_path / "run"
    tree = {**BASE, "model": smollm2_dir, "output_dir": str(out), "data": [str(tasks)],
            "env": {"workspace_root": str(workspace_root)}}  # fmt: skip
    assert main(["train", str(write(tmp_path, tree)), "--check"]) == 2
    printed = capsys.readouterr().out
    assert "2 of 3 dataset rows cannot be used" in printed
    assert "row 1" in printed and "row 2" in printed and "row 0" not in printed
    assert "no_such_reward" in printed
    assert not out.exists()


def test_the_shipped_tools_recipe_checks_with_a_tool_template(capsys):
    root = Path(__file__).resolve().parents[2]
    assert main(["train", str(root / "recipes" / "trl_tools_cpu.yaml"), "--check"]) == 0
    printed = capsys.readouterr().out
    shown = json.loads(printed[printed.index("{") :])
    assert shown["action_format"] == "tools" and shown["tools"] == ["run_python", "submit_answer"]
    assert shown["trainer"] == "GRPOTrainer(environment_factory=…)"


def test_the_tools_format_without_a_tool_template_is_refused(smollm2_dir, workspace_root, tmp_path, capsys):
    tasks = _tasks(tmp_path, [{"method": "qa_plain", "ground_truth": "B"}])
    env = {"workspace_root": str(workspace_root), "action_format": "tools"}
    tree = {
        **BASE,
        "model": smollm2_dir,
        "output_dir": str(tmp_path / "run"),
        "data": [str(tasks)],
        "env": env,
    }
    assert main(["train", str(write(tmp_path, tree)), "--check"]) == 2
    assert "needs a chat template that renders tool calls" in capsys.readouterr().out


def test_an_unknown_trl_chat_template_names_the_shipped_ones(tmp_path):
    recipe = load_recipe(write(tmp_path, {**BASE, "chat_template": "trl:qwen99"}))
    with pytest.raises(ConfigError, match="TRL ships no such template") as caught:
        recipe.chat_template_text()
    assert "qwen3" in str(caught.value)


def test_a_tools_recipe_trains_the_embedded_model_through_environment_factory(
    smollm2_dir, workspace_root, tmp_path
):
    """One real GRPO step of ``backend: trl`` with ``env.action_format: tools``: the embedded
    SmolLM2 under Qwen3's template (TRL ships it), TRL's own tool loop, the env's reward. A 135M
    model rarely calls a tool, so the episodes fail the gate; what is checked is the path: the run
    finishes, saves a model with the template, and every rollout became an episode record."""
    tasks = _tasks(tmp_path, [{"method": "qa_plain", "ground_truth": "B"}])
    out = tmp_path / "run"
    tree = {
        **BASE,
        "output_dir": str(out),
        "max_steps": 1,
        "model": smollm2_dir,
        "chat_template": "trl:qwen3",
        "data": [str(tasks)],
        "env": {"workspace_root": str(workspace_root), "action_format": "tools", "max_turns": 2},
        "trl": {
            "per_device_train_batch_size": 2,
            "num_generations": 2,
            "max_completion_length": 48,
            "max_tool_calling_iterations": 2,
            "learning_rate": 1e-6,
            "beta": 0.0,
            "seed": 0,
            "gradient_checkpointing": False,
        },
    }
    assert main(["train", str(write(tmp_path, tree))]) == 0
    episodes = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 and all(e["reward_status"] == "scored" for e in episodes)
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert "tool_call" in (saved.get("chat_template") or (out / "chat_template.jinja").read_text())


def test_the_shipped_recipes_placeholder_model_is_one_line_naming_the_key(capsys):
    """``recipes/trl_grpo.yaml`` ships ``model: /path/to/DeepAnalyze-8B``: its check ends in one line
    that names the ``model`` key and what it may hold, not transformers' repo-id traceback."""
    root = Path(__file__).resolve().parents[2]
    assert main(["train", str(root / "recipes" / "trl_grpo.yaml"), "--check", "trl.use_vllm=false"]) == 2
    printed = capsys.readouterr().out.strip()
    assert "Traceback" not in printed and "Repo id" not in printed
    [line] = [x for x in printed.splitlines() if x.strip()]
    assert "trl_grpo.yaml: model '/path/to/DeepAnalyze-8B': no such model folder" in line
    assert "set model to embedded:smollm2, a local model folder" in line and "hub id" in line


def test_a_model_that_cannot_be_loaded_names_the_setting(tmp_path):
    from deepanalyze_env.generation.models import load_tokenizer

    empty = tmp_path / "empty-model"
    empty.mkdir()  # a folder, but no tokenizer in it
    with pytest.raises(ConfigError) as caught:
        load_tokenizer(str(empty), key="policy_model", where="learn.yaml")
    message = str(caught.value)
    assert message.startswith(f"learn.yaml: policy_model '{empty}' cannot be loaded (")
    assert "set policy_model to embedded:smollm2" in message and "\n" not in message
