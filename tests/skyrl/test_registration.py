"""Registration where SkyRL looks names up: in fresh processes and inside Ray tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.skyrl.conftest import DATA, ROOT, shipped_rows, trajectories

PROBE = """
import json, sys
import skyrl_gym
from skyrl_gym.envs.registration import registry
before = registry.get("deepanalyze") is not None
{setup}
from skyrl.backends.skyrl_train.utils.ppo_utils import AdvantageEstimatorRegistry
print(json.dumps({{"before": before, "env": registry.get("deepanalyze") is not None,
                  "estimator": "deepanalyze_grpo" in AdvantageEstimatorRegistry._functions}}))
"""


def probe(setup: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(setup=setup)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_fresh_process_knows_nothing_until_something_registers():
    assert probe("") == {"before": False, "env": False, "estimator": False}


def test_the_entrypoint_task_registers_env_and_estimator_in_a_fresh_process():
    # what a Ray worker does: import the task's module, then run the task body's first line
    got = probe("from deepanalyze_env.trainers.skyrl import entrypoint\nentrypoint.register_all()")
    assert got == {"before": False, "env": True, "estimator": True}


# --- 16 episodes as Ray tasks, each registering inside the task ---------------------------------


def play(row: dict, turns: list[str], env_config: dict) -> dict:
    """One episode through skyrl_gym.make, the way SkyRL's generator makes envs."""
    import skyrl_gym

    from deepanalyze_env.core.tasks import env_extras

    env = skyrl_gym.make("deepanalyze", env_config=env_config, extras=env_extras(row))
    env.init(row["prompt"])
    observations = []
    try:
        for turn in turns:
            out = env.step(turn)
            observations += [o["content"] for o in out["observations"]]
            if out["done"]:
                meta = out["metadata"]
                return {
                    "reward": out["reward"],
                    "components": meta["reward_components"],
                    "status": meta["reward_status"],
                    "code_pass": meta["code_pass"],
                    "observations": observations,
                }
    finally:
        env.close()
    raise AssertionError("trajectory ended without done")


def play_in_task(row: dict, turns: list[str], env_config: dict) -> dict:
    from deepanalyze_env.trainers.skyrl.entrypoint import register_all

    register_all()  # the registry does not travel to Ray workers
    result = play(row, turns, env_config)
    result["pid"] = os.getpid()
    return result


def episodes() -> list[tuple[dict, list[str]]]:
    rows = shipped_rows()
    jobs = []
    for label in ("good", "bad"):
        for task_id, turns in sorted(trajectories(label).items()):
            # a bad trajectory may never answer: the turn limit then ends it, as SkyRL's would
            jobs.append(({**rows[task_id], "max_turns": len(turns)}, turns))
    return jobs[:16]


def test_sixteen_episodes_as_ray_tasks_match_a_local_run():
    ray = pytest.importorskip("ray")
    from rewards.judge.fake_server import FakeJudgeServer, Reply

    jobs = episodes()
    assert len(jobs) == 16
    # the judge answers by prompt content, so every run of an episode gets the same reply
    dims = json.dumps(
        {d: 4 for d in ("usefulness", "richness", "soundness", "interpretability", "readability")}
    )
    server = FakeJudgeServer(  # a verdict in the place each rubric asks for it
        lambda prompt: Reply(
            text=f"```json\n{dims}\n```"
            if "five separate dimensions" in prompt
            else f"SCORE: {len(prompt) % 5 + 1}"
        )
    )
    with server:
        env_config = {
            "workspace_root": str(DATA),
            "executor": {"timeout_s": 20},
            "judge": {"backend": "openai", "base_url": server.url, "model": "fake-judge"},
        }
        local = [play(row, turns, env_config) for row, turns in jobs]
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={
                "env_vars": {
                    "PYTHONPATH": str(ROOT),
                    "DEEPANALYZE_SCRATCH": os.environ["DEEPANALYZE_SCRATCH"],
                }
            },
        )
        try:
            task = ray.remote(num_cpus=1)(play_in_task)
            remote = ray.get([task.remote(row, turns, env_config) for row, turns in jobs], timeout=600)
        finally:
            ray.shutdown()
    assert {r.pop("pid") for r in remote} - {os.getpid()}, "episodes ran in Ray worker processes"
    assert remote == local
    assert {r["status"] for r in local} == {"scored"}
    assert len({r["reward"] for r in local}) > 2  # good and bad trajectories differ
