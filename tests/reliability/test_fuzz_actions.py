"""Malformed actions (issue 8): >= 10,000 generated actions through ``step()`` of a real env.

No exception escapes, every step's output matches docs/design.md §6, truncation cuts after the
earliest ``</Code>``/``</Answer>``, and the gate is decided over the policy's own turns. Episodes
are long (max_turns is large) so one env serves many actions; an ``<Answer>`` ends it and the
next example gets a fresh one. Most generated code is garbage that fails to compile, so cells
stay fast; a few 1 MB actions run through as well.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import skyrl_gym
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from deepanalyze_env.core import protocol
from deepanalyze_env.core.records import read_records
from rewards import Method, register_method
from tests.conftest import qa_extras

register_method(Method("fuzz_fenced", ("qa_accuracy",), fence_gate=True))

EXEC_STATUSES = {"ok", "error", "timeout", "crashed", "no_code"}
TOKENS = [
    "<Analyze>", "</Analyze>", "<Understand>", "</Understand>", "<Code>", "</Code>", "<Answer>",
    "</Answer>", "<code>", "</CODE>", "<ANSWER>", "</answer>", "<Execute>", "</Execute>",
    "<think>", "</think>", "```python\n", "```py\n", "```\n", "```", "\n", "Answer: B", "Answer:",
    "print(1)\n", "print('</Code>')\n", "x = '</Answer>'\n", "'''</Code>'''", "# </Code>\n",
    "\x00", "\ud800", "\udfff", "\ufeff", "\r\n", "é", "😀", "import os\n", "raise ValueError\n",
    "<Code>```python\nprint(2)\n```</Code>", "<Answer>B</Answer>",
]  # fmt: skip
pieces = st.one_of(st.sampled_from(TOKENS), st.text(max_size=20))
actions = st.lists(pieces, max_size=25).map("".join)
big_actions = st.tuples(
    st.lists(st.sampled_from(TOKENS), max_size=6).map("".join),
    st.sampled_from(["x", "\x00", "<Code>", "é", "a\n"]),
    st.lists(st.sampled_from(TOKENS), max_size=6).map("".join),
).map(lambda t: t[0] + t[1] * (1_000_000 // len(t[1])) + t[2])


class Runner:
    """Keeps one live episode; starts a new one when the last ended."""

    def __init__(self, root: Path, records: Path, method: str):
        self.root, self.records, self.method = root, records, method
        self.env = None
        self.closed: list = []

    def live(self):
        if self.env is None:
            self.env = skyrl_gym.make(
                "deepanalyze",
                env_config={
                    "workspace_root": str(self.root),
                    "max_turns": 1_000_000,
                    "records_dir": str(self.records),
                    "executor": {"timeout_s": 5, "max_output_chars": 2000},
                },
                extras=qa_extras(reward_spec={"method": self.method, "ground_truth": "B"}),
            )
            self.env.init([{"role": "user", "content": "Which store?"}])
        return self.env

    def end(self):
        if self.env is not None:
            self.env.close()
            self.closed.append(self.env.workspace.path if self.env.workspace else None)
            self.env = None


def check_step(env, action: str, out, fence_gate: bool) -> bool:
    """Assert the step output contract (docs/design.md §6) for one step; True when the episode ended."""
    assert set(out) >= {"observations", "reward", "done", "metadata", "postprocessed_action"}
    cut = protocol.truncate_action(action)
    # None keeps the sampled tokens: nothing was cut, or only whitespace rode on the closing tag
    assert out["postprocessed_action"] == (None if not action[len(cut) :].strip() else cut)
    assert action.startswith(cut)
    stops = [action.find(t) + len(t) for t in protocol.STOP_TAGS if t in action]
    assert len(cut) == (min(stops) if stops else len(action))
    meta = out["metadata"]
    assert isinstance(out["reward"], float) and math.isfinite(out["reward"])
    if not out["done"]:
        assert out["reward"] == 0.0
        assert set(meta) == {"code_pass", "exec"}
        ex = meta["exec"]
        assert set(ex) == {"status", "elapsed_ms", "truncated"}
        assert ex["status"] in EXEC_STATUSES
        shown = out["observations"][0]["content"][len("\n<Execute>\n") : -len("\n</Execute>\n")]
        assert meta["code_pass"] == int(ex["status"] == "ok" and bool(shown.strip()))  # §7 Code pass
        assert isinstance(ex["truncated"], bool) and ex["elapsed_ms"] >= 0
        if protocol.extract_code(cut) is None:
            assert ex["status"] == "no_code"
        else:
            assert ex["status"] != "no_code"
        assert not protocol.has_answer(cut)
        [obs] = out["observations"]
        assert obs["role"] == "user"
        assert obs["content"].startswith("\n<Execute>\n") and obs["content"].endswith("\n</Execute>\n")
        return False
    assert protocol.has_answer(cut)
    assert out["observations"] == []
    assert {"reward_components", "reward_status", "format_ok", "gate", "termination", "code_pass",
            "turns", "exec"} <= set(meta)  # fmt: skip
    assert meta["reward_status"] == "scored", meta.get("error")
    assert meta["termination"] == "answer"
    assert meta["turns"] == len(env.policy_turns) == len(meta["code_pass"]) + 1
    blocks = [b for turn in env.policy_turns for b in protocol.code_blocks(turn)]  # each turn on its own
    expected_gate = None
    if protocol.missing_gate_tags(env.policy_turns):
        expected_gate = "tags"
    elif fence_gate and not all(protocol.is_python_fenced(b) for b in blocks):
        expected_gate = "fence"
    assert meta["gate"] == expected_gate
    if expected_gate:
        assert out["reward"] == -1.0 and meta["reward_components"] == {"format_gate": -1.0}
        assert meta["format_ok"] is False
    else:
        assert meta["format_ok"] is True and set(meta["reward_components"]) >= {"qa_accuracy"}
    return True


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzzroot")
    (root / "data" / "ws").mkdir(parents=True)
    (root / "data" / "ws" / "sales.csv").write_text("store,revenue\nA,10\nB,32\n")
    return root


def _run(runner: Runner, batch: list[str], fence_gate: bool) -> int:
    """Step every action of ``batch``; returns how many were stepped."""
    for action in batch:
        env = runner.live()
        out = env.step(action)
        if check_step(env, action, out, fence_gate):
            again = env.step("anything")  # a step after the end repeats the final result
            assert again["done"] is True and again["reward"] == out["reward"]
            runner.end()
    return len(batch)


def _fuzz_method(root: Path, records: Path, method: str, examples: int) -> int:
    """``examples`` generated batches through one method's env; returns the actions stepped."""
    runner = Runner(root, records, method)
    stepped = 0

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,  # the same actions on every run: CI failures reproduce
        phases=(Phase.explicit, Phase.generate),  # no shrinking: it could outrun the CI budget
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(actions, min_size=1, max_size=5))
    def fuzz(batch: list[str]) -> None:
        nonlocal stepped
        stepped += _run(runner, batch, fence_gate=method == "fuzz_fenced")

    try:
        fuzz()
    finally:
        runner.end()
    assert stepped >= examples  # at least one action per example
    assert all(path is None or not path.exists() for path in runner.closed)
    written = read_records(next(records.glob("episodes-*.jsonl")))
    assert len(written) == len(runner.closed)  # every episode's record, surrogates and all
    return stepped


def test_ten_thousand_generated_actions_keep_the_contract(fuzz_root: Path, tmp_path: Path):
    """At least 10,000 generated actions, counted here (no other test's state): the tag gate
    and the fenced-code gate, each episode's record written and its scratch folder removed."""
    stepped = _fuzz_method(fuzz_root, tmp_path / "tags", "qa_plain", 2600)
    stepped += _fuzz_method(fuzz_root, tmp_path / "fenced", "fuzz_fenced", 900)
    assert stepped >= 10_000, stepped


def test_one_megabyte_actions(fuzz_root: Path, tmp_path: Path):
    runner = Runner(fuzz_root, tmp_path / "records", "qa_plain")

    @settings(max_examples=6, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(big_actions)
    def fuzz(action: str) -> None:
        _run(runner, [action], fence_gate=False)

    try:
        fuzz()
    finally:
        runner.end()
