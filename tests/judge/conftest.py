"""Judge fixtures: a real OpenAI-compatible HTTP server on 127.0.0.1 and clients pointed at it.

Clients use short timeouts and backoffs so failure paths finish in well under a second; the
API key is a distinctive fake set in its own environment variable, so tests can search every
output for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from deepanalyze_env.core.env import DeepAnalyzeEnv
from rewards.judge import JudgeClient, JudgeSession, JudgeSettings
from rewards.judge.fake_server import FakeJudgeServer

KEY_ENV = "DA_JUDGE_TEST_KEY"
FAKE_KEY = "fake-judge-key-Zq81XkP0-7f3c9e1b"
MODEL = "judge-under-test"


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, FAKE_KEY)
    return FAKE_KEY


@pytest.fixture
def server() -> Iterator[FakeJudgeServer]:
    with FakeJudgeServer() as srv:
        yield srv


def settings_for(server: FakeJudgeServer | None, **overrides: Any) -> JudgeSettings:
    values: dict[str, Any] = {
        "backend": "openai",
        "base_url": server.url if server is not None else None,
        "model": MODEL,
        "api_key_env": KEY_ENV,
        "timeout_s": 2.0,
        "max_retries": 2,
        "concurrency": 8,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
    }
    values.update(overrides)
    return JudgeSettings.from_config(values)


@pytest.fixture
def make_client(server: FakeJudgeServer, api_key: str) -> Iterator[Callable[..., JudgeClient]]:
    """``make_client(**overrides)`` → a fresh client (own semaphore, own cache) for the server."""
    made: list[JudgeClient] = []

    def factory(**overrides: Any) -> JudgeClient:
        client = JudgeClient(settings_for(server, **overrides))
        made.append(client)
        return client

    yield factory
    for client in made:
        client.close()


@pytest.fixture
def session(make_client: Callable[..., JudgeClient]) -> JudgeSession:
    return JudgeSession(make_client())


QUESTION = "Which store has the highest revenue?"


def qa_env(
    root: Any,
    judge: dict[str, Any],
    *,
    question: str = QUESTION,
    prefix: list | None = None,
    timeout_s: float = 5,
    **config: Any,
) -> DeepAnalyzeEnv:
    """An initialised qa episode (ground truth ``B``) over the shipped ``ws`` workspace whose
    judge is an OpenAI-compatible server (``judge`` is merged into its settings, no retries):
    the episode the judge's end-to-end tests play."""
    env_config = {
        "workspace_root": str(root),
        "executor": {"timeout_s": timeout_s},
        "judge": {"backend": "openai", "model": "j", "max_retries": 0, **judge},
        **config,
    }
    extras: dict[str, Any] = {
        "reward_spec": {"method": "qa", "ground_truth": "B"},
        "data": "data",
        "workspace_id": "ws",
        "input_seq": question,
    }
    if prefix is not None:
        extras["prefix"] = prefix
    env = DeepAnalyzeEnv(env_config, extras=extras)
    env.init([{"role": "user", "content": question}])
    return env
