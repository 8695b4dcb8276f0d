"""Episode records (docs/design.md §9): fields, versions, torn lines, run folders, SFT loading."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from deepanalyze_env.cli import main
from deepanalyze_env.core.env import DeepAnalyzeEnv
from deepanalyze_env.core.records import (
    RECORD_FIELDS,
    episode_id,
    load_run,
    read_records,
    repair_torn_tail,
    write_jsonl_atomic,
)
from rewards.judge import prompt_hash
from rewards.judge.fake_server import FakeJudgeServer, Reply
from tests.conftest import DATA, code, qa_extras

VERDICT = (
    '```json\n{"usefulness": 5, "richness": 4, "soundness": 4, "interpretability": 3, "readability": 5}\n```'
)


@pytest.fixture(scope="module")
def shipped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scripted policy over every shipped task (good and bad trajectories), judged locally."""
    out = tmp_path_factory.mktemp("shipped") / "run"
    with FakeJudgeServer() as judge:
        judge.script(Reply(text="Weaknesses:\n- none\nSCORE: 4"), match="reviewing the working process")
        judge.script(Reply(text="Weaknesses:\n- rounding\nSCORE: 5"), match="reference answer")
        judge.script(Reply(text="Weaknesses:\n- short\n" + VERDICT))
        args = ["rollout", "--out", str(out), "--run-id", "ship", "--concurrency", "4"]
        code_ = main([*args, "--judge-base-url", judge.url, "--judge-model", "judge-m"])
    assert code_ == 0
    return out


def test_records_have_exactly_the_contract_fields_and_versions(shipped_run: Path):
    records = read_records(shipped_run / "episodes.jsonl")
    tasks = [
        json.loads(x) for f in sorted((DATA / "tasks").glob("*.jsonl")) for x in f.read_text().splitlines()
    ]
    assert len(records) == 2 * len(tasks)
    for record in records:
        assert list(record) == list(RECORD_FIELDS)
        assert record["reward_status"] == "scored"
        versions = record["versions"]
        assert versions["package"] and versions["profile"] == "v1" and len(versions["reward_plan"]) == 16
        assert versions["judge_model"] == "judge-m"
        assert versions["policy_id"] in ("scripted:good", "scripted:bad")
        assert versions["kernel"]["pandas"]
        for rubric, digest in versions["judge_prompts"].items():
            assert digest == prompt_hash(rubric)
        roles = [m["role"] for m in record["messages"]]
        assert roles[0] == "user" and roles.count("assistant") == record["turns"]
        assert record["timings"]["episode_ms"] >= record["timings"]["reward_ms"]
    # ids are (run, task index, sample index), in task order in episodes.jsonl
    assert [r["episode_id"] for r in records[:2]] == [episode_id("ship", 0, 0), episode_id("ship", 0, 1)]
    qa = [r for r in records if r["reward_spec"]["method"] == "qa"]
    assert set(qa[0]["versions"]["judge_prompts"]) == {"judge_analysis"}


def test_records_load_as_a_trl_sft_dataset(shipped_run: Path, tmp_path: Path):
    datasets = pytest.importorskip("datasets")
    # mix in a record with token usage and an int ground truth: schemas differ between lines
    records = read_records(shipped_run / "episodes.jsonl")
    extra = dict(
        records[0], episode_id="x", usage={"per_turn": [{"prompt_tokens": 5, "completion_tokens": 2}]}
    )
    extra["reward_spec"] = {"method": "qa", "ground_truth": 42}
    path = tmp_path / "mixed.jsonl"
    write_jsonl_atomic(path, [*records, extra])
    ds = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == len(records) + 1
    first = ds[0]["messages"]
    assert first[0]["role"] == "user" and first[1]["role"] == "assistant"
    assert first[1]["content"] == records[0]["messages"][1]["content"]


def test_unfinished_episode_closed_without_record_writes_nothing(workspace_root: Path, tmp_path: Path):
    config = {"workspace_root": str(workspace_root), "records_dir": str(tmp_path / "rec")}
    env = DeepAnalyzeEnv(env_config=config, extras=qa_extras(episode_id="e-1"))
    env.init("Which store?")
    env.step(code("print(1)"))
    env.close(record=False)
    assert not (tmp_path / "rec").exists()
    env = DeepAnalyzeEnv(env_config=config, extras=qa_extras(episode_id="e-2"))
    env.init("Which store?")
    env.step("<Analyze>x</Analyze><Answer>Answer: B</Answer>")
    env.close()
    [path] = (tmp_path / "rec").glob("episodes-*.jsonl")
    assert [r["episode_id"] for r in read_records(path)] == ["e-2"]


def test_reader_skips_a_torn_last_line_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    path = tmp_path / "episodes-h-1.jsonl"
    path.write_bytes(b'{"episode_id": "a"}\n{"episode_id": "b"}\n{"episode_id": "c", "mess')
    with caplog.at_level(logging.WARNING, logger="deepanalyze_env.core.records"):
        assert [r["episode_id"] for r in read_records(path)] == ["a", "b"]
    assert "torn last line" in caplog.text
    assert repair_torn_tail(path) == len(b'{"episode_id": "c", "mess')
    assert path.read_bytes().endswith(b'"b"}\n') and repair_torn_tail(path) == 0


def test_reader_rejects_a_corrupt_line_in_the_middle(tmp_path: Path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"episode_id": "a"}\nnot json\n{"episode_id": "b"}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_records(path)


def test_load_run_dedups_and_lays_rescored_records_over_the_originals(tmp_path: Path):
    run = tmp_path / "run"
    (run / "records").mkdir(parents=True)
    write_jsonl_atomic(
        run / "records" / "episodes-h-1.jsonl", [{"episode_id": "a", "v": 1}, {"episode_id": "b", "v": 1}]
    )
    write_jsonl_atomic(run / "records" / "episodes-h-2.jsonl", [{"episode_id": "b", "v": 2}])
    write_jsonl_atomic(run / "rescored-20260101T000000.jsonl", [{"episode_id": "a", "v": 3}])
    write_jsonl_atomic(run / "rescored-20260102T000000.jsonl", [{"episode_id": "a", "v": 4}])
    loaded = load_run(run)
    assert {r["episode_id"]: r["v"] for r in loaded.records} == {"a": 4, "b": 2}
    assert loaded.duplicates == 1 and loaded.rescored == 2
    assert {r["episode_id"]: r["v"] for r in load_run(run, rescored=False).records} == {"a": 1, "b": 2}


def _recovered(turns):
    """A recovered episode: prompt, a replayed prefix (2 turns), then the policy's own turns."""
    return {
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "prefix turn 1"},
            {"role": "user", "content": "<Execute>ok</Execute>"},
            {"role": "assistant", "content": "prefix turn 2"},
            {"role": "user", "content": "<Execute>Traceback</Execute>"},
            {"role": "assistant", "content": "own turn"},
        ],
        "turns": turns,
    }


def test_own_turns_are_the_last_turns_assistant_messages():
    from deepanalyze_env.core.records import own_turn_indices

    assert own_turn_indices(_recovered(1)) == [6]
    assert own_turn_indices(_recovered(3)) == [2, 4, 6]
    assert own_turn_indices(_recovered(0)) == []


def test_a_record_without_a_usable_turn_count_owns_every_assistant_message():
    from deepanalyze_env.core.records import own_turn_indices

    for turns in (None, 5, True, "1"):
        assert own_turn_indices(_recovered(turns)) == [2, 4, 6]


# ----------------------------------------------------------- verifier_error by cause (design.md §6)


def _ep(status: str, cause: str | None = None, *, with_key: bool = True) -> dict:
    record: dict = {"reward_status": status}
    if with_key:
        record["reward_error_cause"] = cause
    return record


def test_verifier_error_rates_are_shares_of_all_episodes_per_cause():
    from deepanalyze_env.core.contracts import verifier_error_rates

    episodes = [
        _ep("verifier_error", "judge_parse"),
        _ep("verifier_error", "judge_parse"),
        _ep("verifier_error", "context_length"),
        _ep("scored"),
        _ep("environment_error"),
        _ep("unfinished"),
        _ep("scored"),
        _ep("scored"),
    ]
    # by hand: 2, 1, 0, 0 of 8 episodes
    assert verifier_error_rates(episodes) == {
        "judge_parse": 0.25,
        "context_length": 0.125,
        "judge_call": 0.0,
        "reward_raised": 0.0,
    }


def test_verifier_error_rates_give_every_cause_as_zero_for_no_episodes():
    from deepanalyze_env.core.contracts import verifier_error_rates

    assert verifier_error_rates([]) == dict.fromkeys(
        ("judge_parse", "context_length", "judge_call", "reward_raised"), 0.0
    )


def test_a_verifier_error_record_without_a_known_cause_counts_as_reward_raised():
    from deepanalyze_env.core.contracts import verifier_error_rates

    old = _ep("verifier_error", with_key=False)  # written before causes were recorded
    odd = _ep("verifier_error", "the_judge_was_sad")
    assert verifier_error_rates([old, odd])["reward_raised"] == 1.0
