"""Recovery tasks: rows with a ``prefix`` replayed at ``init``, the ``recovery`` component and
``deepanalyze-rl recover`` — real kernels, real workspaces, real env; records written by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepanalyze_env.cli.app import main
from deepanalyze_env.core.config import ConfigError, EnvConfig
from deepanalyze_env.core.env import DeepAnalyzeEnv
from deepanalyze_env.core.row_check import check_rows
from deepanalyze_env.core.tasks import env_extras, load_rows
from rewards.recovery import recovery
from tests.conftest import code

PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]
WRITE = code(
    "import pandas as pd\n"
    "pd.read_csv('sales.csv').groupby('store').revenue.sum().to_csv('totals.csv')\n"
    "print('saved')"
)
FAIL = code("raise ValueError('boom')")
# What the kernel prints for them (written by hand from the DeepAnalyze-style executor format).
SAVED = "\n<Execute>\nsaved\n\n</Execute>\n"
BOOM = (
    "\n<Execute>\n[Error]:\nTraceback (most recent call last):\n"
    '  File "<string>", line 1, in <module>\n'
    "    raise ValueError('boom')\nValueError: boom\n\n</Execute>\n"
)
PREFIX = [
    {"role": "assistant", "content": WRITE},
    {"role": "user", "content": SAVED},
    {"role": "assistant", "content": FAIL},
    {"role": "user", "content": BOOM},
]
# Turns after the prefix that do not depend on it, so they can also be played from scratch.
BEST = code("import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum().idxmax())")
ANSWER = "<Analyze>B sells most</Analyze>\n<Answer>\nAnswer: B\n</Answer>"
SPEC = {"method": "verified", "function": ["answer_match"], "ground_truth": "B"}


def extras(prefix=PREFIX, spec=SPEC, **over) -> dict:
    row = {"reward_spec": dict(spec), "data": "data", "workspace_id": "ws", "input_seq": "Which store?"}
    if prefix is not None:
        row["prefix"] = [dict(m) for m in prefix]
    row.update(over)
    return row


def make(root: Path, row: dict, **config) -> DeepAnalyzeEnv:
    config.setdefault("workspace_root", str(root))
    config.setdefault("executor", {"timeout_s": 5})
    return DeepAnalyzeEnv(config, extras=row)


def play(root: Path, row: dict, turns: list[str], **config) -> dict:
    env = make(root, row, **config)
    env.init(PROMPT)
    try:
        for turn in turns:
            out = env.step(turn)
            if out["done"]:
                return {"reward": out["reward"], **out["metadata"]}
        raise AssertionError("the episode did not end")
    finally:
        env.close()


# ---------------------------------------------------------------------------- the env


def test_recovered_task_starts_with_the_file_present_and_the_failure_shown(workspace_root: Path):
    assert not (workspace_root / "data" / "ws" / "totals.csv").exists()  # only the prefix writes it
    env = make(workspace_root, extras())
    messages, _ = env.init(PROMPT)
    try:
        assert messages == [*PROMPT, *PREFIX]  # the failure is the last thing the policy is shown
        out = env.step(code("print(open('totals.csv').read())"))
        assert out["metadata"]["exec"]["status"] == "ok"
        assert out["observations"][0]["content"] == "\n<Execute>\nstore,revenue\nA,15\nB,32\n\n\n</Execute>\n"
    finally:
        env.close()


def test_stateful_cells_get_the_prefix_variables_back(workspace_root: Path):
    prefix = [
        {"role": "assistant", "content": code("x = 41\nprint('set')")},
        {"role": "user", "content": "\n<Execute>\nset\n\n</Execute>\n"},
        {"role": "assistant", "content": FAIL},
        {"role": "user", "content": BOOM},
    ]
    env = make(workspace_root, extras(prefix), stateful_cells=True)
    env.init(PROMPT)
    try:
        out = env.step(code("print(x + 1)"))
        assert out["observations"][0]["content"] == "\n<Execute>\n42\n\n</Execute>\n"
    finally:
        env.close()


def test_a_prefix_whose_replay_differs_is_an_environment_error(workspace_root: Path):
    prefix = [dict(m) for m in PREFIX]
    prefix[1]["content"] = "\n<Execute>\nsaved twice\n\n</Execute>\n"
    result = play(workspace_root, extras(prefix), [BEST])
    assert result["reward_status"] == "environment_error" and result["termination"] == "error"
    assert result["error"].startswith("prefix replay differs at prefix turn 1 of 2: ")
    assert "'saved twice'" in result["error"] and "replayed 'saved'" in result["error"]
    assert result["exec"] == []  # the policy's turn was not run on a wrong state


def test_a_malformed_prefix_is_refused_at_construction(workspace_root: Path):
    with pytest.raises(ConfigError, match=r"extras.prefix\[1\] must be the <Execute> observation"):
        make(workspace_root, extras([PREFIX[0], {"role": "user", "content": "no tags"}]))


def test_turn_limit_counts_only_the_turns_after_the_prefix(workspace_root: Path):
    env = make(workspace_root, extras(max_turns=2))
    env.init(PROMPT)
    try:
        first = env.step(BEST)  # the prefix holds 2 turns; with them this would be turn 3 > 2
        assert first["done"] is False
        last = env.step(BEST)
        assert last["done"] is True and last["metadata"]["termination"] == "max_turns"
        assert last["metadata"]["turns"] == 2
    finally:
        env.close()


# ---------------------------------------------------------------------------- rewards


SHAPED = {
    "method": "verified",
    "function": ["answer_match", "datatask_code", "openresearch_turns"],
    "ground_truth": "B",
}


def test_recovered_episode_scores_like_its_own_turns_played_from_scratch(workspace_root: Path):
    recovered = play(workspace_root, extras(spec=SHAPED), [BEST, ANSWER])
    scratch = play(workspace_root, extras(None, spec=SHAPED), [BEST, ANSWER])
    # by hand: answer right, 1 of 1 cells passed (ran and printed) → min(1/10, 1)
    expected = {"answer_match": 1.0, "datatask_code": 1.0, "openresearch_turns": 0.1}
    assert recovered["reward_components"] == scratch["reward_components"] == expected
    assert recovered["reward"] == pytest.approx(scratch["reward"]) == pytest.approx(2.1 / 3)
    assert recovered["code_pass"] == [1] and recovered["turns"] == 2


def test_the_prefix_turns_are_not_scored(workspace_root: Path):
    """Played from scratch with the prefix's turns, the failed cell and the extra turns count."""
    whole = play(workspace_root, extras(None, spec=SHAPED), [WRITE, FAIL, BEST, ANSWER])
    assert whole["reward_components"] == {
        "answer_match": 1.0,
        "datatask_code": pytest.approx(2 / 3),
        "openresearch_turns": pytest.approx(0.2),  # WRITE and BEST passed: 2 / 10
    }


def test_the_gate_reads_only_the_policy_turns_after_the_prefix(workspace_root: Path):
    # the prefix holds <Analyze>; the policy's own turns here do not
    result = play(workspace_root, extras(), ["<Answer>\nAnswer: B\n</Answer>"])
    assert result["gate"] == "tags" and result["reward"] == -1.0


RECOVERY = {
    "method": "verified",
    "function": ["answer_match", "recovery"],
    "ground_truth": "B",
    "weights": {"answer_match": 1.0, "recovery": 1.0},
}


@pytest.mark.parametrize(
    ("turns", "expected"),
    [
        ([BEST, ANSWER], 1.0),  # the first cell after the failure runs
        ([FAIL, BEST, ANSWER], 0.0),  # it fails again, even if a later one runs
        (["<Analyze>think</Analyze>", BEST, ANSWER], 1.0),  # a turn without code runs no cell
        ([ANSWER], 0.0),  # no cell at all after the failure: nothing was fixed
        ([code("pass"), BEST, ANSWER], 0.0),  # a cell that shows nothing fixes nothing (issue 39)
    ],
)
def test_recovery_component_is_whether_the_first_cell_after_the_prefix_runs(workspace_root, turns, expected):
    result = play(workspace_root, extras(spec=RECOVERY), turns)
    assert result["reward_components"]["recovery"] == expected
    assert result["reward"] == pytest.approx((1.0 + expected) / 2)


def test_recovery_component_on_a_row_without_prefix_is_refused(workspace_root: Path):
    with pytest.raises(ConfigError, match="'recovery' needs a row with a prefix"):
        make(workspace_root, extras(None, spec=RECOVERY))


def test_a_reward_that_needs_a_prefix_is_refused_under_any_name(workspace_root: Path):
    # the rule is the reward's declaration (needs_prefix), not its component's name
    renamed = {**RECOVERY, "function": ["answer_match", {"name": "recovery", "as": "fixed"}], "weights": {}}
    with pytest.raises(ConfigError, match="'fixed' needs a row with a prefix"):
        make(workspace_root, extras(None, spec=renamed))


def test_recovery_function_never_scores_a_context_without_prefix():
    with pytest.raises(ValueError, match="only to a row with a prefix"):
        recovery(exec_statuses=["ok"], code_pass=[1], prefix_turns=0)


# ---------------------------------------------------------------------------- recover


def record(episode_id: str, messages: list[dict], statuses: list[str], status: str = "scored") -> dict:
    """A record as the env writes it (docs/design.md section 9), by hand."""
    return {
        "episode_id": episode_id,
        "task_id": f"task-{episode_id}",
        "task_hash": "0" * 16,
        "reward_spec": dict(SPEC),
        "input_seq": "Which store?",
        "data": "data",
        "workspace_id": "ws",
        "messages": messages,
        "reward": 1.0 if status == "scored" else 0.0,
        "reward_components": {"answer_match": 1.0} if status == "scored" else {},
        "reward_status": status,
        "format_ok": True,
        "gate": None,
        "termination": "answer",
        "code_pass": [int(s == "ok") for s in statuses],
        "turns": sum(1 for m in messages if m["role"] == "assistant"),
        "exec": [{"status": s, "elapsed_ms": 1.0, "truncated": False} for s in statuses],
        "judge": None,
        "usage": None,
        "versions": {"package": "0", "profile": "v1"},
        "timings": {},
        "error": None,
    }


ANSWERED = [{"role": "assistant", "content": ANSWER}]
OK_ONLY = [{"role": "assistant", "content": WRITE}, {"role": "user", "content": SAVED}]
DIFFERS = [dict(m) for m in PREFIX]
DIFFERS[1] = {"role": "user", "content": "\n<Execute>\nsaved at 10:42\n\n</Execute>\n"}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    records = [
        record("good", [*PROMPT, *PREFIX, *ANSWERED], ["ok", "error"]),
        record("clean", [*PROMPT, *OK_ONLY, *ANSWERED], ["ok"]),
        record("judge-down", [*PROMPT, *PREFIX, *ANSWERED], ["ok", "error"], status="verifier_error"),
        record("differs", [*PROMPT, *DIFFERS, *ANSWERED], ["ok", "error"]),
        record("twice", [*PROMPT, *PREFIX, FAIL_TURN, BOOM_OBS, *ANSWERED], ["ok", "error", "error"]),
    ]
    folder = tmp_path / "run" / "records"
    folder.mkdir(parents=True)
    (folder / "episodes-host-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path / "run"


FAIL_TURN = {"role": "assistant", "content": FAIL}
BOOM_OBS = {"role": "user", "content": BOOM}


def recover_cli(run: Path, out: Path, root: Path, *extra: str) -> int:
    return main(["recover", str(run), "--out", str(out), "--workspace-root", str(root), *extra])


def read_rows(path: Path) -> dict[str, dict]:
    return {r["task_id"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_recover_cuts_each_failed_cell_of_scored_episodes(run_dir, workspace_root, tmp_path, capsys):
    out = tmp_path / "recover.jsonl"
    assert recover_cli(run_dir, out, workspace_root) == 0
    rows = read_rows(out)
    assert sorted(rows) == [
        "task-good/recover/good/turn2",
        "task-twice/recover/twice/turn2",
        "task-twice/recover/twice/turn3",
    ]
    row = rows["task-good/recover/good/turn2"]
    assert row["prompt"] == PROMPT and row["prefix"] == PREFIX
    assert row["lineage"] == {
        "parent_episode_id": "good",
        "parent_task_id": "task-good",
        "cut_turn": 2,
        "failed_status": "error",
    }
    assert (row["reward_spec"], row["data"], row["workspace_id"]) == (SPEC, "data", "ws")
    assert rows["task-twice/recover/twice/turn3"]["prefix"] == [*PREFIX, FAIL_TURN, BOOM_OBS]
    printed = capsys.readouterr().out
    assert "skipped: not reproducible" in printed and "task-differs/recover/differs/turn2" in printed
    assert "'saved at 10:42'" in printed


def test_recover_counts_what_it_left_out(run_dir, workspace_root, tmp_path):
    from deepanalyze_env.core.records import load_run
    from deepanalyze_env.offline.recover import recover

    report = recover(load_run(run_dir).records, {"workspace_root": str(workspace_root)})
    assert (report.read, report.not_scored, report.no_failure, report.cuts) == (5, 1, 1, 4)
    assert report.skipped == 1 and len(report.rows) == 3


def test_recover_keep_and_first_cut_only(run_dir, workspace_root, tmp_path):
    out = tmp_path / "recover.jsonl"
    keep = 'episode_id == "twice"'
    assert recover_cli(run_dir, out, workspace_root, "--keep", keep, "--cuts", "first") == 0
    assert sorted(read_rows(out)) == ["task-twice/recover/twice/turn2"]


def test_recovered_rows_load_check_and_play(run_dir, workspace_root, tmp_path):
    out = tmp_path / "recover.jsonl"
    assert recover_cli(run_dir, out, workspace_root, "--keep", 'episode_id == "good"') == 0
    rows = load_rows([out], str(workspace_root))
    bad, checked = check_rows(
        [(str(out), 0, rows[0])], EnvConfig.from_any({"workspace_root": str(workspace_root)})
    )
    assert (bad, checked) == ([], 1)
    env = make(workspace_root, env_extras(rows[0]))
    messages, _ = env.init(rows[0]["prompt"])
    try:
        assert messages[-1]["content"] == BOOM
        assert env.step(code("print(open('totals.csv').read().count('\\n'))"))["observations"][0][
            "content"
        ] == ("\n<Execute>\n3\n\n</Execute>\n")
    finally:
        env.close()


def test_recover_refuses_to_overwrite(run_dir, workspace_root, tmp_path, capsys):
    out = tmp_path / "recover.jsonl"
    out.write_text("keep me\n")
    assert recover_cli(run_dir, out, workspace_root) == 2
    assert out.read_text() == "keep me\n" and "exists" in capsys.readouterr().out


def test_recover_can_weight_the_recovery_component(run_dir, workspace_root, tmp_path):
    out = tmp_path / "recover.jsonl"
    args = ("--keep", 'episode_id == "good"', "--recovery-weight", "0.5")
    assert recover_cli(run_dir, out, workspace_root, *args) == 0
    [row] = read_rows(out).values()
    assert row["reward_spec"] == {
        **SPEC,
        "function": ["answer_match", "recovery"],
        "weights": {"recovery": 0.5},
    }
    result = play(workspace_root, env_extras(row), [FAIL, BEST, ANSWER])
    assert result["reward_components"] == {"answer_match": 1.0, "recovery": 0.0}
    assert result["reward"] == pytest.approx(1.0 / 1.5)  # by hand: (1·1 + 0.5·0) / (1 + 0.5)
