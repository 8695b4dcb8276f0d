"""The success-rate curriculum on hand-made outcomes: estimates, weights, draws, logging, records.

Expected numbers are worked out by hand from the documented formulas (Beta posterior mean with
decay; weight = floor + (1 - floor) * (4p(1-p)) ** sharpness).
"""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from deepanalyze_env.core.errors import ConfigError
from deepanalyze_env.trainers.curriculum import (
    CurriculumConfig,
    SuccessRateCurriculum,
    accuracy_tasks,
    success_of,
)


def outcome(task, reward, status="scored", components=None, termination="answer"):
    return {
        "task_id": task,
        "reward": reward,
        "reward_status": status,
        "termination": termination,
        "reward_components": components if components is not None else {},
    }


def group(task, wins, losses):
    comps = [{"answer_match": 1.0}] * wins + [{"answer_match": 0.0}] * losses
    return [outcome(task, c["answer_match"], components=c) for c in comps]


PLAIN = CurriculumConfig(decay=1.0, sharpness=1.0, floor=0.1)


def test_estimate_is_the_beta_posterior_mean():
    cur = SuccessRateCurriculum(["a"], PLAIN)
    cur.observe(group("a", 3, 1))
    assert cur.estimate("a") == pytest.approx((1 + 3) / (2 + 4))


def test_decay_fades_old_evidence():
    cur = SuccessRateCurriculum(["a"], CurriculumConfig(decay=0.5))
    cur.observe(group("a", 0, 1) + group("a", 1, 0))
    # prior (1, 1) → failure: (0.5, 1.5) → success: (1.25, 0.75)
    assert cur.estimate("a") == pytest.approx(1.25 / 2.0)


def test_weight_peaks_for_middle_tasks_and_never_drops_below_the_floor():
    cur = SuccessRateCurriculum(["mastered", "middle", "hopeless"], PLAIN)
    cur.observe(group("mastered", 30, 0) + group("middle", 15, 15) + group("hopeless", 0, 30))
    w = dict(zip(cur.task_ids, cur.weights(), strict=True))
    p_hopeless = 1 / 32
    assert w["middle"] == pytest.approx(1.0)
    assert w["hopeless"] == pytest.approx(0.1 + 0.9 * 4 * p_hopeless * (1 - p_hopeless))
    assert w["mastered"] == pytest.approx(w["hopeless"])  # symmetric counts, symmetric weight
    assert cur.weight_of(0.0) == pytest.approx(0.1) and cur.weight_of(1.0) == pytest.approx(0.1)
    assert cur.weight_of(0.5) > cur.weight_of(0.3) > cur.weight_of(0.1) > cur.weight_of(0.0)


def test_draws_favour_middle_tasks_yet_revisit_every_task():
    tasks = ["mastered", "middle", "hopeless"]
    cur = SuccessRateCurriculum(tasks, CurriculumConfig(decay=1.0, floor=0.05), seed=3)
    cur.observe(group("mastered", 40, 0) + group("middle", 20, 20) + group("hopeless", 0, 40))
    counts = Counter(tasks[i] for _ in range(4000) for i in cur.draw(1))
    probs = dict(zip(tasks, cur.probabilities(), strict=True))
    for task in tasks:  # empirical frequency matches the stated probabilities
        assert counts[task] / 4000 == pytest.approx(probs[task], abs=0.02)
    assert counts["middle"] > 5 * counts["hopeless"]
    assert counts["hopeless"] > 0 and counts["mastered"] > 0


def test_a_batch_holds_distinct_tasks_and_draws_repeat_under_a_seed():
    a = SuccessRateCurriculum([f"t{i}" for i in range(10)], seed=7)
    b = SuccessRateCurriculum([f"t{i}" for i in range(10)], seed=7)
    batches = [a.draw(4) for _ in range(5)]
    assert batches == [b.draw(4) for _ in range(5)]
    assert all(len(set(batch)) == 4 for batch in batches)
    assert sorted(a.draw(10)) == list(range(10))


def test_infrastructure_failures_do_not_count():
    cur = SuccessRateCurriculum(["a"], PLAIN)
    cur.observe(
        [
            outcome("a", None, status="verifier_error"),
            outcome("a", None, status="environment_error"),
            outcome("a", 1.0, components={"answer_match": 1.0}),
        ]
    )
    assert cur.estimate("a") == pytest.approx(2 / 3)
    log = cur.drain()
    assert (log["episodes_counted"], log["episodes_excluded"]) == (1, 2)


def test_success_reads_the_accuracy_component_before_the_reward():
    config = CurriculumConfig(success_threshold=0.5)
    # a high reward with a wrong answer is no success; a full-marks DABench answer is
    assert success_of(outcome("a", 0.8, components={"answer_match": 0.0, "fmt": 1.0}), config) is False
    assert success_of(outcome("a", 0.6, components={"answer_parts_all": 1.0}), config) is True
    assert success_of(outcome("a", 0.6, components={"qa_accuracy": 1.0}), config) is True
    # no accuracy component: reward > threshold
    assert success_of(outcome("a", 0.6, components={"judge_accuracy": 0.6}), config) is True
    assert success_of(outcome("a", 0.5, components={"judge_accuracy": 0.5}), config) is False
    # cut for length (no trained reward): a failure, not an exclusion
    assert success_of(outcome("a", None, termination="length"), config) is False


def test_tasks_with_an_accuracy_component_are_judged_on_accuracy_and_the_log_says_so():
    """The learn pipeline's setting: a gate pass (reward −0.5 threshold) is no success for a task
    whose plan can tell a right answer; tasks without one fall back to the threshold."""
    config = CurriculumConfig(decay=1.0, success_threshold=-0.5)
    rows = [
        {"task_id": "qa", "reward_spec": {"method": "qa_plain", "ground_truth": "B"}},
        {"task_id": "judged", "reward_spec": {"method": "no_such_method"}},
        {"task_id": "as_text", "reward_spec": json.dumps({"method": "qa_plain", "ground_truth": "B"})},
    ]
    assert accuracy_tasks(rows, config) == {"qa", "as_text"}
    assert accuracy_tasks(rows, CurriculumConfig(accuracy_components=())) == set()
    cur = SuccessRateCurriculum(["qa", "judged"], config, accuracy={"qa"})
    failed_gate = {"format_gate": -1.0}  # a failed gate holds no accuracy component
    cur.observe(
        [
            outcome("qa", 0.2, components={"qa_accuracy": 0.0}),  # passed the gate, wrong answer
            outcome("qa", -1.0, components=failed_gate),
            outcome("qa", 1.0, components={"qa_accuracy": 1.0}),
            outcome("judged", 0.0, components={"judge_score": 0.0}),  # passed the gate
            outcome("judged", -1.0, components=failed_gate),
        ]
    )
    assert cur.estimate("qa") == pytest.approx((1 + 1) / (2 + 3))  # one success of three
    assert cur.estimate("judged") == pytest.approx((1 + 1) / (2 + 2))  # the gate pass counts
    assert cur.drain()["success_basis"] == {"accuracy": 3, "reward": 2}
    # without the task list an episode's own components decide (SkyRL, records)
    assert success_of(outcome("qa", -1.0, components=failed_gate), config) is False
    assert success_of(outcome("qa", 0.0, components={}), config) is True
    assert success_of(outcome("qa", 0.0, components={}), config, accuracy_task=True) is False


def test_step_log_counts_zero_variance_groups_histogram_and_extremes():
    cur = SuccessRateCurriculum(["a", "b", "c", "d"], CurriculumConfig(decay=1.0, min_episodes=4))
    cur.observe(group("a", 4, 0) + group("b", 2, 2) + group("c", 0, 4))
    log = cur.drain()
    assert (log["groups"], log["zero_variance_groups"]) == (3, 2)
    assert log["zero_variance_fraction"] == pytest.approx(2 / 3)
    # estimates: a 5/6, b 3/6, c 1/6, d 1/2 (unseen)
    assert log["success_histogram"] == [0, 1, 0, 0, 0, 2, 0, 0, 1, 0]
    assert (log["mastered"], log["hopeless"]) == (0, 0)  # 5/6 < 0.9 and 1/6 > 0.1
    weights = [cur.weight_of(p) for p in (5 / 6, 0.5, 1 / 6, 0.5)]
    probs = [w / sum(weights) for w in weights]
    assert log["sampling_entropy"] == pytest.approx(-sum(p * math.log(p) for p in probs))
    assert log["sampling_entropy_max"] == pytest.approx(math.log(4))
    assert cur.drain()["groups"] == 0  # drained


def test_mastered_and_hopeless_need_enough_episodes():
    cur = SuccessRateCurriculum(["a", "b", "c"], CurriculumConfig(decay=1.0, min_episodes=20))
    cur.observe(group("a", 30, 0) + group("b", 0, 30) + group("c", 0, 10))
    log = cur.drain()
    assert (log["mastered"], log["hopeless"]) == (1, 1)  # c: 1/12 but only 10 episodes


def test_from_records_seeds_estimates_from_a_run_folder(tmp_path):
    run = tmp_path / "run"
    (run / "records").mkdir(parents=True)
    rows = [
        {"episode_id": "e1", "task_id": "a", "reward": 1.0, "reward_status": "scored",
         "termination": "answer", "reward_components": {"answer_match": 1.0}},
        {"episode_id": "e2", "task_id": "a", "reward": 0.0, "reward_status": "scored",
         "termination": "answer", "reward_components": {"answer_match": 0.0}},
        {"episode_id": "e3", "task_id": "a", "reward": None, "reward_status": "verifier_error",
         "termination": "answer", "reward_components": {}},
        {"episode_id": "e4", "task_id": "b", "reward": None, "reward_status": "unfinished",
         "termination": None, "reward_components": {}},
        {"episode_id": "e5", "task_id": "gone", "reward": 1.0, "reward_status": "scored",
         "termination": "answer", "reward_components": {}},
    ]  # fmt: skip
    (run / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cur = SuccessRateCurriculum.from_records(run, ["a", "b"], CurriculumConfig(decay=1.0))
    assert cur.estimate("a") == pytest.approx(2 / 4)  # prior (1,1) + one win + one loss
    assert cur.estimate("b") == pytest.approx(0.5)  # only an unfinished episode: prior
    assert cur.drain()["groups"] == 0  # history is not reported as this run's step
    with pytest.raises(ConfigError, match="no such file"):
        SuccessRateCurriculum.from_records(tmp_path / "missing", ["a"])


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"kind": "success_rate", "floo": 0.1}, r"unknown key curriculum\.floo"),
        ({"kind": "band"}, "kind must be success_rate"),
        ({"floor": 0.1}, "kind must be success_rate"),
        ({"kind": "success_rate", "floor": 0}, r"floor must be in \(0, 1\]"),
        ({"kind": "success_rate", "decay": 1.5}, r"decay must be in \(0, 1\]"),
        ({"kind": "success_rate", "prior": [1]}, r"curriculum\.prior: bad value \[1\] \(two positive"),
        ({"kind": "success_rate", "floor": "low"}, r"curriculum\.floor: bad value 'low'"),
        ({"kind": "success_rate", "mastered": 0.2, "hopeless": 0.3}, "hopeless < mastered"),
        ("success_rate", "must be a mapping"),
    ],
)
def test_bad_curriculum_settings_are_one_line_errors(tree, message):
    with pytest.raises(ConfigError, match=message) as info:
        CurriculumConfig.from_mapping(tree)
    assert "\n" not in str(info.value)


def test_settings_parse_into_the_documented_fields():
    config = CurriculumConfig.from_mapping(
        {"kind": "success_rate", "prior": [2, 3], "accuracy_components": "answer_match", "seed": "4"}
    )
    assert config.prior == (2.0, 3.0)
    assert config.accuracy_components == ("answer_match",)
    assert config.seed == 4


def test_state_dict_restores_estimates_and_draws_by_task_id():
    """A checkpoint's state: estimates and the draw generator; tasks are matched by id, so a task
    new to the resumed run keeps the prior and one no longer trained is dropped."""
    first = SuccessRateCurriculum(["a", "b", "gone"], PLAIN, seed=5)
    first.observe(group("a", 3, 0) + group("b", 0, 2) + group("gone", 1, 1))
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint file round-trips
    expected = first.draw(2)
    resumed = SuccessRateCurriculum(["b", "a", "new"], PLAIN, seed=99)
    resumed.load_state_dict(state)
    assert resumed.estimate("a") == pytest.approx(4 / 5) and resumed.estimate("b") == pytest.approx(1 / 4)
    assert resumed.estimate("new") == 0.5 and resumed.tasks[1].episodes == 3
    again = SuccessRateCurriculum(["a", "b", "gone"], PLAIN, seed=99)
    again.load_state_dict(state)
    assert again.draw(2) == expected  # same tasks, same generator state: same draws


def test_an_empty_accuracy_list_reads_the_reward_against_the_threshold():
    from deepanalyze_env.trainers.curriculum import CurriculumConfig, success_of

    config = CurriculumConfig.from_mapping(
        {"kind": "success_rate", "accuracy_components": [], "success_threshold": -0.5}
    )
    passed_gate = {"reward_status": "scored", "reward": 0.0, "reward_components": {"answer_match": 0.0}}
    failed_gate = {"reward_status": "scored", "reward": -1.0, "reward_components": {"format_gate": -1.0}}
    assert success_of(passed_gate, config) is True and success_of(failed_gate, config) is False
