"""The one set of tag-token rules (``generation/tag_tokens.py``) that SkyRL, the TRL rollout and SFT read.

On the real SmolLM2 tokenizer: once as shipped (tags are ordinary text), once with the tags added
as special tokens, once as added ordinary tokens, and once with a tag split across a special and
an ordinary piece.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from deepanalyze_env.core.errors import ConfigError
from deepanalyze_env.generation.tag_tokens import tag_stop_ids, token_rules


def test_tags_that_are_ordinary_text_need_no_stop_ids(fresh_smollm2_tokenizer):
    tok = fresh_smollm2_tokenizer
    assert len(tok.encode("</Code>", add_special_tokens=False)) > 1  # the premise: several pieces
    rules = token_rules(tok)
    assert rules.stop_ids == () and rules.special_tags == frozenset()
    assert tok.eos_token_id in rules.drop_ids
    assert tag_stop_ids(tok) == {}


def test_tags_that_are_special_tokens_become_stop_ids_in_tag_order(fresh_smollm2_tokenizer):
    tok = fresh_smollm2_tokenizer
    tok.add_special_tokens({"additional_special_tokens": ["</Answer>", "<Execute>", "</Code>"]})
    code, answer = tok.convert_tokens_to_ids(["</Code>", "</Answer>"])
    rules = token_rules(tok)
    assert rules.stop_ids == (code, answer)  # protocol order, not the order they were added
    assert rules.special_tags == {"</Answer>", "<Execute>", "</Code>"}
    assert code not in rules.drop_ids and answer not in rules.drop_ids  # the env must read them
    assert tag_stop_ids(tok) == {"</Code>": code, "</Answer>": answer}


def test_tags_added_as_ordinary_tokens_are_stop_ids_but_not_special(fresh_smollm2_tokenizer):
    tok = fresh_smollm2_tokenizer
    tok.add_tokens(["</Code>", "</Answer>"])
    code, answer = tok.convert_tokens_to_ids(["</Code>", "</Answer>"])
    rules = token_rules(tok)
    assert rules.stop_ids == (code, answer) and rules.special_tags == frozenset()


def test_a_stop_tag_split_across_special_and_ordinary_pieces_is_one_config_error(fresh_smollm2_tokenizer):
    tok = fresh_smollm2_tokenizer
    tok.add_special_tokens({"additional_special_tokens": ["</Co"]})
    with pytest.raises(ConfigError, match="splits the stop tag '</Code>'"):
        token_rules(tok)


def test_skyrl_and_trl_read_the_same_rules(fresh_smollm2_tokenizer):
    from deepanalyze_env.trainers.trl.train import add_stop_token_ids

    tok = fresh_smollm2_tokenizer
    tok.add_tokens(["</Code>", "</Answer>"])  # added, not special: both trainers stop on the ids
    config = SimpleNamespace(use_vllm=True, generation_kwargs={})
    add_stop_token_ids(config, tok)
    assert config.generation_kwargs["stop_token_ids"] == list(tag_stop_ids(tok).values())
    assert len(config.generation_kwargs["stop_token_ids"]) == 2
