"""Rejection-sampling fine-tuning (``learn``'s ``rft`` stage): which episodes are correct, the
rounds' commands as the CLI parses them, the order of the rounds and their reuse.

The stage subprocesses are stood in for (a fake writes what each command would leave); the real
commands are the ones ``tests/test_learn.py`` runs, and a real tiny run of ``recipes/learn_rft_cpu.yaml``
is described in ``docs/design.md`` (section 10) with its measured time and memory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepanalyze_env.cli.app import build_parser
from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.learn.commands import EvalCommand, StageCommand, TrainCommand
from deepanalyze_env.learn.settings import Pipeline
from deepanalyze_env.offline.correct import is_correct, select_correct, write_correct
from deepanalyze_env.offline.eval_report import build_report, load_eval, write_json
from deepanalyze_env.trainers.recipes import apply_override

REPO = Path(__file__).resolve().parent.parent
PIPELINE = REPO / "recipes" / "learn_rft_cpu.yaml"
SPEC = {"function": ["answer_match"], "ground_truth": "82", "method": "verified"}  # accuracy: answer_match


def _record(
    task: str, n: int, *, status: str = "scored", gate: bool = True, acc: float | None = 1.0, spec=SPEC
):
    components = {} if acc is None else {"answer_match": acc}
    return {
        "episode_id": f"{task}-{n}",
        "task_id": task,
        "reward_spec": spec,
        "reward_status": status,
        "format_ok": gate,
        "reward": None if status != "scored" else (acc or 0.0) if gate else -1.0,
        "reward_components": components,
        "termination": "answer",
        "turns": 2,
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "<Answer>82</Answer>"},
        ],
    }


def test_correct_means_scored_through_the_gate_and_accurate():
    assert is_correct(_record("a", 0))
    assert not is_correct(_record("a", 1, acc=0.0))
    assert not is_correct(_record("a", 2, acc=0.5))  # below the default threshold 1.0 ...
    assert is_correct(_record("a", 2, acc=0.5), threshold=0.5)  # ... at a lower one, kept


@pytest.mark.parametrize(
    "record",
    [
        _record("a", 0, gate=False, acc=1.0),  # the gate failed, whatever the component says
        _record("a", 0, status="verifier_error", acc=1.0),  # the report counts its accuracy; SFT must not
        _record("a", 0, status="environment_error", acc=1.0),
        _record("a", 0, status="missing", acc=None),  # a planned episode that left no record
        _record("a", 0, acc=None),  # the component was not computed
        _record("a", 0, spec={"method": "verified"}),  # a method with no accuracy component
        _record("a", 0, gate=None),  # format_ok absent or not a bool: not a pass
    ],
    ids=[
        "gate-failed",
        "verifier-error",
        "environment-error",
        "missing",
        "no-component",
        "no-accuracy",
        "no-gate",
    ],
)
def test_adversarial_episodes_are_never_kept(record):
    assert not is_correct(record)
    assert not is_correct(record, threshold=0.0)


def test_a_selection_counts_kept_episodes_and_tasks_with_one():
    records = [_record("a", 0), _record("a", 1, acc=0.0), _record("b", 0, gate=False), _record("c", 0)]
    records.append(_record("c", 1, status="verifier_error"))
    selection = select_correct(records)
    assert [r["episode_id"] for r in selection.kept] == ["a-0", "c-0"]
    assert selection.counts == {"episodes": 5, "kept": 2, "tasks": 3, "tasks_correct": 2}


def _eval_folder(folder: Path, records: list[dict], samples: int) -> None:
    """What ``eval`` leaves: the records and ``report.json`` (built by the report's own code)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text("{}")
    (folder / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    loaded, counts = load_eval(folder)
    write_json(folder / "report.json", build_report(loaded, {}, samples, counts=counts))


def test_write_correct_writes_the_kept_records_as_sft_reads_them(tmp_path):
    from deepanalyze_env.trainers.trl.sft_data import load_records, select_records

    records = [_record("a", 0), _record("a", 1, gate=False), _record("b", 0, status="verifier_error")]
    _eval_folder(tmp_path / "sample", records, 2)
    counts = write_correct(tmp_path / "sample", tmp_path / "kept.jsonl")
    assert counts == {"episodes": 3, "kept": 1, "tasks": 2, "tasks_correct": 1}
    kept = load_records([str(tmp_path / "kept.jsonl")])
    assert [r["episode_id"] for r in kept] == ["a-0"]
    assert (
        len(select_records(kept, "format_ok", ["scored", "verifier_error"]).records) == 1
    )  # the SFT recipe's filter


def test_the_rft_pipeline_loads_and_the_main_job_has_no_rft_stage():
    pipe = Pipeline.load(PIPELINE)
    assert pipe.rft is not None and pipe.grpo is None
    assert (pipe.rft.k, pipe.rft.rounds, pipe.rft.temperature, pipe.rft.threshold) == (4, 2, 0.7, 1.0)
    assert Path(pipe.rft.recipe).is_file() and "max_steps=-1" in pipe.rft.overrides()
    assert Pipeline.load(REPO / "recipes" / "learn_cpu.yaml").rft is None


@pytest.mark.parametrize(
    "override, message",
    [
        ("rft.k=0", "k >= 1"),
        ("rft.rounds=0", "rounds >= 1"),
        ("rft.samples=3", "unknown key rft.samples"),
        ("rft.temperature=-1", "temperature"),
    ],
)
def test_rft_section_mistakes_are_one_line(override, message):
    with pytest.raises(ConfigError, match=message):
        Pipeline.load(PIPELINE, [override])


# ---------------------------------------------------------------------------- the rounds


class _Fake:
    """Stands in for each stage's process: an eval leaves records (``outcomes`` by folder name
    under ``rft/``: the round's sample, else every dev episode correct), a train leaves a model."""

    def __init__(self, outcomes: dict[str, list[dict]]):
        self.outcomes = outcomes
        self.commands: list[StageCommand] = []

    def __call__(self, command: StageCommand):
        self.commands.append(command)
        if isinstance(command, EvalCommand):
            key = command.out.parent.name if command.out.name == "sample" else "dev"
            _eval_folder(command.out, self.outcomes.get(key, [_record("d", 0)]), command.samples)
        elif isinstance(command, TrainCommand):
            command.output_dir.mkdir(parents=True, exist_ok=True)
            (command.output_dir / "model.safetensors").write_text(str(command.output_dir))
        return 0, None


def _run(tmp_path: Path, overrides: list[str]):
    from deepanalyze_env.learn.run import Run
    from deepanalyze_env.learn.stages import Stages

    out = tmp_path / "learn"
    out.mkdir(exist_ok=True)
    pipe = Pipeline.load(PIPELINE, [f"output_dir={out}", *overrides])
    files = {}
    for split, tasks in (("train", "abc"), ("dev", "d")):
        files[split] = tmp_path / f"{split}.jsonl"
        files[split].write_text("".join(json.dumps({"id": t, "family": "f"}) + "\n" for t in tasks))
    config = tmp_path / "env.yaml"
    config.write_text("max_turns: 3\n")
    return Run(pipe, out, Stages(out, False), tmp_path, files, {}, config, model="start")


def _tree(command: TrainCommand) -> dict:
    tree: dict = {}
    for assignment in build_parser().parse_args(command.argv()).overrides:
        apply_override(tree, assignment)
    return tree


def test_rounds_sample_keep_and_fine_tune_from_the_previous_model_until_nothing_is_kept(
    tmp_path, monkeypatch
):
    from deepanalyze_env.learn import stages
    from deepanalyze_env.learn.run import rft_stages

    outcomes = {
        "round1": [_record("a", 0), _record("a", 1, gate=False), _record("b", 0, status="verifier_error")],
        "round2": [_record("a", 0), _record("c", 0), _record("c", 1)],
        "round3": [_record("a", 0, acc=0.0), _record("b", 0, gate=False)],
    }
    fake = _Fake(outcomes)
    monkeypatch.setattr(stages, "run_command", fake)
    run = _run(
        tmp_path, ["rft.rounds=4", "rft.k=3", "rft.tasks=0", "rft.temperature=0.9", "rft.max_tokens=64"]
    )
    rounds = rft_stages(run)
    out = run.out

    # sample 1, sft 1, sample 2, sft 2, sample 3 (nothing kept: stop), the dev eval of round 2's model
    kinds = [type(c).__name__ for c in fake.commands]
    assert kinds == [
        "EvalCommand",
        "TrainCommand",
        "EvalCommand",
        "TrainCommand",
        "EvalCommand",
        "EvalCommand",
    ]
    samples = [build_parser().parse_args(c.argv()) for c in fake.commands[:5:2]]
    assert [a.model for a in samples] == [
        "start",
        str(out / "rft/round1/model"),
        str(out / "rft/round2/model"),
    ]
    for a in samples:  # k episodes per train task at the round's temperature and turn budget
        assert (a.command, a.samples, a.temperature, a.max_tokens) == ("eval", 3, 0.9, 64)
        assert a.tasks == [str(tmp_path / "train.jsonl")] and a.config == str(tmp_path / "env.yaml")
    first, second = (_tree(c) for c in fake.commands[1:4:2])
    assert first["model"] == "start" and first["data"] == [str(out / "rft/round1/kept.jsonl")]
    assert second["model"] == str(out / "rft/round1/model") and second["output_dir"] == str(
        out / "rft/round2/model"
    )
    assert first["max_steps"] == -1 and first["trl"]["num_train_epochs"] == 1  # the stage's set, as typed
    dev = build_parser().parse_args(fake.commands[-1].argv())
    assert (dev.model, dev.temperature, dev.samples) == (str(out / "rft/round2/model"), 0.0, 1)

    kept = [json.loads(x)["episode_id"] for x in (out / "rft/round1/kept.jsonl").read_text().splitlines()]
    assert kept == ["a-0"]
    assert [(r["round"], r["kept"], r["tasks_correct"], r["trained"]) for r in rounds] == [
        (1, 1, 1, True),
        (2, 3, 2, True),
        (3, 0, 0, False),
    ]
    assert rounds[2]["model"] == str(out / "rft/round2/model")  # an untrained round keeps its model
    assert set(rounds[0]["seconds"]) == {"sample", "sft"} and set(rounds[2]["seconds"]) == {"sample"}
    assert rounds[1]["sample"]["episodes"] == 3
    assert run.model == str(out / "rft/round2/model") and run.order == ["rft"]

    # a rerun with nothing changed reuses every stage: no command runs again
    fake.commands.clear()
    again = _run(
        tmp_path, ["rft.rounds=4", "rft.k=3", "rft.tasks=0", "rft.temperature=0.9", "rft.max_tokens=64"]
    )
    assert rft_stages(again) == rounds and fake.commands == []

    # another k is another sample: round 1 and everything after it rerun
    third = _run(
        tmp_path, ["rft.rounds=4", "rft.k=2", "rft.tasks=0", "rft.temperature=0.9", "rft.max_tokens=64"]
    )
    rft_stages(third)
    assert len(fake.commands) == 6


def test_eval_rounds_evaluates_each_round_and_a_task_cap_samples_a_subset(tmp_path, monkeypatch):
    from deepanalyze_env.learn import stages
    from deepanalyze_env.learn.run import rft_stages

    fake = _Fake({f"round{i}": [_record("a", 0)] for i in (1, 2)})
    monkeypatch.setattr(stages, "run_command", fake)
    run = _run(tmp_path, ["rft.rounds=2", "rft.eval_rounds=true", "rft.tasks=2"])
    rounds = rft_stages(run)
    assert run.order == ["rft1", "rft2"] and [r["trained"] for r in rounds] == [True, True]
    pool = run.out / "tasks" / "rft.jsonl"
    assert len(pool.read_text().splitlines()) == 2
    assert build_parser().parse_args(fake.commands[0].argv()).tasks == [str(pool)]


def test_a_first_round_that_keeps_nothing_trains_nothing_and_adds_no_eval(tmp_path, monkeypatch):
    from deepanalyze_env.learn import stages
    from deepanalyze_env.learn.run import rft_stages

    fake = _Fake({"round1": [_record("a", 0, gate=False, acc=1.0)]})
    monkeypatch.setattr(stages, "run_command", fake)
    run = _run(tmp_path, ["rft.rounds=2"])
    rounds = rft_stages(run)
    assert len(fake.commands) == 1 and run.model == "start" and run.order == []
    assert rounds[0]["kept"] == 0 and not rounds[0]["trained"]


@pytest.mark.slow
def test_tiny_rft_pipeline_runs_end_to_end(tmp_path):
    """A real run (minutes on 2 cores; -m 'not slow' leaves it out): SFT, one RFT round sampled
    from the SFT model, its correct episodes (as counted by hand) and the round in learn.json."""
    pytest.importorskip("trl")
    from deepanalyze_env.cli import main

    out = tmp_path / "learn"
    overrides = [
        f"output_dir={out}",
        "bank.families=[filter_count]",
        "bank.tables=[fair, wine]",
        "tasks.train=2",
        "tasks.dev=1",
        "env.max_turns=4",
        "eval.before=false",
        "eval.max_tokens=8",
        "sft.set.max_steps=1",
        "rft.k=2",
        "rft.tasks=0",
        "rft.rounds=1",
        "rft.max_tokens=8",
        "rft.set.max_steps=1",
    ]
    assert main(["learn", str(PIPELINE), *overrides]) == 0
    _check_rft_run(out, k=2)


def _check_rft_run(out: Path, k: int) -> None:
    """What a real run with an rft stage leaves, checked against its own records."""
    summary = json.loads((out / "learn.json").read_text())
    stages = json.loads((out / "stages.json").read_text())
    first = summary["rft"][0]
    records, _ = load_eval(out / "rft" / "round1" / "sample")
    assert first["episodes"] == len(records) == k * summary["tasks"]["train"]
    assert first["kept"] == sum(is_correct(r) for r in records)
    assert len((out / "rft" / "round1" / "kept.jsonl").read_text().splitlines()) == first["kept"]
    assert stages["rft_sample1"]["seconds"] is not None and "sample" in first["memory"]
    assert first["trained"] == (first["kept"] > 0) == ("rft_sft1" in stages) == ("rft" in summary["dev"])
    if first["trained"]:
        assert (out / "rft" / "round1" / "model" / "model.safetensors").is_file()
        assert summary["model"] == str(out / "rft" / "round1" / "model")
    assert "RFT round 1" in (out / "learn.md").read_text()
