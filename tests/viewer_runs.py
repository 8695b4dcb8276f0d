"""A small real run folder for the ``view`` and ``export`` tests, made by ``rollout`` itself.

The scripted policy replays the trajectories below against real kernels, a real local judge
server scores them, and ``rollout --out`` writes the run folder — so the tests read exactly
what users' runs hold. The run is built to cover what the pages must show: a hostile task id,
instruction, policy text, cell output and judge reply (``<script>``, ``<img onerror=…>``,
each of which would set ``window.__pwned`` if it ever ran), a truncated cell output, a failing
cell, a ``verifier_error`` episode (unparsable judge reply), GRPO groups of two samples per
task with different rewards, and two reward methods.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepanalyze_env.cli import main
from rewards.judge.fake_server import FakeJudgeServer, Reply

XSS_TASK = 'xss<img src=x onerror="window.__pwned=1">'
XSS_INSTRUCTION = "Which store has the most revenue? <script>window.__pwned=7</script>"
XSS_PRINT = "<script>window.__pwned=3</script>"
XSS_IMG = '<img src=x onerror="window.__pwned=4">'
JUDGE_REPLY = "Weaknesses:\n- <script>window.__pwned=6</script> terse\nSCORE: 4"
GARBAGE_REPLY = "no score here <b>bold</b>"
MAX_OUTPUT_CHARS = 1000


def _code(src: str, analyze: str = "look") -> str:
    return f"<Analyze>{analyze}</Analyze>\n<Code>\n```python\n{src}\n```\n</Code>"


def _answer(text: str, analyze: str = "done") -> str:
    return f"<Analyze>{analyze}</Analyze>\n<Answer>\nAnswer: {text}\n</Answer>"


TASKS = [
    {"id": XSS_TASK, "method": "qa", "instruction": XSS_INSTRUCTION},
    {"id": "t-plain", "method": "qa", "instruction": "Which store has the highest revenue?"},
    {"id": "t-data", "method": "datatask", "instruction": "Report the store with the highest revenue."},
]
TRAJECTORIES = [
    (
        XSS_TASK,
        "good",
        [
            _code(
                f"import pandas as pd\nprint({XSS_PRINT!r})\nprint({XSS_IMG!r})\nprint('x' * 5000)",
                analyze="look <script>window.__pwned=2</script>",
            ),
            _answer("B", analyze='B wins <img src=x onerror="window.__pwned=5">'),
        ],
    ),
    (XSS_TASK, "bad", [_answer("A", analyze="guess")]),
    (
        "t-plain",
        "good",
        [
            _code("print(undefined_name)"),
            _code(
                "import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum().idxmax())"
            ),
            _answer("B"),
        ],
    ),
    ("t-plain", "bad", [_answer("B", analyze="JUDGE-GARBAGE")]),
    (
        "t-data",
        "good",
        [
            _code("import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum())"),
            _answer("B"),
        ],
    ),
]


def make_run(base: Path, run_id: str = "h") -> Path:
    """Write the tasks, trajectories and a workspace under ``base``; return the run folder."""
    base.mkdir(parents=True, exist_ok=True)
    ws = base / "root" / "data" / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "sales.csv").write_text("store,revenue\nA,10\nB,32\nA,5\n")
    tasks = [
        {
            **t,
            "data": "data",
            "workspace_id": "ws",
            "reward_spec": {"method": t["method"], "ground_truth": "B"},
        }
        for t in TASKS
    ]
    (base / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (base / "traj.jsonl").write_text(
        "".join(
            json.dumps({"task_id": t, "label": lab, "turns": turns}) + "\n" for t, lab, turns in TRAJECTORIES
        )
    )
    (base / "env.yaml").write_text(f"executor: {{max_output_chars: {MAX_OUTPUT_CHARS}}}\n")
    out = base / "run"
    with FakeJudgeServer(Reply(text=JUDGE_REPLY)) as judge:
        judge.script(Reply(text=GARBAGE_REPLY), match="JUDGE-GARBAGE")
        args = ["rollout", "--tasks", str(base / "tasks.jsonl"), "--trajectories", str(base / "traj.jsonl")]
        args += ["--workspace-root", str(base / "root"), "--config", str(base / "env.yaml")]
        args += [
            "--out",
            str(out),
            "--run-id",
            run_id,
            "--judge-base-url",
            judge.url,
            "--judge-model",
            "judge-m",
        ]
        assert main(args) == 0
    return out


_SHARED: dict[str, Path] = {}


def shared_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run above, made once per test session (the ``view`` and ``export`` tests both read it)."""
    if "run" not in _SHARED:
        _SHARED["run"] = make_run(tmp_path_factory.mktemp("viewer-run"))
    return _SHARED["run"]
