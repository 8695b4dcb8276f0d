"""``deepanalyze-rl eval`` and ``eval --compare``: real envs and kernels, a scripted policy or a
local chat-completions server as the policy; every expected number is worked out by hand."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from deepanalyze_env.cli import main
from deepanalyze_env.core.records import read_records
from deepanalyze_env.offline.eval_report import build_report, pass_at_k, report_markdown
from rewards.judge.fake_server import Reply
from tests.test_rollout_command import teacher, write_tasks  # noqa: F401  (teacher is a fixture)

ANALYZE = "<Analyze>look</Analyze>\n"
CODE = ANALYZE + "<Code>\n```python\nprint(6 * 7)\n```\n</Code>"


def answer(text: str) -> str:
    return ANALYZE + f"<Answer>\nAnswer: {text}\n</Answer>"


TASKS = [  # id, family, difficulty, good turns, bad turns (truth is always "B")
    ("q1", "retail", "easy", [CODE, answer("B")], [answer("A")]),  # 1 and 0
    # 1, and a failed gate (-1): a message without a stop tag ends the episode (eos), as in training
    ("q2", "retail", "hard", [answer("B")], ["no tags at all"]),
    ("q3", "clinic", "easy", [answer("C")], [answer("C")]),  # 0 and 0
]


@pytest.fixture
def scripted_eval(tmp_path: Path, workspace_root: Path):
    tasks = tmp_path / "tasks.jsonl"
    trajectories = tmp_path / "trajectories.jsonl"
    with open(tasks, "w") as t, open(trajectories, "w") as tr:
        for task_id, family, difficulty, good, bad in TASKS:
            spec = {"method": "qa_plain", "ground_truth": "B"}
            t.write(
                json.dumps(
                    {
                        "id": task_id,
                        "method": "qa_plain",
                        "instruction": f"Which store? ({task_id})",
                        "data": "data",
                        "workspace_id": "ws",
                        "reward_spec": spec,
                        "family": family,
                        "difficulty": difficulty,
                    }
                )
                + "\n"
            )
            tr.write(json.dumps({"task_id": task_id, "label": "good", "turns": good}) + "\n")
            tr.write(json.dumps({"task_id": task_id, "label": "bad", "turns": bad}) + "\n")
    config = tmp_path / "env.yaml"
    config.write_text("max_turns: 2\n")
    out = tmp_path / "eval"
    args = ["eval", "--policy", "scripted", "--trajectories", str(trajectories), "--labels", "good,bad"]
    args += ["--tasks", str(tasks), "--workspace-root", str(workspace_root), "--config", str(config)]
    args += ["--out", str(out), "--concurrency", "2"]
    return args, out


def test_report_numbers_equal_hand_computed_values(scripted_eval):
    args, out = scripted_eval
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    o = report["overall"]
    assert o["episodes"] == 6 and o["tasks"] == 3
    # rewards 1, 0 | 1, -1 | 0, 0
    assert o["reward_mean"] == pytest.approx(1 / 6)
    # bootstrap over 3 tasks with means .5, 0, 0: P(all zero) = 8/27 > 2.5 %, P(all .5) = 1/27 > 2.5 %
    assert o["reward_ci95"] == pytest.approx([0.0, 0.5])
    assert o["format_gate_pass_rate"] == pytest.approx(5 / 6)
    # correct per task (n=2): q1 1, q2 1 (the failed gate counts 0), q3 0
    assert report["pass_at_ks"] == [1, 2]
    assert o["pass_at"]["1"] == {"value": pytest.approx(1 / 3), "tasks": 3}
    assert o["pass_at"]["2"] == {"value": pytest.approx(2 / 3), "tasks": 3}
    assert o["accuracy_mean"] == pytest.approx(2 / 6)
    assert o["components"]["qa_accuracy"] == pytest.approx(2 / 5)  # over the 5 scored episodes that have it
    assert o["components"]["format_gate"] == -1.0
    assert o["status_rates"] == {"scored": 1.0}
    assert o["termination_rates"] == {"answer": pytest.approx(5 / 6), "eos": pytest.approx(1 / 6)}
    assert o["turns_mean"] == pytest.approx(7 / 6) and o["turns_max"] == 2  # turns 2, 1 | 1, 1 | 1, 1
    assert o["completion_tokens_mean"] is None  # the scripted policy reports no usage
    family = report["breakdowns"]["family"]
    assert family["retail"]["reward_mean"] == pytest.approx(0.25)
    assert family["retail"]["pass_at"]["1"]["value"] == pytest.approx(0.5)
    assert family["retail"]["format_gate_pass_rate"] == pytest.approx(0.75)
    assert family["clinic"]["reward_mean"] == 0.0 and family["clinic"]["pass_at"]["2"]["value"] == 0.0
    difficulty = report["breakdowns"]["difficulty"]
    assert difficulty["easy"]["reward_mean"] == pytest.approx(0.25)
    assert difficulty["hard"]["reward_mean"] == pytest.approx(0.0)
    assert set(report["breakdowns"]["method"]) == {"qa_plain"}
    assert "pass@2" in (out / "report.md").read_text()
    assert (out / "report.png").stat().st_size > 1000
    assert len(read_records(out / "episodes.jsonl")) == 6


def test_resume_runs_nothing_twice_and_reports_the_same(scripted_eval):
    args, out = scripted_eval
    assert main(args) == 0
    first = json.loads((out / "report.json").read_text())["overall"]
    assert main([*args, "--resume"]) == 0
    assert json.loads((out / "report.json").read_text())["overall"] == first
    assert len(read_records(out / "episodes.jsonl")) == 6


def test_openai_compatible_endpoint_as_the_policy(tmp_path: Path, workspace_root: Path, teacher):  # noqa: F811
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2, method="qa_plain")
    out = tmp_path / "eval"
    args = ["eval", "--policy-base-url", teacher.url, "--policy-model", "teacher-m", "--samples", "2"]
    args += ["--tasks", str(tasks), "--workspace-root", str(workspace_root), "--out", str(out)]
    assert main(args) == 0
    o = json.loads((out / "report.json").read_text())["overall"]
    assert o["episodes"] == 4 and o["reward_mean"] == 1.0
    assert o["pass_at"]["2"]["value"] == 1.0 and o["format_gate_pass_rate"] == 1.0
    assert o["completion_tokens_mean"] == 16.0  # the fake server reports 8 completion tokens per turn
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["policy_settings"]["temperature"] == 1.0  # k > 1 samples at temperature 1 by default


def test_an_episode_whose_job_raises_counts_as_a_failure_until_resumed(
    tmp_path: Path,
    workspace_root: Path,
    teacher,  # noqa: F811
):
    """A real endpoint that answers HTTP 400 to one task: that job raises and leaves no record. The
    report is still over both planned episodes (the missing one is a failed gate), and --resume
    runs only the missing one."""
    from deepanalyze_env.offline.rollout import episode_id

    teacher.script(Reply(status=400, raw_body='{"error": {"message": "boom"}}'), match="(task 1)")
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2, method="qa_plain")
    out = tmp_path / "eval"
    args = ["eval", "--policy-base-url", teacher.url, "--policy-model", "teacher-m"]
    args += ["--tasks", str(tasks), "--workspace-root", str(workspace_root), "--out", str(out)]
    assert main(args) == 1
    assert len(read_records(out / "episodes.jsonl")) == 1  # only t0 finished
    report = json.loads((out / "report.json").read_text())
    assert report["episodes"] == {
        "planned": 2,
        "finished": 1,
        "missing": 1,
        "missing_tasks": ["t1"],
        "unplanned": 0,
        "tasks": ["t0", "t1"],
    }
    o = report["overall"]
    # t0: reward 1, gate passed, correct; t1 missing: -1, gate failed, accuracy 0
    assert (o["episodes"], o["finished"], o["missing"]) == (2, 1, 1)
    assert o["reward_mean"] == pytest.approx(0.0) and o["format_gate_pass_rate"] == pytest.approx(0.5)
    assert o["pass_at"]["1"] == {"value": pytest.approx(0.5), "tasks": 2}
    assert o["status_rates"] == {"missing": 0.5, "scored": 0.5}
    assert o["turns_mean"] == pytest.approx(2.0)  # over the finished episode only
    assert "planned 2, finished 1, missing 1 (tasks t1" in (out / "report.md").read_text()
    assert main(["stats", str(out)]) == 0
    stats = json.loads((out / "stats.json").read_text())
    assert (stats["episodes"], stats["planned_episodes"], stats["missing_episodes"]) == (1, 2, 1)

    teacher.rules.pop()  # the endpoint recovers
    teacher.calls = 0
    assert main([*args, "--resume"]) == 0
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    records = read_records(out / "episodes.jsonl")
    assert [r["episode_id"] for r in records] == [episode_id(run_id, t, 0) for t in range(2)]
    assert teacher.calls == 2  # t1's two turns; t0 was not run again
    report = json.loads((out / "report.json").read_text())
    assert report["episodes"]["missing"] == 0 and report["overall"]["reward_mean"] == 1.0


def test_embedded_model_is_evaluated_through_the_env(tmp_path: Path, workspace_root: Path):
    pytest.importorskip("transformers")
    tasks = write_tasks(tmp_path / "tasks.jsonl", 1, method="qa_plain")
    config = tmp_path / "env.yaml"
    config.write_text("max_turns: 1\n")
    out = tmp_path / "eval"
    args = ["eval", "--model", "embedded:smollm2", "--max-tokens", "8", "--config", str(config)]
    args += ["--tasks", str(tasks), "--workspace-root", str(workspace_root), "--out", str(out)]
    assert main(args) == 0
    o = json.loads((out / "report.json").read_text())["overall"]
    # eight tokens cannot hold an <Analyze> block and an <Answer>: the gate fails
    assert o["episodes"] == 1 and o["reward_mean"] == -1.0 and o["format_gate_pass_rate"] == 0.0
    assert 1 <= o["completion_tokens_mean"] <= 8


def test_embedded_model_is_evaluated_in_the_tools_format(tmp_path: Path, workspace_root: Path):
    """``action_format: tools`` with a tool-capable template: the prompt carries the tools' schemas
    and a turn runs to the end-of-message token (TRL's environment_factory layout), so the episode
    is played and scored in the tools format — here the 135M model answers in prose, which fails
    the tools gate (no submit_answer)."""
    pytest.importorskip("trl")
    tasks = write_tasks(tmp_path / "tasks.jsonl", 1, method="qa_plain")
    config = tmp_path / "env.yaml"
    config.write_text("max_turns: 1\naction_format: tools\n")
    out = tmp_path / "eval"
    args = ["eval", "--model", "embedded:smollm2", "--chat-template", "trl:qwen3", "--max-tokens", "12"]
    args += ["--config", str(config), "--tasks", str(tasks), "--workspace-root", str(workspace_root)]
    assert main([*args, "--out", str(out)]) == 0
    [record] = [json.loads(x) for f in (out / "records").glob("*.jsonl") for x in f.read_text().splitlines()]
    assert record["gate"] == "tools" and record["reward"] == -1.0
    # the prompt the policy saw carried the tools' schemas: longer than the same messages without them
    from transformers import AutoTokenizer

    from deepanalyze_env.generation.chat_templates import chat_template_text
    from deepanalyze_env.generation.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("embedded:smollm2"))
    tok.chat_template = chat_template_text("trl:qwen3")
    bare = tok.apply_chat_template(
        record["messages"][:1], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    [turn] = record["usage"]["per_turn"]
    assert turn["prompt_tokens"] > len(bare) + 100
    o = json.loads((out / "report.json").read_text())["overall"]
    assert 1 <= o["completion_tokens_mean"] <= 12


def _write_eval(folder: Path, rewards: dict[str, float]) -> None:
    folder.mkdir(parents=True)
    lines = []
    for task, reward in rewards.items():
        gate_ok = reward > -1
        lines.append(
            {
                "episode_id": f"{folder.name}-{task}",
                "task_id": task,
                "reward_spec": {"method": "qa_plain", "ground_truth": "B"},
                "reward": reward,
                "reward_status": "scored",
                "format_ok": gate_ok,
                "reward_components": {"qa_accuracy": float(reward == 1.0)}
                if gate_ok
                else {"format_gate": -1.0},
                "termination": "answer",
                "turns": 1,
                "messages": [],
            }
        )
    (folder / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_compare_gives_paired_per_task_differences(tmp_path: Path):
    _write_eval(tmp_path / "a", {"t1": 0.0, "t2": -1.0, "t3": 1.0})
    _write_eval(tmp_path / "b", {"t1": 1.0, "t2": 0.0, "t3": 1.0, "t4": 1.0})
    out = tmp_path / "cmp"
    assert main(["eval", "--compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
    result = json.loads((out / "compare.json").read_text())
    reward = result["metrics"]["reward"]
    assert reward["tasks"] == 3 and reward["mean_diff"] == pytest.approx(2 / 3)
    assert reward["mean_a"] == 0.0 and reward["mean_b"] == pytest.approx(2 / 3)
    # differences 1, 1, 0: a resample of all zeros has chance 1/27 > 2.5 %, all ones 8/27
    assert reward["diff_ci95"] == pytest.approx([0.0, 1.0])
    assert (reward["b_better"], reward["a_better"], reward["ties"]) == (2, 0, 1)
    acc = result["metrics"]["pass@1"]
    assert acc["mean_diff"] == pytest.approx(1 / 3)  # t1 0 -> 1; t2 gate failed (0) -> 0; t3 1 -> 1
    assert result["metrics"]["format_gate"]["mean_diff"] == pytest.approx(1 / 3)
    assert result["only_in_b"] == ["t4"] and result["only_in_a"] == []
    assert "B − A" in (out / "compare.md").read_text()
    assert (out / "compare.png").stat().st_size > 1000


@pytest.mark.parametrize(("n", "c", "k"), [(5, 0, 1), (5, 2, 1), (5, 2, 3), (6, 3, 6), (4, 4, 2), (7, 1, 4)])
def test_pass_at_k_equals_brute_force_over_subsets(n, c, k):
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    expected = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "give exactly one policy"),
        (["--policy", "scripted", "--model", "m"], "give exactly one policy"),
        (["--policy-base-url", "http://127.0.0.1:9/v1"], "needs --policy-model"),
        (["--model", "m", "--chat-template-kwargs", "{thinking"], "--chat-template-kwargs: not JSON"),
        (["--model", "m", "--chat-template-kwargs", "[1]"], "--chat-template-kwargs: give a JSON object"),
    ],
)
def test_policy_choice_mistakes_are_one_line_errors(tmp_path, capsys, extra, message):
    assert main(["eval", "--out", str(tmp_path / "e"), *extra]) == 2
    assert message in capsys.readouterr().out


def test_compare_of_a_missing_folder_is_a_one_line_error(tmp_path, capsys):
    assert main(["eval", "--compare", str(tmp_path / "nope"), str(tmp_path)]) == 2
    assert "no such eval folder" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("spec", "component"),
    [
        ({"method": "verified", "function": ["answer_match"]}, "answer_match"),
        ({"method": "verified", "function": ["answer_parts"]}, "answer_parts_all"),
        ({"method": "datatask", "function": ["file_match", "answer_match"]}, "answer_match"),
        ({"method": "qa"}, "qa_accuracy"),
        ({"method": "openresearch", "function": ["judge_opendomain"]}, None),
    ],
)
def test_bank_methods_have_an_accuracy_component(spec, component):
    """The bank's scorers say whether the answer is right; the report's accuracy reads them."""
    from rewards.plan import spec_accuracy_component

    assert spec_accuracy_component(spec) == component


def test_a_bank_difficulty_groups_by_its_level_and_prints_readably():
    """A bank task's difficulty is an object; the table groups and names by its level, so tasks
    with different operation lists still land in one ``difficulty=medium`` row, never a printed dict."""

    def difficulty(level: str, ops: list[str]) -> dict:
        return {"cells": 2, "level": level, "operations": ops}

    tasks = {
        "t1": {"method": "verified", "family": "f", "difficulty": difficulty("medium", ["filter", "mean"])},
        "t2": {"method": "verified", "family": "f", "difficulty": difficulty("medium", ["groupby", "max"])},
        "t3": {"method": "verified", "family": "f", "difficulty": difficulty("easy", ["count"])},
    }
    records = [
        {"episode_id": f"e{t}", "task_id": t, "reward_status": "scored", "reward": 1.0, "format_ok": True}
        for t in tasks
    ]
    report = build_report(records, tasks, 1)
    assert sorted(report["breakdowns"]["difficulty"]) == ["easy", "medium"]
    assert report["breakdowns"]["difficulty"]["medium"]["episodes"] == 2
    text = report_markdown(report, "t")
    assert "| difficulty=medium | 2 |" in text
    assert "| difficulty=easy | 1 |" in text
    assert "{" not in text.split("## Components")[0]


def test_the_report_gives_the_verifier_error_rate_by_cause():
    from deepanalyze_env.offline.eval_report import summarize

    def ep(i: int, status: str, cause: str | None) -> dict:
        return {
            "episode_id": f"e{i}",
            "task_id": f"t{i % 2}",
            "reward_spec": {"method": "qa_plain", "ground_truth": "B"},
            "reward": 0.0,
            "reward_components": {},
            "reward_status": status,
            "reward_error_cause": cause,
            "format_ok": True,
            "termination": "answer",
            "turns": 1,
            "messages": [],
        }

    records = [ep(0, "verifier_error", "context_length"), ep(1, "scored", None), ep(2, "scored", None)]
    records.append(ep(3, "scored", None))
    # by hand: one of four episodes is excluded, for its judge's context length
    assert summarize(records, [1])["verifier_error_rates"] == {
        "judge_parse": 0.0,
        "context_length": 0.25,
        "judge_call": 0.0,
        "reward_raised": 0.0,
    }
