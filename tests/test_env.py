"""DeepAnalyzeEnv end to end through the real skyrl_gym registry, real kernels and workspaces."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest
import skyrl_gym

import deepanalyze_env
from deepanalyze_env.core.config import ConfigError
from rewards import register_reward
from rewards.judge.fake_server import FakeJudgeServer, Reply
from tests.conftest import code, qa_extras, wait_gone

ANSWER_B = "<Analyze>done</Analyze>\n<Answer>\nStore B has the most.\nAnswer: B\n</Answer>"
PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]


@register_reward("test_needs_judge", needs_judge=True)
def _needs_judge(answer: str | None) -> float:
    return 1.0


def make(root: Path, extras: dict | None = None, **config):
    config.setdefault("workspace_root", str(root))
    config.setdefault("executor", {"timeout_s": 2})
    return skyrl_gym.make("deepanalyze", env_config=config, extras=extras or qa_extras())


@pytest.fixture
def env(workspace_root: Path):
    e = make(workspace_root)
    e.init(PROMPT)
    yield e
    e.close()


def test_import_registers_the_env_id():
    assert "deepanalyze" in skyrl_gym.registry


def test_registration_is_idempotent():
    deepanalyze_env.register()
    importlib.reload(deepanalyze_env)
    deepanalyze_env.register()
    assert skyrl_gym.registry["deepanalyze"].entry_point == "deepanalyze_env.core.env:DeepAnalyzeEnv"


def test_full_episode_produces_contract_metadata(env):
    first = env.step(
        code("import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum())")
    )
    assert first["done"] is False and first["reward"] == 0.0
    assert first["metadata"]["code_pass"] == 1
    assert first["metadata"]["exec"]["status"] == "ok"
    assert set(first["metadata"]["exec"]) == {"status", "elapsed_ms", "truncated"}
    obs = first["observations"][0]
    assert obs["role"] == "user"
    assert obs["content"].startswith("\n<Execute>\n") and obs["content"].endswith("\n</Execute>\n")
    assert "32" in obs["content"]

    error = env.step(code("print(undefined_name)"))
    assert error["metadata"]["code_pass"] == 0 and error["metadata"]["exec"]["status"] == "error"
    assert "NameError" in error["observations"][0]["content"]

    timeout = env.step(code("while True:\n    pass"))
    assert timeout["metadata"]["exec"]["status"] == "timeout" and timeout["metadata"]["code_pass"] == 0

    final = env.step(ANSWER_B)
    assert final["done"] is True and final["observations"] == []
    meta = final["metadata"]
    assert meta["reward_status"] == "scored"
    assert meta["reward_components"] == {"qa_accuracy": 1.0, "qa_exact": 1.0}
    assert final["reward"] == 1.0
    assert meta["format_ok"] is True and meta["gate"] is None
    assert meta["termination"] == "answer"
    assert meta["code_pass"] == [1, 0, 0]
    assert meta["turns"] == 4
    assert "error" not in meta


def test_text_after_the_closing_code_tag_is_dropped(env):
    out = env.step(code("print(1)") + "\n<Answer>Answer: B</Answer>")
    assert out["done"] is False
    assert out["postprocessed_action"].endswith("</Code>")


def test_turn_without_code_is_a_failed_turn_with_a_clear_observation(env):
    out = env.step("<Analyze>I am thinking</Analyze>")
    assert out["metadata"]["exec"]["status"] == "no_code" and out["metadata"]["code_pass"] == 0
    assert "No code was found" in out["observations"][0]["content"]


def test_printed_tags_do_not_satisfy_the_gate(env):
    env.step("<Code>\nt = 'Analyze>'\nprint('<' + t + 'x</' + t)\n</Code>")
    assert "<Analyze>x</Analyze>" in env.messages[-1]["content"]
    out = env.step("<Answer>Answer: B</Answer>")
    assert out["reward"] == -1.0
    assert out["metadata"]["reward_components"] == {"format_gate": -1.0}
    assert out["metadata"]["gate"] == "tags" and out["metadata"]["format_ok"] is False


def test_wrong_answer_scores_zero(env):
    out = env.step(ANSWER_B.replace("Answer: B", "Answer: A"))
    assert out["reward"] == 0.0 and out["metadata"]["reward_components"]["qa_accuracy"] == 0.0


def test_observation_role_comes_from_config(workspace_root):
    e = make(workspace_root, observation_role="tool")
    e.init(PROMPT)
    try:
        assert e.step(code("print(1)"))["observations"][0]["role"] == "tool"
    finally:
        e.close()


def test_row_max_turns_wins_over_config(workspace_root):
    e = make(workspace_root, qa_extras(max_turns=2), max_turns=5)
    e.init(PROMPT)
    try:
        assert e.step(code("print(1)"))["done"] is False
        last = e.step(code("print(2)"))
        assert last["done"] is True and last["metadata"]["termination"] == "max_turns"
        assert last["reward"] == -1.0  # never answered: the gate fails
        assert last["metadata"]["code_pass"] == [1]  # the last turn's code is not run
    finally:
        e.close()


def test_config_max_turns_is_the_default(workspace_root):
    e = make(workspace_root, max_turns=1)
    e.init(PROMPT)
    try:
        assert e.step(code("print(1)"))["metadata"]["termination"] == "max_turns"
    finally:
        e.close()


def test_protocol_system_prompt_is_prepended(workspace_root):
    e = make(workspace_root, system_prompt="protocol")
    messages, _ = e.init(PROMPT)
    e.close()
    assert messages[0]["role"] == "system" and "<Code>" in messages[0]["content"]
    assert "<Answer>" in messages[0]["content"] and messages[1:] == PROMPT


def test_system_prompt_from_a_file(workspace_root, tmp_path):
    path = tmp_path / "sys.md"
    path.write_text("Be brief.")
    e = make(workspace_root, system_prompt=str(path))
    messages, _ = e.init(PROMPT)
    e.close()
    assert messages[0] == {"role": "system", "content": "Be brief."}


def test_no_system_prompt_by_default(env):
    assert env.messages[0]["role"] == "user"


@pytest.mark.parametrize(
    ("config", "extras", "message"),
    [
        ({"executor": {"timout_s": 3}}, None, r"unknown key env_config\.executor\.timout_s"),
        ({"max_turn": 3}, None, r"unknown key env_config\.max_turn"),
        ({}, {"data": "data", "workspace_id": "ws"}, "reward_spec is missing"),
        ({}, qa_extras(workspace_id="nope"), "workspace folder does not exist"),
        ({"workspace_root": ""}, None, "workspace_root is not set"),
        (
            {},
            qa_extras(reward_spec={"method": "datatask", "function": ["test_needs_judge"]}),
            "needs a judge",
        ),
        ({}, qa_extras(reward_spec={"method": "qa", "function": ["nope_fn"]}), "unknown reward function"),
        ({"profile": "v9"}, None, "profile must be one of"),
        ({"system_prompt": "/no/such/prompt.md"}, None, "no such file"),
        ({"executor": {"timeout_s": "soon"}}, None, "must be a number"),
    ],
)
def test_bad_settings_fail_at_construction_naming_the_problem(workspace_root, config, extras, message):
    with pytest.raises(ConfigError, match=message):
        make(workspace_root, extras, **config)


def test_agent_cannot_modify_the_source_data(env, workspace_root):
    source = workspace_root / "data" / "ws" / "sales.csv"
    before = source.read_bytes()
    out = env.step(
        code("import os\nos.remove('sales.csv')\nopen('new.txt', 'w').write('x')\nprint(os.listdir('.'))")
    )
    assert out["metadata"]["code_pass"] == 1
    assert source.read_bytes() == before
    assert sorted(p.name for p in source.parent.iterdir()) == ["sales.csv"]


def test_close_removes_the_scratch_folder_and_the_worker(workspace_root):
    e = make(workspace_root)
    e.init(PROMPT)
    scratch, pid = e.workspace.path, e.kernel.pid
    assert scratch.is_dir()
    e.close()
    e.close()  # idempotent
    assert not scratch.exists()
    assert wait_gone(pid)


def test_task_without_workspace_runs_code_in_an_empty_folder(workspace_root):
    e = make(workspace_root, qa_extras(data=None, workspace_id=None))
    e.init(PROMPT)
    try:
        assert e.step(code("import os\nprint(os.listdir('.'))"))["observations"][0]["content"] == (
            "\n<Execute>\n[]\n\n</Execute>\n"
        )
    finally:
        e.close()


def test_step_never_raises_for_strange_actions(env):
    for action in [
        "",
        "\x00\x00",
        "<Code>",
        "</Code></Code>",
        "<Code>```python\n\ud800\n```</Code>",
        "é" * 10000,
    ]:
        out = env.step(action)
        assert out["done"] is False and out["metadata"]["code_pass"] == 0


def test_worker_killed_after_a_cell_is_the_policys_crash(env):
    """Nothing the trainer side holds tells this SIGKILL from one a cell forged (issue 26)."""
    env.step(code("print(1)"))
    os.kill(env.kernel.pid, 9)
    assert wait_gone(env.kernel.pid)
    out = env.step(code("print(2)"))
    assert out["done"] is False and out["metadata"]["exec"]["status"] == "crashed"
    assert "KernelDied" in out["observations"][0]["content"]


def test_step_after_done_repeats_the_final_result(env):
    final = env.step(ANSWER_B)
    again = env.step(code("print(1)"))
    assert again["done"] is True and again["reward"] == final["reward"]


def test_metrics_are_numeric(env):
    env.step(code("print(1)"))
    env.step(ANSWER_B)
    metrics = env.get_metrics()
    assert metrics["turns"] == 2 and metrics["code_pass_rate"] == 1.0
    assert metrics["reward/qa_accuracy"] == 1.0 and metrics["status_scored"] == 1.0
    assert all(isinstance(v, int | float) for v in metrics.values())


class _JudgeReplyUnreadable(RuntimeError):
    """Stands in for the judge's parse failure (``rewards/judge/errors.py`` names the real cause)."""

    verifier_cause = "judge_parse"


@register_reward("test_unreadable_verdict")
def _unreadable_verdict(answer: str | None) -> float:
    raise _JudgeReplyUnreadable("no SCORE line")


def _excluded(root: Path, tmp_path: Path):
    spec = {"method": "qa_plain", "ground_truth": "B", "function": ["test_unreadable_verdict"]}
    e = make(root, qa_extras(reward_spec=spec), records_dir=str(tmp_path / "records"))
    e.init(PROMPT)
    return e, e.step(ANSWER_B)


def test_a_verifier_error_names_its_cause_in_the_final_metadata(workspace_root, tmp_path):
    e, final = _excluded(workspace_root, tmp_path)
    e.close()
    assert final["metadata"]["reward_status"] == "verifier_error"
    assert final["metadata"]["reward_error_cause"] == "judge_parse"


def test_a_scored_episode_has_a_null_error_cause(env):
    assert env.step(ANSWER_B)["metadata"]["reward_error_cause"] is None


def test_env_metrics_give_the_verifier_error_cause_as_zero_or_one_for_each_cause(workspace_root, tmp_path):
    e, _ = _excluded(workspace_root, tmp_path)
    metrics = e.get_metrics()
    e.close()
    assert {k: v for k, v in metrics.items() if k.startswith("verifier_error_")} == {
        "verifier_error_judge_parse": 1.0,
        "verifier_error_context_length": 0.0,
        "verifier_error_judge_call": 0.0,
        "verifier_error_reward_raised": 0.0,
    }


def test_env_metrics_give_every_cause_for_an_unfinished_episode_too(env):
    env.step(code("print(1)"))
    metrics = env.get_metrics()
    assert metrics["finished"] == 0.0
    assert [
        metrics[f"verifier_error_{c}"]
        for c in ("judge_parse", "context_length", "judge_call", "reward_raised")
    ] == [0.0] * 4


def test_the_record_carries_the_verifier_error_cause(workspace_root, tmp_path):
    e, _ = _excluded(workspace_root, tmp_path)
    e.close()
    [path] = list((tmp_path / "records").glob("episodes-*.jsonl"))
    record = json.loads(path.read_text().splitlines()[0])
    assert (record["reward_status"], record["reward_error_cause"]) == ("verifier_error", "judge_parse")


@pytest.mark.parametrize(
    ("reply", "cause"),
    [
        (Reply(text="I would rather not give a score."), "judge_parse"),
        (Reply(status=503, text=None, raw_body="overloaded"), "judge_call"),
    ],
    ids=["unreadable-verdict", "judge-down"],
)
def test_a_real_judges_failure_is_excluded_under_its_cause(workspace_root, reply, cause):
    """A judge on a real HTTP server that answers without a verdict, or with a 5xx: the judge's own
    exception classes name the cause (``rewards/judge/errors.py``)."""
    with FakeJudgeServer(reply) as judge:
        e = make(
            workspace_root,
            qa_extras(reward_spec={"method": "qa", "ground_truth": "B"}),
            judge={"backend": "openai", "base_url": judge.url, "model": "j", "max_retries": 0},
        )
        try:
            e.init(PROMPT)
            meta = e.step(ANSWER_B)["metadata"]
        finally:
            e.close()
    assert (meta["reward_status"], meta["reward_error_cause"]) == ("verifier_error", cause)


def test_a_task_too_long_for_the_judge_is_excluded_as_context_length(workspace_root):
    """The task's own question does not fit the judge's prompt budget: not the policy's doing, so
    the episode is excluded, under its cause."""
    with FakeJudgeServer(Reply(text="SCORE: 3")) as judge:
        e = make(
            workspace_root,
            qa_extras(reward_spec={"method": "qa", "ground_truth": "B"}, input_seq="Which store? " * 2000),
            judge={"base_url": judge.url, "model": "j", "max_retries": 0, "max_prompt_tokens": 2000},
        )
        try:
            e.init(PROMPT)
            meta = e.step(ANSWER_B)["metadata"]
        finally:
            e.close()
    assert (meta["reward_status"], meta["reward_error_cause"]) == ("verifier_error", "context_length")


def test_records_are_appended_on_close(workspace_root, tmp_path):
    records = tmp_path / "records"
    e = make(workspace_root, qa_extras(task_id="t-1"), records_dir=str(records), policy_id="pol-7")
    e.init(PROMPT)
    e.step(code("print(1)"))
    e.step(ANSWER_B)
    e.close()
    [path] = list(records.glob("episodes-*.jsonl"))
    assert path.name.endswith(f"-{os.getpid()}.jsonl")
    [line] = path.read_text().splitlines()
    record = json.loads(line)
    assert record["task_id"] == "t-1" and record["reward"] == 1.0
    assert [m["role"] for m in record["messages"]] == ["user", "assistant", "user", "assistant"]
    assert record["versions"]["policy_id"] == "pol-7"
    assert record["versions"]["kernel"]["pandas"]
    assert record["reward_spec"] == {"method": "qa_plain", "ground_truth": "B"}


def test_sandbox_settings_reach_the_worker(workspace_root):
    e = make(workspace_root, executor={"timeout_s": 5, "sandbox": {"file_size_mb": 1}})
    e.init(PROMPT)
    try:
        out = e.step(code("open('big.bin', 'wb').write(b'x' * 3 * 1024 * 1024)"))
        assert out["metadata"]["exec"]["status"] == "error"
        assert "File too large" in out["observations"][0]["content"]
    finally:
        e.close()


def test_unknown_sandbox_key_is_rejected(workspace_root):
    with pytest.raises(ConfigError, match=r"unknown key env_config\.executor\.sandbox\.max_procs"):
        make(workspace_root, executor={"sandbox": {"max_procs": 3}})


# --- row_errors: a bad row as a failed episode, for trainers whose batch must survive it -------


@pytest.mark.parametrize(
    "bad, problem",
    [
        ({"workspace_id": "gone"}, "workspace folder does not exist"),
        ({"reward_spec": {"method": "no_such_method"}}, "no_such_method"),
    ],
)
def test_with_row_errors_episode_a_bad_row_is_an_environment_error_episode(
    workspace_root, tmp_path, bad, problem
):
    records = tmp_path / "records"
    env = make(workspace_root, qa_extras(**bad), row_errors="episode", records_dir=str(records))
    env.init([{"role": "user", "content": "Which store?"}])
    out = env.step(code("print(1)"))
    assert out["done"] is True and out["metadata"]["reward_status"] == "environment_error"
    assert problem in out["metadata"]["error"]
    assert env.get_metrics()["status_environment_error"] == 1.0
    env.close()
    (line,) = next(records.iterdir()).read_text().splitlines()
    record = json.loads(line)
    assert record["reward_status"] == "environment_error" and problem in record["error"]


def test_by_default_a_bad_row_fails_construction():
    with pytest.raises(ConfigError, match="row_errors must be one of raise, episode"):
        make(Path("/nonexistent"), qa_extras(), row_errors="sometimes")
    with pytest.raises(ConfigError, match="workspace folder does not exist"):
        make(Path("/nonexistent"), qa_extras())


def test_a_bad_reward_argument_fails_construction_with_one_line_naming_the_task(workspace_root):
    spec = {"method": "verified", "function": [{"name": "answer_match", "args": {"tolerance": 0.5}}]}
    with pytest.raises(ConfigError) as info:
        make(workspace_root, qa_extras(task_id="t7", reward_spec=spec))
    assert str(info.value) == (
        "task 't7': reward_spec.function[0] (answer_match): unknown argument 'tolerance' "
        "(answer_match takes: none)"
    )


def test_a_tag_turn_the_reader_cannot_read_fails_the_gate_and_is_scored(env, monkeypatch):
    """A reader bug cannot be produced from real text (the readers are total), so this one is
    simulated by replacing the code extractor: the guard around reading is what is tested."""

    def broken(text: str):
        raise RecursionError("simulated reader failure")

    monkeypatch.setattr("deepanalyze_env.core.protocol.extract_code", broken)
    out = env.step(code("print(1)"))
    meta = out["metadata"]
    assert out["done"] is True and meta["reward_status"] == "scored" and out["reward"] == -1.0
    assert meta["gate"] == "tags"
    assert "unreadable turn (RecursionError)" in meta["reward_notes"]["format_gate"]
