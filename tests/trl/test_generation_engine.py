"""The KV-cache generation engine (generation/engine.py) on the real embedded SmolLM2.

Oracle for greedy turns: transformers' own ``generate`` on the whole re-read conversation, one
episode at a time, stopped by ``StopStringCriteria`` — the path the engine replaces. Oracle for
stop detection: the shortest prefix whose decoded text holds a stop tag, found by decoding every
prefix.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from deepanalyze_env.core import protocol
from deepanalyze_env.generation.engine import GenerationEngine, GenRequest, unsupported_options
from deepanalyze_env.generation.turn_end import completes_stop, split_turn, stop_candidates

torch = pytest.importorskip("torch")

SYSTEM = "Write your code inside <Code></Code> tags, like <Code>print(1)</Code>."
PROMPTS = [
    "What is the mean of column age in data.csv? Start with <Analyze>.",
    "Which column of fair.csv has the most missing values?",
    "Count the rows of wine.csv.",
]
# one episode starts inside a code block: greedy SmolLM2 closes it, so a turn ends on </Code>
OPENINGS = ["", "", "<Code>print(1)"]
OBSERVATIONS = [
    "\n<Execute>\n   age  income\n0   31   5000\n1   45   7000\n</Execute>\n",
    "\n<Execute>\n(178, 14)\n</Execute>\n",
]
TURNS = 3
CAP = 20


@pytest.fixture(scope="module")
def lm(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    return tok, model


def _prompt(tok, i: int) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPTS[i]}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return ids + tok.encode(OPENINGS[i], add_special_tokens=False)


def _reference_turn(tok, model, context: list[int], cap: int) -> list[int]:
    """Today's path: ``generate`` over the whole conversation, cut after the stop/EOS token."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([context]),
            attention_mask=torch.ones((1, len(context)), dtype=torch.long),
            max_new_tokens=cap,
            do_sample=False,
            stop_strings=list(protocol.STOP_TAGS),
            tokenizer=tok,
            pad_token_id=tok.pad_token_id,
            temperature=None,
            top_p=None,
            top_k=None,
        )
    return out[0, len(context) :].tolist()


def _obs(tok, turn: int) -> list[int]:
    return tok.encode(OBSERVATIONS[turn % len(OBSERVATIONS)], add_special_tokens=False)


@pytest.fixture(scope="module")
def reference(lm):
    """Per episode, per turn: (context, generated ids) from the re-read path."""
    tok, model = lm
    episodes = []
    for i in range(len(PROMPTS)):
        context, turns = _prompt(tok, i), []
        for t in range(TURNS):
            ids = _reference_turn(tok, model, context, CAP)
            turns.append((list(context), ids))
            context = context + ids + _obs(tok, t)
        episodes.append(turns)
    return episodes


def _run_engine(tok, model, batched: bool):
    engine = GenerationEngine(tok, eos_ids=[tok.eos_token_id])
    contexts = [_prompt(tok, i) for i in range(len(PROMPTS))]
    turns: list[list] = [[] for _ in PROMPTS]
    with torch.no_grad():
        for t in range(TURNS):
            if batched:
                outs = engine.generate(model, [GenRequest(c, CAP) for c in contexts])
            else:
                outs = [engine.generate(model, [GenRequest(c, CAP)])[0] for c in contexts]
            for i, out in enumerate(outs):
                turns[i].append((list(contexts[i]), out))
                contexts[i] = contexts[i] + out.ids + _obs(tok, t)
    return engine, turns


@pytest.fixture(scope="module")
def batched_run(lm):
    return _run_engine(*lm, batched=True)


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-at-a-time"])
def test_greedy_turns_match_generate_on_the_reread_conversation(lm, reference, batched_run, batched):
    tok, model = lm
    _engine, turns = batched_run if batched else _run_engine(tok, model, batched)
    for i, episode in enumerate(turns):
        for t, (context, out) in enumerate(episode):
            ref_context, ref_ids = reference[i][t]
            assert context == ref_context, (i, t)
            # generate pads a stopped row to its cap with pad ids; the engine ends at the stop token
            assert out.ids == ref_ids[: len(out.ids)], (i, t)
            assert all(x == tok.pad_token_id for x in ref_ids[len(out.ids) :]), (i, t)
    finishes = {out.finish for episode in turns for _, out in episode}
    assert "stop" in finishes  # the code-block episode ends a turn on </Code>
    stopped = next(out for episode in turns for _, out in episode if out.finish == "stop")
    assert tok.decode(stopped.ids).rstrip().endswith(protocol.CODE_CLOSE)


def test_a_later_turn_prefills_only_the_observation_and_the_last_sampled_token(lm, batched_run):
    tok, _ = lm
    engine, turns = batched_run
    firsts = [episode[0][0] for episode in turns]
    for i, episode in enumerate(turns):
        first_context, first = episode[0]
        # the first turn computes its prompt, less the longest prefix an earlier prompt of the
        # same call already computed (the system message here)
        common = max((_common(first_context, other) for other in firsts[:i]), default=0)
        assert common > 0 or i == 0
        assert (first.reused, first.shared, first.prefilled) == (0, common, len(first_context) - common)
        for t in range(1, TURNS):
            prev_context, prev = episode[t - 1]
            _, out = episode[t]
            # cached: everything fed before (the last sampled token of a turn is never fed)
            assert out.reused == len(prev_context) + len(prev.ids) - 1, (i, t)
            assert out.prefilled == len(_obs(tok, t - 1)) + 1, (i, t)
    assert engine.cached_episodes == len(PROMPTS)
    engine.clear()
    assert engine.cached_episodes == 0


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_a_shared_prompt_is_computed_once_per_round(lm):
    tok, model = lm
    engine = GenerationEngine(tok, eos_ids=[tok.eos_token_id])
    prompt = _prompt(tok, 0)
    with torch.no_grad():
        outs = engine.generate(model, [GenRequest(prompt, 8) for _ in range(3)])
    assert [o.prefilled for o in outs] == [len(prompt), 1, 1]
    assert [o.shared for o in outs] == [0, len(prompt) - 1, len(prompt) - 1]
    assert engine.stats.shared_tokens == 2 * (len(prompt) - 1)
    assert outs[0].ids == outs[1].ids == outs[2].ids  # greedy


def test_a_sampled_turn_depends_on_its_seed_not_on_its_batch(lm):
    tok, model = lm
    engine = GenerationEngine(tok, eos_ids=[tok.eos_token_id], temperature=1.0)
    a, b = _prompt(tok, 0), _prompt(tok, 1)
    with torch.no_grad():
        alone = engine.generate(model, [GenRequest(a, 12, seed=7)])[0]
        engine.clear()
        together = engine.generate(model, [GenRequest(b, 12, seed=3), GenRequest(a, 12, seed=7)])[1]
        engine.clear()
        other_seeds = [engine.generate(model, [GenRequest(a, 12, seed=s)])[0].ids for s in (8, 9, 10)]
    assert together.ids == alone.ids
    assert any(ids != alone.ids for ids in other_seeds)


def _first_stop_by_decoding(tok, ids: list[int]) -> int | None:
    for n in range(1, len(ids) + 1):
        if any(tag in tok.decode(ids[:n], skip_special_tokens=False) for tag in protocol.STOP_TAGS):
            return n
    return None


@pytest.mark.parametrize(
    "text",
    [
        "<Code>\n```python\nprint(1)\n```\n</Code>\nand more",
        "x = a > b\n</Code>>\n",
        "<Answer>\nAnswer: 4 > 3</Answer>",
        "compare a >= b and </Cod e> but no tag",
        "nested </Answer</Code>",
    ],
)
def test_the_candidate_rule_fires_exactly_where_decoding_every_prefix_finds_a_tag(smollm2_tokenizer, text):
    tok = smollm2_tokenizer
    table = stop_candidates(tok)
    ids = tok.encode(text, add_special_tokens=False)
    found = None
    for n in range(1, len(ids) + 1):
        if table[ids[n - 1]] and completes_stop(tok, ids[:n]):
            found = n
            break
    assert found == _first_stop_by_decoding(tok, ids)
    # the rollout's cut is the same rule: the engine and the rollout cannot disagree about a turn
    assert split_turn(tok, ids, set()) == ((found, "stop") if found else (len(ids), "length"))


def test_a_closing_tag_that_is_a_special_token_is_a_candidate_and_completes(fresh_smollm2_tokenizer):
    tok = fresh_smollm2_tokenizer
    tok.add_special_tokens({"additional_special_tokens": ["<Code>", "</Code>"]})
    close = tok.convert_tokens_to_ids("</Code>")
    assert stop_candidates(tok, [close])[close]
    ids = [*tok.encode("<Code>\nprint(1)\n", add_special_tokens=False), close]
    assert completes_stop(tok, ids) and not completes_stop(tok, ids[:-1])


def test_options_the_engine_does_not_implement_are_named():
    from transformers import GenerationConfig

    assert unsupported_options(GenerationConfig(do_sample=True, temperature=0.7, top_p=0.9)) == []
    bias = GenerationConfig(repetition_penalty=1.2, sequence_bias={(5,): 1.0})
    assert unsupported_options(bias) == ["repetition_penalty", "sequence_bias"]


def test_the_trl_backend_matches_the_reread_turns_and_drops_its_cache(lm, reference):
    """``CachedTurns`` (the TRL rollout's transformers backend) against the re-read ``generate``
    turns, compared as the rollout uses them: cut by ``split_turn`` (the re-read path pads a
    stopped row with the pad id, which is SmolLM2's EOS)."""
    from accelerate import Accelerator
    from transformers import GenerationConfig

    from deepanalyze_env.trainers.trl.turns import CachedTurns

    tok, model = lm
    trainer = SimpleNamespace(
        processing_class=tok,
        model_wrapped=model,
        accelerator=Accelerator(cpu=True),
        generation_config=GenerationConfig(
            do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
        ),
        generation_kwargs=None,
        args=SimpleNamespace(gradient_checkpointing_kwargs=None, ds3_gather_for_generation=True),
        eos_token_ids=[tok.eos_token_id],
    )
    eos = {tok.eos_token_id}
    backend = CachedTurns()
    for t in range(2):
        contexts = [reference[i][t][0] for i in range(len(PROMPTS))]
        cached = backend(trainer, contexts, [CAP] * len(contexts))
        for i, generated in enumerate(cached):
            ref = reference[i][t][1]
            assert split_turn(tok, generated.ids, eos) == split_turn(tok, ref, eos), (i, t)
            assert generated.ids[: split_turn(tok, ref, eos)[0]] == ref[: split_turn(tok, ref, eos)[0]]
    assert backend.engine is not None and backend.engine.cached_episodes == len(PROMPTS)
    assert backend.engine.stats.reused_tokens > 0
    backend.close()
    assert backend.engine.cached_episodes == 0
