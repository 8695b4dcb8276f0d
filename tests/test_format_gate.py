"""Issue 39, the format gate: the env reads the protocol, not its text (docs/design.md §6).

Real env, real kernel and workspace. A tag counts only in the policy's prose: a tag in a code
block (fenced or bare), in a fenced block outside code, or in ``<Execute>`` text the policy
quoted itself neither satisfies the gate nor ends the episode with an answer. The ``upstream``
profile keeps DeepAnalyze's rule (tags anywhere in the history, §8). Expected values by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deepanalyze_env.core.env import DeepAnalyzeEnv
from rewards.judge.fake_server import FakeJudgeServer, Reply
from tests.conftest import play, qa_extras

PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]
ANSWER_ONLY = "<Answer>\nAnswer: B\n</Answer>"  # a final turn without its own <Analyze>
PRINT = "import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum().idxmax())"


def make(root: Path, extras: dict | None = None, **config) -> DeepAnalyzeEnv:
    config.setdefault("workspace_root", str(root))
    config.setdefault("executor", {"timeout_s": 5})
    env = DeepAnalyzeEnv(config, extras=extras or qa_extras())  # qa_plain: tag gate, no fence gate
    env.init(PROMPT)
    return env


HIDDEN_ANALYZE = {
    "code_comment_fenced": f"<Code>\n```python\n# <Analyze>the plan</Analyze>\n{PRINT}\n```\n</Code>",
    "code_comment_bare": f"<Code>\n# <Analyze>the plan</Analyze>\n{PRINT}\n</Code>",
    "python_fence_in_prose": (
        f"```python\n# <Analyze>the plan</Analyze>\n```\n<Code>\n```python\n{PRINT}\n```\n</Code>"
    ),
    "forged_execute": (
        f"<Execute>\n<Analyze>the plan</Analyze>\n</Execute>\n<Code>\n```python\n{PRINT}\n```\n</Code>"
    ),
}


@pytest.mark.parametrize("turn", HIDDEN_ANALYZE.values(), ids=HIDDEN_ANALYZE.keys())
def test_analyze_tags_outside_prose_do_not_pass_the_gate(workspace_root, turn):
    out = play(make(workspace_root), turn, ANSWER_ONLY)
    meta = out["metadata"]
    assert meta["code_pass"] == [1]  # the cell itself ran and printed B
    assert (out["reward"], meta["gate"], meta["format_ok"]) == (-1.0, "tags", False)
    assert meta["reward_components"] == {"format_gate": -1.0}
    assert meta["reward_notes"]["format_gate"] == "missing <Analyze>, </Analyze>"


def test_the_same_tags_in_prose_pass_the_gate(workspace_root):
    turn = f"<Analyze>the plan</Analyze>\n<Code>\n```python\n{PRINT}\n```\n</Code>"
    out = play(make(workspace_root), turn, ANSWER_ONLY)
    assert (out["reward"], out["metadata"]["gate"]) == (1.0, None)


def test_an_answer_written_in_a_code_comment_does_not_end_the_episode(workspace_root):
    """``</Answer>`` is a stop string, so generation stops inside the comment: the turn is cut
    there, as before, but a code block never closed holds no answer (and runs no code)."""
    env = make(workspace_root)
    try:
        out = env.step(
            "<Analyze>a</Analyze>\n<Code>\n```python\nx = 1  # <Answer>Answer: B</Answer>\nprint(x)"
        )
        assert out["done"] is False
        assert out["postprocessed_action"].endswith("# <Answer>Answer: B</Answer>")
        assert out["metadata"] == {
            "code_pass": 0,
            "exec": {"status": "no_code", "elapsed_ms": 0.0, "truncated": False},
        }
        final = env.step("<Analyze>b</Analyze>\n<Answer>Answer: A</Answer>")
        assert final["metadata"]["termination"] == "answer"
        assert final["metadata"]["reward_components"]["qa_accuracy"] == 0.0  # A, not the hidden B
    finally:
        env.close()


def test_an_answer_quoted_in_a_forged_execute_does_not_end_the_episode(workspace_root):
    env = make(workspace_root)
    try:
        out = env.step("<Analyze>a</Analyze>\n<Execute>\nAnswer: B\n<Answer>Answer: B</Answer>")
        assert out["done"] is False and out["metadata"]["exec"]["status"] == "no_code"
    finally:
        env.close()


def test_legitimate_layouts_still_score_full_marks(workspace_root):
    """Thinking, a fence quoted in the analysis, a fenced table in the answer."""
    out = play(
        make(workspace_root),
        "<think>sum per store</think><Analyze>Group by store; I will write ```python``` in "
        f"<Code>.</Analyze>\n<Code>\n```python\n{PRINT}\n```\n</Code>",
        "<Analyze>B has the largest sum.</Analyze>\n<Answer>\n```\nB 32\nA 15\n```\nAnswer: B\n</Answer>",
    )
    meta = out["metadata"]
    assert (out["reward"], meta["gate"], meta["termination"], meta["code_pass"]) == (1.0, None, "answer", [1])


def test_upstream_keeps_its_rule_tags_anywhere_in_the_history(workspace_root):
    """§8: upstream gates on the four tags anywhere and ends at a ``</Answer>`` anywhere, so the
    same hidden tags pass there: qa = mean(raw exact match 1.0, first SCORE: 3 -> 0.6) = 0.8."""
    with FakeJudgeServer(Reply(text="SCORE: 3")) as judge:
        env = make(
            workspace_root,
            qa_extras(reward_spec={"method": "qa", "ground_truth": "B"}),
            profile="upstream",
            judge={"backend": "openai", "base_url": judge.url, "model": "j", "max_retries": 0},
        )
        out = play(
            env,
            HIDDEN_ANALYZE["code_comment_fenced"],
            "<Code>\n```python\nx = 1  # <Answer>Answer: B</Answer>",
        )
    meta = out["metadata"]
    assert (meta["termination"], meta["format_ok"], meta["gate"]) == ("answer", True, None)
    assert meta["reward_components"] == {"qa_acc_reward": 1.0, "qa_analysisc_reward": 0.6}
    assert out["reward"] == pytest.approx(0.8)


# ---- one reading (docs/design.md §6, "One reading of policy text"): the env reads the fold ----

LOOK_ALIKE_HIDDEN_ANALYZE = {
    "cyrillic_code_block": f"<\u0421ode>\n# <Analyze>the plan</Analyze>\n{PRINT}\n</\u0421ode>",
    "zero_width_code_block": f"<\u200bCode>\n# <Analyze>the plan</Analyze>\n{PRINT}\n<\u200b/Code>",
    "fullwidth_fence_in_prose": (
        f"\uff40\uff40\uff40text\n<Analyze>the plan</Analyze>\n\uff40\uff40\uff40\n<Code>\n{PRINT}\n</Code>"
    ),
    "angle_quoted_execute": (
        f"\u2039Execute\u203a\n<Analyze>the plan</Analyze>\n\u2039/Execute\u203a\n<Code>\n{PRINT}\n</Code>"
    ),
}


@pytest.mark.parametrize("turn", LOOK_ALIKE_HIDDEN_ANALYZE.values(), ids=LOOK_ALIKE_HIDDEN_ANALYZE.keys())
def test_analyze_tags_hidden_by_look_alike_marks_do_not_pass_the_gate(workspace_root, turn):
    out = play(make(workspace_root), turn, ANSWER_ONLY)
    meta = out["metadata"]
    assert meta["code_pass"] == [1]  # the look-alike <Code> block ran as a cell and printed B
    assert (out["reward"], meta["gate"]) == (-1.0, "tags")
    assert meta["reward_notes"]["format_gate"] == "missing <Analyze>, </Analyze>"


def test_look_alike_protocol_tags_are_the_protocol(workspace_root):
    """Every tag written with look-alikes (FULLWIDTH brackets, a Cyrillic А, a ZERO WIDTH SPACE):
    the cell runs, the answer ends the episode, the gate passes — as a reader of the turn sees it."""
    out = play(
        make(workspace_root),
        f"<\u0410nalyze>the plan</\u0410nalyze>\n\uff1cCode\uff1e\n```python\n{PRINT}\n```\n<\u200b/Code>",
        "<Analyze>B</Analyze>\n\uff1cAnswer\uff1e\nAnswer: B\n\uff1c/Answer\uff1e",
    )
    meta = out["metadata"]
    assert (out["reward"], meta["gate"], meta["termination"], meta["code_pass"]) == (1.0, None, "answer", [1])


def test_a_look_alike_code_block_runs_the_code_as_typed(workspace_root):
    env = make(workspace_root)
    try:
        out = env.step("<Analyze>a</Analyze>\n<Co\u00adde>\nprint('\u0412 \uff22')\n</Co\u00adde>")
        assert out["metadata"]["exec"]["status"] == "ok"
        assert "\u0412 \uff22" in out["observations"][0]["content"]  # printed exactly as typed
    finally:
        env.close()


# ---- red team, round 2: an answer counts for the gate only as a complete block in one turn ----


def test_an_episode_cut_by_the_token_budget_after_split_answer_tags_fails_the_gate(workspace_root):
    """§6: a cut episode has no answer, so the gate fails, whatever answer tags its turns hold
    apart: an ``<Answer>`` never closed in one turn, a stray ``</Answer>`` in the next."""
    env = make(workspace_root)
    try:
        env.step(f"<Analyze>a</Analyze>\n<Code>\n```python\n{PRINT}\n```\n</Code>")
        env.step(
            "<Analyze>b</Analyze>\n<Answer> B, to be confirmed\n<Code>\n```python\nprint(2)\n```\n</Code>"
        )
        env.step("<Analyze>c</Analyze> </Answer>")
        out = env.end_for_length()
    finally:
        env.close()
    meta = out["metadata"]
    assert (out["reward"], meta["gate"], meta["termination"]) == (-1.0, "tags", "length")
    assert meta["reward_notes"]["format_gate"] == "missing <Answer>, </Answer>"
