"""A judge that refuses the prompt's content (issue 52): the episode's own text refused scores 0
with a note, the task's refused stays a verifier_error — decided by asking once more with the
policy-written fields emptied.

Episodes run through the real env and kernel; the scripted judge server on 127.0.0.1 refuses any
prompt holding a trigger string, with the HTTP 400 bodies OpenAI and Azure OpenAI send (or a 200
whose choice stopped with ``finish_reason: content_filter``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deepanalyze_env.core.env import DeepAnalyzeEnv
from rewards.judge.backends import content_refusal_of
from rewards.judge.fake_server import FakeJudgeServer, Reply
from tests.conftest import code, play
from tests.judge.conftest import QUESTION, qa_env

TRIGGER = "TRIGGER-c0ntent"
OPENAI_400 = "Invalid prompt: your prompt was flagged as potentially violating our usage policy."
AZURE_400 = "The response was filtered due to the prompt triggering Azure OpenAI's content management policy."


def make_env(root: Path, url: str, question: str = QUESTION) -> DeepAnalyzeEnv:
    return qa_env(root, {"base_url": url}, question=question)


@pytest.mark.parametrize(
    "refusal",
    [
        Reply(text=OPENAI_400, status=400),
        Reply(text=AZURE_400, status=400),
        Reply(text="", finish_reason="content_filter"),
    ],
    ids=["openai-400", "azure-400", "finish-reason"],
)
def test_a_refusal_of_the_episodes_own_text_scores_0_with_a_note(workspace_root, refusal):
    with FakeJudgeServer() as server:
        server.script(refusal, match=TRIGGER)
        out = play(
            make_env(workspace_root, server.url),
            code("print(1)"),
            f"<Analyze>{TRIGGER}</Analyze>\n<Answer>Answer: B</Answer>",
        )
        probes = [
            r for r in server.requests if "BEGIN TRAJECTORY" in r["prompt"] and TRIGGER not in r["prompt"]
        ]
    meta = out["metadata"]
    assert meta["reward_status"] == "scored", meta.get("error")
    assert meta["reward_components"]["qa_analysis"] == 0.0
    assert "that text was refused" in meta["reward_notes"]["judge_analysis"]
    assert len(probes) == 1  # asked once more, with the trajectory emptied


def test_a_refusal_of_the_tasks_own_text_stays_a_verifier_error(workspace_root):
    with FakeJudgeServer() as server:
        server.script(Reply(text=OPENAI_400, status=400), match=TRIGGER)
        env = make_env(workspace_root, server.url, question=f"Which store? {TRIGGER}")
        out = play(env, code("print(1)"), "<Analyze>a</Analyze>\n<Answer>Answer: B</Answer>")
    meta = out["metadata"]
    assert meta["reward_status"] == "verifier_error"
    assert "refused the prompt's content" in meta["error"] and "JudgeContentRefused" in meta["error"]


@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        (400, OPENAI_400, True),
        (400, AZURE_400, True),
        (400, "Error code: 400 - {'error': {'code': 'content_policy_violation'}}", True),
        (400, "This model's maximum context length is 4097 tokens.", False),
        (500, OPENAI_400, False),
    ],
)
def test_content_refusals_are_told_from_other_errors(status, message, expected):
    assert content_refusal_of(status, message) is expected
