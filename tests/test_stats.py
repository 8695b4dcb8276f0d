"""``deepanalyze-rl stats`` on a small crafted run, against numbers computed by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from deepanalyze_env.cli import main
from deepanalyze_env.core.records import write_jsonl_atomic
from deepanalyze_env.offline.stats import distribution


def rec(
    eid, method, status, reward, comps, *, fmt, term, passes, turns, chars, gate=None, calls=(), usage=None
):
    return {
        "episode_id": eid,
        "reward_spec": {"method": method, "ground_truth": "B"},
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x" * chars}][
            : 2 if chars else 1
        ],
        "reward": reward,
        "reward_components": comps,
        "reward_status": status,
        "format_ok": fmt,
        "gate": gate,
        "termination": term,
        "code_pass": passes,
        "turns": turns,
        "exec": [{"status": "ok" if p else "error", "elapsed_ms": 1.0, "truncated": False} for p in passes],
        "judge": {"calls": list(calls)} if calls else None,
        "usage": {"per_turn": usage} if usage else None,
    }


def u(p, c, finish="stop"):
    return {"prompt_tokens": p, "completion_tokens": c, "finish_reason": finish}


QA = {"qa_accuracy": 1.0, "qa_analysis": 0.8, "qa_exact": 1.0}
QA_WRONG = {"qa_accuracy": 0.0, "qa_analysis": 0.8, "qa_exact": 0.0}
GATED = {"format_gate": -1.0}


def crafted() -> list[dict]:
    a = rec(
        "A",
        "qa",
        "scored",
        0.9,
        QA,
        fmt=True,
        term="answer",
        passes=[1, 0],
        turns=3,
        chars=10,
        calls=[{"latency_ms": 100.0, "cached": False, "error": None}],
        usage=[u(100, 10), u(200, 20), u(300, 30)],
    )
    a["exec"][1]["truncated"] = True
    return [
        a,
        rec(
            "B",
            "qa",
            "scored",
            0.4,
            QA_WRONG,
            fmt=True,
            term="answer",
            passes=[1],
            turns=2,
            chars=20,
            calls=[{"latency_ms": 300.0, "cached": False, "error": None}],
            usage=[u(100, 10), u(200, 20, "length")],
        ),
        rec(
            "C",
            "datatask",
            "scored",
            -1.0,
            GATED,
            fmt=False,
            gate="tags",
            term="max_turns",
            passes=[0, 0],
            turns=4,
            chars=30,
            usage=[u(50, 5)],
        ),
        rec(
            "D",
            "datatask",
            "verifier_error",
            0.0,
            {"datatask_code": 1.0},
            fmt=True,
            term="answer",
            passes=[1],
            turns=2,
            chars=40,
            calls=[{"latency_ms": None, "cached": False, "error": "JudgeCallError: 503"}],
        ),
        rec("E", "qa", "environment_error", 0.0, {}, fmt=False, term="error", passes=[], turns=1, chars=0),
        rec(
            "F",
            "qa",
            "scored",
            -1.0,
            GATED,
            fmt=False,
            gate="tags",
            term="length",
            passes=[1, 1],
            turns=2,
            chars=60,
            calls=[{"latency_ms": 1.0, "cached": True, "error": None}],
        ),
    ]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    (folder / "records").mkdir(parents=True)
    write_jsonl_atomic(folder / "records" / "episodes-h-1.jsonl", crafted())
    return folder


def test_stats_match_hand_computed_values(run: Path, capsys: pytest.CaptureFixture):
    assert main(["stats", str(run), "--price-prompt", "1", "--price-completion", "2"]) == 0
    s = json.loads((run / "stats.json").read_text())
    assert s["episodes"] == 6
    assert s["status_counts"] == {"environment_error": 1, "scored": 4, "verifier_error": 1}
    assert s["termination_counts"] == {"answer": 3, "error": 1, "length": 1, "max_turns": 1}
    assert s["valid_episodes"] == 3 and s["valid_rate"] == pytest.approx(0.5)  # A, B, C (F ran out of budget)
    assert s["format_pass_rate"] == pytest.approx(3 / 5)  # A, B, D of the five that reached the gate
    assert s["gate_counts"] == {"tags": 2}
    # scored rewards 0.9, 0.4, -1, -1: mean -0.175, population variance 2.8475 / 4
    assert s["reward"]["all"]["mean"] == pytest.approx(-0.175)
    assert s["reward"]["all"]["std"] == pytest.approx(math.sqrt(0.711875))
    assert s["reward"]["by_method"]["qa"]["mean"] == pytest.approx(0.3 / 3)
    assert s["reward"]["by_method"]["qa"]["n"] == 3
    assert s["reward"]["by_method"]["datatask"] == {
        "n": 1,
        "mean": -1.0,
        "std": 0.0,
        "min": -1.0,
        "p50": -1.0,
        "p90": -1.0,
        "max": -1.0,
    }
    assert s["components"] == {
        "format_gate": {"n": 2, "mean": -1.0},
        "qa_accuracy": {"n": 2, "mean": 0.5},
        "qa_analysis": {"n": 2, "mean": pytest.approx(0.8)},
        "qa_exact": {"n": 2, "mean": 0.5},
    }  # D's datatask_code is not a scored episode's
    assert s["code_cells"] == 8 and s["code_pass_rate"] == pytest.approx(5 / 8)
    assert s["output_truncated_rate"] == pytest.approx(1 / 8)
    # turns 3, 2, 4, 2, 1, 2 → sorted 1 2 2 2 3 4: p50 2, p90 at rank 4.5 → 3.5
    assert s["turns"]["mean"] == pytest.approx(14 / 6) and s["turns"]["p50"] == 2.0
    assert s["turns"]["p90"] == pytest.approx(3.5) and s["turns"]["max"] == 4
    assert s["turns"]["histogram"] == {"1": 1, "2": 3, "3": 1, "4": 1}
    # not every episode reports usage, so lengths are characters: 10 20 30 40 0 60
    assert s["length"]["source"] == "characters"
    assert s["length"]["mean"] == pytest.approx(160 / 6) and s["length"]["p50"] == pytest.approx(25.0)
    assert s["truncated_episodes"] == 2 and s["truncation_ratio"] == pytest.approx(
        1 / 3
    )  # F by length, B by a turn
    judge = s["judge"]
    assert (judge["calls"], judge["failed"], judge["cached"]) == (4, 1, 1)
    assert judge["latency_ms"] == {"n": 2, "p50": pytest.approx(200.0), "p95": pytest.approx(290.0)}
    usage = s["usage"]
    assert (usage["episodes_with_usage"], usage["prompt_tokens"], usage["completion_tokens"]) == (3, 950, 95)
    assert usage["prompt_tokens_per_scored_episode"] == pytest.approx(950 / 4)
    assert usage["cost_usd"] == pytest.approx((950 * 1 + 95 * 2) / 1e6)
    assert usage["cost_per_scored_episode_usd"] == pytest.approx(1140e-6 / 4)

    md = (run / "stats.md").read_text()
    assert "| valid episodes | 3 (50.0%) |" in md and "## Definitions" in md
    assert (run / "stats.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "format pass rate" in printed and "60.0%" in printed


def test_stats_give_the_verifier_error_rate_by_cause(tmp_path: Path):
    records = crafted()
    records[3]["reward_error_cause"] = "judge_call"  # D: its judge answered 503
    folder = tmp_path / "run"
    (folder / "records").mkdir(parents=True)
    write_jsonl_atomic(folder / "records" / "episodes-h-1.jsonl", records)
    assert main(["stats", str(folder)]) == 0
    s = json.loads((folder / "stats.json").read_text())
    # by hand: one of six episodes, D, is a verifier_error, caused by the judge call
    assert s["verifier_error_rates"] == {
        "judge_parse": 0.0,
        "context_length": 0.0,
        "judge_call": pytest.approx(1 / 6),
        "reward_raised": 0.0,
    }
    md = (folder / "stats.md").read_text()
    row = "judge_parse 0.0%, context_length 0.0%, judge_call 16.7%, reward_raised 0.0%"
    assert f"| verifier_error by cause | {row} |" in md


def test_stats_read_rescored_records_over_the_originals(run: Path, tmp_path: Path):
    fixed = dict(crafted()[3], reward_status="scored", reward=0.5)
    fixed["reward_components"] = {"judge_accuracy": 0.0, "datatask_code": 1.0}
    write_jsonl_atomic(run / "rescored-20260101T000000.jsonl", [fixed])
    assert main(["stats", str(run), "--out", str(tmp_path / "a")]) == 0
    after = json.loads((tmp_path / "a" / "stats.json").read_text())
    assert after["status_counts"]["scored"] == 5 and after["rescored_records"] == 1
    assert after["reward"]["by_method"]["datatask"]["mean"] == pytest.approx(-0.25)
    assert main(["stats", str(run), "--out", str(tmp_path / "b"), "--no-rescored"]) == 0
    before = json.loads((tmp_path / "b" / "stats.json").read_text())
    assert before["status_counts"]["scored"] == 4 and "usage" in before


def test_stats_token_lengths_come_from_usage_when_every_episode_has_it(tmp_path: Path):
    records = [r for r in crafted() if r["usage"]]
    write_jsonl_atomic(tmp_path / "one.jsonl", records)
    assert main(["stats", str(tmp_path / "one.jsonl")]) == 0
    s = json.loads((tmp_path / "stats.json").read_text())
    assert s["length"]["source"] == "usage completion tokens"
    assert s["length"]["mean"] == pytest.approx((60 + 30 + 5) / 3) and s["length"]["max"] == 60


def test_stats_on_a_missing_folder_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture):
    assert main(["stats", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().out.strip() == f"error: no such run folder or file: {tmp_path / 'nope'}"


def test_distribution_of_nothing_is_empty():
    assert distribution([]) == {"n": 0}


def test_a_recovered_episodes_replayed_prefix_is_not_counted_as_policy_output(tmp_path: Path):
    record = rec(
        "R",
        "verified",
        "scored",
        1.0,
        {"answer_match": 1.0},
        fmt=True,
        term="answer",
        passes=[True],
        turns=1,
        chars=0,
    )
    record["messages"] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "p" * 50},  # the prefix: 50 characters, not the policy's
        {"role": "user", "content": "<Execute>Traceback</Execute>"},
        {"role": "assistant", "content": "x" * 7},  # the policy's one turn
    ]
    folder = tmp_path / "run"
    (folder / "records").mkdir(parents=True)
    write_jsonl_atomic(folder / "records" / "episodes-h-1.jsonl", [record])
    assert main(["stats", str(folder)]) == 0
    length = json.loads((folder / "stats.json").read_text())["length"]
    assert length["source"] == "characters" and length["mean"] == pytest.approx(7.0)
