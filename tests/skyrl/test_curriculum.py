"""The success-rate curriculum inside SkyRL: the real trainer's train dataloader draws from it,
the real generator's episodes feed it, each step logs its state, checkpoints carry it.

Real parts: SkyRL's ``PromptDataset`` and ``StatefulDataLoader``, ``prepare_generator_input``,
``SkyRLGymGenerator`` with our env and the judge over HTTP, the trainer's own ``generate`` and
``postprocess_generator_output``. The stand-in is ``ScriptedEngine`` (vLLM needs a GPU); the
trainer is built without Ray (its policy workers need GPUs), so its train loop is not run — the
methods the loop calls are.

Expected numbers are worked out by hand from the documented rules: Beta(1, 1) prior, counts + 1
per success / failure (decay 1 here), estimate alpha / (alpha + beta), weight
floor + (1 − floor)·(4p(1−p))^sharpness.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest
from skyrl.train.dataset import PromptDataset
from skyrl.train.generators.utils import prepare_generator_input

from deepanalyze_env.core.tasks import write_parquet
from deepanalyze_env.trainers.curriculum import CurriculumConfig, SuccessRateCurriculum
from deepanalyze_env.trainers.recipes import load_recipe
from deepanalyze_env.trainers.skyrl.config import parse_config
from deepanalyze_env.trainers.skyrl.curriculum import CurriculumBatchSampler, outcomes_of
from deepanalyze_env.trainers.skyrl.entrypoint import main
from deepanalyze_env.trainers.skyrl.launch import as_dotlist, overrides
from deepanalyze_env.trainers.skyrl.trainer import DeepAnalyzeTrainer, row_verdicts
from rewards.judge.fake_server import FakeJudgeServer, Reply
from tests.skyrl.conftest import ScriptedEngine, make_cfg, make_generator, shipped_rows, vllm_params

NO_RAY_MONITORS = (
    "generator.inference_engine.enable_ray_prometheus_stats=false",
    "trainer.enable_ray_gpu_monitor=false",
)
QA = ["qa-retail-001", "qa-inventory-001", "qa-clinic-001"]
M = "deepanalyze/curriculum/"


def answer(text: str) -> list[str]:
    return [f"<Analyze>final</Analyze>\n<Answer>\nAnswer: {text}\n</Answer>"]


def outcome(task, success: bool | None):
    """A synthetic episode: a qa answer right (1.0) or wrong (0.5), or a verifier_error."""
    if success is None:
        return {"task_id": task, "reward": None, "reward_status": "verifier_error",
                "termination": "answer", "reward_components": {}}  # fmt: skip
    return {"task_id": task, "reward": 1.0 if success else 0.5, "reward_status": "scored",
            "termination": "answer", "reward_components": {"qa_accuracy": float(success)}}  # fmt: skip


def train_file(tmp_path, task_ids) -> str:
    rows = shipped_rows()
    path = tmp_path / "train.parquet"
    write_parquet([rows[t] for t in task_ids], path)
    return str(path)


def trainer_for(cfg, tok, data, engine=None, generator=None) -> DeepAnalyzeTrainer:
    dataset = PromptDataset(data, tok, max_prompt_length=100000, num_workers=1)
    return DeepAnalyzeTrainer(
        cfg=cfg, tracker=None, tokenizer=tok, train_dataset=dataset,
        inference_engine_client=engine, generator=generator,
    )  # fmt: skip


def curriculum_cfg(data, *extra):
    return make_cfg(
        f"data.train_data=['{data}']",
        "deepanalyze.curriculum.kind=success_rate",
        "deepanalyze.curriculum.decay=1.0",
        *NO_RAY_MONITORS,
        *extra,
    )


def test_without_a_curriculum_the_train_dataloader_is_skyrls(tmp_path, tiny_tokenizer):
    data = train_file(tmp_path, QA)
    trainer = trainer_for(make_cfg(f"data.train_data=['{data}']", *NO_RAY_MONITORS), tiny_tokenizer, data)
    assert trainer.curriculum is None
    assert not isinstance(trainer.train_dataloader.batch_sampler, CurriculumBatchSampler)


def test_the_trainers_batches_are_drawn_by_success_estimate(tmp_path, tiny_tokenizer):
    """Three tasks, one prompt a batch. After 8 wins of retail (p = 9/10), 4 wins and 4 losses of
    inventory (p = 1/2) and 8 losses of clinic (p = 1/10; its verifier errors do not count), the
    weights (floor 0.1, sharpness 1) are 0.1 + 0.9·0.36 = 0.424, 1, 0.424: inventory is drawn
    with probability 1/1.848 = 0.541, the others 0.424/1.848 = 0.229 each."""
    data = train_file(tmp_path, QA)
    cfg = curriculum_cfg(
        data,
        "deepanalyze.curriculum.floor=0.1",
        "deepanalyze.curriculum.sharpness=1",
        "trainer.train_batch_size=1",
    )
    trainer = trainer_for(cfg, tiny_tokenizer, data)
    loader = trainer.train_dataloader
    assert isinstance(loader.batch_sampler, CurriculumBatchSampler)
    assert len(loader) == 3 and trainer.total_training_steps == 3 * cfg.trainer.epochs
    trainer.curriculum.observe(
        [outcome("qa-retail-001", True)] * 8
        + [outcome("qa-inventory-001", True)] * 4
        + [outcome("qa-inventory-001", False)] * 4
        + [outcome("qa-clinic-001", False)] * 8
        + [outcome("qa-clinic-001", None)] * 20
    )
    drawn = Counter()
    for _ in range(400):  # 400 epochs of 3 batches, through SkyRL's dataloader and collate_fn
        for batch in loader:
            (prompt,) = batch
            assert QA[int(prompt["uid"])] == prompt["env_extras"]["task_id"]  # uid = dataset index
            drawn[prompt["env_extras"]["task_id"]] += 1
    n = sum(drawn.values())
    assert n == 1200
    # binomial sd at n = 1200 is about 0.014; uniform sampling would give 0.333 each
    assert drawn["qa-inventory-001"] / n == pytest.approx(1 / 1.848, abs=0.05)
    assert drawn["qa-retail-001"] / n == pytest.approx(0.424 / 1.848, abs=0.05)
    assert drawn["qa-clinic-001"] / n == pytest.approx(0.424 / 1.848, abs=0.05)


def test_each_batch_is_drawn_when_the_loop_asks_for_it(tmp_path, tiny_tokenizer):
    """No prefetch: outcomes observed after batch 1 decide batch 2. With 40 wins of retail
    (p = 41/42), 40 losses of clinic (p = 1/42) and 20/20 of inventory (p = 1/2), floor 0.001,
    sharpness 2, the weights are about 0.0097, 0.0097 and 1: inventory is drawn with probability
    0.98 (a loader that had drawn ahead from the prior would give it 1/3)."""
    data = train_file(tmp_path, QA)
    cfg = curriculum_cfg(data, "deepanalyze.curriculum.floor=0.001", "trainer.train_batch_size=1")
    trainer = trainer_for(cfg, tiny_tokenizer, data)
    batches = iter(trainer.train_dataloader)
    next(batches)
    trainer.curriculum.observe(
        [outcome("qa-retail-001", True)] * 40
        + [outcome("qa-clinic-001", False)] * 40
        + [outcome("qa-inventory-001", True)] * 20
        + [outcome("qa-inventory-001", False)] * 20
    )
    assert [b[0]["env_extras"]["task_id"] for b in batches] == ["qa-inventory-001"] * 2


def test_generated_episodes_feed_the_curriculum_and_each_step_logs_it(tmp_path, tiny_tokenizer):
    """One step as SkyRL's train loop runs it: a batch from the trainer's dataloader, SkyRL's
    generator input (4 samples per prompt), the trainer's ``generate`` and
    ``postprocess_generator_output``. Retail: two right answers (reward 1.0), one wrong (0.5), one
    the judge fails on (verifier_error, not counted). Inventory: four wrong answers (0.5 each, a
    zero-variance group)."""
    rows = shipped_rows()
    data = train_file(tmp_path, QA[:2])
    plans = {
        rows["qa-retail-001"]["input_seq"][:60]: {
            0: answer("Harbor Point"), 1: answer("Elm Street"),
            2: answer("Outage"), 3: answer("Harbor Point"),
        },
        rows["qa-inventory-001"]["input_seq"][:60]: {i: answer(str(i + 20)) for i in range(4)},
    }  # fmt: skip
    judge = FakeJudgeServer(Reply(text="Weaknesses:\n- none\nSCORE: 5"))
    judge.script(*[Reply(status=500)] * 20, match="Answer: Outage")
    with judge:
        cfg = curriculum_cfg(
            data,
            "deepanalyze.curriculum.hopeless=0.2",
            "environment.skyrl_gym.deepanalyze.judge.backend=openai",
            f"environment.skyrl_gym.deepanalyze.judge.base_url={judge.url}",
            "environment.skyrl_gym.deepanalyze.judge.model=fake-judge",
            "environment.skyrl_gym.deepanalyze.judge.max_retries=0",
            "generator.n_samples_per_prompt=4",
            "trainer.train_batch_size=2",
            "trainer.policy_mini_batch_size=2",
        )
        engine = ScriptedEngine(tiny_tokenizer, plans)
        gen = make_generator(cfg, tiny_tokenizer, engine)
        trainer = trainer_for(cfg, tiny_tokenizer, data, engine, gen)
        batch = next(iter(trainer.train_dataloader))
        gen_input, uids = prepare_generator_input(
            batch, 4, vllm_params(cfg.generator.sampling_params), "deepanalyze", "train", 1
        )
        output = asyncio.run(trainer.generate(gen_input))
    cur = trainer.curriculum
    # retail: Beta(1 + 2, 1 + 1); inventory: Beta(1, 1 + 4)
    assert cur.estimate("qa-retail-001") == pytest.approx(3 / 5)
    assert cur.estimate("qa-inventory-001") == pytest.approx(1 / 6)
    trainer.postprocess_generator_output(output, uids)
    logged = trainer.all_metrics  # what SkyRL's loop hands the tracker at the end of the step
    assert logged[M + "groups"] == 2 and logged[M + "zero_variance_groups"] == 1
    assert logged[M + "zero_variance_fraction"] == 0.5
    assert logged[M + "episodes_counted"] == 7 and logged[M + "episodes_excluded"] == 1
    hist = {k[len(M + "success_histogram/") :]: v for k, v in logged.items() if "success_histogram/" in k}
    assert len(hist) == 10 and hist["0.6-0.7"] == 1 and hist["0.1-0.2"] == 1 and sum(hist.values()) == 2
    # inventory: 4 episodes (min_episodes 4) at 1/6 <= hopeless 0.2; retail has only 3 episodes
    assert logged[M + "hopeless"] == 1 and logged[M + "mastered"] == 0
    w_retail = 0.05 + 0.95 * (4 * 0.6 * 0.4) ** 2  # floor 0.05, sharpness 2: 0.92552
    w_inventory = 0.05 + 0.95 * (4 * (1 / 6) * (5 / 6)) ** 2  # 0.34321
    probs = [w / (w_retail + w_inventory) for w in (w_retail, w_inventory)]
    assert logged[M + "sampling_entropy"] == pytest.approx(-sum(p * math.log(p) for p in probs))
    assert logged[M + "sampling_entropy_max"] == pytest.approx(math.log(2))
    # the next step starts a fresh count
    trainer.all_metrics = {}
    trainer.postprocess_generator_output(output, uids)
    assert trainer.all_metrics[M + "groups"] == 0 and M + "zero_variance_fraction" not in trainer.all_metrics


def test_length_stopped_rows_are_failures_whose_trained_reward_follows_score_truncated():
    """GeneratorOutput-shaped rows: a trained answer, a row SkyRL stopped before the env said done
    (no status yet), a verifier_error. Group ids are dataset indices."""
    output = {
        "loss_masks": [[1, 1], [1, 1], [1, 1]],
        "stop_reasons": ["stop", "length", "stop"],
        "env_metrics": [
            {"finished": 1.0, "reward": 1.0, "status_scored": 1.0, "termination_answer": 1.0,
             "reward/qa_accuracy": 1.0},
            {"finished": 0.0, "turns": 3},
            {"finished": 1.0, "reward": -1.0, "status_verifier_error": 1.0, "status_scored": 0.0,
             "termination_answer": 1.0},
        ],
    }  # fmt: skip
    for score_truncated, length_reward in ((False, None), (True, -1.0)):
        got = outcomes_of(output, ["1", "0", "1"], ["a", "b"], row_verdicts(output, score_truncated))
        assert [o["task_id"] for o in got] == ["b", "a", "b"]
        assert [o["reward"] for o in got] == [1.0, length_reward, None]
        assert [o["reward_status"] for o in got] == ["scored", "scored", "verifier_error"]
        assert got[1]["termination"] == "length" and got[0]["reward_components"] == {"qa_accuracy": 1.0}
    cur = SuccessRateCurriculum(["a", "b"], CurriculumConfig(decay=1.0))
    cur.observe(got)
    assert cur.tasks[0].beta == 2.0 and cur.tasks[0].alpha == 1.0  # the length cut: one failure
    assert cur.tasks[1].alpha == 2.0 and cur.tasks[1].episodes == 1  # the verifier_error: nothing


def test_a_resumed_run_draws_what_the_first_would_have(tmp_path, tiny_tokenizer):
    """SkyRL saves ``train_dataloader.state_dict()`` with each checkpoint and loads it on resume:
    the curriculum's estimates and its draw generator travel with it."""
    data = train_file(tmp_path, QA)
    cfg = curriculum_cfg(data, "trainer.train_batch_size=1")
    first = trainer_for(cfg, tiny_tokenizer, data)
    first.curriculum.observe([outcome("qa-retail-001", True)] * 6 + [outcome("qa-clinic-001", False)] * 3)
    it = iter(first.train_dataloader)
    next(it)
    state = first.train_dataloader.state_dict()
    rest = [b[0]["uid"] for b in it]
    estimates = first.curriculum.estimates()
    resumed = trainer_for(cfg, tiny_tokenizer, data)
    assert resumed.curriculum.estimates() != estimates
    resumed.train_dataloader.load_state_dict(state)
    assert [b[0]["uid"] for b in resumed.train_dataloader] == rest  # the epoch's two remaining draws
    assert resumed.curriculum.estimates() == estimates


def test_the_recipe_section_reaches_the_trainer_config(tmp_path):
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(
        json.dumps(
            {"backend": "skyrl", "output_dir": str(tmp_path / "out"), "model": "m", "data": ["t.parquet"],
             "curriculum": {"kind": "success_rate", "floor": 0.2, "prior": [2, 3],
                            "from_records": "runs/prev"}}
        )
    )  # fmt: skip
    recipe = load_recipe(recipe_path)
    cfg = parse_config(as_dotlist(overrides(recipe, ["t.parquet"])))
    got = cfg.deepanalyze.curriculum
    assert got["kind"] == "success_rate" and got["floor"] == 0.2 and got["prior"] == [2.0, 3.0]
    assert got["decay"] == 0.9 and got["seed"] is None  # the defaults travel too
    assert got["from_records"] == str((tmp_path.cwd() / "runs" / "prev").resolve())  # absolute for Ray
    assert parse_config([]).deepanalyze.curriculum is None  # off unless set


ON = "deepanalyze.curriculum.kind=success_rate"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["deepanalyze.curriculum.kind=uniform"], "kind must be success_rate"),
        ([ON, "deepanalyze.curriculum.flor=0.1"], r"unknown key curriculum\.flor"),
        ([ON, "data.dataloader.num_workers=4"], "in the trainer's process"),
        ([ON, "data.dataloader.persistent_workers=true"], "in the trainer's process"),
    ],
)
def test_bad_curriculum_settings_are_one_line_errors(extra, message, judge_free_data, capsys):
    assert main(["--check", *judge_free_data, *extra]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("\n") == 1


def test_check_reports_the_curriculum_and_its_seed_records(tmp_path, judge_free_data, capsys):
    run = tmp_path / "prev"
    run.mkdir()
    records = [
        {"episode_id": f"e{i}", "task_id": "datatask-retail-001", "reward": 1.0, "reward_status": "scored",
         "termination": "answer", "reward_components": {}} for i in range(3)
    ]  # fmt: skip
    (run / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    args = [
        *judge_free_data,
        "deepanalyze.curriculum.kind=success_rate",
        f"deepanalyze.curriculum.from_records={run}",
        "trainer.policy_mini_batch_size=1",
    ]
    assert main(["--check", *args, "trainer.train_batch_size=3"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["curriculum"]["from_records"] == str(run)
    assert shown["curriculum_check"] == {"kind": "success_rate", "tasks": 3, "seeded_episodes": 3}
    assert main(["--check", *args, "trainer.train_batch_size=4"]) == 2
    assert "larger than the 3 training tasks" in capsys.readouterr().err


def test_a_task_listed_twice_is_refused(tmp_path, judge_free_data, capsys):
    path = judge_free_data[0].split("'")[1]
    twice = tmp_path / "twice.jsonl"
    twice.write_text(Path(path).read_text() * 2)
    args = [f"data.train_data=['{twice}']", judge_free_data[1], "deepanalyze.curriculum.kind=success_rate"]
    assert main(["--check", *args]) == 2
    assert "holds task 'datatask-" in capsys.readouterr().err
