"""``deepanalyze-rl rescore`` after a judge outage: a real judge server that first fails, then works."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from deepanalyze_env.cli import main
from deepanalyze_env.core.records import load_run, read_records
from deepanalyze_env.offline.rescore import context_from_record
from rewards import register_reward
from rewards.judge.fake_server import FakeJudgeServer, Reply
from tests.conftest import code

ANSWERS = {"t0": "B", "t1": "A"}  # t1's trajectory answers wrongly
SCORE_4 = Reply(text="Weaknesses:\n- terse\nSCORE: 4")
SCORE_2 = Reply(text="Weaknesses:\n- wrong store\nSCORE: 2")


def write_inputs(tmp: Path, method: str = "qa") -> tuple[Path, Path]:
    tasks = tmp / "tasks.jsonl"
    trajectories = tmp / "trajectories.jsonl"
    spec = {"method": method, "ground_truth": "B"}
    if method == "datatask":
        spec["function"] = ["judge_accuracy"]
    with tasks.open("w") as t, trajectories.open("w") as j:
        for tid, answer in ANSWERS.items():
            instruction = f"Which store has the highest revenue? ({tid})"
            t.write(json.dumps({"id": tid, "method": method, "instruction": instruction, "data": "data",
                                "workspace_id": "ws", "reward_spec": spec}) + "\n")  # fmt: skip
            turns = [
                code("import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum())"),
                f"<Analyze>Store {answer} leads.</Analyze>\n<Answer>\nAnswer: {answer}\n</Answer>",
            ]
            j.write(json.dumps({"task_id": tid, "label": "good", "turns": turns}) + "\n")
    return tasks, trajectories


def rollout(tmp: Path, root: Path, judge: FakeJudgeServer, *extra: str, method: str = "qa") -> Path:
    tasks, trajectories = write_inputs(tmp, method)
    config = tmp / "env.yaml"
    config.write_text("judge:\n  max_retries: 0\n  timeout_s: 5\n")
    out = tmp / "run"
    args = ["rollout", "--tasks", str(tasks), "--trajectories", str(trajectories), "--labels", "good"]
    args += ["--workspace-root", str(root), "--out", str(out), "--config", str(config), "--samples", "2"]
    assert main([*args, "--judge-base-url", judge.url, "--judge-model", "judge-m", *extra]) == 0
    return out


def rescore(run: Path, url: str, *extra: str) -> int:
    config = run.parent / "env.yaml"
    return main(
        [
            "rescore",
            str(run),
            "--config",
            str(config),
            "--judge-base-url",
            url,
            "--judge-model",
            "judge-m",
            *extra,
        ]
    )


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*.jsonl"))
        if not p.name.startswith("rescored-")
    }


def test_rescore_after_a_judge_that_first_fails_then_works(tmp_path: Path, workspace_root: Path):
    with FakeJudgeServer(SCORE_4) as judge:
        judge.script(*[Reply(status=503, text="judge overloaded")] * 4, SCORE_4)  # the outage: 4 calls
        run = rollout(tmp_path, workspace_root, judge)
        collected = read_records(run / "episodes.jsonl")
        assert len(collected) == 4 and judge.calls == 4
        for r in collected:
            assert r["reward_status"] == "verifier_error" and "503" in r["error"]
            assert r["reward_error_cause"] == "judge_call"
            assert "qa_analysis" not in r["reward_components"] and r["reward"] == 0.0
        originals = digest(run)

        # still down (nothing listens there): everything stays verifier_error, and says so
        assert rescore(run, "http://127.0.0.1:9/v1") == 1
        [first] = run.glob("rescored-*.jsonl")
        assert {r["reward_status"] for r in read_records(first)} == {"verifier_error"}
        assert {r["reward_error_cause"] for r in read_records(first)} == {"judge_call"}

        assert rescore(run, judge.url) == 0  # the judge is back
        assert judge.calls == 8
    assert digest(run) == originals  # never edited in place
    rescored = sorted(run.glob("rescored-*.jsonl"))
    assert len(rescored) == 2 and rescored[0] == first
    latest = {r["episode_id"]: r for r in read_records(rescored[1])}
    assert len(latest) == 4
    for before in collected:
        after = latest[before["episode_id"]]
        right = ANSWERS[before["task_id"]] == "B"
        assert after["reward_status"] == "scored" and after["error"] is None
        assert after["reward_error_cause"] is None
        assert after["reward_components"] == {
            "qa_accuracy": 1.0 if right else 0.0, "qa_analysis": 0.8, "qa_exact": 1.0 if right else 0.0
        }  # fmt: skip
        assert after["reward"] == pytest.approx(0.9 if right else 0.4)  # qa_exact has weight 0
        assert after["messages"] == before["messages"] and after["code_pass"] == before["code_pass"]
        assert after["judge"]["calls"][0]["reply"].endswith("SCORE: 4")
        assert after["versions"]["judge_model"] == "judge-m" and after["versions"]["judge_prompts"]
        prov = after["rescore"]
        assert prov["recomputed"] == ["judge_analysis"] and prov["judge"]["model"] == "judge-m"
        previous = prov["previous"]  # the failed re-score, which kept the collection-time one
        assert previous["reward_status"] == "verifier_error" and "connection failed" in previous["error"]
        assert previous["reward_error_cause"] == "judge_call"
        assert previous["rescore"]["judge"]["base_url"] == "http://127.0.0.1:9/v1"
        assert "503" in previous["rescore"]["previous"]["error"]

    # the run now reads as fully scored; a further rescore has nothing left to do
    assert {r["reward_status"] for r in load_run(run).records} == {"scored"}
    assert rescore(run, "http://127.0.0.1:9/v1") == 0 and len(list(run.glob("rescored-*.jsonl"))) == 2
    assert main(["stats", str(run)]) == 0
    assert json.loads((run / "stats.json").read_text())["status_counts"] == {"scored": 4}


@pytest.mark.parametrize(
    ("profile", "action_format"), [("v1", "tags"), ("upstream", "tags"), ("v1", "tools")]
)
def test_rescore_all_with_the_same_judge_reproduces_the_original_scores(
    tmp_path: Path, workspace_root: Path, profile: str, action_format: str
):
    """``tools``: the context is rebuilt in the format the episode was played in (the tools gate,
    the submit_answer argument), so a tools episode re-scores to its live reward."""
    with FakeJudgeServer(SCORE_4) as judge:
        judge.script(SCORE_2, match="Store A leads")  # a different verdict per trajectory
        (tmp_path / "p.yaml").write_text(f"profile: {profile}\naction_format: {action_format}\n")
        run = rollout(tmp_path, workspace_root, judge, "--config", str(tmp_path / "p.yaml"))
        collected = {r["episode_id"]: r for r in read_records(run / "episodes.jsonl")}
        assert len(collected) == 4
        if action_format == "tools":  # the episodes were played with calls, and 2 answered right
            assert all(any(m.get("tool_calls") for m in r["messages"]) for r in collected.values())
            assert sorted(r["reward_components"]["qa_accuracy"] for r in collected.values()) == [0, 0, 1, 1]
        (tmp_path / "env.yaml").write_text(f"profile: {profile}\njudge:\n  max_retries: 0\n")
        assert rescore(run, judge.url) == 0 and not list(run.glob("rescored-*.jsonl"))  # none failed
        assert rescore(run, judge.url, "--all") == 0
    [path] = run.glob("rescored-*.jsonl")
    assert len(read_records(path)) == 4
    for after in read_records(path):
        before = collected[after["episode_id"]]
        assert before["reward_status"] == after["reward_status"] == "scored"
        assert after["reward_components"] == before["reward_components"]
        assert after["reward"] == pytest.approx(before["reward"])
        assert after["versions"]["reward_plan"] == before["versions"]["reward_plan"]


def test_rescore_keeps_non_judge_components_and_recomputes_the_judge_one(
    tmp_path: Path, workspace_root: Path
):
    """datatask: judge_accuracy is recomputed, datatask_code (from the executed cells) is kept."""
    with FakeJudgeServer(Reply(text="Weaknesses:\n- none\nSCORE: 5")) as judge:
        judge.script(*[Reply(status=500, text="boom")] * 4, Reply(text="Weaknesses:\n- none\nSCORE: 5"))
        run = rollout(tmp_path, workspace_root, judge, method="datatask")
        [record, *_] = read_records(run / "episodes.jsonl")
        assert record["reward_status"] == "verifier_error"
        assert record["reward_components"] == {"datatask_code": 1.0}
        assert rescore(run, judge.url) == 0
    [path] = run.glob("rescored-*.jsonl")
    after = {r["episode_id"]: r for r in read_records(path)}[record["episode_id"]]
    assert after["reward_components"] == {"judge_accuracy": 1.0, "datatask_code": 1.0}
    assert after["reward"] == 1.0 and after["rescore"]["recomputed"] == ["judge_accuracy"]


def test_context_from_record_finds_the_policy_turns_after_a_few_shot_prompt():
    record = {
        "messages": [
            {"role": "user", "content": "example"},
            {"role": "assistant", "content": "<Answer>Answer: 1</Answer>"},
            {"role": "user", "content": "real question"},
            {"role": "assistant", "content": "<Analyze>a</Analyze><Code>x</Code>"},
            {"role": "user", "content": "\n<Execute>\nout\n</Execute>\n"},
            {"role": "assistant", "content": "<Answer>Answer: 2</Answer>"},
        ],
        "turns": 2,
        "reward_spec": {"method": "qa", "ground_truth": "2"},
        "input_seq": "q",
        "code_pass": [1],
    }
    ctx = context_from_record(record, judge=None)
    assert ctx.answer == "2" and ctx.turns == 2
    assert ctx.trajectory.startswith("<Analyze>a</Analyze>") and ctx.trajectory.endswith("Answer: 2</Answer>")


def test_rescore_without_a_judge_is_one_line_error_when_a_plan_needs_one(
    tmp_path: Path, workspace_root: Path, capsys: pytest.CaptureFixture
):
    with FakeJudgeServer(Reply(status=503, text="down")) as judge:
        run = rollout(tmp_path, workspace_root, judge)  # qa: judge_analysis, all verifier_error
    capsys.readouterr()
    assert main(["rescore", str(run)]) == 2
    out = capsys.readouterr().out
    assert out.startswith("error: these episodes' reward plans need a judge (judge_analysis)")
    assert not list(run.glob("rescored-*.jsonl"))


BROKEN = {"raise": True}  # the state of the scorer below: broken at collection time, fixed later


@register_reward("test_rescore_flaky_len")
def _flaky_len(answer: str | None) -> float:
    if BROKEN["raise"]:
        raise RuntimeError("scorer bug")
    return float(answer is not None and len(answer) == 1)


def test_a_plan_without_a_judge_rescores_without_one_once_its_function_is_fixed(
    tmp_path: Path, workspace_root: Path
):
    """No judge flags at all: a reward function that raised live is recomputed from the record."""
    tasks, trajectories = write_inputs(tmp_path)
    spec = {"method": "verified", "ground_truth": "B", "function": ["answer_match", "test_rescore_flaky_len"]}
    rows = [json.loads(x) for x in tasks.read_text().splitlines()]
    rows = [{**r, "method": "verified", "reward_spec": spec} for r in rows]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    args = ["rollout", "--tasks", str(tasks), "--trajectories", str(trajectories), "--labels", "good"]
    BROKEN["raise"] = True
    assert main([*args, "--workspace-root", str(workspace_root), "--out", str(out)]) == 0
    collected = read_records(out / "episodes.jsonl")
    assert {r["reward_status"] for r in collected} == {"verifier_error"}
    assert {r["reward_error_cause"] for r in collected} == {"reward_raised"}  # a plain RuntimeError
    BROKEN["raise"] = False
    assert main(["rescore", str(out)]) == 0
    [path] = out.glob("rescored-*.jsonl")
    after = {r["task_id"]: r for r in read_records(path)}
    # t0 answers B (right), t1 answers A (wrong); both answers are one character long
    assert after["t0"]["reward_components"] == {"answer_match": 1.0, "test_rescore_flaky_len": 1.0}
    assert after["t1"]["reward_components"] == {"answer_match": 0.0, "test_rescore_flaky_len": 1.0}
    assert (after["t0"]["reward"], after["t1"]["reward"]) == (1.0, 0.5)
    assert after["t0"]["rescore"]["recomputed"] == ["test_rescore_flaky_len"]
    assert after["t0"]["rescore"]["judge"] is None and after["t0"]["versions"]["judge_model"] is None
