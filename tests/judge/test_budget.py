"""The judge prompt's budget in tokens (issue 52): counted by the judge's tokenizer or an upper
bound, long environment outputs elided in the middle, and a prompt that still does not fit — or
that the server refuses for its context — scored as the policy's failure or excluded as the
task's, whichever emptying the policy's fields shows.

Episodes run through the real env and kernel against the scripted judge server on 127.0.0.1,
which plays a model with a context limit: it answers a prompt that does not fit with the real
HTTP 400 vLLM sends ("This model's maximum context length is …"). Expected sizes are worked out
by hand in each test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deepanalyze_env.core.env import DeepAnalyzeEnv
from rewards.judge import JudgeConfigError, JudgeSettings, get_judge_client
from rewards.judge.backends import context_refusal_of
from rewards.judge.budget import (
    FLOOR_TOKENS,
    TEMPLATE_MARGIN,
    UTF8_BYTES,
    counter_for,
    fit,
    prompt_budget,
    water_level,
)
from rewards.judge.fake_server import FakeJudgeServer
from rewards.judge.transcript import Part, Transcript
from tests.conftest import code, play
from tests.judge.conftest import QUESTION, qa_env

MARKER = re.compile(r"<<<([\d,]+) CHARACTERS OF THIS OUTPUT ELIDED [0-9a-f]{16}>>>")


def make_env(root: Path, judge: dict, *, question: str = QUESTION) -> DeepAnalyzeEnv:
    return qa_env(root, judge, question=question, timeout_s=10)


def analysis_prompts(server: FakeJudgeServer) -> list[str]:
    return [r["prompt"] for r in server.requests if "BEGIN TRAJECTORY" in r["prompt"]]


WRONG = "<Analyze>done</Analyze>\n<Answer>Answer: A</Answer>"


# ------------------------------------------------------------------ counting and the water level


def test_the_estimate_is_one_token_per_utf8_byte():
    assert UTF8_BYTES.count("abc") == 3
    assert UTF8_BYTES.count("1234567890") == 10
    assert UTF8_BYTES.count("数据") == 6  # three bytes each: no tokenizer spends more
    assert UTF8_BYTES.count("é") == 2


@pytest.mark.parametrize(
    ("costs", "cut", "level"),
    [
        ({0: 100, 1: 10}, 50, 50),  # only the longest is cut: 100 → 50
        ({0: 100, 1: 60}, 80, 40),  # both down to 40: 60 + 20 removed
        ({0: 100, 1: 60}, 81, 39),  # 61 + 21 = 82 ≥ 81 (one more than needed, never less)
        ({0: 30, 1: 30, 2: 30}, 90, 0),  # everything
        ({0: 30}, 1000, 0),  # more than everything: still 0
    ],
)
def test_the_water_level_cuts_the_longest_outputs_first_and_all_to_one_length(costs, cut, level):
    assert water_level(costs, cut) == level


def _transcript(*outputs: str, turn: str = "I looked at the data.") -> Transcript:
    parts = []
    for output in outputs:
        parts += [Part("analyst", turn), Part("environment", output)]
    return Transcript((*parts, Part("analyst", "Answer: B")))


def test_a_prompt_within_budget_is_rendered_whole():
    fields = {"question": QUESTION, "trajectory": _transcript("7" * 500)}
    fitted = fit("judge_analysis", fields, None, UTF8_BYTES, 100_000)
    assert fitted.fits and fitted.elided == 0 and "7" * 500 in fitted.prompt.text
    assert fitted.tokens == len(fitted.prompt.text.encode()) + TEMPLATE_MARGIN


def test_an_over_budget_prompt_elides_the_middle_of_the_longest_output_only():
    short, long_ = "short output " * 10, "H" * 1000 + "7" * 20_000 + "T" * 1000
    fields = {"question": QUESTION, "trajectory": _transcript(short, long_)}
    whole = fit("judge_analysis", fields, None, UTF8_BYTES, 10**6)
    budget = whole.tokens - 15_000
    fitted = fit("judge_analysis", fields, None, UTF8_BYTES, budget)
    assert fitted.fits and fitted.tokens <= budget
    text = fitted.prompt.text
    assert short.strip() in text  # the short output is untouched
    assert text.count("I looked at the data.") == 2  # analyst turns whole
    cut = [int(m.group(1).replace(",", "")) for m in MARKER.finditer(text)]
    assert len(cut) == 1 and cut[0] == fitted.elided and cut[0] >= 15_000
    assert "H" * 1000 in text and "T" * 1000 in text  # head and tail kept around the marker


def test_a_prompt_whose_analyst_text_alone_is_over_budget_does_not_fit():
    fields = {"question": QUESTION, "trajectory": _transcript("7" * 100, turn="blah " * 4000)}
    fitted = fit("judge_analysis", fields, None, UTF8_BYTES, 10_000)
    assert not fitted.fits  # 40,000 bytes of analyst text: never elided


def test_long_analyst_turns_cannot_starve_an_output_below_its_floor():
    """Analyst text is never elided, outputs are: without a floor, a long enough turn would cut
    the output that refutes it to nothing. Every output keeps its head and tail (FLOOR_TOKENS,
    here bytes), where a traceback's last line stands."""
    error = "Traceback (most recent call last):\n" + "  frame\n" * 600 + "ZeroDivisionError: division by zero"
    fields = {"question": QUESTION, "trajectory": _transcript(error, turn="claims " * 3000)}
    whole = fit("judge_analysis", fields, None, UTF8_BYTES, 10**6)
    # room for 300 bytes of the output: its marker line (63 bytes) and 237 of it, above the floor
    fitted = fit("judge_analysis", fields, None, UTF8_BYTES, whole.tokens - len(error) + 300)
    assert fitted.fits and "ZeroDivisionError: division by zero" in fitted.prompt.text
    assert len(error) - fitted.elided >= FLOOR_TOKENS  # one byte per character here
    # room for 250: the floor (200) and the marker do not fit, so the prompt does not
    assert not fit("judge_analysis", fields, None, UTF8_BYTES, whole.tokens - len(error) + 250).fits


# ------------------------------------------------------------------ a real tokenizer


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory) -> Path:
    """A real Hugging Face tokenizer folder, made here (nothing downloaded): one token per word."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("word-tokenizer")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", model_max_length=4096
    )
    fast.save_pretrained(folder)
    return folder


def test_a_named_tokenizer_counts_the_prompt(word_tokenizer: Path):
    settings = JudgeSettings.from_config(
        {
            "backend": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "model": "j",
            "tokenizer": str(word_tokenizer),
        }
    )
    counter = counter_for(settings)
    assert counter.count("blah blah 数据 12345") == 4
    # 2,000 words are 10,000 bytes but 2,000 tokens: within a 5,000-token budget whole
    fields = {"question": QUESTION, "trajectory": _transcript("word " * 2000)}
    fitted = fit("judge_analysis", fields, None, counter, 5000)
    assert fitted.fits and fitted.elided == 0
    assert fit("judge_analysis", fields, None, UTF8_BYTES, 5000).elided > 0  # the estimate elides


def test_a_tokenizer_stating_a_context_lowers_the_budget_to_it_less_the_reply(word_tokenizer: Path):
    """A local judge has no server to refuse a longer prompt: the tokenizer's model_max_length
    (4,096 here) less max_tokens (1,024) caps judge.max_prompt_tokens (30,000)."""
    local = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "j", "max_tokens": 1024}
    settings = JudgeSettings.from_config({**local, "tokenizer": str(word_tokenizer)})
    assert prompt_budget(settings, counter_for(settings)) == 4096 - 1024
    bare = JudgeSettings.from_config(local)
    assert prompt_budget(bare, counter_for(bare)) == 30_000  # the estimate states no context


def test_a_tokenizer_that_cannot_load_locally_fails_when_the_client_is_built(tmp_path: Path):
    with pytest.raises(JudgeConfigError, match="nothing is downloaded"):
        get_judge_client(
            {
                "backend": "openai",
                "base_url": "http://127.0.0.1:9/v1",
                "model": "j",
                "tokenizer": str(tmp_path / "no-such-tokenizer"),
            }
        )


def test_max_prompt_chars_is_refused_with_what_replaced_it():
    with pytest.raises(JudgeConfigError, match="replaced by max_prompt_tokens"):
        JudgeSettings.from_config(
            {"backend": "openai", "base_url": "http://x/v1", "model": "j", "max_prompt_chars": 9}
        )


# ------------------------------------------------------------------ what servers send


@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        (
            400,
            "This model's maximum context length is 32768 tokens. However, you requested 40000 tokens "
            "(38976 in the messages, 1024 in the completion). Please reduce the length of the messages "
            "or completion.",
            (32768, 38976),
        ),
        (
            400,
            "This model's maximum context length is 4097 tokens. However, your messages resulted in "
            "13,393 tokens. Please reduce the length of the messages.",
            (4097, 13393),
        ),
        (
            400,
            "The input (40000 tokens) is longer than the model's context length (32768 tokens).",
            (32768, 40000),
        ),
        (400, "context_length_exceeded", (None, None)),
        (400, "max_tokens must be at least 1, got -186.", None),  # not a context refusal
        (500, "This model's maximum context length is 4097 tokens.", None),  # a server fault
    ],
)
def test_context_refusals_are_recognised_with_the_figures_they_state(status, message, expected):
    assert context_refusal_of(status, message) == expected


# ------------------------------------------------------------------ through the env


@pytest.mark.parametrize(("char", "cells"), [("7", 3), ("数", 6)], ids=["digits", "cjk"])
def test_a_flood_of_dense_output_is_elided_and_the_episode_scored(workspace_root, char, cells):
    """Cells print 19,000 digits (three cells: 57,000 characters) or CJK characters (six cells, each
    kept by the executor's 20,000-byte output cap as about 6,700 characters: 40,000) — under the
    old 64,000-character cap — to a judge with a 32k-token context that spends one token per
    character. Before, the server refused the prompt and the episode was excluded
    (verifier_error). Now the outputs are elided to the budget and the episode is scored."""
    with FakeJudgeServer(context_tokens=32_768) as server:
        env = make_env(workspace_root, {"base_url": server.url})
        flood = code(f"print('{char}' * 19000)")
        out = play(env, *[flood] * cells, WRONG)
        prompts = analysis_prompts(server)
        refused = server.refused
    meta = out["metadata"]
    assert meta["reward_status"] == "scored", meta.get("error")
    assert len(prompts) == 1 and refused == 0
    assert len(MARKER.findall(prompts[0])) == cells  # each flood cut in its middle
    assert len(prompts[0].encode()) + TEMPLATE_MARGIN <= 30_000  # the default budget, counted in bytes
    assert meta["reward_components"]["qa_accuracy"] == 0.0  # the wrong answer still scores as one
    call = next(c for c in meta["judge"]["calls"] if c["rubric"] == "judge_analysis")
    assert call["elided_chars"] > 0 and call["prompt_tokens"] <= 30_000


def test_a_judge_with_a_smaller_context_than_the_budget_gets_the_prompt_refitted(workspace_root):
    """The server's context (8,000) is below judge.max_prompt_tokens (30,000): its HTTP 400 states
    the limit, the prompt is fitted to it and asked once more — an honest episode that printed a
    lot is scored, not excluded and not zeroed."""
    with FakeJudgeServer(context_tokens=8000) as server:
        env = make_env(workspace_root, {"base_url": server.url})
        big = code("print('x' * 9000)")
        out = play(env, big, big, "<Analyze>done</Analyze>\n<Answer>Answer: B</Answer>")
        prompts = analysis_prompts(server)
    meta = out["metadata"]
    assert meta["reward_status"] == "scored", meta.get("error")
    assert meta["reward_components"]["qa_analysis"] == pytest.approx(4 / 5)  # the default reply's SCORE: 4
    assert len(prompts) == 2 and len(prompts[0]) > 18_000 and len(prompts[1]) + 12 + 1024 <= 8000
    call = next(c for c in meta["judge"]["calls"] if c["rubric"] == "judge_analysis")
    assert call["attempts"] == 2 and call["elided_chars"] > 0


def test_a_refusal_caused_by_the_episodes_own_turns_scores_0_with_a_note(workspace_root):
    with FakeJudgeServer(context_tokens=8000) as server:
        env = make_env(workspace_root, {"base_url": server.url})
        ramble = "<Analyze>" + "blah " * 2400 + "</Analyze>\n<Answer>Answer: B</Answer>"  # 12,000 characters
        out = play(env, code("print(1)"), ramble)
    meta = out["metadata"]
    assert meta["reward_status"] == "scored", meta.get("error")
    assert meta["reward_components"]["qa_analysis"] == 0.0
    note = meta["reward_notes"]["judge_analysis"]
    assert "the episode's own text made it so" in note and "maximum context length is 8000" in note


def test_a_refusal_caused_by_the_task_alone_stays_a_verifier_error(workspace_root):
    question = "Which store? " + "Context: " + "the table lists stores and revenue. " * 300  # ~10,800
    with FakeJudgeServer(context_tokens=8000) as server:
        env = make_env(workspace_root, {"base_url": server.url}, question=question)
        out = play(env, code("print(1)"), "<Analyze>a</Analyze>\n<Answer>Answer: B</Answer>")
    meta = out["metadata"]
    assert meta["reward_status"] == "verifier_error"
    assert "JudgePromptTooLong" in meta["error"] and "the task's fields made it so" in meta["error"]
