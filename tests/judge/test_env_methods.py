"""All three methods scored end to end through ``env.step``: shipped tasks, their reference
trajectories, real kernels, and the real openai client against a local judge server."""

from __future__ import annotations

import json

import pytest

from deepanalyze_env.core.env import DeepAnalyzeEnv
from deepanalyze_env.core.tasks import env_extras, load_rows
from rewards.judge.fake_server import FakeJudgeServer, Reply
from tests.conftest import DATA

VERDICT = (
    '```json\n{"usefulness": 5, "richness": 4, "soundness": 4, "interpretability": 3, "readability": 5}\n```'
)


def trajectories() -> dict[tuple[str, str], list[str]]:
    lines = [json.loads(x) for x in (DATA / "trajectories.jsonl").read_text().splitlines()]
    return {(t["task_id"], t["label"]): t["turns"] for t in lines}


def run(row: dict, turns: list[str], judge_url: str) -> dict:
    config = {
        "workspace_root": str(DATA),
        "judge": {"backend": "openai", "base_url": judge_url, "model": "j"},
    }
    env = DeepAnalyzeEnv(env_config=config, extras=env_extras(row))
    env.init(row["prompt"])
    try:
        for turn in turns:
            out = env.step(turn)
            if out["done"]:
                return out
        raise AssertionError("the trajectory never finished")
    finally:
        env.close()


@pytest.fixture(scope="module")
def judge():
    with FakeJudgeServer() as server:
        server.script(Reply(text="Weaknesses:\n- none\nSCORE: 4"), match="reviewing the working process")
        server.script(Reply(text="Weaknesses:\n- rounding\nSCORE: 5"), match="reference answer")
        server.script(Reply(text="Weaknesses:\n- short\n" + VERDICT))
        yield server


@pytest.mark.parametrize("method", ["qa", "datatask", "openresearch"])
def test_good_reference_trajectories_are_scored_with_the_methods_components(method, judge):
    rows = load_rows([DATA / "tasks" / f"{method}.jsonl"], str(DATA))
    scripts = trajectories()
    expected = {
        "qa": {"qa_accuracy", "qa_analysis", "qa_exact"},
        "datatask": {"judge_accuracy", "datatask_code"},
        "openresearch": {
            "openresearch_usefulness",
            "openresearch_richness",
            "openresearch_soundness",
            "openresearch_interpretability",
            "openresearch_readability",
            "openresearch_code",
            "openresearch_turns",
        },
    }[method]
    for row in rows:
        out = run(row, scripts[(row["task_id"], "good")], judge.url)
        meta = out["metadata"]
        assert meta["reward_status"] == "scored", meta.get("error")
        assert set(meta["reward_components"]) == expected
        assert meta["judge"]["calls"] and all(c["error"] is None for c in meta["judge"]["calls"])
        weighted = {k: v for k, v in meta["reward_components"].items() if k != "qa_exact"}
        assert out["reward"] == pytest.approx(sum(weighted.values()) / len(weighted))


def test_judge_outage_mid_run_is_a_verifier_error_not_a_zero():
    rows = load_rows([DATA / "tasks" / "datatask.jsonl"], str(DATA))
    row = rows[0]
    with FakeJudgeServer(Reply(status=503, text="down")) as server:
        config = {
            "workspace_root": str(DATA),
            "judge": {
                "backend": "openai",
                "base_url": server.url,
                "model": "j",
                "max_retries": 1,
                "timeout_s": 2,
            },
        }
        env = DeepAnalyzeEnv(env_config=config, extras=env_extras(row))
        env.init(row["prompt"])
        for turn in trajectories()[(row["task_id"], "good")]:
            out = env.step(turn)
        env.close()
    meta = out["metadata"]
    assert out["done"] and meta["reward_status"] == "verifier_error"
    assert "judge_accuracy" in meta["error"] and "503" in meta["error"]
    assert "judge_accuracy" not in meta["reward_components"]
