"""The task bank: a small build of every family, its determinism, splits, self-check and gate.

The module builds a subset of the bank once (every family, five small tables from all three
splits, one draft per family and table) through the real kernel and ``DeepAnalyzeEnv``; the
full build with its sizes is ``benchmarks/bank.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepanalyze_env.cli import main
from deepanalyze_env.core.records import RECORD_FIELDS
from deepanalyze_env.core.tasks import load_rows
from deepanalyze_env.offline.bank import BankError
from deepanalyze_env.offline.bank.build import build, compare
from deepanalyze_env.offline.bank.families import FAMILIES
from deepanalyze_env.offline.bank.families.base import AnswerFormat, Part
from deepanalyze_env.offline.bank.quality import judge
from deepanalyze_env.offline.bank.sources import TABLES, TableSpec

SAMPLE_TABLES = ["macrodata", "sunspots", "wine", "iris", "statecrime"]  # train, dev, dev, test, test
ONE_EACH = {"train": 1, "dev": 1, "test": 1}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    out = tmp_path_factory.mktemp("bank") / "bank"
    result = build(out, tables=SAMPLE_TABLES, per_table=ONE_EACH, workers=2)
    return out, result


def tasks_of(out: Path) -> list[dict]:
    return [t for split in ("train", "dev", "test") for t in read_jsonl(out / "tasks" / f"{split}.jsonl")]


# ------------------------------------------------------------------------------ the sample build
def test_every_family_is_built_and_passes_the_self_check(sample):
    out, result = sample
    assert result.failures == []
    families = {t["family"] for t in tasks_of(out)}
    assert families == set(FAMILIES)
    assert len(FAMILIES) >= 12


def test_every_kept_task_has_a_reference_episode_with_full_marks(sample):
    out, _ = sample
    for split in ("train", "dev", "test"):
        tasks = read_jsonl(out / "tasks" / f"{split}.jsonl")
        episodes = read_jsonl(out / "episodes" / f"{split}.jsonl")
        assert [e["task_id"] for e in episodes] == [t["id"] for t in tasks]
        for task, ep in zip(tasks, episodes, strict=True):
            assert set(ep) == set(RECORD_FIELDS)
            assert ep["reward_spec"] == task["reward_spec"]
            roles = [m["role"] for m in ep["messages"]]
            assert roles[0] == "user" and roles[1::2] == ["assistant"] * len(roles[1::2])
            assert ep["turns"] >= 3 and ep["code_pass"] == [1] * (ep["turns"] - 1)
            if task["method"] == "openresearch":
                assert ep["reward_status"] == "verifier_error" and "not judged" in ep["error"]
            else:
                assert ep["reward_status"] == "scored" and ep["reward"] == 1.0


def test_splits_share_no_table_and_follow_the_tables_split(sample):
    out, result = sample
    tables = result.manifest["tables_per_split"]
    assert not (set(tables["train"]) & set(tables["dev"]))
    assert not (set(tables["train"]) & set(tables["test"]))
    assert not (set(tables["dev"]) & set(tables["test"]))
    for task in tasks_of(out):
        assert [TABLES[t].split for t in task["tables"]] == [task["split"]]
    assert {s: n > 0 for s, n in result.manifest["counts"]["per_split"].items()} == {
        "train": True,
        "dev": True,
        "test": True,
    }


def test_manifest_counts_sources_and_versions(sample):
    out, _ = sample
    manifest = json.loads((out / "manifest.json").read_text())
    tasks = tasks_of(out)
    total = sum(
        n
        for splits in manifest["counts"]["family_split_method"].values()
        for m in splits.values()
        for n in m.values()
    )
    assert total == len(tasks)
    assert sorted(s["table"] for s in manifest["sources"]) == sorted(SAMPLE_TABLES)
    iris = next(s for s in manifest["sources"] if s["table"] == "iris")
    assert (iris["package"], iris["rows"], iris["columns"]) == ("scikit-learn", 150, 5)
    crime = next(s for s in manifest["sources"] if s["table"] == "statecrime")
    assert crime["licence"] == "Public domain." and crime["rows"] == 51
    assert manifest["versions"]["pandas"] and manifest["seed"] == 13
    assert set(manifest["files"]) >= {"tasks/test.jsonl", "episodes/test.jsonl"}


def test_task_files_render_with_the_existing_loader(sample):
    out, _ = sample
    rows = load_rows([out / "tasks" / "test.jsonl"], str(out))
    assert rows and all(r["prompt"][0]["content"].startswith("# Instruction\n") for r in rows)
    assert all("\n# Data\nFile 1: " in r["prompt"][0]["content"] for r in rows)


def test_workspaces_cover_the_formats(sample):
    out, _ = sample
    suffixes = {p.suffix for p in (out / "workspaces").rglob("*") if p.is_file()}
    assert {".csv", ".json", ".xlsx", ".db"} <= suffixes
    join = sorted(p.name for p in (out / "workspaces" / "iris-join").iterdir())
    assert join == ["iris_info.csv", "iris_measures.csv"]


def test_the_self_check_fails_a_task_whose_ground_truth_is_wrong(sample, tmp_path):
    from deepanalyze_env.offline.bank.episodes import empty_judge_cache, play
    from deepanalyze_env.offline.bank.families.base import Cell, Draft

    out, _ = sample
    task = next(t for t in tasks_of(out) if t["family"] == "describe_stat")
    task = {**task, "reward_spec": {**task["reward_spec"], "ground_truth": "-12345.5"}}
    workspace = type("W", (), {"id": task["workspace_id"]})()
    draft = Draft(
        "describe_stat",
        task["tables"][0],
        workspace,
        task["instruction"],
        AnswerFormat("number", 2),
        "",
        [Cell("look", "print('Final answer: 1.00')")],
        "done",
        ("x",),
    )
    check = play(task, draft, out, empty_judge_cache(tmp_path))
    assert not check.ok and any("answer_match=0.000" in p for p in check.problems)


def _one_cell_draft(task: dict, cell: str, answer: AnswerFormat):
    from deepanalyze_env.offline.bank.families.base import Cell, Draft

    workspace = type("W", (), {"id": task["workspace_id"]})()
    return Draft(
        task["family"],
        task["tables"][0],
        workspace,
        task["instruction"],
        answer,
        "",
        [Cell("look", cell)],
        "done",
        ("x",),
    )


def test_the_self_check_fails_a_task_whose_tolerance_accepts_the_next_printed_value(sample, tmp_path):
    from deepanalyze_env.offline.bank.episodes import empty_judge_cache, last_digit_moved, play

    out, _ = sample
    task = next(t for t in tasks_of(out) if t["family"] == "describe_stat")
    truth = task["reward_spec"]["ground_truth"]
    decimals = len(truth.split(".")[1]) if "." in truth else 0
    loose = 2 * 10**-decimals  # two units of the last printed digit: the next value up passes
    task = {**task, "reward_spec": {**task["reward_spec"], "tolerance": loose}}
    draft = _one_cell_draft(task, f"print('Final answer: {truth}')", AnswerFormat("number", decimals))
    check = play(task, draft, out, empty_judge_cache(tmp_path))
    up = last_digit_moved(truth, 1)
    assert check.problems == [
        f"{up} (one unit off the truth {truth}) scored answer_match",
        f"{last_digit_moved(truth, -1)} (one unit off the truth {truth}) scored answer_match",
    ]
    assert up != truth and abs(float(up) - float(truth)) == pytest.approx(10**-decimals)


def test_the_self_check_keeps_the_shipped_tolerance(sample, tmp_path):
    from deepanalyze_env.offline.bank.episodes import empty_judge_cache, play

    out, _ = sample
    task = next(t for t in tasks_of(out) if t["family"] == "describe_stat")
    truth = task["reward_spec"]["ground_truth"]
    decimals = len(truth.split(".")[1]) if "." in truth else 0
    draft = _one_cell_draft(task, f"print('Final answer: {truth}')", AnswerFormat("number", decimals))
    assert play(task, draft, out, empty_judge_cache(tmp_path)).problems == []


def test_the_self_check_fails_a_cleaning_task_that_the_raw_file_passes(sample, tmp_path):
    import csv

    from deepanalyze_env.offline.bank.episodes import empty_judge_cache, play

    out, _ = sample
    task = next(t for t in tasks_of(out) if t["family"] == "cleaning")
    expected = task["reward_spec"]["expected_file"]
    [raw] = sorted((out / "workspaces" / task["workspace_id"]).glob("*.csv"))
    header, *rows = list(csv.reader(raw.open(encoding="utf-8")))
    degenerate = {**expected, "columns": header, "rows": rows}  # "cleaning" that changes nothing
    spec = {**task["reward_spec"], "expected_file": degenerate, "ground_truth": str(len(rows))}
    task = {**task, "reward_spec": spec}
    cell = (
        f"import shutil\nshutil.copy({raw.name!r}, {expected['name']!r})\nprint('Final answer: {len(rows)}')"
    )
    check = play(
        task,
        _one_cell_draft(task, cell, AnswerFormat("integer", file=expected["name"])),
        out,
        empty_judge_cache(tmp_path),
    )
    assert check.problems == [f"{raw.name} saved unchanged as {expected['name']} scored full file marks"]


# ------------------------------------------------------------------------------ determinism
def test_a_rebuild_is_byte_identical_and_check_names_differences(tmp_path, capsys):
    kwargs = {
        "tables": ["iris", "macrodata"],
        "families": ["filter_count", "sql_query", "cleaning"],
        "per_table": ONE_EACH,
    }
    first, second = tmp_path / "a", tmp_path / "b"
    build(first, **kwargs)
    build(second, **kwargs)
    assert compare(second, first) == []
    tampered = first / "tasks" / "test.jsonl"
    tampered.write_text(tampered.read_text() + "\n")
    (first / "workspaces" / "iris-csv" / "iris.csv").unlink()
    assert compare(second, first) == [
        "only in the new build: workspaces/iris-csv/iris.csv",
        "differs: tasks/test.jsonl",
    ]
    argv = ["bank", "build", "--out", str(first), "--check", "--tables", "iris", "macrodata"]
    argv += ["--families", "filter_count", "sql_query", "cleaning"]
    # the CLI builds with the default sizes, so the check names differences and exits 1
    assert main(argv) == 1
    assert "differs: tasks/test.jsonl" in capsys.readouterr().out


# ------------------------------------------------------------------------------ errors
def test_a_table_whose_package_is_missing_names_the_extra():
    spec = TableSpec(
        "penguins",
        "palmerpenguins",
        "palmerpenguins_not_installed",
        "penguins",
        "train",
        dict,
        (),
        extra="bank-extra",
    )
    with pytest.raises(
        BankError, match=r"needs the palmerpenguins package: pip install 'deepanalyze-env\[bank-extra\]'"
    ):
        spec.load()


def test_cli_unknown_table_is_a_one_line_error(tmp_path, capsys):
    assert main(["bank", "build", "--out", str(tmp_path / "x"), "--tables", "no_such_table"]) == 2
    err = capsys.readouterr().out.strip()
    assert err.startswith("error: unknown tables no_such_table") and "\n" not in err


# ------------------------------------------------------------------------------ the gate
def gate(payload: dict) -> str:
    return "noise\n__GATE__" + json.dumps(payload)


NUMBER2 = AnswerFormat("number", 2)


@pytest.mark.parametrize(
    ("fmt", "payload", "reason"),
    [
        (NUMBER2, {"answer": 2.0 / 3.0, "n": 0}, "empty"),
        (NUMBER2, {"answer": float("nan"), "n": 4}, "nan"),
        (NUMBER2, {"answer": 1.125, "n": 4}, "rounding"),  # exactly between 1.12 and 1.13
        (NUMBER2, {"answer": 1.0049999999999999, "n": 4}, "rounding"),  # float noise from the tie
        (AnswerFormat("text"), {"answer": "A", "n": 3, "margin": 0.0}, "tie"),
        (AnswerFormat("integer"), {"answer": 0, "n": 0}, "empty"),
        (
            AnswerFormat("parts", parts=(Part("p_value", "number", 4), Part("decision", "text"))),
            {"answer": {"p_value": 0.0503, "decision": "fail to reject"}, "n": 9, "alpha_gap": 0.0003},
            "near_alpha",
        ),
    ],
)
def test_the_gate_drops_ambiguous_answers(fmt, payload, reason):
    draft = type("D", (), {"answer": fmt})()
    assert judge(draft, "ok", gate(payload)) == (None, reason)


def test_the_gate_keeps_a_clear_answer_with_its_tolerance():
    draft = type("D", (), {"answer": NUMBER2})()
    truth, reason = judge(draft, "ok", gate({"answer": 2.0 / 3.0, "n": 3}))
    assert reason is None and truth.ground_truth == "0.67" and truth.tolerance == 0.005
    assert judge(draft, "error", "Traceback …") == (None, "error")


def test_a_missing_workspace_names_the_extra_or_the_build_command(tmp_path):
    from deepanalyze_env.core.config import ConfigError

    task = {
        "id": "bank-x",
        "method": "verified",
        "instruction": "q",
        "reward_spec": {"method": "verified", "ground_truth": "1", "function": ["answer_match"]},
        "data": "workspaces",
        "workspace_id": "penguins-csv",
        "sources": [
            {"table": "penguins", "package": "palmerpenguins", "module": "no_such_module_13", "extra": "x"}
        ],
    }
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(task) + "\n")
    with pytest.raises(ConfigError, match=r"not installed: pip install 'deepanalyze-env\[x\]'"):
        load_rows([path], str(tmp_path))
    task["sources"][0]["module"] = "json"
    path.write_text(json.dumps(task) + "\n")
    with pytest.raises(ConfigError, match=r"deepanalyze-rl bank build --out"):
        load_rows([path], str(tmp_path))


def test_rollout_replays_the_reference_turns_and_stats_reads_the_run(sample, tmp_path, capsys):
    out, _ = sample
    checkable = [t for t in tasks_of(out) if t["method"] != "openresearch"][:6]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in checkable))
    run = tmp_path / "run"
    argv = ["rollout", "--tasks", str(tasks), "--workspace-root", str(out), "--policy", "scripted"]
    argv += ["--trajectories", str(out / "trajectories.jsonl"), "--labels", "good", "--out", str(run)]
    assert main(argv) == 0
    records = read_jsonl(run / "episodes.jsonl")
    assert sorted(r["task_id"] for r in records) == sorted(t["id"] for t in checkable)
    assert all(r["reward_status"] == "scored" and r["reward"] == 1.0 for r in records)
    assert main(["stats", str(run)]) == 0
    assert json.loads((run / "stats.json").read_text())


def test_the_gate_keeps_a_tiny_p_value_shown_as_zero():
    fmt = AnswerFormat("parts", parts=(Part("p_value", "number", 4), Part("decision", "text")))
    draft = type("D", (), {"answer": fmt})()
    payload = {"answer": {"p_value": 3e-30, "decision": "reject"}, "n": 40, "alpha_gap": 0.05}
    truth, reason = judge(draft, "ok", gate(payload))
    assert reason is None and truth.ground_truth == [["p_value", "0.0000"], ["decision", "reject"]]


def test_bank_build_on_an_existing_bank_keeps_it(sample, capsys):
    out, _ = sample
    before = (out / "manifest.json").read_bytes()
    assert main(["bank", "build", "--out", str(out)]) == 0
    assert "already built" in capsys.readouterr().out
    assert (out / "manifest.json").read_bytes() == before
