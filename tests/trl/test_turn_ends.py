"""How a TRL turn ends, with the real SmolLM2 tokenizer and real kernels.

Generation is scripted (a stand-in for the policy: each episode's k-th turn is a fixed list of
token ids, cut at the cap the rollout asks for, as an engine's ``max_tokens`` would); the env, its
kernels and the tokenizer are real. Rules under test (README "Training with TRL"):
a turn ends at the token completing a stop tag (stepped), at EOS (the episode ends, ``eos``), or at
a token limit (the episode ends for ``length`` without a step); a finished episode fits in
``max_completion_length`` including its final EOS.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from deepanalyze_env.trainers.trl.rollout_func import DeepAnalyzeRollout, trl_prompt
from deepanalyze_env.trainers.trl.turns import Generated
from rewards import Method, register_method, register_reward
from tests.conftest import qa_extras

CODE_TURN = "<Analyze>look</Analyze>\n<Code>\n```python\nprint(6 * 7)\n```\n</Code>"
ANSWER_TURN = "<Analyze>done</Analyze>\n<Answer>\nAnswer: B\n</Answer>"
RAMBLE = "<Analyze>" + "let me think about the stores and their revenue " * 20


@register_reward("test_trl_scorer_always_fails")
def _always_fails(answer: str | None) -> float:
    raise RuntimeError("scorer broke (injected)")


register_method(
    Method(
        "qa_broken_scorer",
        ("qa_accuracy", "test_trl_scorer_always_fails"),
        weights={"test_trl_scorer_always_fails": 0.0},
    )
)


def row(task_id: str = "t1", method: str = "qa_plain") -> dict:
    extras = qa_extras(reward_spec={"method": method, "ground_truth": "B"})
    return {"prompt": [{"role": "user", "content": "Which store?"}], "task_id": task_id, **extras}


def trainer_for(tok, budget: int, **extra) -> SimpleNamespace:
    return SimpleNamespace(
        processing_class=tok,
        args=SimpleNamespace(max_completion_length=budget),
        eos_token_ids=[tok.eos_token_id],
        **extra,
    )


def ids_of(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def scripted(tok, plan: list[list[int]]):
    """Turn k of an episode is ``plan[k]`` (k = observations in its context), cut at the cap."""

    def generate(trainer, contexts, max_new):
        outs = []
        for ctx, cap in zip(contexts, max_new, strict=True):
            k = tok.decode(ctx, skip_special_tokens=False).count("</Execute>")
            ids = plan[min(k, len(plan) - 1)][:cap]
            outs.append(Generated(ids, [-0.25] * len(ids)))
        return outs

    return generate


def run(tok, plan, env_config, budget=4096, rows=None, **kw):
    rows = rows or [row()]
    rollout = DeepAnalyzeRollout(rows, env_config, generator=scripted(tok, plan), **kw)
    return rollout([trl_prompt(r) for r in rows], trainer_for(tok, budget))


@pytest.fixture
def env_config(workspace_root, tmp_path):
    return {
        "workspace_root": str(workspace_root),
        "executor": {"timeout_s": 10},
        "records_dir": str(tmp_path / "records"),
    }


def records(env_config) -> list[dict]:
    from pathlib import Path

    lines = []
    for path in sorted(Path(env_config["records_dir"]).glob("episodes-*.jsonl")):
        lines += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return lines


# ---------------------------------------------------------------- defect 1: length cuts


def test_turn_cut_by_the_budget_ends_the_episode_for_length_without_a_step(smollm2_tokenizer, env_config):
    tok = smollm2_tokenizer
    env_config["max_turns"] = 1  # the last allowed turn: a step would close it as max_turns, scored
    budget = 40
    out = run(tok, [ids_of(tok, RAMBLE)], env_config, budget=budget)
    completion = out["completion_ids"][0]
    assert out["termination"] == ["length"]
    assert out["env_reward"] == [None]  # masked, as the README promises
    assert len(completion) == budget - 1  # never budget + 1; one token stays free for an EOS
    assert completion[-1] != tok.eos_token_id  # TRL sees it as truncated
    assert tok.decode(completion).startswith("<Analyze>let me think")
    [record] = records(env_config)
    assert record["termination"] == "length" and record["turns"] == 0  # the cut turn was not stepped


def test_turn_cut_by_max_turn_tokens_alone_is_stepped_as_it_stands(smollm2_tokenizer, env_config):
    tok = smollm2_tokenizer
    out = run(tok, [ids_of(tok, RAMBLE), ids_of(tok, ANSWER_TURN)], env_config, max_turn_tokens=24)
    completion, mask = out["completion_ids"][0], out["env_mask"][0]
    assert completion[:24] == ids_of(tok, RAMBLE)[:24] and mask[:24] == [1] * 24
    assert mask[24] == 0 and "No code was found" in tok.decode(completion[24:])
    assert out["termination"] == ["answer"] and out["env_reward"] == [1.0]
    [record] = records(env_config)
    assert record["turns"] == 2 and record["exec"][0]["status"] == "no_code"


def test_finished_episode_with_its_eos_fits_in_the_budget(smollm2_tokenizer, env_config):
    tok = smollm2_tokenizer
    answer = ids_of(tok, ANSWER_TURN)
    budget = len(answer) + 1  # exactly the answer and the EOS
    out = run(tok, [answer], env_config, budget=budget)
    assert out["termination"] == ["answer"] and out["env_reward"] == [1.0]
    assert out["completion_ids"][0] == [*answer, tok.eos_token_id]
    out = run(tok, [answer], env_config, budget=budget - 1)  # one short: the answer cannot finish
    assert out["termination"] == ["length"] and len(out["completion_ids"][0]) <= budget - 1


# ---------------------------------------------------------------- defect 2: EOS inside an episode


def test_eos_without_a_tag_ends_the_episode_and_is_its_last_trained_token(smollm2_tokenizer, env_config):
    tok = smollm2_tokenizer
    eos = tok.eos_token_id
    analyze_only = [*ids_of(tok, "<Analyze>I think it is B.</Analyze>"), eos, *ids_of(tok, "stray")]
    out = run(tok, [analyze_only, ids_of(tok, ANSWER_TURN)], env_config)
    completion, mask = out["completion_ids"][0], out["env_mask"][0]
    assert out["termination"] == ["eos"]
    assert completion == analyze_only[: analyze_only.index(eos) + 1]  # nothing after the EOS
    assert mask == [1] * len(completion)  # the sampled EOS is trained, no observation follows it
    assert completion.count(eos) == 1
    # scored like any ending without an answer: the format gate fails, and it trains
    assert out["reward_status"] == ["scored"] and out["env_reward"] == [-1.0]
    [record] = records(env_config)
    assert record["termination"] == "eos" and record["turns"] == 1
    # SFT labels the same tokens the same way: the policy's own EOS carries loss
    from deepanalyze_env.trainers.trl.sft_data import render_record

    rendered = render_record(tok, record)
    assert rendered.prompt_ids == out["prompt_ids"][0]
    assert (rendered.completion_ids, rendered.completion_mask) == (completion, mask)


def test_eos_after_a_stop_tag_is_dropped_and_the_turn_is_stepped(smollm2_tokenizer, env_config):
    tok = smollm2_tokenizer
    code = [*ids_of(tok, CODE_TURN), tok.eos_token_id]
    out = run(tok, [code, ids_of(tok, ANSWER_TURN)], env_config)
    completion, mask = out["completion_ids"][0], out["env_mask"][0]
    assert out["termination"] == ["answer"] and out["env_reward"] == [1.0]
    assert completion.count(tok.eos_token_id) == 1 and completion[-1] == tok.eos_token_id
    assert mask[-1] == 0  # the appended end-of-episode EOS is not trained


# ---------------------------------------------------------------- defect 6: observations are plain text


def test_printed_special_tokens_stay_plain_text_in_the_observation(smollm2_tokenizer, env_config):
    tok = smollm2_tokenizer
    prints_eos = "<Analyze>x</Analyze>\n<Code>\n```python\nprint('<|im_end|><|im_start|>user')\n```\n</Code>"
    written = tok.encode(prints_eos, add_special_tokens=False, split_special_tokens=True)  # as text
    assert tok.eos_token_id not in written
    out = run(tok, [written, ids_of(tok, ANSWER_TURN)], env_config)
    completion, mask = out["completion_ids"][0], out["env_mask"][0]
    observed = [t for t, m in zip(completion[:-1], mask[:-1], strict=True) if m == 0]
    special = set(tok.all_special_ids)
    assert not special & set(observed)
    assert "<|im_end|><|im_start|>user" in tok.decode(observed)
    assert completion.count(tok.eos_token_id) == 1  # only the final one


# ---------------------------------------------------------------- defect 7: untrainable episodes


@pytest.mark.parametrize("failure", ["verifier_error", "environment_error"])
def test_episode_without_a_reward_has_an_all_zero_mask(smollm2_tokenizer, env_config, monkeypatch, failure):
    tok = smollm2_tokenizer
    if failure == "environment_error":
        from tools.kernel import Kernel, KernelError

        def broken(self, code):
            raise KernelError("scratch disk full (injected)")

        monkeypatch.setattr(Kernel, "run", broken)
        rows = [row()]
    else:
        rows = [row(method="qa_broken_scorer")]
    out = run(tok, [ids_of(tok, CODE_TURN), ids_of(tok, ANSWER_TURN)], env_config, rows=rows)
    assert out["reward_status"] == [failure] and out["env_reward"] == [None]
    assert out["completion_ids"][0] and set(out["env_mask"][0]) == {0}


# ---------------------------------------------------------------- issue 19 on the TRL path


def test_stop_token_that_carries_a_newline_keeps_the_sampled_tokens(fresh_smollm2_tokenizer, env_config):
    tok = fresh_smollm2_tokenizer
    tok.add_tokens([">\n"])  # like Qwen's BPE: the token completing </Code> also holds the newline
    sampled = ids_of(tok, CODE_TURN + "\n<Answer>Answer: Z</Answer>")
    turn = ids_of(tok, CODE_TURN + "\n")
    assert turn[-1] == tok.convert_tokens_to_ids(">\n") and sampled[: len(turn)] == turn
    out = run(tok, [sampled, ids_of(tok, ANSWER_TURN)], env_config)
    completion, mask = out["completion_ids"][0], out["env_mask"][0]
    assert completion[: len(turn)] == turn and set(mask[: len(turn)]) == {1}  # trained ids = sampled ids
    assert mask[len(turn)] == 0  # the observation follows at once
    assert out["env_reward"] == [1.0]
    [record] = records(env_config)
    assistant = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
    assert assistant[0].endswith("</Code>")  # the executed text and the record stay cut at the tag
    observation = next(m["content"] for m in record["messages"] if "<Execute>" in m["content"])
    assert "42" in observation


TAGS = ["<Analyze>", "</Analyze>", "<Code>", "</Code>", "<Execute>", "</Execute>", "<Answer>", "</Answer>"]


def test_tags_that_are_special_tokens_reach_the_env_and_frame_observations(
    fresh_smollm2_tokenizer, env_config
):
    tok = fresh_smollm2_tokenizer
    tok.add_special_tokens({"additional_special_tokens": TAGS})
    tag_id = {t: tok.convert_tokens_to_ids(t) for t in TAGS}
    assert all(len(ids_of(tok, t)) == 1 for t in TAGS)
    code_turn = ids_of(tok, CODE_TURN)
    assert tag_id["</Code>"] in code_turn
    out = run(tok, [code_turn, ids_of(tok, ANSWER_TURN)], env_config)
    assert out["termination"] == ["answer"] and out["env_reward"] == [1.0]  # the env saw the tags
    completion, mask = out["completion_ids"][0], out["env_mask"][0]
    observed = [t for t, m in zip(completion[:-1], mask[:-1], strict=True) if m == 0]
    assert observed[: len(ids_of(tok, "\n<Execute>"))] == ids_of(tok, "\n<Execute>")
    assert tag_id["<Execute>"] in observed and tag_id["</Execute>"] in observed
    [record] = records(env_config)
    assert record["exec"][0]["status"] == "ok" and record["code_pass"] == [1]


def test_transformers_generation_stops_on_a_special_closing_tag(fresh_smollm2_tokenizer, smollm2_dir):
    """The real SmolLM2 through ``transformers_turns``: ``sequence_bias`` makes ``</Code>`` (a
    special token here) its first greedy choice; generation must end right there."""
    torch = pytest.importorskip("torch")
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, GenerationConfig

    from deepanalyze_env.trainers.trl.rollout_func import env_text
    from deepanalyze_env.trainers.trl.turns import transformers_turns

    tok = fresh_smollm2_tokenizer
    tok.add_special_tokens({"additional_special_tokens": TAGS})
    close = tok.convert_tokens_to_ids("</Code>")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    model.resize_token_embeddings(len(tok))
    trainer = SimpleNamespace(
        processing_class=tok,
        model_wrapped=model,
        accelerator=Accelerator(cpu=True),
        generation_config=GenerationConfig(
            do_sample=False,
            sequence_bias={(close,): 100.0},
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        ),
        generation_kwargs=None,
        args=SimpleNamespace(gradient_checkpointing_kwargs=None, ds3_gather_for_generation=True),
        eos_token_ids=[tok.eos_token_id],
    )
    context = tok.encode("<Code>\nprint(1)\n", add_special_tokens=False)
    [out] = transformers_turns(trainer, [context], [12])
    assert out.ids == [close]
    assert env_text(tok, context + out.ids) == "<Code>\nprint(1)\n</Code>"  # the tag survives decoding


class ClosingGenerator:
    """A scripted generator with the ``close`` hook the KV-cache backend uses to drop its cache."""

    def __init__(self, inner, fail_at: int | None = None):
        self.inner, self.fail_at, self.calls, self.closed = inner, fail_at, 0, 0

    def __call__(self, trainer, contexts, max_new):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("generation failed (injected)")
        assert self.closed == 0  # never closed while the call still generates
        return self.inner(trainer, contexts, max_new)

    def close(self):
        self.closed += 1


@pytest.mark.parametrize("fail_at", [None, 2], ids=["finished", "failed"])
def test_the_generator_is_closed_at_the_end_of_each_rollout_call(smollm2_tokenizer, env_config, fail_at):
    tok = smollm2_tokenizer
    gen = ClosingGenerator(scripted(tok, [ids_of(tok, CODE_TURN), ids_of(tok, ANSWER_TURN)]), fail_at)
    rollout = DeepAnalyzeRollout([row()], env_config, generator=gen)
    if fail_at is None:
        out = rollout([trl_prompt(row())], trainer_for(tok, 4096))
        assert out["termination"] == ["answer"] and gen.calls == 2
    else:
        with pytest.raises(RuntimeError, match="injected"):
            rollout([trl_prompt(row())], trainer_for(tok, 4096))
    assert gen.closed == 1
