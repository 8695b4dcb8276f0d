"""Turns end at the closing tags, and the tokens SkyRL trains on are the tokens it sampled.

Through SkyRL's own ``SkyRLGymGenerator`` with ``VllmLikeEngine`` (vLLM's stopping rules; vLLM
itself needs a GPU): a tag completed by a token that carries a newline, tags that are special
tokens, and stop lists that lack a tag.
"""

from __future__ import annotations

import json

import pytest

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.trainers.skyrl.config import apply_tag_tokens, parse_config
from deepanalyze_env.trainers.skyrl.entrypoint import main
from tests.conftest import build_tiny_tokenizer, qa_extras
from tests.skyrl.conftest import make_cfg, run_vllm_episode, vllm_params, with_special_tags

# what a model would write if nothing stopped it: each turn runs on past its closing tag
CODE = "<Analyze>sum it</Analyze>\n<Code>\n```python\nprint(10 + 32)\n```\n</Code>\n<Execute>\nmade up\n"
ANSWER = "<Analyze>done</Analyze>\n<Answer>\nAnswer: B\n</Answer>\nand more text"


def run_episode(cfg, tok, workspace_root, plan):
    return run_vllm_episode(cfg, tok, plan)


def policy_ids(out) -> list[int]:
    """The response ids SkyRL trains on (loss mask 1), without the end-of-message id it appends."""
    ids = [t for t, m in zip(out.response_ids, out.loss_mask, strict=True) if m == 1]
    return ids[:-1]


def records(path):
    return [json.loads(x) for f in path.glob("*.jsonl") for x in f.read_text().splitlines()]


# --- defect 1: a tag completed by ">\n" -----------------------------------------------------------


def test_a_tag_completed_by_a_newline_token_keeps_the_sampled_tokens(
    qwen_like_tokenizer, workspace_root, tmp_path
):
    tok = qwen_like_tokenizer
    # the premise: this tokenizer completes the tag with a token that also holds the newline
    assert tok.decode(tok.encode("</Code>\n", add_special_tokens=False)[-1:]) == ">\n"
    cfg = make_cfg(f"environment.skyrl_gym.deepanalyze.records_dir={tmp_path}", workspace_root=workspace_root)
    out, engine = run_episode(cfg, tok, workspace_root, [CODE, ANSWER])
    assert engine.stop_reasons == ["stop", "stop"]
    assert tok.decode(engine.sampled[0]).endswith("</Code>\n")  # vLLM stopped inside ">\n"
    # trained ids are exactly the sampled ids, one logprob each
    assert policy_ids(out) == engine.sampled[0] + engine.sampled[1]
    assert len(out.rollout_logprobs) == len(out.response_ids)
    # the env executed and recorded the text cut at the tags
    assert out.env_metrics["exec_ok"] == 1.0 and out.env_metrics["status_scored"] == 1.0
    turns = [m["content"] for m in records(tmp_path)[0]["messages"] if m["role"] == "assistant"]
    assert turns[0].endswith("</Code>") and turns[1].endswith("</Answer>")


def test_text_past_the_tag_that_is_not_whitespace_is_still_cut_and_retokenized(workspace_root):
    """The exception stays an exception: what the env did not keep is not trained on."""
    from deepanalyze_env.core.env import DeepAnalyzeEnv

    env = DeepAnalyzeEnv({"workspace_root": str(workspace_root)}, qa_extras())
    env.init([{"role": "user", "content": "Which store?"}])
    try:
        out = env.step("<Analyze>a</Analyze>\n<Code>\nprint(1)\n</Code>oops")
        assert out["postprocessed_action"] == "<Analyze>a</Analyze>\n<Code>\nprint(1)\n</Code>"
        out = env.step("<Analyze>b</Analyze>\n<Code>\nprint(2)\n</Code>\n\n")
        assert out["postprocessed_action"] is None
    finally:
        env.close(record=False)


# --- defect 2: tags that are special tokens ---------------------------------------------------


@pytest.fixture
def special_tag_model(tmp_path):
    """A local model folder whose tokenizer holds the tags as added special tokens."""
    tok = with_special_tags(build_tiny_tokenizer())
    folder = tmp_path / "model"
    tok.save_pretrained(folder)
    return folder, tok


def test_special_closing_tags_become_stop_token_ids(special_tag_model, capsys, judge_free_data):
    folder, tok = special_tag_model
    code_id, answer_id = tok.convert_tokens_to_ids(["</Code>", "</Answer>"])
    assert main(["--check", f"trainer.policy.model.path={folder}", *judge_free_data]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["stop_token_ids"] == [code_id, answer_id]
    cfg = parse_config([f"trainer.policy.model.path={folder}"])
    apply_tag_tokens(cfg, tok)
    apply_tag_tokens(cfg, tok)  # idempotent: the Ray task applies it again
    for params in (cfg.generator.sampling_params, cfg.generator.eval_sampling_params):
        sent = vllm_params(params)  # what reaches vLLM
        assert sent["stop_token_ids"] == [code_id, answer_id]


def test_with_special_tags_turns_stop_at_the_tag_and_the_env_reads_it(
    special_tag_model, workspace_root, tmp_path
):
    _, tok = special_tag_model
    cfg = make_cfg(
        f"environment.skyrl_gym.deepanalyze.records_dir={tmp_path / 'records'}",
        "generator.sampling_params.max_generate_length=60",
        workspace_root=workspace_root,
    )
    apply_tag_tokens(cfg, tok)
    out, engine = run_episode(cfg, tok, workspace_root, [CODE + "x" * 400, ANSWER + "y" * 400])
    code_id, answer_id = tok.convert_tokens_to_ids(["</Code>", "</Answer>"])
    assert engine.stop_reasons == ["stop", "stop"]
    assert [ids[-1] for ids in engine.sampled] == [code_id, answer_id]
    assert out.stop_reason == "stop"
    assert out.env_metrics["exec_ok"] == 1.0  # the code ran: the env saw <Code>…</Code>
    assert out.env_metrics["format_ok"] == 1.0 and out.env_metrics["reward"] == 1.0  # "B" is right
    assert policy_ids(out) == engine.sampled[0] + engine.sampled[1]


def test_a_tag_split_into_special_and_ordinary_pieces_is_refused(tmp_path, capsys, judge_free_data):
    tok = with_special_tags(build_tiny_tokenizer(), ["</Co"])  # "</Code>" -> "</Co" + "de" + ">"
    tok.save_pretrained(tmp_path / "model")
    argv = ["--check", f"trainer.policy.model.path={tmp_path / 'model'}", *judge_free_data]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "</Code>" in err and "special" in err


# --- defect 5: stop lists without a closing tag -------------------------------------------------


@pytest.mark.parametrize(
    "override, missing",
    [
        ("generator.sampling_params.stop=['</Code>']", "</Answer>"),
        ("generator.eval_sampling_params.stop=['</Answer>','</s>']", "</Code>"),
        ("generator.sampling_params.stop=null", "</Code> and </Answer>"),
    ],
)
def test_a_stop_list_without_a_closing_tag_is_refused(override, missing):
    with pytest.raises(ConfigError, match=f"lacks {missing}"):
        parse_config([override])


def test_extra_stop_strings_are_allowed():
    cfg = parse_config(["generator.sampling_params.stop=['</Code>','</Answer>','<|im_end|>']"])
    assert cfg.generator.sampling_params.stop[-1] == "<|im_end|>"
