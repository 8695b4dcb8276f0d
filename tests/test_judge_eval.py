"""``deepanalyze-rl judge-eval`` against a real local chat-completions server with scripted replies.

Every candidate carries a marker string, and the server answers each marker with a scripted
verdict, so each number in ``report.json`` is known in advance; the tests compare it with
values worked out by hand (written out in the comments). The openai client, retries, cache and
prompt rendering are the real ones the environment uses.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deepanalyze_env.cli import main
from deepanalyze_env.generation.models import embedded_gguf
from deepanalyze_env.offline.judge_eval import LABELS, load_fixtures
from rewards.judge.fake_server import FakeJudgeServer, Reply
from rewards.judge.prompts import RUBRICS, prompt_path
from tests.conftest import DATA, ROOT

DELAY_S = 0.02  # every scripted reply waits this long, so latency has a known lower bound


def dims(u: int, r: int, s: int, i: int, rd: int) -> str:
    body = {"usefulness": u, "richness": r, "soundness": s, "interpretability": i, "readability": rd}
    return f"Weaknesses:\n- none\n```json\n{json.dumps(body)}\n```"


def score(n: float) -> Reply:
    return Reply(text=f"Weaknesses:\n- some\nSCORE: {n:g}", delay_s=DELAY_S)


def case(
    case_id: str, judge: str, *cands: tuple[str, str], ground_truth: Any = "42", method: str = "qa"
) -> dict:
    return {
        "id": case_id,
        "method": method,
        "judge": judge,
        "question": "How many widgets were sold?",
        "ground_truth": ground_truth,
        "candidates": [{"label": label, "text": text} for label, text in cands],
    }


def write_jsonl(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


@pytest.fixture
def server() -> Iterator[FakeJudgeServer]:
    with FakeJudgeServer(Reply(text="no verdict here", delay_s=DELAY_S)) as srv:
        yield srv


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """No retries and a short timeout: an outage costs one fast call, not a backoff schedule."""
    path = tmp_path / "env.yaml"
    path.write_text("judge:\n  max_retries: 0\n  timeout_s: 5\n")
    return path


def run(server: FakeJudgeServer, config: Path, out: Path, *extra: str) -> tuple[int, dict, list[dict]]:
    args = ["judge-eval", "--config", str(config), "--judge-base-url", server.url, "--judge-model", "m"]
    code = main([*args, "--out", str(out), *extra])
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    rows = [json.loads(x) for x in (out / "cases.jsonl").read_text().splitlines()] if report else []
    return code, report, rows


def approx(x: float) -> Any:
    return pytest.approx(x, abs=1e-9)


def test_every_metric_matches_the_hand_computation(tmp_path: Path, server: FakeJudgeServer, config: Path):
    fixtures = write_jsonl(
        tmp_path / "f.jsonl",
        [
            case(
                "c1",
                "judge_analysis",
                ("reference", "c1-ref"),
                ("perturbed", "c1-pert"),
                ("wrong", "c1-wrong"),
            ),
            case(
                "c2",
                "judge_analysis",
                ("reference", "c2-ref"),
                ("perturbed", "c2-pert"),
                ("wrong", "c2-wrong"),
            ),
            case("c3", "judge_accuracy", ("reference", "c3-ref"), ("wrong", "c3-wrong"), method="datatask"),
            case(
                "c4",
                "judge_opendomain",
                ("reference", "c4-ref"),
                ("wrong", "c4-wrong"),
                ground_truth="",
                method="openresearch",
            ),
        ],
    )
    server.script(score(5), score(3), match="c1-ref")  # repeats differ: 1.0 and 0.6
    server.script(score(3), match="c1-pert")  # 0.6
    server.script(score(1), match="c1-wrong")  # 0.2
    server.script(score(4), match="c2-ref")  # 0.8
    server.script(score(4), match="c2-pert")  # 0.8: a tie with the reference
    server.script(Reply(text="I would rather not give a score.", delay_s=DELAY_S), match="c2-wrong")  # parse
    server.script(score(5), match="c3-ref")  # accuracy rubric 0-5: 1.0
    server.script(score(0), match="c3-wrong")  # 0.0
    server.script(Reply(text=dims(5, 5, 5, 5, 4), delay_s=DELAY_S), match="c4-ref")  # mean 24/25 = 0.96
    server.script(Reply(text=dims(2, 2, 2, 2, 2), delay_s=DELAY_S), match="c4-wrong")  # 0.4

    out = tmp_path / "out"
    gates = ["--min-ordering-accuracy", "0.9", "--max-parse-failure-rate", "0.05"]
    code, report, rows = run(server, config, out, "--fixtures", str(fixtures), "--repeats", "2", *gates)

    # 10 candidates x 2 repeats = 20 calls, all answered; c2-wrong's 2 replies are unparsable.
    assert server.calls == 20
    assert report["n_cases"] == 4 and report["n_candidates"] == 10 and report["n_samples"] == 20
    assert report["n_calls"] == 20 and report["n_replies"] == 20 and report["n_scored"] == 18
    assert report["n_parse_failures"] == 2 and report["parse_failure_rate"] == approx(2 / 20)
    assert report["n_call_errors"] == 0 and report["n_other_errors"] == 0
    assert report["n_unscored_candidates"] == 1  # c2-wrong
    # Candidate means: c1 0.8 / 0.6 / 0.2, c2 0.8 / 0.8 / -, c3 1.0 / 0.0, c4 0.96 / 0.4.
    assert report["per_label_mean"]["reference"] == approx((0.8 + 0.8 + 1.0 + 0.96) / 4)
    assert report["per_label_mean"]["perturbed"] == approx((0.6 + 0.8) / 2)
    assert report["per_label_mean"]["wrong"] == approx((0.2 + 0.0 + 0.4) / 3)
    assert report["per_label_n"] == {"reference": 4, "perturbed": 2, "wrong": 3}
    # Pairs: c1 three in order (3), c2 reference=perturbed (0.5; its wrong has no score),
    # c3 one (1), c4 one (1): 5.5 / 6.
    assert report["n_pairs"] == 6 and report["ordering_accuracy"] == approx(5.5 / 6)
    assert report["ordering_by_pair"] == {
        "reference>perturbed": {"accuracy": approx(0.75), "n_pairs": 2},
        "reference>wrong": {"accuracy": approx(1.0), "n_pairs": 3},
        "perturbed>wrong": {"accuracy": approx(1.0), "n_pairs": 1},
    }
    # Sample std of c1-ref's (1.0, 0.6) is 0.4/sqrt(2); the other 8 scored candidates have 0.
    assert report["n_std_candidates"] == 9
    assert report["score_std_across_repeats"] == approx((0.4 / math.sqrt(2)) / 9)
    analysis = report["per_judge"]["judge_analysis"]
    assert analysis["n_cases"] == 2 and analysis["n_pairs"] == 4
    assert analysis["ordering_accuracy"] == approx(3.5 / 4)
    assert analysis["per_label_mean"] == {
        "reference": approx(0.8),
        "perturbed": approx(0.7),
        "wrong": approx(0.2),
    }
    accuracy = report["per_judge"]["judge_accuracy"]
    assert accuracy["per_label_mean"] == {"reference": approx(1.0), "wrong": approx(0.0)}
    opendomain = report["per_judge"]["judge_opendomain"]
    assert opendomain["ordering_accuracy"] == approx(1.0)
    assert opendomain["per_dimension_mean"]["reference"]["openresearch_readability"] == approx(0.8)
    assert opendomain["per_dimension_mean"]["reference"]["openresearch_usefulness"] == approx(1.0)
    assert list(opendomain["per_dimension_mean"]["wrong"].values()) == [approx(0.4)] * 5
    # Latency: the median of the per-call latencies recorded in cases.jsonl, each >= the delay.
    latencies = [
        call["latency_ms"]
        for row in rows
        for c in row["candidates"]
        for s in c["samples"]
        for call in s["calls"]
    ]
    assert len(latencies) == 20 and min(latencies) >= DELAY_S * 1000
    assert report["latency_ms_p50"] == approx(statistics.median(latencies))
    # Identity of what was evaluated.
    assert report["model"] == "m" and report["backend"] == "openai" and report["repeats"] == 2
    shipped = {
        name: hashlib.sha256(prompt_path(name).read_bytes()).hexdigest()
        for name in ("judge_accuracy", "judge_analysis", "judge_opendomain")
    }
    assert report["prompt_hashes"] == shipped
    expected_set = hashlib.sha256(
        "".join(f"{k}:{shipped[k]}\n" for k in sorted(shipped)).encode()
    ).hexdigest()
    assert report["prompt_hash"] == expected_set
    # Gates: ordering 0.917 >= 0.9 passes, parse failures 0.1 > 0.05 fails -> exit 1.
    assert report["thresholds"]["min_ordering_accuracy"] == {
        "limit": 0.9,
        "value": approx(5.5 / 6),
        "passed": True,
    }
    assert report["thresholds"]["max_parse_failure_rate"]["passed"] is False
    assert report["passed"] is False and code == 1
    # Per-case detail, the readable report and the plot.
    by_id = {row["id"]: row for row in rows}
    c1_ref = by_id["c1"]["candidates"][0]
    assert sorted(c1_ref["scores"]) == [approx(0.6), approx(1.0)] and c1_ref["std"] == approx(
        0.4 / math.sqrt(2)
    )
    c2_wrong = by_id["c2"]["candidates"][2]
    assert c2_wrong["score"] is None and {s["status"] for s in c2_wrong["samples"]} == {"parse_error"}
    assert c2_wrong["samples"][0]["calls"][0]["reply"] == "I would rather not give a score."
    assert by_id["c2"]["ordering_accuracy"] == approx(0.5)
    assert sorted(call["sample"] for s in c1_ref["samples"] for call in s["calls"]) == [0, 1]
    md = (out / "report.md").read_text()
    assert (
        "FAIL** max_parse_failure_rate" in md and "| c2 | reference>perturbed | 0.800 vs 0.800 | 0.5 |" in md
    )
    assert (out / "scores.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_judge_that_inverts_the_order_scores_zero_and_fails_the_gate(
    tmp_path: Path, server: FakeJudgeServer, config: Path
):
    fixtures = write_jsonl(
        tmp_path / "f.jsonl",
        [
            case(
                "inv", "judge_analysis", ("reference", "i-ref"), ("perturbed", "i-pert"), ("wrong", "i-wrong")
            )
        ],
    )
    server.script(score(1), match="i-ref")
    server.script(score(3), match="i-pert")
    server.script(score(5), match="i-wrong")
    out = tmp_path / "out"
    code, report, _ = run(server, config, out, "--fixtures", str(fixtures), "--min-ordering-accuracy", "0.5")
    assert report["ordering_accuracy"] == 0.0 and report["n_pairs"] == 3
    assert report["per_label_mean"] == {
        "reference": approx(0.2),
        "perturbed": approx(0.6),
        "wrong": approx(1.0),
    }
    assert report["score_std_across_repeats"] is None  # one repeat: no noise estimate
    assert report["thresholds"]["min_ordering_accuracy"]["passed"] is False and code == 1
    # Without a gate the same run succeeds: a bad judge is a finding, not an error.
    code, report, _ = run(server, config, tmp_path / "out2", "--fixtures", str(fixtures))
    assert code == 0 and report["passed"] is True and report["thresholds"] == {}


def test_bad_fixture_lines_and_a_judge_outage_are_reported_per_item(
    tmp_path: Path, server: FakeJudgeServer, config: Path
):
    good = case("ok", "judge_analysis", ("reference", "o-ref"), ("wrong", "o-wrong"))
    fixtures = write_jsonl(
        tmp_path / "f.jsonl",
        [
            good,
            "{not json",
            case("lab", "judge_analysis", ("best", "x")),
            case("fn", "no_such_judge", ("reference", "x")),
            "",
            {**good, "candidates": [{"label": "reference", "text": "dup"}]},
            case("qa_acc", "qa_accuracy", ("reference", "x")),
        ],
    )
    server.script(score(5), match="o-ref")
    server.script(Reply(status=503, text="overloaded", delay_s=DELAY_S), match="o-wrong")
    out = tmp_path / "out"
    code, report, rows = run(server, config, out, "--fixtures", str(fixtures))
    assert code == 0
    assert report["n_cases"] == 1 and report["n_bad_lines"] == 5
    bad = {b["line"]: b["error"] for b in report["bad_lines"]}
    assert sorted(bad) == [2, 3, 4, 6, 7]
    assert "not valid JSON" in bad[2]
    assert "label must be one of reference, perturbed, wrong" in bad[3]
    assert "unknown reward function 'no_such_judge'" in bad[4]
    assert "duplicate case id 'ok'" in bad[6] and f"{fixtures}:1" in bad[6]
    assert "does not use a judge" in bad[7]
    # The outage: one call, no reply, the candidate unscored, the run finished.
    assert report["n_calls"] == 2 and report["n_replies"] == 1 and report["n_call_errors"] == 1
    assert (
        report["parse_failure_rate"] == 0.0 and report["n_pairs"] == 0 and report["ordering_accuracy"] is None
    )
    assert report["per_label_mean"] == {"reference": approx(1.0)}
    sample = rows[0]["candidates"][1]["samples"][0]
    assert sample["status"] == "call_error" and "HTTP 503" in sample["error"]
    md = (out / "report.md").read_text()
    assert "## Fixture lines skipped" in md and "## Samples without a score" in md
    # A gate on a metric that could not be computed fails rather than passing silently.
    code, report, _ = run(
        server, config, tmp_path / "o2", "--fixtures", str(fixtures), "--min-ordering-accuracy", "0"
    )
    assert code == 1 and report["thresholds"]["min_ordering_accuracy"]["value"] is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--fixtures", "no/such.jsonl"], "no such fixture file no/such.jsonl"),
        (["--min-ordering-accuracy", "1.5"], "--min-ordering-accuracy must be between 0 and 1"),
        (["--prompt-dir", "no/such/dir"], "--prompt-dir: no such folder"),
        (["--judge-temperature", "-1"], "--judge-temperature must be >= 0"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    tmp_path: Path, server: FakeJudgeServer, config: Path, capsys: pytest.CaptureFixture, extra, message
):
    code, report, _ = run(server, config, tmp_path / "out", *extra)
    assert code == 2 and report == {}
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and printed[0].startswith("error: ") and message in printed[0]
    assert server.calls == 0


def test_usage_errors_without_a_judge_or_usable_fixtures(tmp_path: Path, capsys: pytest.CaptureFixture):
    assert main(["judge-eval", "--out", str(tmp_path / "o")]) == 2
    assert "no judge configured" in capsys.readouterr().out
    fixtures = write_jsonl(tmp_path / "bad.jsonl", ["[1, 2]"])
    args = ["judge-eval", "--judge-base-url", "http://127.0.0.1:9/v1", "--judge-model", "m"]
    assert main([*args, "--fixtures", str(fixtures), "--out", str(tmp_path / "o")]) == 2
    assert "no usable fixture case" in capsys.readouterr().out
    assert main([*args, "--fixtures", str(fixtures)]) == 2
    assert "--out DIR is required" in capsys.readouterr().out


def test_repeats_are_separate_samples_and_the_cache_serves_a_rerun(
    tmp_path: Path, server: FakeJudgeServer, config: Path
):
    cache = tmp_path / "judge.sqlite"
    config.write_text(f"judge:\n  max_retries: 0\n  timeout_s: 5\n  cache_path: {cache}\n")
    fixtures = write_jsonl(
        tmp_path / "f.jsonl", [case("r", "judge_analysis", ("reference", "r-ref"), ("wrong", "r-wrong"))]
    )
    server.script(score(5), score(4), score(3), match="r-ref")
    server.script(score(2), match="r-wrong")
    flags = ["--fixtures", str(fixtures), "--repeats", "3", "--judge-temperature", "0.7"]
    code, report, _ = run(server, config, tmp_path / "a", *flags)
    assert code == 0 and server.calls == 6  # 2 candidates x 3 repeats, none answered from the cache
    assert {r["temperature"] for r in server.requests} == {0.7} and report["temperature"] == 0.7
    assert report["score_std_across_repeats"] == approx(statistics.stdev([1.0, 0.8, 0.6]) / 2)
    code, again, _ = run(server, config, tmp_path / "b", *flags)
    assert server.calls == 6 and again["n_cached"] == 6 and again["latency_ms_p50"] is None
    assert again["score_std_across_repeats"] == approx(report["score_std_across_repeats"])


def test_latency_is_the_judges_answer_time_not_time_queued(
    tmp_path: Path, server: FakeJudgeServer, config: Path
):
    # 6 calls of 0.15 s, 2 at a time. Had all 6 been handed to the client at once, its latency
    # clock (started before its queue) would read 0.15, 0.15, 0.3, 0.3, 0.45, 0.45 s: median 0.3.
    fixtures = write_jsonl(
        tmp_path / "f.jsonl",
        [
            case(f"q{i}", "judge_analysis", ("reference", f"q{i}-ref"), ("wrong", f"q{i}-wrong"))
            for i in range(3)
        ],
    )
    server.script(Reply(text="SCORE: 3", delay_s=0.15))
    code, report, _ = run(
        server, config, tmp_path / "o", "--fixtures", str(fixtures), "--judge-concurrency", "2"
    )
    assert code == 0 and server.max_in_flight == 2
    assert 150 <= report["latency_ms_p50"] < 250


def test_prompt_dir_is_used_and_hashed(tmp_path: Path, server: FakeJudgeServer, config: Path):
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for name in RUBRICS:
        shutil.copy(prompt_path(name), prompts / f"{name}.md")
    edited = prompts / "judge_analysis.md"
    edited.write_text(edited.read_text() + "\nEDITED-RUBRIC-MARKER\n")
    fixtures = write_jsonl(tmp_path / "f.jsonl", [case("p", "judge_analysis", ("reference", "p-ref"))])
    server.script(score(4), match="p-ref")
    code, report, _ = run(
        server, config, tmp_path / "o", "--fixtures", str(fixtures), "--prompt-dir", str(prompts)
    )
    assert code == 0 and "EDITED-RUBRIC-MARKER" in server.requests[0]["prompt"]
    digest = hashlib.sha256(edited.read_bytes()).hexdigest()
    assert report["prompt_hashes"] == {"judge_analysis": digest} and report["prompt_dir"] == str(prompts)
    assert report["prompt_hash"] == hashlib.sha256(f"judge_analysis:{digest}\n".encode()).hexdigest()


def test_trajectory_candidates_show_answer_judges_only_the_final_answer(
    tmp_path: Path, server: FakeJudgeServer, config: Path
):
    trajectory = (
        "<Analyze>\nsecret-analysis-step\n</Analyze>\n<Code>\n```python\nprint(6 * 7)\n```\n</Code>"
        "\n<Execute>\n<Answer>printed-by-code</Answer>\n</Execute>\n"
        "<Analyze>\ndone\n</Analyze>\n<Answer>\nIt is 42.\n\nAnswer: forty-two-marker\n</Answer>"
    )
    fixtures = write_jsonl(
        tmp_path / "f.jsonl",
        [
            case("acc", "judge_accuracy", ("reference", trajectory), method="datatask"),
            case("ana", "llm_as_judgement_analyze", ("reference", trajectory)),
        ],
    )
    server.script(score(5))
    code, report, _ = run(server, config, tmp_path / "o", "--fixtures", str(fixtures))
    assert code == 0 and report["n_scored"] == 2
    accuracy_prompt = next(r["prompt"] for r in server.requests if "secret-analysis-step" not in r["prompt"])
    assert "forty-two-marker" in accuracy_prompt and "printed-by-code" not in accuracy_prompt
    analysis_prompt = next(r["prompt"] for r in server.requests if "secret-analysis-step" in r["prompt"])
    assert "printed-by-code" in analysis_prompt  # the analysis judge sees the observations too


def test_shipped_fixtures_are_complete_and_run(tmp_path: Path, server: FakeJudgeServer, config: Path):
    cases, bad = load_fixtures([DATA / "judge_fixtures"])
    assert bad == [] and len(cases) >= 12
    assert {c.method for c in cases} == {"qa", "datatask", "openresearch"}
    assert {c.judge for c in cases} == {"judge_analysis", "judge_accuracy", "judge_opendomain"}
    for c in cases:
        assert sorted({cand.label for cand in c.candidates}) == sorted(LABELS), c.id
        assert all("<Answer>" in cand.text and cand.kind for cand in c.candidates), c.id
    good = {
        t["task_id"]: t["turns"]
        for t in map(json.loads, (DATA / "trajectories.jsonl").read_text().splitlines())
        if t["label"] == "good"
    }
    for c in cases:  # the reference candidate is the shipped good trajectory, observations added
        reference = next(cand.text for cand in c.candidates if cand.label == "reference")
        assert all(turn in reference for turn in good[c.task_id]), c.id
    server.script(Reply(text=dims(4, 3, 4, 4, 5)), match="five separate dimensions")  # judge_opendomain
    server.script(score(4))
    code, report, rows = run(server, config, tmp_path / "o")
    assert code == 0 and report["n_cases"] == len(cases) and report["n_bad_lines"] == 0
    assert report["n_calls"] == sum(len(c.candidates) for c in cases)
    assert report["n_other_errors"] == 0 and report["n_call_errors"] == 0
    assert len(rows) == len(cases)


# Two prompt sets, each candidate's replies per set (one per repeat; /5 is the score). Set B's
# rubric file carries the marker RUBRIC-B, so the server knows which set a prompt comes from.
COMPARE_REPLIES = {
    "A": {
        "c1-ref": (5, 3), "c1-pert": (3, 3), "c1-wrong": (1, 1),
        "c2-ref": (3, 3), "c2-pert": (4, 4), "c2-wrong": (2, 2),
        "c3-ref": (4, 4), "c3-pert": (4, 4), "c3-wrong": (None, None),
    },
    "B": {
        "c1-ref": (5, 5), "c1-pert": (2, 2), "c1-wrong": (1, 1),
        "c2-ref": (5, 5), "c2-pert": (3, 3), "c2-wrong": (1, 1),
        "c3-ref": (5, 5), "c3-pert": (3, 3), "c3-wrong": (2, None),
    },
}  # fmt: skip


def compare_server() -> FakeJudgeServer:
    calls: dict[tuple[str, str], int] = {}

    def reply(prompt: str) -> Reply:
        which = "B" if "RUBRIC-B" in prompt else "A"
        marker = next(m for m in COMPARE_REPLIES[which] if m in prompt)
        n = calls.get((which, marker), 0)
        calls[(which, marker)] = n + 1
        value = COMPARE_REPLIES[which][marker][n % 2]
        return Reply(text="no verdict here" if value is None else f"Weaknesses:\n- some\nSCORE: {value}")

    return FakeJudgeServer(reply)


def test_two_prompt_sets_are_compared_with_paired_differences_over_cases(tmp_path: Path, config: Path):
    revised = tmp_path / "revised"
    revised.mkdir()
    text = prompt_path("judge_analysis").read_text()
    (revised / "judge_analysis.md").write_text(text + "\nRUBRIC-B\n")
    fixtures = write_jsonl(
        tmp_path / "f.jsonl",
        [
            case(
                c,
                "judge_analysis",
                ("reference", f"{c}-ref"),
                ("perturbed", f"{c}-pert"),
                ("wrong", f"{c}-wrong"),
            )
            for c in ("c1", "c2", "c3")
        ],
    )
    out = tmp_path / "out"
    with compare_server() as srv:
        args = ["judge-eval", "--config", str(config), "--judge-base-url", srv.url, "--judge-model", "m"]
        args += ["--fixtures", str(fixtures), "--repeats", "2", "--out", str(out)]
        code = main([*args, "--prompt-dir", "shipped", "--prompt-dir", str(revised)])
        assert srv.calls == 36  # 9 candidates x 2 repeats x 2 sets, on the same fixtures and judge
    assert code == 0
    result = json.loads((out / "compare.json").read_text())
    assert (out / "shipped" / "report.json").is_file() and (out / "revised" / "cases.jsonl").is_file()
    assert "Paired differences from shipped" in (out / "compare.md").read_text()
    sets = {s["name"]: s for s in result["sets"]}
    assert result["baseline"] == "shipped" and list(sets) == ["shipped", "revised"]
    assert sets["shipped"]["prompt_dir"] is None and sets["revised"]["prompt_dir"] == str(revised)
    # A: c1 1,1,1; c2 ref 0.6 < pert 0.8 -> 0, then 1, 1; c3 ref = pert -> 0.5 (wrong unscored) = 5.5/7
    assert sets["shipped"]["ordering_accuracy"] == approx(5.5 / 7)
    assert sets["revised"]["ordering_accuracy"] == approx(1.0)
    assert sets["shipped"]["parse_failure_rate"] == approx(2 / 18)
    assert sets["revised"]["parse_failure_rate"] == approx(1 / 18)
    # std over repeats: A's c1-ref is stdev(1.0, 0.6) over 8 candidates with two scores; B's are all 0
    assert sets["shipped"]["score_std_across_repeats"] == approx(statistics.stdev([1.0, 0.6]) / 8)
    assert sets["revised"]["score_std_across_repeats"] == approx(0.0)
    (diff,) = result["differences"]
    assert (diff["set"], diff["minus"]) == ("revised", "shipped")
    m = diff["metrics"]
    # paired pairs: c1 [0, 0, 0], c2 [1, 0, 0], c3 only ref>pert [1 - 0.5]
    assert m["ordering_accuracy"]["diff"] == approx(1.5 / 7) and m["ordering_accuracy"]["n_items"] == 7
    low, high = m["ordering_accuracy"]["ci95"]
    assert 0.0 <= low <= 1.5 / 7 <= high <= 0.5  # a resample's mean lies between c1's 0 and c3's 0.5
    # every sample answered in both sets: c3-wrong's two repeats differ by -1 and 0
    assert m["parse_failure_rate"]["diff"] == approx(-1 / 18) and m["parse_failure_rate"]["n_items"] == 18
    low, high = m["parse_failure_rate"]["ci95"]
    assert -1 / 6 - 1e-9 <= low <= -1 / 18 <= high <= 0.0  # (reported rounded to 12 decimals)
    noise = m["score_std_across_repeats"]  # c3-wrong has one score in B: left out of the pairing
    assert noise["diff"] == approx(-statistics.stdev([1.0, 0.6]) / 8) and noise["n_items"] == 8
    assert noise["n_cases"] == 3


def test_a_prompt_dir_that_does_not_exist_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture):
    code = main(
        ["judge-eval", "--out", str(tmp_path / "o"), "--prompt-dir", "shipped", "--prompt-dir", "nope"]
    )
    assert (
        code == 2
        and "--prompt-dir: no such folder nope (or 'shipped' for the shipped prompts)"
        in " ".join(capsys.readouterr().out.split())
    )


def test_the_upstream_profile_and_judge_eval_read_one_reply_as_one_score(
    tmp_path: Path, workspace_root: Path, config: Path
):
    """The upstream plan scores through the JudgeSession judge-eval uses: "SCORE: 4.5" is 0.9 in
    both (upstream's own integer regex read 4, 0.8, in training only)."""
    from deepanalyze_env.core.env import DeepAnalyzeEnv

    fixtures = write_jsonl(tmp_path / "f.jsonl", [case("u", "judge_analysis", ("reference", "u-ref"))])
    (tmp_path / "up.yaml").write_text("profile: upstream\njudge:\n  max_retries: 0\n")
    with FakeJudgeServer(Reply(text="Weaknesses:\n- few\nSCORE: 4.5")) as srv:
        code, report, _ = run(srv, tmp_path / "up.yaml", tmp_path / "o", "--fixtures", str(fixtures))
        judge = {"backend": "openai", "base_url": srv.url, "model": "m", "max_retries": 0}
        env = DeepAnalyzeEnv(
            {"workspace_root": str(workspace_root), "profile": "upstream", "judge": judge},
            extras={"reward_spec": {"method": "qa", "ground_truth": "B"}, "input_seq": "Which store?"},
        )
        env.init([{"role": "user", "content": "Which store?"}])
        out = env.step("<Analyze>plan</Analyze>\n<Answer>Answer: B</Answer>")
        env.close()
    assert code == 0 and report["per_label_mean"]["reference"] == approx(0.9)
    assert out["metadata"]["reward_components"]["qa_analysisc_reward"] == approx(0.9)


@pytest.mark.slow
def test_transformers_backend_on_embedded_smollm2(tmp_path: Path):
    """The local-model path end to end on one short candidate (its score is not the point)."""
    pytest.importorskip("transformers")
    try:
        embedded_gguf("smollm2")
    except ValueError as exc:
        pytest.skip(str(exc))
    config = tmp_path / "env.yaml"
    config.write_text("judge:\n  max_tokens: 16\n  timeout_s: 120\n")
    fixtures = write_jsonl(
        tmp_path / "f.jsonl", [case("s", "judge_accuracy", ("reference", "42 widgets"), method="datatask")]
    )
    args = ["judge-eval", "--config", str(config), "--judge-backend", "transformers"]
    args += ["--judge-model", "embedded:smollm2", "--fixtures", str(fixtures), "--out", str(tmp_path / "o")]
    assert main(args) == 0
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["n_calls"] == 1 and report["n_replies"] == 1 and report["backend"] == "transformers"
    assert report["n_parse_failures"] + report["n_scored"] == 1


@pytest.mark.slow
def test_shipped_fixtures_match_their_build_script():
    """The committed fixtures are what data/judge_fixtures/build.py makes (it runs every cell)."""
    script = DATA / "judge_fixtures" / "build.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr
