"""The action protocol: truncation, done detection, extraction, format checks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from deepanalyze_env.core import protocol


def test_truncates_at_first_closing_code_tag():
    action = "<Code>print(1)</Code> more <Code>print(2)</Code>"
    assert protocol.truncate_action(action) == "<Code>print(1)</Code>"


def test_earlier_code_close_wins_over_later_answer_close():
    action = "<Code>print(1)</Code><Answer>42</Answer>"
    assert protocol.truncate_action(action) == "<Code>print(1)</Code>"


def test_earlier_answer_close_wins_over_later_code_close():
    action = "<Answer>42</Answer> then <Code>x</Code>"
    assert protocol.truncate_action(action) == "<Answer>42</Answer>"


def test_action_without_closing_tags_is_kept_whole():
    assert protocol.truncate_action("<Analyze>thinking") == "<Analyze>thinking"


def test_done_needs_a_complete_answer_block():
    assert protocol.has_answer("<Answer>x</Answer>")
    assert not protocol.has_answer("<Answer>x")
    assert not protocol.has_answer("<Code>x</Code>")


def test_answer_inside_think_does_not_count():
    assert not protocol.has_answer("<think><Answer>x</Answer></think>")


def test_extracts_python_fenced_code():
    assert protocol.extract_code("<Code>\n```python\nprint(1)\n```\n</Code>") == "print(1)"


def test_extracts_py_fenced_code():
    assert protocol.extract_code("<Code>```py\nx = 2\nprint(x)\n```</Code>") == "x = 2\nprint(x)"


def test_extracts_unfenced_code():
    assert protocol.extract_code("<Code>\nprint(3)\n</Code>") == "print(3)"


def test_extracts_first_code_block_only():
    assert protocol.extract_code("<Code>a = 1</Code><Code>b = 2</Code>") == "a = 1"


def test_blank_code_block_counts_as_no_code():
    assert protocol.extract_code("<Code>\n```python\n\n```\n</Code>") is None
    assert protocol.extract_code("<Analyze>no code</Analyze>") is None


def test_code_inside_think_is_ignored():
    assert protocol.extract_code("<think><Code>bad()</Code></think><Code>good()</Code>") == "good()"


def test_answer_is_last_block_of_last_answering_turn():
    turns = ["<Answer>first</Answer>", "<Code>x</Code>", "<Answer>Answer: second</Answer>"]
    assert protocol.extract_answer(turns) == "second"


def test_answer_prefix_is_stripped_and_text_before_it_dropped():
    assert protocol.extract_answer(["<Answer>\nThe best store is B.\nAnswer: B\n</Answer>"]) == "B"


def test_answer_without_prefix_is_whole_block_stripped():
    assert protocol.extract_answer(["<Answer>  42 \n</Answer>"]) == "42"


def test_no_answer_block_gives_none():
    assert protocol.extract_answer(["<Analyze>x</Analyze>"]) is None


def test_gate_tags_missing_are_listed():
    assert protocol.missing_gate_tags("<Analyze>a</Analyze><Answer>b</Answer>") == []
    assert protocol.missing_gate_tags("<Answer>b</Answer>") == ["<Analyze>", "</Analyze>"]


def test_python_fence_check():
    assert protocol.is_python_fenced("\n```python\nprint(1)\n```\n")
    assert protocol.is_python_fenced("```py\nprint(1)\n```")
    assert not protocol.is_python_fenced("print(1)")
    assert not protocol.is_python_fenced("```sql\nselect 1\n```")
    assert not protocol.is_python_fenced("```python\nprint(1)\n```\nprint(2)")


def test_observation_layout_closes_execute_tag():
    assert protocol.render_observation("out") == "\n<Execute>\nout\n</Execute>\n"


_TAG_TOKENS = ["<Code>", "</Code>", "<Answer>", "</Answer>", "<think>", "</think>", "x", "\n"]


@given(st.lists(st.sampled_from(_TAG_TOKENS), max_size=14).map("".join))
@settings(max_examples=3000, deadline=None, database=None, derandomize=True)
def test_block_extraction_agrees_with_the_lazy_regex(text):
    """Oracle: the non-greedy regex the extraction replaced (it is quadratic on a megabyte of
    opening tags, so the protocol scans linearly instead)."""
    import re

    visible = protocol.strip_think(text)
    code = re.search(r"<Code>(.*?)</Code>", visible, re.DOTALL)
    assert protocol.extract_code_block(text) == (code.group(1) if code else None)
    assert protocol.code_blocks(text) == re.findall(r"<Code>(.*?)</Code>", visible, re.DOTALL)
    answer = re.search(r"<Answer>(.*?)</Answer>", visible, re.DOTALL)
    assert protocol.has_answer(text) == (answer is not None)


def test_a_megabyte_of_opening_tags_is_parsed():
    """170,000 ``<Code>`` without a closing tag: no code, no answer (and no quadratic stall)."""
    assert protocol.extract_code("<Code>" * 170_000) is None
    assert protocol.extract_answer(["<Answer>" * 170_000]) is None
