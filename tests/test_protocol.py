"""The action protocol: truncation, done detection, extraction, format checks."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from deepanalyze_env.core import protocol
from deepanalyze_env.core.fold import fold


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
    opening tags, so the protocol scans linearly instead). For the answer, the same regex over
    each stretch of text between code blocks (a ``<Code>`` never closed runs to the end): an
    ``<Answer>`` written inside code is no answer, and no answer spans a code block."""
    import re

    visible = protocol.strip_think(text)
    code = re.search(r"<Code>(.*?)</Code>", visible, re.DOTALL)
    assert protocol.extract_code_block(text) == (code.group(1) if code else None)
    assert protocol.code_blocks(text) == re.findall(r"<Code>(.*?)</Code>", visible, re.DOTALL)
    outside_code = re.split(r"<Code>(?:.*?</Code>|.*\Z)", visible, flags=re.DOTALL)
    answered = any(re.search(r"<Answer>(.*?)</Answer>", part, re.DOTALL) for part in outside_code)
    assert protocol.has_answer(text) == answered


def test_a_megabyte_of_opening_tags_is_parsed():
    """170,000 ``<Code>`` without a closing tag: no code, no answer (and no quadratic stall)."""
    assert protocol.extract_code("<Code>" * 170_000) is None
    assert protocol.extract_answer(["<Answer>" * 170_000]) is None


# ------------------------------------------------------------- the protocol, read (issue 39)
# A tag counts only in the policy's prose: not in code, a fenced block, or <Execute> text the
# policy quoted itself (docs/design.md §6). Expected values are written by hand.
ALL_TAGS = ["<Analyze>", "</Analyze>", "<Answer>", "</Answer>"]


def test_gate_tags_in_a_fenced_code_comment_do_not_count():
    turn = "<Code>\n```python\n# <Analyze>x</Analyze>\nprint(1)\n```\n</Code>"
    assert protocol.missing_gate_tags(turn) == ALL_TAGS


def test_gate_tags_in_a_bare_code_block_do_not_count():
    assert protocol.missing_gate_tags("<Code>\n# <Analyze>x</Analyze>\nprint(1)\n</Code>") == ALL_TAGS


def test_gate_tags_in_a_fence_outside_code_do_not_count():
    for fence in ("```python\n# <Analyze>x</Analyze>\n```", "```\n<Analyze>x</Analyze>\n```"):
        assert protocol.missing_gate_tags(fence + "\n<Answer>Answer: 1</Answer>") == ALL_TAGS[:2]


def test_gate_tags_in_a_quoted_execute_do_not_count():
    forged = "<Execute>\n<Analyze>x</Analyze>\n<Answer>Answer: 1</Answer>\n</Execute>"
    assert protocol.missing_gate_tags(forged) == ALL_TAGS


def test_a_fence_or_quote_never_closed_hides_the_rest_of_its_text():
    assert protocol.missing_gate_tags("```\n<Analyze>x</Analyze>") == ALL_TAGS
    assert protocol.missing_gate_tags("<Execute>\n<Analyze>x</Analyze>") == ALL_TAGS


def test_an_answer_written_in_code_is_no_answer_even_when_truncation_stops_there():
    turn = protocol.truncate_action("<Code>\n```python\nx = 1  # <Answer>Answer: 5</Answer>\n```\n</Code>")
    assert turn == "<Code>\n```python\nx = 1  # <Answer>Answer: 5</Answer>"  # the stop string fired
    assert not protocol.has_answer(turn)
    assert protocol.extract_answer([turn]) is None
    assert protocol.extract_code(turn) is None  # and no code ran: its block never closed


def test_an_answer_in_a_fence_or_quoted_execute_is_no_answer():
    for turn in ("```\n<Answer>Answer: 5</Answer>", "<Execute>\n<Answer>Answer: 5</Answer>"):
        assert not protocol.has_answer(turn) and protocol.extract_answer([turn]) is None


def test_the_legitimate_layouts_pass():
    turns = [
        "<think>plan</think><Analyze>Load it; a ```python fence``` goes in <Code>.</Analyze>\n"
        "<Code>\n```python\nprint(1)\n```\n</Code>",
        "<Analyze>done</Analyze>\n<Answer>\n| a |\n```\nx = 1\n```\nAnswer: 5\n</Answer>",
    ]
    assert protocol.missing_gate_tags(turns) == []
    assert protocol.read_turn(turns[1]).answers == ("\n| a |\n```\nx = 1\n```\nAnswer: 5\n",)
    assert protocol.extract_answer(turns) == "5"


def test_each_turn_is_read_on_its_own():
    """A code block left open in one turn (a turn cut by a token budget) ends with that turn."""
    turns = ["<Analyze>a</Analyze>\n<Code>\nprint(1)", "<Analyze>b</Analyze>\n<Answer>Answer: 5</Answer>"]
    assert protocol.missing_gate_tags(turns) == []
    assert protocol.missing_gate_tags(["<Code>\nprint(1)", "# <Analyze>b</Analyze>\n</Code>"]) == ALL_TAGS[2:]


# Hidden contexts and what their contents may hold: never their own closing mark (the context
# would end there), never a <Code> outside code (a <Code> opens a code block wherever it stands,
# as the code extraction reads it), never <think> tags (removed before anything is read).
_FILLER = ["x", "42", "Answer: 7", "df.head()", "`", "<", ">", "\n"]
_GATE = ["<Analyze>", "</Analyze>", "<Answer>", "</Answer>"]
_HIDDEN = {
    "code": (
        "<Code> ",
        " </Code>",
        [*_GATE, *_FILLER, "```", "```python", "<Execute>", "</Execute>", "<Code>"],
    ),
    "fence": ("```python ", " ```", [*_GATE, *_FILLER, "<Execute>", "</Execute>"]),
    "execute": ("<Execute> ", " </Execute>", [*_GATE, *_FILLER, "```", "<Execute>"]),
    "think": ("<think> ", " </think>", [*_GATE, *_FILLER, "```", "<Code>", "</Code>", "<Execute>"]),
}
# Prose: the two Analyze tags, whole answers (their bodies filler), filler and stray closers
# (a stray </Answer> places no gate tag: the answer's tags count only as a whole block).
_PROSE = ["<Analyze>", "</Analyze>", "answer", "</Answer>", "</Code>", "</Execute>", "</think>", *_FILLER]


@st.composite
def _turns(draw):
    """Turns built from labelled segments, with what the oracle needs recorded at build time:
    the gate tags placed in prose and the answer bodies written there."""
    turns, placed, bodies = [], set(), []
    for _ in range(draw(st.integers(1, 3))):
        parts, turn_bodies = [], []
        segments = draw(st.lists(st.sampled_from(["prose", *_HIDDEN]), min_size=1, max_size=6))
        for i, kind in enumerate(segments):
            if kind == "prose":
                words = []
                for token in draw(st.lists(st.sampled_from(_PROSE), max_size=5)):
                    if token == "answer":
                        body = " " + " ".join(draw(st.lists(st.sampled_from(_FILLER), max_size=3))) + " "
                        turn_bodies.append(body)
                        placed.update({"<Answer>", "</Answer>"})
                        token = f"<Answer>{body}</Answer>"
                    elif token in ("<Analyze>", "</Analyze>"):  # a stray </Answer> is no answer
                        placed.add(token)
                    words.append(token)
                parts.append(" ".join(words))
                continue
            opener, closer, inside = _HIDDEN[kind]
            closed = i < len(segments) - 1 or draw(st.booleans())  # only the last may stay open
            content = " ".join(draw(st.lists(st.sampled_from(inside), max_size=5)))
            parts.append(opener + content + (closer if closed else ""))
        turns.append(" ".join(parts))
        bodies.append(turn_bodies)
    return turns, placed, bodies


@given(_turns())
@settings(max_examples=400, deadline=None, database=None, derandomize=True)
def test_the_gate_passes_iff_the_tags_are_in_prose(case):
    """Oracle: the tags the generator put in prose, not a parse of the text."""
    turns, placed, bodies = case
    assert protocol.missing_gate_tags(turns) == [t for t in protocol.GATE_TAGS if t not in placed]
    for turn, turn_bodies in zip(turns, bodies, strict=True):
        assert protocol.read_turn(turn).answers == tuple(turn_bodies)
        assert protocol.has_answer(turn) == bool(turn_bodies)
    last = next((b[-1] for b in reversed(bodies) if b), None)
    assert protocol.extract_answer(turns) == protocol.answer_value(last)


# ---- the protocol is read in the fold (core/fold.py); what it returns is the text as typed ----

LOOK_ALIKE_CODE = "\uff1cCode\uff1e"  # FULLWIDTH LESS-THAN, FULLWIDTH GREATER-THAN
LOOK_ALIKE_CODE_CLOSE = "<\u200b/Code>"  # ZERO WIDTH SPACE after the bracket


def test_a_look_alike_closing_tag_cuts_the_turn_after_its_last_character():
    action = "<Code>print(1)</\u0421ode> more"  # CYRILLIC CAPITAL ES
    assert protocol.truncate_action(action) == "<Code>print(1)</\u0421ode>"


def test_a_cut_after_a_look_alike_tag_keeps_every_character_of_the_tag():
    action = "<Answer>B</Answer\u2060\u200b> more"  # WORD JOINER and ZERO WIDTH SPACE before '>'
    assert protocol.truncate_action(action) == "<Answer>B</Answer\u2060\u200b>"


def test_a_look_alike_code_block_yields_the_code_as_typed():
    action = f"{LOOK_ALIKE_CODE}\nprint('\u041e\u0442\u0432\u0435\u0442')\n{LOOK_ALIKE_CODE_CLOSE}"
    assert protocol.extract_code(action) == "print('\u041e\u0442\u0432\u0435\u0442')"


def test_a_look_alike_fence_is_a_fence_and_the_code_inside_is_kept_as_typed():
    block = (
        "\n\uff40\uff40\uff40python\nx = '\uff21'\nprint(x)\n\uff40\uff40\uff40\n"  # FULLWIDTH GRAVE ACCENT
    )
    assert protocol.extract_code(f"<Code>{block}</Code>") == "x = '\uff21'\nprint(x)"
    assert protocol.is_python_fenced(block)


def test_a_look_alike_answer_is_an_answer_and_its_body_is_kept_as_typed():
    turn = "<\u0410nswer>\nAnswer: \uff22\n</\u0410nswer>"  # CYRILLIC CAPITAL A; FULLWIDTH B
    assert protocol.has_answer(turn)
    assert protocol.extract_answer([turn]) == "\uff22"


def test_a_look_alike_answer_marker_is_read_as_the_marker():
    assert protocol.answer_value("some text \u0410nswer\uff1a 42") == "42"  # FULLWIDTH COLON


def test_a_character_that_is_part_tag_stays_with_the_tag():
    # « reads as <<: the first < is text, the second opens <Answer>; the body is B alone
    assert protocol.extract_answer(["\u00abAnswer>B</Answer>"]) == "B"


def test_tags_in_a_look_alike_code_block_are_not_prose():
    turn = f"{LOOK_ALIKE_CODE}\n# <Analyze>x</Analyze>\n{LOOK_ALIKE_CODE_CLOSE}"
    assert protocol.missing_gate_tags(turn) == ["<Analyze>", "</Analyze>", "<Answer>", "</Answer>"]


def test_look_alike_gate_tags_in_prose_are_the_gate_tags():
    turn = "<\u0410nalyze>x</Analyz\u0435>\n\uff1cAnswer\uff1eB<\u200b/Answer>"
    assert protocol.missing_gate_tags(turn) == []


def test_an_answer_in_a_look_alike_think_is_no_answer():
    assert not protocol.has_answer("<th\u0456nk><Answer>B</Answer></th\u0456nk>")


def test_the_rest_of_a_turn_after_a_look_alike_think_is_kept_as_typed():
    turn = "\uff1cthink\uff1eplan\uff1c/think\uff1e<Answer>\u0412</Answer>"  # CYRILLIC CAPITAL VE
    assert protocol.extract_answer([turn]) == "\u0412"


@settings(max_examples=300)
@given(st.text(st.characters(codec="utf-8"), max_size=40))
def test_code_in_a_block_comes_back_exactly_as_typed(code):
    assume("<" not in fold(code))  # no tag, real or look-alike, inside the code itself
    extracted = protocol.extract_code_block(f"{LOOK_ALIKE_CODE}{code}{LOOK_ALIKE_CODE_CLOSE}")
    assert extracted == code


def test_invisible_characters_at_a_bodys_edges_stay_in_the_body():
    assert protocol.extract_answer(["<Answer>\u200bB\u2060</Answer>"]) == "\u200bB\u2060"
