"""What the viewer page embeds, without a browser: tag segments, highlighting runs, safe JSON."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from deepanalyze_env.offline.viewer.highlight import CLASSES, code_runs, python_runs
from deepanalyze_env.offline.viewer.payload import Payload, join_segments, script_json, segments

PIECES = [
    "<Analyze>",
    "</Analyze>",
    "<Code>",
    "</Code>",
    "<Execute>",
    "</Execute>",
    "<Answer>",
    "</Answer>",
    "<Other>",
    "x",
    "\n",
    " ",
    "<",
    ">",
    "/",
    "😀",
    "print(1)",
]


@given(st.lists(st.sampled_from(PIECES), max_size=30).map("".join))
def test_segments_join_back_to_the_text(text: str):
    assert join_segments(segments(text)) == text


def test_segments_name_tags_and_mark_a_cut_turn():
    segs = segments("hi <Analyze>a</Analyze>\n<Code>\n```python\nimport os\n```\n</Code> <Answer>B")
    assert [(s["t"], s["s"], s.get("o", False)) for s in segs] == [
        ("", "hi ", False),
        ("Analyze", "a", False),
        ("", "\n", False),
        ("Code", "\n```python\nimport os\n```\n", False),
        ("", " ", False),
        ("Answer", "B", True),
    ]
    assert "h" in segs[3] and "h" not in segs[1]


def _pieces(text: str, runs: list[int]) -> list[tuple[str, str]]:
    """Cut ``text`` the way the page does: by UTF-16 code units."""
    units = text.encode("utf-16-le")
    out, pos = [], 0
    for cls, length in zip(runs[::2], runs[1::2], strict=True):
        out.append((CLASSES[cls], units[2 * pos : 2 * (pos + length)].decode("utf-16-le")))
        pos += length
    assert 2 * pos == len(units)
    return out


def test_highlight_runs_count_utf16_units_like_javascript():
    code = "print('😀')  # ok"
    assert _pieces(code, python_runs(code)) == [
        ("bi", "print"),
        ("", "("),
        ("str", "'😀'"),
        ("", ")  "),
        ("com", "# ok"),
    ]


def test_fence_lines_stay_plain_and_the_body_is_python():
    cell = "\n```python\nimport os\nx = 1\n```\n"
    pieces = _pieces(cell, code_runs(cell))
    assert pieces[0] == ("", "\n```python\n") and pieces[1] == ("kw", "import")
    assert pieces[-1] == ("", "\n```\n") and ("num", "1") in pieces


def test_script_json_cannot_close_its_element():
    value = {"a": "</script><script>alert(1)</script><!--", "b": "\u2028"}
    text = script_json(value)
    assert "<" not in text and json.loads(text) == value


def test_weights_come_from_the_plan_and_say_when_they_may_differ():
    from deepanalyze_env.core.profiles import PROFILES

    spec = {"method": "qa", "ground_truth": "B"}
    fingerprint = PROFILES["v1"].build_plan(spec).fingerprint()
    record = {"reward_spec": spec, "versions": {"profile": "v1", "reward_plan": fingerprint}}
    # the qa method: accuracy and the judge's analysis score count equally, exact match is reported only
    assert Payload().weights(record) == ({"qa_accuracy": 1.0, "qa_analysis": 1.0, "qa_exact": 0.0}, "plan")
    changed = {**record, "versions": {"profile": "v1", "reward_plan": "0000000000000000"}}
    assert Payload().weights(changed)[1] == "recomputed"
    upstream = PROFILES["upstream"].build_plan(spec).fingerprint()
    mean = {
        "reward_spec": spec,
        "versions": {"profile": "upstream", "reward_plan": upstream},
        "reward_components": {"qa_acc_reward": 1.0, "qa_analysisc_reward": 0.5},
    }
    assert Payload().weights(mean) == ({"qa_acc_reward": 1.0, "qa_analysisc_reward": 1.0}, "plan")
    assert Payload().weights({"reward_spec": {"method": "nosuch"}, "versions": {}}) == (None, "unknown")


def test_a_tools_record_shows_its_calls_and_its_submitted_answer():
    """A tools-format record keeps calls as structured messages; the page shows each call as the
    text the policy wrote, and the submitted answer is what the episode list searches."""
    call = {"type": "function", "function": {"name": "run_python", "arguments": {"code": "print(1)"}}}
    answer = {"type": "function", "function": {"name": "submit_answer", "arguments": {"answer": "Store B"}}}
    record = {
        "episode_id": "e1",
        "task_id": "t1",
        "input_seq": "Which store?",
        "reward_spec": {"method": "qa_plain", "ground_truth": "B"},
        "messages": [
            {"role": "user", "content": "Which store?"},
            {"role": "assistant", "content": "Sum it.", "tool_calls": [call]},
            {"role": "tool", "name": "run_python", "content": "1"},
            {"role": "assistant", "content": "", "tool_calls": [answer]},
        ],
        "reward_status": "scored",
        "reward": 1.0,
    }
    payload = Payload()
    payload.add(record, kept=None, source=0)
    body = json.loads(payload.bodies[0])
    shown = [join_segments(m["segs"]) for m in body["messages"]]
    assert shown[1].startswith("Sum it.\n<tool_call>") and '"code": "print(1)"' in shown[1]
    assert body["messages"][2] == {"role": "tool", "segs": [{"t": "", "s": "1"}]}
    assert "Store B" in json.dumps(payload.index[0])


# ------------------------------------------------ exclusions: verifier_error by cause (design.md §6)


def _record(eid: str, status: str, cause: str | None) -> dict:
    return {
        "episode_id": eid,
        "task_id": "t1",
        "reward_spec": {"method": "qa_plain", "ground_truth": "B"},
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        "reward": 0.0,
        "reward_components": {},
        "reward_status": status,
        "reward_error_cause": cause,
        "format_ok": True,
        "gate": None,
        "termination": "answer",
        "code_pass": [],
        "turns": 1,
        "exec": [],
        "versions": {"profile": "v1"},
    }


def _step(step: int, judge_parse: float) -> str:
    rates = {"judge_parse": judge_parse, "context_length": 0.0, "judge_call": 0.0, "reward_raised": 0.0}
    return json.dumps({"step": step, "episodes": 4, "verifier_error_rates": rates})


def _page_meta(page: str) -> dict:
    start = page.index('<script type="application/json" id="meta">') + len(
        '<script type="application/json" id="meta">'
    )
    return json.loads(page[start : page.index("</script>", start)])


def _training_folder(tmp_path: Path, metrics: list[str]) -> Path:
    folder = tmp_path / "grpo-out"
    folder.mkdir()
    records = [_record("e1", "verifier_error", "judge_parse"), _record("e2", "scored", None)]
    records += [_record("e3", "verifier_error", None), _record("e4", "scored", None)]
    (folder / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "metrics.jsonl").write_text("".join(line + "\n" for line in metrics))
    return folder


def test_the_page_gives_the_runs_verifier_error_rate_by_cause(tmp_path: Path):
    from deepanalyze_env.offline.viewer.build import build_view

    folder = _training_folder(tmp_path, [])
    report = build_view([folder], folder / "episodes.html")
    meta = _page_meta(report.path.read_text())
    # by hand: e1 for a judge reply it could not read, e3 (no cause recorded) as reward_raised; of 4
    assert meta["verifier_error_rates"] == {
        "judge_parse": 0.25,
        "context_length": 0.0,
        "judge_call": 0.0,
        "reward_raised": 0.25,
    }
    assert meta["steps"] == []  # no metrics.jsonl lines: no per-step lines to draw


def test_the_page_carries_each_training_steps_rates_by_cause(tmp_path: Path):
    from deepanalyze_env.offline.viewer.build import build_view

    lines = [_step(1, 0.0), json.dumps({"step": 2, "episodes": 4}), "{torn", _step(3, 0.5)]
    folder = _training_folder(tmp_path, lines)
    meta = _page_meta(build_view([folder], folder / "episodes.html").path.read_text())
    # the line without rates (an older run's) and the torn one are skipped
    assert [(s["source"], s["step"], s["rates"]["judge_parse"]) for s in meta["steps"]] == [
        (0, 1, 0.0),
        (0, 3, 0.5),
    ]
    assert set(meta["steps"][1]["rates"]) == {"judge_parse", "context_length", "judge_call", "reward_raised"}


def test_an_episode_body_names_its_verifier_error_cause():
    payload = Payload()
    payload.add(_record("e1", "verifier_error", "context_length"), kept=None, source=0)
    assert json.loads(payload.bodies[0])["reward_error_cause"] == "context_length"
