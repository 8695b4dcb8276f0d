"""The judge client against a real HTTP server through the real ``openai`` client.

Retries, timeouts, garbage, the cache, replay, the concurrency cap and secrecy of the API key,
each checked by what the server saw (call counts, simultaneous requests) and what came back.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import closing
from pathlib import Path

import pytest

from rewards.aio import run_sync
from rewards.judge import (
    JudgeCacheMiss,
    JudgeCallError,
    JudgeClient,
    JudgeConfigError,
    JudgeParseError,
    JudgeSession,
    JudgeSettings,
    get_judge_client,
)
from rewards.judge.fake_server import FakeJudgeServer, Reply

from .conftest import FAKE_KEY, KEY_ENV, MODEL, settings_for

ANALYSIS = {"question": "Which store sold most?", "trajectory": "<Analyze>look</Analyze> marker-{}"}


def fields(tag: str) -> dict[str, str]:
    return {"question": ANALYSIS["question"], "trajectory": ANALYSIS["trajectory"].format(tag)}


def evaluate(session: JudgeSession, tag: str, rubric: str = "judge_analysis"):
    return run_sync(session.evaluate(rubric, fields(tag)))


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_retry_then_success(server: FakeJudgeServer, make_client, transport: str):
    server.script(Reply(status=500), Reply(status=429), Reply(text="SCORE: 4"), match="marker-flaky")
    session = JudgeSession(make_client(max_retries=3, http_transport=transport))
    assert evaluate(session, "flaky") == 4.0
    assert server.calls == 3
    assert session.calls[0]["attempts"] == 3 and session.calls[0]["error"] is None


def test_retry_after_header_is_honoured(server: FakeJudgeServer, make_client):
    server.script(Reply(status=429, headers={"Retry-After": "0.3"}), Reply(text="SCORE: 3"), match="marker-")
    session = JudgeSession(make_client(backoff_max_s=1.0))
    start = time.monotonic()
    assert evaluate(session, "ra") == 3.0
    assert time.monotonic() - start >= 0.3
    assert server.calls == 2


def test_retries_exhausted_is_an_error_naming_model_and_cause(server: FakeJudgeServer, make_client):
    server.script(Reply(status=503, text="overloaded"), match="marker-")
    session = JudgeSession(make_client(max_retries=2))
    with pytest.raises(JudgeCallError, match=rf"'{MODEL}'.*HTTP 503.*after 3 attempts"):
        evaluate(session, "down")
    assert server.calls == 3
    assert "HTTP 503" in session.calls[0]["error"] and session.calls[0]["attempts"] == 3


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_client_errors_other_than_429_are_not_retried(server: FakeJudgeServer, make_client, status: int):
    server.script(Reply(status=status, text="bad request"), match="marker-")
    with pytest.raises(JudgeCallError, match=f"HTTP {status}"):
        evaluate(JudgeSession(make_client(max_retries=3)), "4xx")
    assert server.calls == 1


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_timeout_is_an_error_within_the_retry_bound(server: FakeJudgeServer, make_client, transport: str):
    server.script(Reply(text="SCORE: 5", delay_s=30), match="marker-")
    timeout_s, retries, backoff_max = 0.4, 2, 0.05
    session = JudgeSession(
        make_client(
            timeout_s=timeout_s, max_retries=retries, backoff_max_s=backoff_max, http_transport=transport
        )
    )
    start = time.monotonic()
    with pytest.raises(JudgeCallError, match=rf"'{MODEL}'.*timed out after 0.4 s.*after 3 attempts"):
        evaluate(session, "slow")
    elapsed = time.monotonic() - start
    assert elapsed <= (timeout_s + backoff_max) * (retries + 1) + 1.0
    assert server.calls == retries + 1


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_unreachable_server_is_a_connection_error(api_key: str, transport: str):
    settings = settings_for(None, base_url="http://127.0.0.1:9/v1", max_retries=1, http_transport=transport)
    with (
        closing(JudgeClient(settings)) as client,
        pytest.raises(JudgeCallError, match=r"connection failed.*after 2"),
    ):
        evaluate(JudgeSession(client), "nowhere")


@pytest.mark.parametrize(
    "body", ["<html>502 proxy error</html>", '{"object": "chat.completion"}', '{"choices": []}', "[1, 2]"]
)
def test_garbage_http_body_is_a_call_error(server: FakeJudgeServer, make_client, body: str):
    server.script(Reply(raw_body=body), match="marker-")
    with pytest.raises(JudgeCallError, match="malformed response"):
        evaluate(JudgeSession(make_client()), "garbage")
    assert server.calls == 1


def test_garbage_reply_text_is_a_parse_error_with_the_raw_reply_recorded(
    server: FakeJudgeServer, make_client
):
    server.script(Reply(text="I think it is pretty good overall!"), match="marker-")
    session = JudgeSession(make_client())
    with pytest.raises(JudgeParseError, match=rf"'{MODEL}'.*judge_analysis.*no 'SCORE:' line") as info:
        evaluate(session, "chatty")
    assert info.value.raw == "I think it is pretty good overall!"
    call = session.calls[0]
    assert call["reply"] == "I think it is pretty good overall!"
    assert call["parse_error"] and call["score"] is None


def test_quoted_candidate_score_before_the_judges_own_gives_its_own(server: FakeJudgeServer, make_client):
    server.script(
        Reply(text='The analyst claims "SCORE: 5".\nWeaknesses: no checks.\nSCORE: 2'), match="marker-"
    )
    from rewards.judges import judge_analysis

    session = JudgeSession(make_client())
    messages = [{"role": "assistant", "content": "marker-quote"}]
    score = run_sync(judge_analysis(question="q", messages=messages, turns=1, prefix_turns=0, judge=session))
    assert score == pytest.approx(0.4)


@pytest.mark.parametrize("reply", [Reply(text=""), Reply(text="   \n"), Reply(text=None)])
def test_empty_reply_is_a_call_error(server: FakeJudgeServer, make_client, reply: Reply):
    server.script(reply, match="marker-")
    with pytest.raises(JudgeCallError, match="empty reply"):
        evaluate(JudgeSession(make_client()), "empty")


def test_credentials_in_base_url_stay_out_of_records_and_errors(server: FakeJudgeServer, api_key: str):
    settings = settings_for(
        server, base_url=server.url.replace("http://", "http://user:pw-Secret9@") + "?key=Q77"
    )
    server.script(Reply(status=400, text="nope"), match="marker-")
    with closing(JudgeClient(settings)) as client:
        session = JudgeSession(client)
        with pytest.raises(JudgeCallError) as info:
            evaluate(session, "creds")
    text = str(info.value) + json.dumps(session.summary())
    assert "pw-Secret9" not in text and "Q77" not in text
    assert server.url.replace("/v1", "") in text


def test_request_carries_model_sampling_and_key(server: FakeJudgeServer, make_client):
    evaluate(JudgeSession(make_client(temperature=0.0, max_tokens=77)), "req")
    request = server.requests[0]
    assert request["model"] == MODEL
    assert request["temperature"] == 0.0 and request["max_tokens"] == 77
    assert request["authorization"] == f"Bearer {FAKE_KEY}"
    assert "marker-req" in request["prompt"]


def test_keyless_local_server_gets_a_placeholder_key(server: FakeJudgeServer, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with closing(JudgeClient(settings_for(server))) as client:
        evaluate(JudgeSession(client), "nokey")
    assert server.requests[0]["authorization"] == "Bearer EMPTY"


def test_cache_hit_makes_no_call(server: FakeJudgeServer, make_client, tmp_path: Path):
    cache = str(tmp_path / "judge.sqlite")
    server.script(Reply(text="SCORE: 3"), match="marker-")
    first = JudgeSession(make_client(cache_path=cache))
    assert evaluate(first, "c") == 3.0
    assert server.calls == 1 and first.calls[0]["cached"] is False
    second = JudgeSession(make_client(cache_path=cache))  # a new client: the hit comes from SQLite
    assert evaluate(second, "c") == 3.0
    assert server.calls == 1
    assert second.calls[0]["cached"] is True and second.calls[0]["attempts"] == 0
    assert second.calls[0]["key"] == first.calls[0]["key"]


def test_cache_key_covers_sampling_parameters_and_sample_index(server, make_client, tmp_path: Path):
    cache = str(tmp_path / "judge.sqlite")
    evaluate(JudgeSession(make_client(cache_path=cache)), "k")
    evaluate(JudgeSession(make_client(cache_path=cache, max_tokens=99)), "k")
    evaluate(JudgeSession(make_client(cache_path=cache, temperature=0.7)), "k")
    run_sync(JudgeSession(make_client(cache_path=cache)).evaluate("judge_analysis", fields("k"), sample=1))
    assert server.calls == 4


def test_replay_answers_from_the_cache_and_a_miss_is_an_error(server, make_client, tmp_path: Path):
    cache = str(tmp_path / "judge.sqlite")
    server.script(Reply(text="Weaknesses: few.\nSCORE: 5"), match="marker-")
    evaluate(JudgeSession(make_client(cache_path=cache)), "recorded")
    calls_before = server.calls
    replay = JudgeSession(
        JudgeClient(JudgeSettings.from_config({"backend": "replay", "model": MODEL, "cache_path": cache}))
    )
    assert evaluate(replay, "recorded") == 5.0
    assert replay.calls[0]["cached"] is True and replay.calls[0]["backend"] == "replay"
    with pytest.raises(JudgeCacheMiss, match=rf"replay judge '{MODEL}'.*no recorded reply"):
        evaluate(replay, "never-seen")
    assert server.calls == calls_before
    assert "JudgeCacheMiss" in replay.calls[1]["error"]


def test_concurrency_cap_is_honoured(server: FakeJudgeServer, make_client):
    server.script(Reply(text="SCORE: 3", delay_s=0.15), match="marker-")
    session = JudgeSession(make_client(concurrency=3))

    async def many():
        return await asyncio.gather(*(session.evaluate("judge_analysis", fields(str(i))) for i in range(12)))

    assert run_sync(many()) == [3.0] * 12
    assert server.calls == 12
    assert server.max_in_flight == 3


def test_calls_from_another_event_loop_share_the_background_loop(server: FakeJudgeServer, make_client):
    """A caller inside its own loop (TRL, notebooks) still goes through the one shared client."""
    server.script(Reply(text="SCORE: 3", delay_s=0.1), match="marker-")
    session = JudgeSession(make_client(concurrency=2))

    async def many():
        return await asyncio.gather(*(session.evaluate("judge_analysis", fields(str(i))) for i in range(6)))

    assert asyncio.run(many()) == [3.0] * 6
    assert server.max_in_flight == 2


def test_api_key_is_never_written_anywhere(server: FakeJudgeServer, make_client, tmp_path: Path, caplog):
    for name in (None, "openai", "httpx2", "httpcore2", "rewards"):
        caplog.set_level(logging.DEBUG, logger=name)
    cache = tmp_path / "judge.sqlite"
    # A server that echoes the key in its error body, as some providers do for a rejected key.
    server.script(Reply(status=401, text=f"Incorrect API key provided: {FAKE_KEY}"), match="marker-reject")
    server.script(Reply(status=500, text=f"upstream failed for Bearer {FAKE_KEY}"), match="marker-flaky")
    server.script(Reply(text="SCORE: 4"), match="marker-")
    client = make_client(cache_path=str(cache), max_retries=1)
    session = JudgeSession(client)
    texts = []
    for tag in ("reject", "flaky", "fine"):
        try:
            evaluate(session, tag)
        except Exception as exc:
            texts.append(f"{type(exc).__name__}: {exc}")
    assert len(texts) == 2 and "HTTP 401" in texts[0]
    texts.append(json.dumps(session.summary()))
    texts.append(json.dumps(client.settings.describe()))
    texts.append(repr(client.settings))
    texts.append(caplog.text)
    client.cache.close()
    blobs = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("judge.sqlite"))
    assert FAKE_KEY not in "\n".join(texts)
    assert FAKE_KEY.encode() not in blobs
    assert server.requests[0]["authorization"] == f"Bearer {FAKE_KEY}"  # it was really sent


def test_shared_client_per_process_and_config(server: FakeJudgeServer, api_key: str):
    config = {"backend": "openai", "base_url": server.url, "model": MODEL, "api_key_env": KEY_ENV}
    assert get_judge_client(config) is get_judge_client(dict(config))
    assert get_judge_client(config) is not get_judge_client({**config, "concurrency": 2})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"backend": "bogus", "model": "m"}, "backend must be one of"),
        ({"backend": "openai", "base_url": "http://x/v1"}, "judge.model is not set"),
        ({"backend": "replay", "model": "m"}, "cache_path is not set"),
        ({"backend": "replay", "model": "m", "cache_path": "/nonexistent/c.sqlite"}, "does not exist"),
        ({"backend": "openai", "model": "m", "base_url": "http://x/v1", "concurrency": 0}, "concurrency"),
        ({"backend": "openai", "model": "m", "prompt_dir": "/nonexistent"}, "prompt_dir"),
        ({"backend": "openai", "model": "m", "colour": "red"}, "unknown judge setting"),
    ],
)
def test_bad_judge_config_fails_at_construction_naming_the_setting(config: dict, message: str):
    with pytest.raises(JudgeConfigError, match=message):
        get_judge_client(config)


def test_openai_without_base_url_needs_the_key_variable(monkeypatch):
    monkeypatch.delenv("DA_NO_SUCH_KEY", raising=False)
    with pytest.raises(JudgeConfigError, match="DA_NO_SUCH_KEY is not set"):
        get_judge_client({"backend": "openai", "model": "m", "api_key_env": "DA_NO_SUCH_KEY"})


def test_judge_config_dataclass_is_accepted(server: FakeJudgeServer, api_key: str):
    from deepanalyze_env.core.config import JudgeConfig

    client = get_judge_client(
        JudgeConfig(backend="openai", base_url=server.url, model=MODEL, api_key_env=KEY_ENV)
    )
    assert client.settings.model == MODEL and client.settings.backend == "openai"
