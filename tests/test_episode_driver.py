"""One episode, every path: the same turns — ending at a stop string, at the end of the message,
at a token limit — played through ``rollout`` (``run_episode`` with a policy), the TRL
``rollout_func`` (token ids through its per-turn handling), TRL's ``environment_factory``, the
bank's reference episodes and a served session give the same records (apart from ids, timings
and the policy's name), because each hands its turns to the one driver (``core/driver.py``).

Real envs, kernels and workspaces throughout; the turns come from a stand-in for a model (a
replay of fixed turns with the end a backend would report). A path that cannot express an end
plays only the ends it has: the bank writes closed turns only, a tool-calling client (served,
``environment_factory``) ends a turn with its call, and TRL's ``rollout_func`` is tags-only.
Expected values are worked out by hand (qa_plain, truth ``B``: a correct answer with the gate
passed scores 1, a failed gate -1).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from deepanalyze_env.core import driver
from deepanalyze_env.core.driver import Turn, TurnEnd
from deepanalyze_env.core.env import DeepAnalyzeEnv
from deepanalyze_env.core.records import read_records
from deepanalyze_env.core.tool_calls import ToolCall, render_call
from deepanalyze_env.offline.bank.episodes import ReferenceTurns
from deepanalyze_env.offline.bank.families.base import Cell
from deepanalyze_env.offline.policies import PolicyTurn, TurnContext
from deepanalyze_env.offline.rollout import run_episode
from deepanalyze_env.serve.session import EpisodeSession
from deepanalyze_env.trainers.trl.environment import environment_factory
from deepanalyze_env.trainers.trl.rollout_func import DeepAnalyzeRollout, trl_prompt
from deepanalyze_env.trainers.trl.turns import Generated
from tests.conftest import qa_extras

PRINTS_B = "print('Final answer: B')"
CODE_TURN = f"<Analyze>\nlook\n</Analyze>\n<Code>\n```python\n{PRINTS_B}\n```\n</Code>"
CLOSING = "The computation ran cleanly and printed the value asked for, in the requested format."
ANSWER_TURN = f"<Analyze>\n{CLOSING}\n</Analyze>\n<Answer>\nStore B.\n\nAnswer: B\n</Answer>"
MESSAGE_END = "<Analyze>\nI think it is B.\n</Analyze>"  # no stop tag: the message ended there
RAMBLE = "<Analyze>" + "let me think about the stores and their revenue " * 40
CUT_TOKENS = 120  # the turn limit of the length scenario (the answer turn fits under it)

TOOL_CODE = render_call(ToolCall("run_python", PRINTS_B))
TOOL_ANSWER = render_call(ToolCall("submit_answer", "B"))
TOOL_CUT = '<tool_call>\n{"name": "run_python", "arguments": {"code": "print('  # cut mid-call

# (turn text, how it ended) per scenario, and the record fields every path must agree on
TAGS: dict[str, list[tuple[str, TurnEnd]]] = {
    "stop": [(CODE_TURN, "stop"), (ANSWER_TURN, "stop")],
    "eos": [(MESSAGE_END, "eos")],
    "length": [("<cut RAMBLE>", "length"), (ANSWER_TURN, "stop")],
}
TOOLS: dict[str, list[tuple[str, TurnEnd]]] = {
    "stop": [(TOOL_CODE, "stop"), (TOOL_ANSWER, "stop")],
    "eos": [("I think it is B.", "eos")],
    "length": [(TOOL_CUT, "length"), (TOOL_ANSWER, "stop")],
}
EXPECTED = {  # by hand: (termination, turns, reward, exec statuses)
    ("tags", "stop"): ("answer", 2, 1.0, ["ok"]),
    ("tags", "eos"): ("eos", 1, -1.0, []),  # no answer: the gate fails, nothing more is played
    ("tags", "length"): ("answer", 2, 1.0, ["no_code"]),  # the cut turn is stepped as it stands
    ("tools", "stop"): ("answer", 2, 1.0, ["ok"]),
    ("tools", "eos"): ("eos", 1, -1.0, []),  # a message without a call hands the turn back
    ("tools", "length"): ("answer", 2, -1.0, ["no_code"]),  # the cut call is invalid: gate "tools"
}
FIELDS = ("termination", "turns", "reward", "reward_status", "reward_components", "format_ok", "gate")


def row() -> dict:
    return {"prompt": [{"role": "user", "content": "Which store?"}], "task_id": "t1", **qa_extras()}


def config(workspace_root: Path, records: Path, action_format: str) -> dict:
    cfg = {"workspace_root": str(workspace_root), "records_dir": str(records), "executor": {"timeout_s": 20}}
    if action_format == "tools":
        cfg |= {"action_format": "tools", "system_prompt": "protocol"}
    return cfg


def the_record(folder: Path) -> dict:
    [record] = [r for f in sorted(folder.glob("episodes-*.jsonl")) for r in read_records(f)]
    return record


def projection(record: dict) -> dict:
    """What must be identical across paths: outcome, score and what ran."""
    seen = {k: record[k] for k in FIELDS}
    seen["code_pass"] = record["code_pass"]
    seen["exec"] = [e["status"] for e in record["exec"]]
    return seen


@dataclass
class Replay:
    """A stand-in for a model: turn k of the episode is ``turns[k]``, with the end its backend reports."""

    turns: list[tuple[str, TurnEnd]]
    name: str = "replay"
    policy_id: str = "replay"

    def act(self, ctx: TurnContext) -> PolicyTurn:
        text, end = self.turns[ctx.turn]
        return PolicyTurn(text, end=end)


def via_rollout(turns, workspace_root: Path, folder: Path, action_format: str) -> dict:
    outcome = run_episode(config(workspace_root, folder, action_format), row(), Replay(turns))
    assert outcome.finished, outcome.error
    return the_record(folder)


def via_trl_rollout(tok, turns, workspace_root: Path, folder: Path, max_turn_tokens: int | None) -> dict:
    """TRL's ``rollout_func`` with each turn as the token ids a model would sample: a stop turn as
    written, an end-of-message turn followed by the EOS, a cut turn as the ids the cap keeps."""
    plan = []
    for text, end in turns:
        ids = tok.encode(text, add_special_tokens=False)
        plan.append([*ids, tok.eos_token_id] if end == "eos" else ids)

    def generate(trainer, contexts, caps):
        picked = [plan[tok.decode(c, skip_special_tokens=False).count("</Execute>")] for c in contexts]
        return [Generated(ids[:cap], None) for ids, cap in zip(picked, caps, strict=True)]

    rollout = DeepAnalyzeRollout(
        [row()],
        config(workspace_root, folder, "tags"),
        generator=generate,
        max_turn_tokens=max_turn_tokens,
        env_workers=1,
    )
    trainer = SimpleNamespace(
        processing_class=tok,
        args=SimpleNamespace(max_completion_length=4096),
        eos_token_ids=[tok.eos_token_id],
    )
    rollout([trl_prompt(row())], trainer)
    return the_record(folder)


def via_bank(workspace_root: Path, folder: Path) -> dict:
    """The bank's reference-episode loop: its turn source, written from a draft, through the driver."""
    draft = SimpleNamespace(
        cells=[Cell("look", PRINTS_B)], conclusion="Store B.", answer=SimpleNamespace(kind="text")
    )
    env = DeepAnalyzeEnv(config(workspace_root, folder, "tags"), row() | {"task_id": "t1"})
    env.init(row()["prompt"])
    source = ReferenceTurns(draft)  # type: ignore[arg-type]  # the three fields it reads
    try:
        driver.play(env, source)
    finally:
        env.close()
    assert source.problems == [] and source.value == "B"
    return the_record(folder)


def via_served(calls, workspace_root: Path, folder: Path) -> dict:
    session = EpisodeSession(config(workspace_root, folder, "tools"), row())
    session.start()
    for name, arguments in calls:
        session.call(name, arguments)
    assert session.ended == "finished"
    return the_record(folder)


def via_environment_factory(calls, workspace_root: Path, folder: Path) -> dict:
    """TRL's tool path: each dispatched call, then ``get_reward`` (a message without a call ends it)."""
    factory = environment_factory(config(workspace_root, folder, "tools"))
    env = factory()
    env.reset(**row())
    for name, arguments in calls:
        getattr(env, name)(**arguments)
    env.get_reward()
    factory.close()
    return the_record(folder)


def cut_ramble(tok) -> str:
    return tok.decode(tok.encode(RAMBLE, add_special_tokens=False)[:CUT_TOKENS], skip_special_tokens=False)


@pytest.mark.parametrize("scenario", ["stop", "eos", "length"])
def test_tag_turns_give_the_same_record_through_rollout_trl_and_the_bank(
    scenario, tiny_tokenizer, workspace_root, tmp_path
):
    turns = [(cut_ramble(tiny_tokenizer) if t == "<cut RAMBLE>" else t, e) for t, e in TAGS[scenario]]
    assert len(tiny_tokenizer.encode(ANSWER_TURN, add_special_tokens=False)) < CUT_TOKENS
    records = {
        "rollout": via_rollout(turns, workspace_root, tmp_path / "rollout", "tags"),
        "trl": via_trl_rollout(
            tiny_tokenizer,
            [(RAMBLE if e == "length" else t, e) for t, e in turns],
            workspace_root,
            tmp_path / "trl",
            CUT_TOKENS if scenario == "length" else None,
        ),
    }
    if scenario == "stop":
        records["bank"] = via_bank(workspace_root, tmp_path / "bank")
    termination, n, reward, statuses = EXPECTED[("tags", scenario)]
    for path, record in records.items():
        seen = projection(record)
        assert (seen["termination"], seen["turns"], seen["reward"], seen["exec"]) == (
            termination,
            n,
            reward,
            statuses,
        ), path
        assert seen == projection(records["rollout"]), path
        assert record["messages"] == records["rollout"]["messages"], path  # the same turns, cut alike


@pytest.mark.parametrize("scenario", ["stop", "eos", "length"])
def test_tool_turns_give_the_same_record_through_rollout_served_and_trl_tools(
    scenario, workspace_root, tmp_path
):
    records = {"rollout": via_rollout(TOOLS[scenario], workspace_root, tmp_path / "rollout", "tools")}
    calls = {"stop": [("run_python", {"code": PRINTS_B}), ("submit_answer", {"answer": "B"})], "eos": []}
    if scenario in calls:
        records["environment_factory"] = via_environment_factory(
            calls[scenario], workspace_root, tmp_path / "factory"
        )
    if scenario == "stop":
        records["served"] = via_served(calls["stop"], workspace_root, tmp_path / "served")
    termination, n, reward, statuses = EXPECTED[("tools", scenario)]
    for path, record in records.items():
        seen = projection(record)
        assert (seen["termination"], seen["turns"], seen["reward"], seen["exec"]) == (
            termination,
            n,
            reward,
            statuses,
        ), path
        assert seen == projection(records["rollout"]), path


def test_apply_turn_maps_each_end_to_its_env_call():
    """The driver's table, against an env that records which call it got."""

    class Calls:
        def __init__(self):
            self.got = []

        def step(self, text):
            self.got.append(("step", text))

        def end_with_eos(self, text):
            self.got.append(("end_with_eos", text))

        def end_for_length(self):
            self.got.append(("end_for_length",))

        def act(self, call, raw=None):
            self.got.append(("act", call, raw))

    from deepanalyze_env.core.tool_calls import ParsedTurn

    env = Calls()
    call = ParsedTurn("", ToolCall("submit_answer", "B"))
    for turn in (
        Turn("a", "stop"),
        Turn("b", "eos"),
        Turn("c", "length"),
        Turn("d", "length", out_of_budget=True),
        Turn("", call=call),
    ):
        driver.apply_turn(env, turn)  # type: ignore[arg-type]  # the four calls it makes
    assert env.got == [
        ("step", "a"),
        ("end_with_eos", "b"),
        ("step", "c"),  # a turn-level cut is stepped as it stands
        ("end_for_length",),  # the episode's budget: never stepped
        ("act", call, None),
    ]


def test_a_parsed_call_that_did_not_end_at_its_call_is_refused():
    from deepanalyze_env.core.tool_calls import ParsedTurn

    with pytest.raises(ValueError, match="stop"):
        Turn("", "eos", call=ParsedTurn("", None))


def _env_turn_calls(source: str) -> list[str]:
    """``<receiver>.step/act/end_with_eos(...)`` calls on an env (a receiver named ``env``)."""
    import ast
    import re

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = ast.unparse(node.func.value)
            if node.func.attr in ("step", "act", "end_with_eos") and re.search(r"(^|\.)_?env$", receiver):
                found.append(f"{node.lineno}: {receiver}.{node.func.attr}")
    return found


def test_no_episode_loop_maps_a_turn_end_to_an_env_call_itself():
    root = Path(__file__).resolve().parent.parent / "deepanalyze_env"
    owners = {root / "core" / "driver.py", root / "core" / "env.py"}
    bad = [
        f"{path.relative_to(root.parent)}:{hit}"
        for path in sorted(root.rglob("*.py"))
        if path not in owners
        for hit in _env_turn_calls(path.read_text(encoding="utf-8"))
    ]
    assert bad == []


def test_the_turn_call_check_sees_a_loop_that_steps_the_env_itself():
    """Negative control: the check catches the loops this driver replaced."""
    source = (
        "def f(ep, text, end):\n    return ep.env.end_with_eos(text) if end == 'eos' else ep.env.step(text)\n"
    )
    assert _env_turn_calls(source) == ["2: ep.env.end_with_eos", "2: ep.env.step"]
    assert _env_turn_calls("policy.act(ctx)\noptimizer.step()\n") == []
