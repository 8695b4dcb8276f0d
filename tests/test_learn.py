"""``deepanalyze-rl learn``: the pipeline file, the task sample, stage reuse, and one real tiny run."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from deepanalyze_env.cli import main
from deepanalyze_env.cli.app import build_parser
from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.learn.commands import (
    BankCommand,
    EvalCommand,
    RolloutCommand,
    StageCommand,
    TrainCommand,
)
from deepanalyze_env.learn.settings import BankSlice, Pipeline
from deepanalyze_env.learn.tasks import bank_folder, sample_tasks

REPO = Path(__file__).resolve().parent.parent


def _tasks(counts: dict[str, int]) -> list[dict]:
    return [{"id": f"{fam}-{i}", "family": fam} for fam, n in counts.items() for i in range(n)]


def test_task_sample_takes_families_in_turn():
    picked = sample_tasks(_tasks({"a": 5, "b": 1, "c": 2}), 5, seed=3)
    # turns: a, b, c, a, c (b is exhausted after one)
    assert Counter(t["family"] for t in picked) == {"a": 2, "b": 1, "c": 2}
    assert len({t["id"] for t in picked}) == 5


def test_task_sample_is_seeded_and_capped_by_what_exists():
    tasks = _tasks({"a": 6, "b": 6})
    assert sample_tasks(tasks, 4, seed=1) == sample_tasks(tasks, 4, seed=1)
    ids = [{t["id"] for t in sample_tasks(tasks, 4, seed=s)} for s in (1, 2)]
    assert ids[0] != ids[1]
    assert len(sample_tasks(tasks, 100, seed=0)) == 12


def test_a_bank_slice_gets_its_own_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("DEEPANALYZE_CACHE", str(tmp_path))
    whole = bank_folder(BankSlice())
    a = bank_folder(BankSlice(families=("ols",), tables=("fair", "wine")))
    b = bank_folder(BankSlice(families=("ols",), tables=("wine", "fair")))  # order does not matter
    c = bank_folder(BankSlice(families=("correlation",), tables=("fair", "wine")))
    assert whole == tmp_path / "bank-seed13-r2"  # the seed and the build's revision
    assert a == b and a != c and a.parent == whole.parent and a.name.startswith("bank-seed13-")


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"output_dir": "x", "stages": []}, "unknown pipeline key 'stages'"),
        ({"model": "m"}, "'output_dir' is required"),
        ({"output_dir": "x", "tasks": {"valid": 3}}, "unknown split tasks.valid"),
        ({"output_dir": "x", "sft": {"set": {}}}, "sft needs a recipe file"),
        ({"output_dir": "x", "grpo": {"recipe": "nope.yaml"}}, "grpo.recipe: no such file"),
        ({"output_dir": "x", "eval": {"sample": 2}}, "eval:"),
        ({"output_dir": "x", "env": {"max_turn": 2}}, "max_turn"),
        ({"output_dir": "x", "bank": {"family": ["ols"]}}, "unknown key bank.family"),
        ({"output_dir": "x", "bank": {"tables": "fair"}}, "bank.tables must be a list"),
    ],
)
def test_pipeline_mistakes_name_what_to_fix(tmp_path, tree, message):
    path = tmp_path / "pipe.yaml"
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError, match=message):
        Pipeline.load(path)


def test_shipped_pipeline_loads_and_its_recipes_exist():
    pipe = Pipeline.load(REPO / "recipes" / "learn_cpu.yaml")
    assert Path(pipe.sft.recipe).is_file() and Path(pipe.grpo.recipe).is_file()
    assert pipe.tasks["train"] > 0 and pipe.tasks["dev"] > 0


@pytest.mark.parametrize(
    ("value", "message"),
    [(0, "sft.references must be a positive"), ("some", "sft.references must be"), (True, "sft.references")],
)
def test_sft_references_is_a_count_or_all(tmp_path, value, message):
    pipe = Pipeline.load(REPO / "recipes" / "learn_cpu.yaml")
    assert pipe.sft.references is None  # the default: every reference that passed
    shipped = REPO / "recipes" / "learn_cpu.yaml"
    assert Pipeline.load(shipped, ["sft.references=all"]).sft.references is None
    assert Pipeline.load(shipped, ["sft.references=96"]).sft.references == 96
    with pytest.raises(ConfigError, match=message):
        Pipeline.load(shipped, [f"sft.references={json.dumps(value)}"])
    with pytest.raises(ConfigError, match=r"unknown key sft\.reference "):
        Pipeline.load(shipped, ["sft.reference=3"])


def test_sft_trains_on_a_seeded_family_stratified_sample_of_the_references_that_passed(tmp_path):
    from deepanalyze_env.learn.run import sample_references

    tasks = _tasks({"a": 6, "b": 2, "c": 4})
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    kept = tmp_path / "kept.jsonl"  # c-0 and c-1 did not pass
    passed = [t["id"] for t in tasks if t["id"] not in ("c-0", "c-1")]
    kept.write_text("".join(json.dumps({"task_id": i, "reward": 1.0}) + "\n" for i in passed))

    def sample(references: int | str) -> list[str]:
        pipe = Pipeline.load(REPO / "recipes" / "learn_cpu.yaml", [f"sft.references={references}"])
        data = sample_references(kept, train, pipe.sft.references, 7, tmp_path / "sample.jsonl")
        return [json.loads(x)["task_id"] for x in data.read_text().splitlines()]

    assert sample("all") == passed  # the rollout's own file, untouched
    six = sample(6)
    assert Counter(i[0] for i in six) == {"a": 2, "b": 2, "c": 2} and not {"c-0", "c-1"} & set(six)
    assert sample(6) == six and sample(100) == sample(10) and len(sample(10)) == 10
    assert six[:4] == sample(4)  # nested: a smaller sample is a prefix of a larger one


def test_train_given_a_pipeline_file_names_the_learn_command(capsys):
    """A pipeline file is not a recipe: ``train`` says which command runs it, in one line."""
    shipped = "recipes/learn_cpu.yaml"
    assert main(["train", str(REPO / shipped), "eval.samples=2"]) == 2
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "is a learn pipeline file, not a training recipe" in lines[0]
    assert lines[0].endswith(f"run deepanalyze-rl learn {REPO / shipped} eval.samples=2")
    # a recipe's own mistake is still that mistake
    assert main(["train", str(REPO / "recipes" / "trl_cpu_smoke.yaml"), "bank=1"]) == 2
    assert "unknown recipe key 'bank'" in capsys.readouterr().out


def test_pipeline_mistake_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "pipe.yaml"
    path.write_text("output_dir: x\nstages: []\n")
    assert main(["learn", str(path)]) == 2
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "stages" in lines[0]


def _headline_by_hand(eval_dir: Path) -> tuple[float, float]:
    records = [json.loads(x) for x in (eval_dir / "episodes.jsonl").read_text().splitlines() if x]
    gate_ran = [r for r in records if r["reward_status"] in ("scored", "verifier_error")]
    scored = [r["reward"] for r in records if r["reward_status"] == "scored"]
    return sum(bool(r["format_ok"]) for r in gate_ran) / len(gate_ran), sum(scored) / len(scored)


def test_tiny_pipeline_runs_every_stage_and_a_rerun_reuses_them(tmp_path):
    """A real run: bank slice, embedded SmolLM2, env + kernel, TRL SFT and GRPO (a few tokens)."""
    pytest.importorskip("trl")
    out = tmp_path / "learn"
    overrides = [
        f"output_dir={out}",
        "bank.families=[filter_count]",
        "bank.tables=[fair, wine]",
        "tasks.train=2",
        "tasks.dev=1",
        "env.max_turns=4",  # every reference of these tasks fits: all are SFT data
        "eval.max_tokens=8",
        "eval.after_sft=true",
        "sft.set.max_steps=1",
        "grpo.set.max_steps=1",
        "grpo.set.rollout.max_turn_tokens=8",
        "grpo.set.trl.max_completion_length=16",
        "grpo.set.trl.num_generations=2",
        "grpo.set.trl.gradient_accumulation_steps=2",
    ]
    pipe = str(REPO / "recipes" / "learn_cpu.yaml")
    assert main(["learn", pipe, *overrides]) == 0
    summary = json.loads((out / "learn.json").read_text())
    assert list(summary["dev"]) == ["base", "sft", "grpo"]
    assert summary["tasks"] == {"train": 2, "dev": 1}
    for stage in ("base", "sft", "grpo"):
        gate, reward = _headline_by_hand(out / f"eval-{stage}")
        assert summary["dev"][stage]["format_gate_pass_rate"] == pytest.approx(gate)
        assert summary["dev"][stage]["reward_mean"] == pytest.approx(reward)
    assert [s["step"] for s in summary["grpo_steps"]] == [1]
    assert (out / "sft" / "model.safetensors").is_file() and (out / "grpo" / "model.safetensors").is_file()
    kept = (out / "reference" / "kept.jsonl").read_text().splitlines()
    assert len(kept) == 2  # both train tasks' reference episodes pass the gate: the SFT data
    stages = json.loads((out / "stages.json").read_text())
    assert {"eval_base", "reference", "sft", "eval_sft", "grpo", "eval_grpo"} <= set(stages)

    # every model folder and file a stage reads is part of its identity
    assert str(out / "reference" / "kept.jsonl") in stages["sft"]["inputs"]
    assert str(out / "sft") in stages["eval_sft"]["inputs"] and str(out / "sft") in stages["grpo"]["inputs"]
    assert str(out / "grpo") in stages["eval_grpo"]["inputs"]
    assert any(k.endswith(".gguf") for k in stages["eval_base"]["inputs"])  # embedded:smollm2's weights

    weights = (out / "grpo" / "model.safetensors").stat().st_mtime_ns
    assert main(["learn", pipe, *overrides]) == 0  # nothing changed: every stage is reused
    assert (out / "grpo" / "model.safetensors").stat().st_mtime_ns == weights
    assert json.loads((out / "stages.json").read_text()) == stages

    # the GRPO model rewritten in place (same path, same size, other weights): its eval reruns
    from safetensors.torch import load_file, save_file

    path = out / "grpo" / "model.safetensors"
    tensors = load_file(path)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] * 0.5
    save_file(tensors, path, metadata={"format": "pt"})
    run_id = json.loads((out / "eval-grpo" / "run.json").read_text())["run_id"]
    assert main(["learn", pipe, *overrides]) == 0
    again = json.loads((out / "stages.json").read_text())
    assert {k: again[k] for k in again if k != "eval_grpo"} == {
        k: stages[k] for k in stages if k != "eval_grpo"
    }
    assert again["eval_grpo"]["inputs"][str(out / "grpo")] != stages["eval_grpo"]["inputs"][str(out / "grpo")]
    assert json.loads((out / "eval-grpo" / "run.json").read_text())["run_id"] != run_id  # a new eval


class _Calls:
    """Stands in for the stage subprocess (the real one runs in the tiny pipeline test): records
    each stage's command (typed settings) and exits 0 — or, when ``script`` holds actions, runs
    the next one (it writes what the command would have left and returns its exit code) — so the
    reuse, resume and clean decisions can be read directly."""

    def __init__(self):
        self.commands: list[StageCommand] = []
        self.script: list = []

    def __call__(self, command):
        self.commands.append(command)
        code = self.script.pop(0)(command) if self.script else 0
        return code, None  # no process ran, so no memory figures


def _eval(out: Path, **settings) -> EvalCommand:
    """An eval stage's command writing into ``out`` (the settings a test does not care about fixed)."""
    base = {"model": "m", "tasks": Path("dev.jsonl"), "config": Path("env.yaml"), "samples": 1}
    base |= {"max_tokens": 160, "temperature": 0.0, "concurrency": 1}
    return EvalCommand(out=out, **(base | settings))


def _train(recipe: str, model_dir: Path) -> TrainCommand:
    return TrainCommand(recipe, model_dir, "m", Path("data.jsonl"))


def _parsed(command: StageCommand):
    """The command's argv as the CLI's own parser reads it."""
    return build_parser().parse_args(command.argv())


@pytest.fixture
def calls(monkeypatch):
    from deepanalyze_env.learn import stages

    spy = _Calls()
    monkeypatch.setattr(stages, "run_command", spy)
    return spy


def _eval_folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text("{}")
    (path / "episodes.jsonl").write_text('{"episode": "from before"}\n')
    return path


def test_a_stage_whose_input_file_changed_reruns_in_a_clean_folder(tmp_path, calls):
    from deepanalyze_env.learn.stages import Stages

    tasks = tmp_path / "dev.jsonl"
    tasks.write_text('{"id": "a"}\n')
    out = tmp_path / "eval"
    command = _eval(out, tasks=tasks)
    Stages(tmp_path, fresh=False).run("eval", "t", command, out, [tasks])
    _eval_folder(out)
    Stages(tmp_path, fresh=False).run("eval", "t", command, out, [tasks])
    assert len(calls.commands) == 1  # same arguments, same tasks: reused
    tasks.write_text('{"id": "b"}\n')  # same path, other tasks
    Stages(tmp_path, fresh=False).run("eval", "t", command, out, [tasks])
    assert calls.commands[-1] == command and not _parsed(command).resume  # no --resume
    assert len(calls.commands) == 2 and not out.exists()  # the old episodes are gone


def test_an_interrupted_eval_with_the_same_identity_resumes(tmp_path, calls):
    from deepanalyze_env.learn.stages import Stages

    out = tmp_path / "eval"
    command = _eval(out)
    stages = Stages(tmp_path, fresh=False)
    stages.done["eval"] = {"argv": command.argv(), "inputs": {}, "seconds": None}  # started, never finished
    _eval_folder(out)
    stages.run("eval", "t", command, out)
    assert calls.commands == [dataclasses.replace(command, resume=True)]
    assert calls.commands[0].argv() == [*command.argv(), "--resume"] and _parsed(calls.commands[0]).resume
    assert (out / "episodes.jsonl").is_file()
    saved = json.loads((tmp_path / "stages.json").read_text())["eval"]
    assert saved["argv"] == command.argv() and saved["seconds"] is not None


def test_changed_arguments_or_fresh_never_resume_an_old_folder(tmp_path, calls):
    from deepanalyze_env.learn.stages import Stages

    out = tmp_path / "eval"
    Stages(tmp_path, fresh=False).run("eval", "t", _eval(out, max_tokens=128), out)
    _eval_folder(out)
    Stages(tmp_path, fresh=False).run("eval", "t", _eval(out, max_tokens=160), out)
    assert calls.commands[-1] == _eval(out, max_tokens=160) and not out.exists()
    _eval_folder(out)
    Stages(tmp_path, fresh=True).run("eval", "t", _eval(out, max_tokens=160), out)
    assert calls.commands[-1] == _eval(out, max_tokens=160) and not out.exists()


def test_a_stage_after_a_rerun_stage_reruns_even_with_the_same_arguments(tmp_path, calls):
    from deepanalyze_env.learn.stages import Stages

    model, out = tmp_path / "sft", tmp_path / "eval"
    first = Stages(tmp_path, fresh=False)
    first.run("sft", "t", _train("a", model), model)
    model.mkdir()
    first.run("eval", "t", _eval(out, model=str(model)), out)
    _eval_folder(out)
    second = Stages(tmp_path, fresh=False)
    second.run("sft", "t", _train("b", model), model)  # the model changes under the same path
    second.run("eval", "t", _eval(out, model=str(model)), out)
    assert calls.commands[-1] == _eval(out, model=str(model)) and not out.exists()


def test_a_nested_stage_override_changes_one_recipe_key_not_the_whole_section(tmp_path):
    pipe = Pipeline.load(
        REPO / "recipes" / "learn_cpu.yaml",
        ["grpo.set.trl.temperature=0.5", "sft.set.trl.per_device_train_batch_size=1"],
    )
    shipped = yaml.safe_load((REPO / "recipes" / "learn_cpu.yaml").read_text())["grpo"]["set"]
    assert pipe.grpo.set["trl.temperature"] == 0.5
    assert pipe.grpo.set["trl.num_generations"] == shipped["trl.num_generations"]  # the others stay
    assert "trl" not in pipe.grpo.set and "trl" not in pipe.sft.set
    args = pipe.grpo.overrides()
    assert "trl.temperature=0.5" in args and "trl.learning_rate=1e-05" in args

    from deepanalyze_env.trainers.recipes import load_recipe

    recipe = load_recipe(pipe.grpo.recipe, args)
    assert recipe.trl["temperature"] == 0.5 and recipe.trl["learning_rate"] == pytest.approx(1e-5)
    assert recipe.trl["beta"] == 0.0  # from the recipe file: the section was not replaced


def test_stage_overrides_keep_their_types_through_the_command_line(tmp_path):
    from deepanalyze_env.learn.settings import StageRecipe

    stage = StageRecipe("r.yaml", {"a": True, "b": [1, 2], "c": "text", "d": 2e-4, "e": None})
    assert stage.overrides() == ["a=true", "b=[1, 2]", "c=text", "d=0.0002", "e=null"]


def _stage_eval(folder: Path, rewards: dict[str, float], planned: list[str]) -> None:
    """An eval folder as ``eval`` leaves it: records of the finished episodes, the plan of every
    episode, and the report ``eval`` writes from them."""
    from deepanalyze_env.offline.eval_report import write_report

    folder.mkdir(parents=True)
    spec = {"method": "qa_plain", "ground_truth": "B"}
    lines = [
        {
            "episode_id": f"e-{task}",
            "task_id": task,
            "reward_spec": spec,
            "reward": reward,
            "reward_status": "scored",
            "format_ok": True,
            "reward_components": {"qa_accuracy": float(reward == 1.0)},
            "termination": "answer",
            "turns": 1,
            "messages": [],
        }
        for task, reward in rewards.items()
    ]
    (folder / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    plan = {"episodes": [{"episode_id": f"e-{t}", "task_id": t} for t in planned], "reward_specs": {}}
    plan["reward_specs"] = {t: spec for t in planned}
    (folder / "planned.json").write_text(json.dumps(plan))
    write_report(folder, 1)


def test_missing_episodes_count_as_failures_and_unpaired_tasks_are_named(tmp_path):
    from deepanalyze_env.learn.outputs import markdown
    from deepanalyze_env.learn.summary import compare_stages, coverage, headline

    _stage_eval(tmp_path / "eval-base", {"t1": 1.0, "t2": 0.0}, ["t1", "t2", "t3"])  # t3 raised
    _stage_eval(tmp_path / "eval-sft", {"t1": 1.0, "t2": 1.0}, ["t1", "t2"])  # t3 never planned
    base = headline(tmp_path / "eval-base")
    # over the 3 planned: rewards 1, 0 and -1 (missing); gate 1, 1, 0; correct 1, 0, 0
    assert base["reward_mean"] == pytest.approx(0.0)
    assert base["format_gate_pass_rate"] == pytest.approx(2 / 3)
    assert base["accuracy"] == pytest.approx(1 / 3)
    assert (base["planned"], base["finished"], base["missing"], base["missing_tasks"]) == (3, 2, 1, ["t3"])
    dev = {"base": base, "sft": headline(tmp_path / "eval-sft")}
    cov = coverage(dev)
    assert cov == {"same_tasks": False, "tasks": 3, "lacking": {"sft": ["t3"]}}
    comparisons = compare_stages(tmp_path, ["base", "sft"])
    pair = comparisons["base->sft"]
    assert pair["only_in_a"] == ["t3"] and pair["only_in_b"] == []
    assert pair["reward"]["tasks"] == 2 and pair["reward"]["mean_diff"] == pytest.approx(0.5)
    summary = {
        "dev": dev,
        "test": None,
        "coverage": cov,
        "comparisons": comparisons,
        "seconds": {"total": 1.0},
    }
    md = markdown(summary)
    assert "NOT COMPARABLE" in md and "sft lacks ['t3']" in md
    assert "UNPAIRED tasks left out: only earlier ['t3']" in md
    assert "base: 1 of 3 planned episodes did not finish (tasks t3)" in md
    assert "| base | 2/3 |" in md and "| sft | 2/2 |" in md


def _report(out: Path, missing: int, planned: int = 3) -> int:
    """What ``eval`` leaves: a run folder and a report over its planned episodes; exit 1 when
    some did not finish (as ``eval`` does)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text("{}")
    counts = {"planned": planned, "finished": planned - missing, "missing": missing}
    (out / "report.json").write_text(json.dumps({"episodes": counts}))
    return 1 if missing else 0


def test_an_eval_with_missing_episodes_is_resumed_not_recorded_as_done(tmp_path, calls, capsys):
    from deepanalyze_env.learn.stages import Stages, eval_gap

    out = tmp_path / "eval"
    command = _eval(out)
    calls.script = [lambda a: _report(out, missing=1), lambda a: _report(out, missing=0)]
    Stages(tmp_path, fresh=False).run("eval", "t", command, out, check=eval_gap)
    assert calls.commands == [command, dataclasses.replace(command, resume=True)]
    assert (
        "stage eval is incomplete (1 of 3 planned episodes did not finish): resuming"
        in capsys.readouterr().out
    )
    saved = json.loads((tmp_path / "stages.json").read_text())["eval"]
    assert saved["seconds"] is not None and "incomplete" not in saved


def test_an_eval_still_missing_episodes_stays_not_done_and_the_next_run_resumes_it(tmp_path, calls):
    from deepanalyze_env.learn.stages import Stages, eval_gap

    out = tmp_path / "eval"
    command = _eval(out)
    calls.script = [lambda a: _report(out, missing=2), lambda a: _report(out, missing=1)]
    Stages(tmp_path, fresh=False).run("eval", "t", command, out, check=eval_gap)
    saved = json.loads((tmp_path / "stages.json").read_text())["eval"]
    assert saved["seconds"] is None and saved["incomplete"] == "1 of 3 planned episodes did not finish"
    calls.script = [lambda a: _report(out, missing=0)]
    Stages(tmp_path, fresh=False).run("eval", "t", command, out, check=eval_gap)
    resumed = dataclasses.replace(command, resume=True)
    assert calls.commands[-1] == resumed and len(calls.commands) == 3  # resumed, not reused
    assert json.loads((tmp_path / "stages.json").read_text())["eval"]["seconds"] is not None


def test_a_crashed_eval_is_rerun_in_a_clean_folder_and_a_second_crash_is_an_error(tmp_path, calls, capsys):
    from deepanalyze_env.learn.stages import StageFailed, Stages, eval_gap

    out = tmp_path / "eval"
    command = _eval(out)

    def crash_before_any_run(a):
        out.mkdir(exist_ok=True)
        (out / "stray.log").write_text("x")
        return 1  # an uncaught exception: no run.json, no report

    calls.script = [crash_before_any_run, lambda a: _report(out, missing=0)]
    Stages(tmp_path, fresh=False).run("eval", "t", command, out, check=eval_gap)
    assert calls.commands == [command, command] and not (out / "stray.log").exists()
    assert "did not start a run (it wrote no report: it crashed): rerunning it in a clean folder" in (
        capsys.readouterr().out
    )

    def crash_after_some_episodes(a):
        out.mkdir(exist_ok=True)
        (out / "run.json").write_text("{}")
        (out / "report.json").unlink(missing_ok=True)
        return 1

    calls.script = [crash_after_some_episodes, crash_after_some_episodes]
    with pytest.raises(StageFailed, match="stage eval failed \\(it wrote no report: it crashed\\)") as failed:
        Stages(tmp_path, fresh=True).run("eval", "t", command, out, check=eval_gap)
    resumed = dataclasses.replace(command, resume=True)
    assert calls.commands[-1] == resumed  # the second try resumed the run it had started
    assert str(failed.value).endswith("deepanalyze-rl " + " ".join(resumed.argv()))  # how to rerun it
    saved = json.loads((tmp_path / "stages.json").read_text())["eval"]
    assert saved["seconds"] is None and "crashed" in saved["incomplete"]


def test_a_model_or_sft_data_rewritten_in_place_reruns_the_stages_that_read_it(tmp_path, calls):
    from deepanalyze_env.learn.stages import Stages

    model, kept = tmp_path / "sft", tmp_path / "kept.jsonl"
    kept.write_text('{"episode": 1}\n')
    out = tmp_path / "eval"

    def both():
        stages = Stages(tmp_path, fresh=False)
        stages.run("sft", "t", _train("r", model), model, [kept])
        if not model.exists():  # what the train command leaves
            model.mkdir()
            (model / "model.safetensors").write_bytes(b"\0" * 4096)
            (model / "config.json").write_text("{}")
        stages.run("eval", "t", _eval(out, model=str(model)), out, [model])
        out.mkdir(exist_ok=True)

    both()
    kept.write_text('{"episode": 1}\n')  # rewritten unchanged, as every learn run rewrites its task files
    both()
    assert len(calls.commands) == 2  # nothing changed: both reused
    weights = model / "model.safetensors"
    weights.write_bytes(b"\1" * 4096)  # same path, same size, other weights
    both()
    assert calls.commands[-1] == _eval(out, model=str(model)) and len(calls.commands) == 3  # the eval only
    kept.write_text('{"episode": 2}\n')  # other SFT data at the same path
    both()
    assert [type(c) for c in calls.commands[3:]] == [TrainCommand, EvalCommand]  # the SFT and all after it


def test_one_set_of_chat_template_kwargs_reaches_every_stage(tmp_path):
    from deepanalyze_env.learn.run import eval_command, template_override

    shipped = REPO / "recipes" / "learn_cpu.yaml"
    pipe = Pipeline.load(shipped, ["chat_template_kwargs.enable_thinking=false"])
    command = eval_command(pipe, "m", tmp_path / "dev.jsonl", tmp_path / "e", tmp_path / "env.yaml")
    assert command.chat_template_kwargs == {"enable_thinking": False}
    assert _parsed(command).chat_template_kwargs == '{"enable_thinking": false}'
    assert template_override(pipe) == ['trl.chat_template_kwargs={"enable_thinking": false}']
    # unset in the pipeline: the recipes' own value, for the evals too
    pipe = Pipeline.load(shipped, ["grpo.set.trl.chat_template_kwargs.enable_thinking=false"])
    assert pipe.chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(ConfigError, match=r"different trl\.chat_template_kwargs"):
        Pipeline.load(
            shipped,
            [
                "grpo.set.trl.chat_template_kwargs.enable_thinking=false",
                "sft.set.trl.chat_template_kwargs.enable_thinking=true",
            ],
        )
    assert Pipeline.load(shipped).chat_template_kwargs == {}


def test_the_tools_format_reaches_every_stage_with_its_chat_template(tmp_path):
    """``env.action_format: tools`` with ``chat_template``: evals render with the template, the
    training stages get it as a recipe override, and GRPO gets no budget check (TRL runs the
    tool loop); a curriculum, which seeds our rollout_func's sampler, is refused."""
    from deepanalyze_env.learn.run import eval_command, grpo_inputs, template_override
    from deepanalyze_env.learn.stages import Stages

    shipped = REPO / "recipes" / "learn_cpu.yaml"
    tools = ["env.action_format=tools", "chat_template=trl:qwen3", "grpo.recipe=trl_tools_cpu.yaml"]
    with pytest.raises(ConfigError, match="curriculum seeds our rollout_func"):
        Pipeline.load(shipped, tools)
    pipe = Pipeline.load(shipped, [*tools, "curriculum=null"])
    command = eval_command(pipe, "m", tmp_path / "dev.jsonl", tmp_path / "e", tmp_path / "env.yaml")
    assert command.chat_template == "trl:qwen3" and _parsed(command).chat_template == "trl:qwen3"
    assert template_override(pipe) == ["chat_template=trl:qwen3"]
    pipe.output_dir = str(tmp_path)
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "episodes.jsonl").write_text("{}\n")
    files = {"train": tmp_path / "train.jsonl"}
    _, extra = grpo_inputs(pipe, Stages(tmp_path, fresh=True), "m", files, tmp_path, tmp_path / "env.yaml")
    assert extra == []  # no rollout.budget_check for TRL's own tool loop


def test_a_missing_chat_template_file_fails_when_the_pipeline_loads():
    with pytest.raises(ConfigError, match="chat_template: no such file"):
        Pipeline.load(REPO / "recipes" / "learn_cpu.yaml", ["chat_template=no_such.jinja"])


def test_a_curriculum_section_samples_the_sft_model_on_grpos_tasks_and_seeds_the_curriculum(tmp_path, calls):
    from deepanalyze_env.learn.run import GrpoSampling, grpo_inputs
    from deepanalyze_env.learn.stages import Stages

    shipped = REPO / "recipes" / "learn_cpu.yaml"
    pipe = Pipeline.load(
        shipped,
        [
            "curriculum.tasks=2",
            "curriculum.samples=3",
            "curriculum.set.success_threshold=-0.5",
            "grpo.set.trl.temperature=0.7",
            "grpo.set.rollout.max_turn_tokens=120",
        ],
    )
    train = tmp_path / "tasks" / "train.jsonl"
    train.parent.mkdir()
    train.write_text("".join(json.dumps({"id": f"t{i}", "family": "f"}) + "\n" for i in range(5)))
    estimate = tmp_path / "estimate"
    calls.script = [lambda argv: (_stage_eval(estimate, {"t1": 1.0}, ["t1"]), 0)[1]]
    pool, extra = grpo_inputs(
        pipe, Stages(tmp_path, fresh=False), "sft", {"train": train}, tmp_path, tmp_path / "e"
    )
    # GRPO draws from 2 of the 5 train tasks, and the pass sampled exactly those
    assert pool == tmp_path / "tasks" / "grpo.jsonl" and len(pool.read_text().splitlines()) == 2
    [command] = calls.commands
    assert isinstance(command, EvalCommand)
    assert command.tasks == pool and command.model == "sft" and command.out == estimate
    # at GRPO's sampling temperature and per-turn budget (looked up once), k samples a task
    assert GrpoSampling.of(pipe) == GrpoSampling(temperature=0.7, max_tokens=120, budget_check=False)
    assert (command.temperature, command.max_tokens, command.samples) == (0.7, 120, 3)
    args = _parsed(command)
    assert args.tasks == [str(pool)] and args.model == "sft"
    assert (args.temperature, args.max_tokens, args.samples) == (0.7, 120, 3)
    assert extra == [
        "curriculum.kind=success_rate",
        f"curriculum.from_records={estimate}",
        "curriculum.success_threshold=-0.5",  # the shipped pipeline's set, with the override on top
        f"rollout.budget_check={estimate}",  # the budget check measures the same episodes
    ]


def test_without_a_curriculum_grpo_takes_every_train_task_and_the_budget_check_reads_the_sft_eval(
    tmp_path, calls
):
    from deepanalyze_env.learn.run import grpo_inputs
    from deepanalyze_env.learn.stages import Stages

    pipe = Pipeline.load(REPO / "recipes" / "learn_cpu.yaml", ["curriculum=null"])
    train = tmp_path / "train.jsonl"
    train.write_text('{"id": "a"}\n')
    (tmp_path / "eval-sft").mkdir()
    (tmp_path / "eval-sft" / "episodes.jsonl").write_text("{}\n")
    pool, extra = grpo_inputs(
        pipe, Stages(tmp_path, fresh=False), "sft", {"train": train}, tmp_path, tmp_path / "e"
    )
    assert pool == train and calls.commands == []
    assert extra == [f"rollout.budget_check={tmp_path / 'eval-sft'}"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("curriculum.samples=0", "samples >= 1"),
        ("curriculum.sampels=2", "curriculum:"),
        ("grpo=null", "no grpo stage"),
    ],
)
def test_curriculum_section_mistakes_are_one_line(override, message):
    with pytest.raises(ConfigError, match=message):
        Pipeline.load(REPO / "recipes" / "learn_cpu.yaml", ["curriculum.tasks=2", override])


def test_every_stage_command_line_parses_back_into_its_settings(tmp_path):
    """``commands.py`` is the one place a stage's argv is built; each one is read back by the CLI's
    own parser into the same settings (what the stage runs, and what ``stages.json`` reruns)."""
    bank = BankCommand(tmp_path / "bank", families=("ols", "correlation"), tables=("wine",), seed=7)
    args = _parsed(bank)
    assert (args.command, args.bank_command, args.out) == ("bank", "build", str(tmp_path / "bank"))
    assert (args.families, args.tables, args.seed) == (["correlation", "ols"], ["wine"], 7)
    assert _parsed(BankCommand(tmp_path / "bank")).families is None  # none named: every family

    command = _eval(
        tmp_path / "e",
        samples=4,
        temperature=0.7,
        max_tokens=96,
        concurrency=3,
        chat_template_kwargs={"enable_thinking": False},
        chat_template="trl:qwen3",
        resume=True,
    )
    args = _parsed(command)
    assert (args.command, args.model, args.tasks, args.out) == (
        "eval",
        "m",
        ["dev.jsonl"],
        str(tmp_path / "e"),
    )
    assert (args.samples, args.temperature, args.max_tokens, args.concurrency) == (4, 0.7, 96, 3)
    assert json.loads(args.chat_template_kwargs) == {"enable_thinking": False}
    assert (args.config, args.chat_template, args.resume) == ("env.yaml", "trl:qwen3", True)

    rollout = RolloutCommand(
        tmp_path / "t.jsonl", tmp_path / "train.jsonl", tmp_path / "env.yaml", tmp_path / "r"
    )
    args = _parsed(rollout)
    assert (args.command, args.policy, args.labels, args.keep) == (
        "rollout",
        "scripted",
        "good",
        'reward_status == "scored" and format_ok',
    )
    assert args.trajectories == [str(tmp_path / "t.jsonl")] and args.tasks == [str(tmp_path / "train.jsonl")]
    assert args.out == str(tmp_path / "r") and not args.resume

    train = TrainCommand(
        "r.yaml",
        tmp_path / "g",
        "sft",
        tmp_path / "pool.jsonl",
        env={"max_turns": 3},
        overrides=("max_steps=2",),
    )
    args = _parsed(train)
    assert (args.command, args.recipe) == ("train", "r.yaml")
    from deepanalyze_env.trainers.recipes import apply_override

    tree: dict = {}
    for assignment in args.overrides:
        apply_override(tree, assignment)
    assert tree == {
        "output_dir": str(tmp_path / "g"),
        "model": "sft",
        "data": [str(tmp_path / "pool.jsonl")],
        "env": {"max_turns": 3},
        "max_steps": 2,
    }
