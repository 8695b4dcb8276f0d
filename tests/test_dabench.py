"""DABench import: the fixture in DABench's exact format becomes rows scored by answer_parts.

tests/fixtures/dabench/ is written for this test (DABench itself is not shipped): 7 question
lines (3 good; a truncated line, an unknown CSV, a question without a label, a question missing
its format key) and 7 label lines (one whose answers are not a list, one not JSON).
"""

from __future__ import annotations

import json
from pathlib import Path

from deepanalyze_env.cli import main
from deepanalyze_env.core.env import DeepAnalyzeEnv
from deepanalyze_env.core.tasks import env_extras

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "dabench"


def convert(tmp_path: Path, capsys) -> tuple[int, list[dict], str]:
    out = tmp_path / "dabench_rows.jsonl"
    code = main(
        [
            "prepare-data",
            "--from",
            "dabench",
            "--questions",
            str(FIXTURE / "questions.jsonl"),
            "--labels",
            str(FIXTURE / "labels.jsonl"),
            "--tables",
            str(FIXTURE / "tables"),
            "--out",
            str(out),
            "--format",
            "trl",
        ]
    )
    text = capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return code, rows, text


def test_good_questions_become_rows_and_bad_lines_are_named(tmp_path, capsys):
    code, rows, text = convert(tmp_path, capsys)
    assert code == 0
    assert [r["task_id"] for r in rows] == ["dabench-0", "dabench-1", "dabench-2"]
    skipped = [line for line in text.splitlines() if line.startswith("skipped")]
    assert [s.split()[1] for s in skipped] == [
        "labels.jsonl:6:",
        "labels.jsonl:7:",
        "questions.jsonl:4:",
        "questions.jsonl:5:",
        "questions.jsonl:6:",
        "questions.jsonl:7:",
    ]
    assert "table 'missing_table.csv' not found" in text and "question 5 has no label" in text
    assert "missing format" in text


def test_a_row_carries_question_constraints_format_and_the_csv(tmp_path, capsys):
    _, rows, _ = convert(tmp_path, capsys)
    row = rows[1]
    prompt = row["prompt"][0]["content"]
    assert "Which variety has the tallest average height" in prompt
    assert "Constraints: Group by variety and compare mean height_m." in prompt
    assert "Answer format: @variety[variety_name] @tree_count[count]" in prompt
    assert 'File 1: {"name": "orchard.csv"' in prompt
    assert row["reward_spec"] == {
        "method": "verified",
        "ground_truth": [["variety", "Bramley"], ["tree_count", "3"]],
        "function": ["answer_parts"],
        "match": "dabench",  # scored by DABench's own rule
    }
    assert (tmp_path / "dabench" / "orchard" / "orchard.csv").read_bytes() == (
        FIXTURE / "tables" / "orchard.csv"
    ).read_bytes()


def test_a_converted_row_scores_through_the_env(tmp_path, capsys):
    _, rows, _ = convert(tmp_path, capsys)
    row = rows[1]
    env = DeepAnalyzeEnv({"workspace_root": str(tmp_path)}, env_extras(row))
    try:
        env.init(row["prompt"])
        code = (
            "import pandas as pd\ndf = pd.read_csv('orchard.csv')\n"
            "m = df.groupby('variety')['height_m'].mean()\n"
            "best = m.idxmax()\nprint(best, int((df['variety'] == best).sum()))"
        )
        obs = env.step(f"<Analyze>group</Analyze>\n<Code>\n```python\n{code}\n```\n</Code>")
        assert "Bramley 3" in obs["observations"][0]["content"]
        # one part right, one wrong: half the parts, not all
        final = env.step("<Analyze>done</Analyze>\n<Answer>Answer: @variety[Bramley] @tree_count[4]</Answer>")
    finally:
        env.close(record=False)
    assert final["metadata"]["reward_components"] == {"answer_parts": 0.5, "answer_parts_all": 0.0}


def test_dabench_needs_its_three_inputs(tmp_path, capsys):
    assert main(["prepare-data", "--from", "dabench", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "--from dabench needs --questions" in capsys.readouterr().out
