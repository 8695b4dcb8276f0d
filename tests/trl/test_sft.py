"""SFT warm start: record selection, the token layout shared with the TRL rollout, a real SFTTrainer run.

The episodes are real (env, kernels, records written by ``env.close()``); the turns come from a
scripted stand-in for the policy, as in ``test_rollout_masks.py``, so each test knows them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from deepanalyze_env.cli import main
from deepanalyze_env.core.records import read_records
from deepanalyze_env.trainers.trl.rollout_func import DeepAnalyzeRollout, trl_prompt
from deepanalyze_env.trainers.trl.sft_data import IGNORE_INDEX, SFTDataError, render_record, select_records
from tests.tiny_llama import tiny_llama
from tests.trl.test_rollout_masks import ANSWER_TURN, CODE_TURN, fake_trainer, row, scripted

# A cell that prints the text of the tokenizer's EOS token: it must stay text, not become EOS.
SPECIAL_TURN = "<Analyze>peek</Analyze>\n<Code>\n```python\nprint('<|' + 'end|>', 6 * 7)\n```\n</Code>"


def rollout_with_records(tok, env_config, plan, records_dir: Path, n: int = 1):
    config = {**env_config, "records_dir": str(records_dir)}
    rows = [row(f"t{i}") for i in range(n)]
    rollout = DeepAnalyzeRollout(rows, config, generator=scripted(tok, plan))
    out = rollout([trl_prompt(r) for r in rows], fake_trainer(tok))
    records = [r for p in sorted(records_dir.glob("episodes-*.jsonl")) for r in read_records(p)]
    by_id = {r["episode_id"]: r for r in records}
    return out, [by_id[eid] for eid in out["episode_id"]]


@pytest.fixture
def env_config(workspace_root):
    return {"workspace_root": str(workspace_root), "executor": {"timeout_s": 5}}


def test_record_renders_to_the_rollouts_token_ids_and_masks(tiny_tokenizer, env_config, tmp_path):
    tok = tiny_tokenizer
    out, (record,) = rollout_with_records(tok, env_config, [CODE_TURN, SPECIAL_TURN, ANSWER_TURN], tmp_path)
    rendered = render_record(tok, record)
    assert rendered.prompt_ids == out["prompt_ids"][0]
    assert rendered.completion_ids == out["completion_ids"][0]
    assert rendered.completion_mask == out["env_mask"][0]


def test_unmasked_tokens_decode_to_the_policy_turns_and_nothing_else(tiny_tokenizer, env_config, tmp_path):
    tok = tiny_tokenizer
    _, (record,) = rollout_with_records(tok, env_config, [CODE_TURN, SPECIAL_TURN, ANSWER_TURN], tmp_path)
    rendered = render_record(tok, record)
    trained = [t for t in rendered.labels if t != IGNORE_INDEX]
    assert tok.decode(trained) == CODE_TURN + SPECIAL_TURN + ANSWER_TURN
    masked = [t for t, lab in zip(rendered.input_ids, rendered.labels, strict=True) if lab == IGNORE_INDEX]
    assert len(masked) == len(rendered.prompt_ids) + rendered.completion_mask.count(0)
    # the observation printed "<|end|>": it is text (several tokens); the only EOS id closes the episode
    assert rendered.input_ids.count(tok.eos_token_id) == 1 + rendered.prompt_ids.count(tok.eos_token_id)
    assert rendered.input_ids[-1] == tok.eos_token_id and rendered.labels[-1] == IGNORE_INDEX
    assert "<|end|> 42" in tok.decode(rendered.completion_ids)


def _record(status: str, reward: float, episode_id: str) -> dict:
    return {
        "episode_id": episode_id,
        "reward_status": status,
        "reward": reward,
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    }


def test_selection_keeps_usable_statuses_and_applies_the_filter():
    records = [
        _record("scored", 1.0, "a"),
        _record("scored", -1.0, "b"),
        _record("verifier_error", 0.0, "c"),
        _record("environment_error", 0.0, "d"),
        {**_record("scored", 1.0, "e"), "messages": [{"role": "user", "content": "q"}]},
    ]
    picked = select_records(records)
    assert [r["episode_id"] for r in picked.records] == ["a", "b", "c"]
    assert picked.dropped == {"status environment_error": 1, "without a policy turn": 1}
    kept = select_records(records, keep="reward_status != 'scored' or reward >= 0.5")
    assert [r["episode_id"] for r in kept.records] == ["a", "c"]
    only_scored = select_records(records, statuses=["scored"])
    assert [r["episode_id"] for r in only_scored.records] == ["a", "b"]


def test_environment_error_is_refused_as_sft_data():
    with pytest.raises(SFTDataError, match="environment_error"):
        select_records([], statuses=["scored", "environment_error"])


def test_sft_recipe_trains_on_policy_tokens_and_leaves_a_model_folder(
    tiny_tokenizer, env_config, workspace_root, tmp_path
):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = tiny_tokenizer
    _, records = rollout_with_records(tok, env_config, [CODE_TURN, ANSWER_TURN], tmp_path / "rec", n=3)
    bad = {**records[0], "episode_id": "broken", "reward_status": "environment_error"}
    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [*records, bad]))
    torch.manual_seed(0)
    # randomly initialised: SFT must bring its loss down on its own
    base = _tiny_model(tok, tmp_path / "base", hidden=32)
    out = tmp_path / "sft"
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "backend": "trl-sft",
                "output_dir": str(out),
                "max_steps": 6,
                "model": str(base),
                "data": [str(data)],
                "sft": {"keep": "reward >= 0.5"},
                "trl": {"learning_rate": 3e-3, "per_device_train_batch_size": 3, "seed": 0},
            }
        )
    )
    assert main(["train", str(recipe)]) == 0
    info = json.loads((out / "sft_data.json").read_text())
    assert info["records_selected"] == 3 and info["dropped"] == {"status environment_error": 1}
    expected_policy = 3 * len(tok.encode(CODE_TURN + ANSWER_TURN, add_special_tokens=False))
    assert info["policy_tokens"] == expected_policy
    losses = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    model = AutoModelForCausalLM.from_pretrained(out)  # the folder a GRPO recipe takes as `model`
    assert AutoTokenizer.from_pretrained(out).eos_token_id == tok.eos_token_id
    assert model.config.vocab_size == len(tok)
    assert (out / "loss_curve.png").stat().st_size > 1000


def test_sft_recipe_without_matching_records_is_a_one_line_error(tmp_path, capsys):
    data = tmp_path / "records.jsonl"
    data.write_text(json.dumps(_record("environment_error", 0.0, "x")) + "\n")
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {"backend": "trl-sft", "output_dir": str(tmp_path / "o"), "model": "m", "data": [str(data)]}
        )
    )
    assert main(["train", str(recipe)]) == 2
    assert "no record to train on" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["trl_sft_cpu.yaml", "trl_sft.yaml"])
def test_shipped_sft_recipes_are_valid(name):
    from deepanalyze_env.trainers.recipes import load_recipe
    from deepanalyze_env.trainers.trl.sft import _sft_config

    root = Path(__file__).resolve().parents[2]
    recipe = load_recipe(root / "recipes" / name, ["trl.bf16=false"])
    assert recipe.backend == "trl-sft"
    config, template_kwargs = _sft_config(recipe, root / "runs" / "unused", cuda=False)
    assert config.max_steps == recipe.max_steps and template_kwargs == {}


def test_the_cpu_sft_recipe_makes_one_pass_over_its_records():
    """No fixed step count: how many records (``learn``'s ``sft.references``) sets how long SFT trains."""
    from deepanalyze_env.trainers.recipes import load_recipe
    from deepanalyze_env.trainers.trl.sft import _sft_config

    root = Path(__file__).resolve().parents[2]
    recipe = load_recipe(root / "recipes" / "trl_sft_cpu.yaml")
    config, _ = _sft_config(recipe, root / "runs" / "unused", cuda=False)
    assert config.max_steps == -1 and config.num_train_epochs == 1


def test_local_eval_policy_sees_the_tokens_training_built(tiny_tokenizer, env_config, tmp_path):
    """``eval --model`` (the transformers policy, continue layout) must feed the model the same
    ids as the TRL rollout and SFT: the prompt, then each turn and observation tokenised alone."""
    pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    from deepanalyze_env.offline.policies import TransformersPolicy, TurnContext

    tok = tiny_tokenizer
    _, (record,) = rollout_with_records(
        tok, env_config, [CODE_TURN, SPECIAL_TURN, ANSWER_TURN], tmp_path / "r"
    )
    folder = tmp_path / "model"
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    policy = TransformersPolicy(model=str(folder), device="cpu")
    rendered = render_record(tok, record)
    messages = record["messages"]
    prompt_len = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    before_last_turn = messages[:-1]  # the context of the answer turn
    ctx = TurnContext("e", "t0", None, 2, before_last_turn, prompt_len)
    last_turn = len(tok.encode(ANSWER_TURN, add_special_tokens=False)) + 1  # + the closing EOS
    assert policy._prompt_ids(ctx) == rendered.input_ids[:-last_turn]


def test_unknown_sft_recipe_key_names_the_key(tmp_path):
    from deepanalyze_env.core.config import ConfigError
    from deepanalyze_env.trainers.recipes import load_recipe

    recipe = tmp_path / "sft.yaml"
    recipe.write_text(
        yaml.safe_dump({"backend": "trl-sft", "output_dir": "o", "model": "m", "data": ["r.jsonl"]})
    )
    with pytest.raises(ConfigError, match=r"unknown key sft\.kep"):
        load_recipe(recipe, ["sft.kep=format_ok"])


def test_protocol_tags_that_are_special_tokens_stay_single_ids(fresh_smollm2_tokenizer):
    """DeepAnalyze's tokenizer holds the tags as special tokens: the policy sampled one id per tag,
    so SFT must train on that id, not on ``<``, ``Code``, ``>`` pieces; other text (a printed
    ``<|im_end|>``) stays plain."""
    tok = fresh_smollm2_tokenizer
    tok.add_special_tokens({"additional_special_tokens": ["<Code>", "</Code>"]})
    code_open, code_close = tok.convert_tokens_to_ids(["<Code>", "</Code>"])
    turn = "<Analyze>look</Analyze>\n<Code>\nprint('<|im_end|>')\n</Code>"
    record = {
        "episode_id": "e1",
        "termination": "max_turns",
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": turn}],
    }
    rendered = render_record(tok, record)
    policy_ids = [i for i, m in zip(rendered.completion_ids, rendered.completion_mask, strict=True) if m == 1]
    assert policy_ids.count(code_open) == 1 and policy_ids.count(code_close) == 1
    assert tok.eos_token_id not in policy_ids  # the printed <|im_end|> is text
    assert tok.decode(policy_ids) == turn


def test_a_recovered_episode_trains_only_on_the_turns_after_its_prefix(tiny_tokenizer):
    """A row with a ``prefix`` replays earlier turns into the prompt: those are not the policy's."""
    tok = tiny_tokenizer
    record = {
        "episode_id": "rec",
        "turns": 1,
        "termination": "answer",
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": CODE_TURN},  # the prefix: replayed, not generated
            {"role": "user", "content": "\n<Execute>\nboom\n</Execute>\n"},
            {"role": "assistant", "content": ANSWER_TURN},
        ],
    }
    rendered = render_record(tok, record)
    trained = [t for t in rendered.labels if t != IGNORE_INDEX]
    assert tok.decode(trained) == ANSWER_TURN
    assert CODE_TURN not in tok.decode(rendered.completion_ids)


def _tiny_model(tok, folder: Path, hidden: int = 16) -> Path:
    """A one-layer Llama over ``tok``, randomly initialised, saved with its tokenizer."""

    tiny_llama(tok, hidden=hidden).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_sft_eval_and_rollout_render_prompts_with_the_same_template_kwargs(env_config, tmp_path):
    """``trl.chat_template_kwargs`` (Qwen3's enable_thinking) reach SFT, the eval policy and the
    GRPO rollout alike: one prompt, token for token, and not the prompt without them."""
    pytest.importorskip("torch")
    from deepanalyze_env.offline.policies import TransformersPolicy, TurnContext
    from tests.conftest import build_tiny_tokenizer

    tok = build_tiny_tokenizer()  # its own copy: the template below must not leak into other tests
    tok.chat_template += "{% if thinking is defined and not thinking %}<think>\n\n</think>\n{% endif %}"
    kwargs = {"thinking": False}
    config = {**env_config, "records_dir": str(tmp_path / "rec")}
    rows = [row("t0")]
    rollout = DeepAnalyzeRollout(rows, config, generator=scripted(tok, [ANSWER_TURN]))
    trainer = fake_trainer(tok)
    trainer.chat_template_kwargs = kwargs
    out = rollout([trl_prompt(r) for r in rows], trainer)
    (record,) = [r for p in (tmp_path / "rec").glob("episodes-*.jsonl") for r in read_records(p)]
    prompt = out["prompt_ids"][0]
    assert "<think>" in tok.decode(prompt)  # the kwargs took effect in the rollout
    assert render_record(tok, record, template_kwargs=kwargs).prompt_ids == prompt
    assert render_record(tok, record).prompt_ids != prompt
    policy = TransformersPolicy(
        model=str(_tiny_model(tok, tmp_path / "m")), device="cpu", chat_template_kwargs=kwargs
    )
    messages = record["messages"]
    prompt_len = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ctx = TurnContext("e", "t0", None, 0, messages[:prompt_len], prompt_len)
    assert policy._prompt_ids(ctx) == prompt


def test_sft_data_json_counts_what_trl_trains_after_its_truncation(tiny_tokenizer, env_config, tmp_path):
    """With ``trl.max_length`` TRL cuts every episode and drops one left without a policy token;
    ``sft_data.json`` reports those numbers, not the rendered ones."""
    pytest.importorskip("torch")
    tok = tiny_tokenizer
    _, records = rollout_with_records(tok, env_config, [CODE_TURN, ANSWER_TURN], tmp_path / "rec", n=3)
    first_user = next(i for i, m in enumerate(records[2]["messages"]) if m["role"] == "user")
    records[2]["messages"][first_user]["content"] = "Which store? " * 60  # a prompt longer than max_length
    prompt = records[0]["messages"][
        : next(i for i, m in enumerate(records[0]["messages"]) if m["role"] == "assistant")
    ]
    text = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    prompt_len = len(tok(text, add_special_tokens=False)["input_ids"])
    keep = 5  # policy tokens left per episode: the first 5 of CODE_TURN
    assert keep < len(tok.encode(CODE_TURN, add_special_tokens=False))
    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "sft"
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "backend": "trl-sft",
                "output_dir": str(out),
                "max_steps": 1,
                "model": str(_tiny_model(tok, tmp_path / "base")),
                "data": [str(data)],
                "trl": {"max_length": prompt_len + keep, "per_device_train_batch_size": 2},
            }
        )
    )
    assert main(["train", str(recipe)]) == 0
    info = json.loads((out / "sft_data.json").read_text())
    per_episode = len(tok.encode(CODE_TURN + ANSWER_TURN, add_special_tokens=False))
    assert info["rendered_policy_tokens"] == 3 * per_episode
    assert info["examples_trained"] == 2 and info["examples_dropped_by_trl"] == 1
    assert info["policy_tokens"] == 2 * keep
    assert info["masked_tokens"] == 2 * prompt_len
    assert info["policy_tokens_cut_by_trl"] == 3 * per_episode - 2 * keep
