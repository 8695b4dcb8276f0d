"""Issue 39, code-pass credit (docs/design.md §7, "Code pass"): in ``v1`` a cell earns code_pass
when it ran without error *and* printed something that is not whitespace — both observed from
the trainer side (the kernel's status, the output stream it captured). ``openresearch_turns``
counts those cells, not turns. ``upstream`` keeps DeepAnalyze's rule (output non-empty and
without ``[Error]:``). Real env, real kernel; expected values by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepanalyze_env.core.env import DeepAnalyzeEnv
from rewards.judge.fake_server import FakeJudgeServer, Reply
from tests.conftest import code, qa_extras

PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]
BEST = code("import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum().idxmax())")
ANSWER = "<Analyze>B sells most</Analyze>\n<Answer>\nAnswer: B\n</Answer>"
SILENT = {
    "pass": "pass",
    "assignment": "x = 1",
    "blank_print": "print()\nprint('   \\t')",
    "load_only": "import pandas as pd\ndf = pd.read_csv('sales.csv')",
}


def make(root: Path, extras: dict | None = None, **config) -> DeepAnalyzeEnv:
    config.setdefault("workspace_root", str(root))
    config.setdefault("executor", {"timeout_s": 5})
    env = DeepAnalyzeEnv(config, extras=extras or qa_extras())
    env.init(PROMPT)
    return env


@pytest.fixture
def env(workspace_root):
    e = make(workspace_root)
    yield e
    e.close()


@pytest.mark.parametrize("src", SILENT.values(), ids=SILENT.keys())
def test_a_cell_that_shows_nothing_earns_no_code_pass_in_v1(env, src):
    out = env.step(code(src))
    assert out["metadata"]["exec"]["status"] == "ok"  # it ran without error ...
    assert out["metadata"]["code_pass"] == 0  # ... and showed nothing


def test_a_cell_that_prints_earns_code_pass(env):
    assert env.step(BEST)["metadata"]["code_pass"] == 1
    # a warning on stderr is output the kernel captured too
    assert env.step(code("import warnings\nwarnings.warn('odd')"))["metadata"]["code_pass"] == 1


def test_with_stateful_cells_a_load_earns_nothing_and_the_print_that_uses_it_earns_one(workspace_root):
    """The decision for stateful kernels: credit goes to the cell that shows what was learned."""
    env = make(workspace_root, stateful_cells=True)
    try:
        load = env.step(code("import pandas as pd\ndf = pd.read_csv('sales.csv')"))
        use = env.step(code("print(df.revenue.sum())"))
        assert [load["metadata"]["code_pass"], use["metadata"]["code_pass"]] == [0, 1]
        assert "47" in use["observations"][0]["content"]
    finally:
        env.close()


def test_the_tools_format_follows_the_same_rule(workspace_root):
    env = make(workspace_root, action_format="tools")
    try:
        call = {"name": "run_python", "arguments": {"code": "pass"}}
        out = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
        assert (out["metadata"]["exec"]["status"], out["metadata"]["code_pass"]) == ("ok", 0)
    finally:
        env.close()


def test_upstream_keeps_its_rule(workspace_root):
    """DeepAnalyze's rule: output non-empty and without ``[Error]:`` (a timeout passes, §8)."""
    with FakeJudgeServer(Reply(text="SCORE: 3")) as judge:
        env = make(
            workspace_root,
            qa_extras(reward_spec={"method": "qa", "ground_truth": "B"}),
            profile="upstream",
            executor={"timeout_s": 1},
            judge={"backend": "openai", "base_url": judge.url, "model": "j", "max_retries": 0},
        )
        try:
            passes = [env.step(code(src))["metadata"]["code_pass"] for src in ("pass", "print()", "1/0")]
            timeout = env.step(code("while True:\n    pass"))["metadata"]
        finally:
            env.close()
    assert passes == [0, 1, 0]  # "print()" writes a newline: non-empty output
    assert (timeout["exec"]["status"], timeout["code_pass"]) == ("timeout", 1)


SHAPED = {"method": "verified", "function": ["answer_match", "openresearch_turns"], "ground_truth": "B"}


def test_no_op_turns_do_not_raise_openresearch_turns(workspace_root):
    """One cell that printed: min(1 / 10, 1) = 0.1, however many turns did nothing around it."""
    played = {}
    no_ops = [code("pass")] * 4 + ["<Analyze>hmm</Analyze>", code("1/0"), code("x = 2")]
    for name, turns in {"direct": [BEST, ANSWER], "padded": [*no_ops, BEST, *no_ops, ANSWER]}.items():
        env = make(workspace_root, qa_extras(reward_spec=SHAPED), max_turns=30)
        try:
            for turn in turns:
                out = env.step(turn)
        finally:
            env.close()
        played[name] = out["metadata"]
    assert played["padded"]["turns"] == 16 and sum(played["padded"]["code_pass"]) == 1
    for meta in played.values():
        assert meta["reward_components"] == {"answer_match": 1.0, "openresearch_turns": pytest.approx(0.1)}
