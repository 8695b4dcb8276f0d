"""``benchmarks/learning2_report.py``: the round-two targets are met only in every configured
seed, PENDING while a seed has not run, MISSED (with the values) otherwise; the family verdict.
Pure JSON in, no stage runs."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

from learning2_report import family_table, report, targets  # noqa: E402


def config(task_set: str = "two") -> dict:
    return {
        "task_set": task_set,
        "tasks": {"families": ["describe_stat"], "train": 10**6, "dev": 10**6, "test": 10**6, "about": "x"},
        "model": "embedded:smollm2",
        "task_seed": 0,
        "env": {},
        "eval": {},
        "sft": {},
        "curriculum": None,
        "grpo": {},
        "rft": None,
        "rft_max_rounds": 1,
        "pass_k": 4,
        "seeds": [0, 1],
        "budget_minutes": 120.0,
        "accuracy_target": 0.5,
        "pending": [],
    }


def acc(value: float, low: float) -> dict:
    return {"tasks": 48, "accuracy": value, "ci95": [low, value + 0.1]}


def pair(low: float) -> dict:
    return {
        "tasks": 48,
        "accuracy_a": 0.4,
        "accuracy_b": 0.6,
        "mean_diff": 0.2,
        "ci95": [low, 0.3],
        "b_better": 10,
        "a_better": 1,
        "ties": 37,
        "binary": True,
        "mcnemar_p": 0.01,
        "unpaired": 0,
    }


def head(accuracy: float) -> dict:
    return {
        "format_gate_pass_rate": 0.9,
        "reward_mean": 0.1,
        "accuracy": accuracy,
        "pass_at": {"1": accuracy},
    }


def result(seed: int, grpo_acc: float = 0.6, low: float = 0.05, minutes: float = 100.0) -> dict:
    return {
        "seed": seed,
        "date": "d",
        "machine": "m",
        "models": {"sft": "a", "grpo": "b"},
        "sft": {"seconds": {}, "timed_minutes": 30.0, "memory": {}},
        "branches": {"grpo": {"model": "b", "train_seconds": 600.0, "timed_minutes": minutes, "steps": []}},
        "pipeline_minutes": minutes,
        "measure_minutes": 10.0,
        "dev": {"sft": head(0.4), "grpo": head(grpo_acc)},
        "dev_accuracy": {"sft": acc(0.4, 0.3), "grpo": acc(grpo_acc, grpo_acc - 0.1)},
        "test": {"sft": head(0.3), "grpo": head(0.5)},
        "test_accuracy": {"sft": acc(0.3, 0.2), "grpo": acc(0.5, 0.4)},
        "paired": {"dev": {"sft->grpo": pair(low)}, "test": {"sft->grpo": pair(low)}},
        "pass_k": {**head(0.3), "k": 4, "temperature": 0.7, "pass_at": {"1": 0.3, "4": 0.6}},
        "families": {
            "sft": {"describe_stat": 0.5, "ols": 0.0},
            "grpo": {"describe_stat": 0.7, "ols": 0.0},
            "sft pass@4": {"describe_stat": 0.8, "ols": 0.0},
        },
    }


def states(cfg: dict, results: list[dict]) -> dict[str, str]:
    return {name: t["state"] for name, t in targets(cfg, results).items()}


def test_one_seed_is_pending_not_met():
    assert set(states(config(), [result(0)]).values()) == {"PENDING"}


def test_both_seeds_met():
    assert set(states(config(), [result(0), result(1)]).values()) == {"met"}


def test_a_miss_in_one_seed_is_missed_at_once():
    found = states(config(), [result(0, low=0.0, minutes=130.0)])
    assert found["grpo above SFT on dev accuracy, paired 95% lower bound > 0"] == "MISSED"
    assert found["grpo: <= 120 min per seed (timed stages)"] == "MISSED"
    assert found["grpo: dev accuracy >= 0.5"] == "PENDING"
    found = states(config(), [result(0), result(1, grpo_acc=0.45)])
    assert found["grpo: dev accuracy >= 0.5"] == "MISSED"


def test_a_branch_a_seed_has_not_run_yet_is_pending_for_that_seed():
    """Seed 1 run in parts (``--branches grpo``): its RFT branch is still to come, so RFT's targets
    that seed 0 met are PENDING, not met, and name seed 1 as missing."""
    both = result(0)
    both["branches"]["rft"] = {**both["branches"]["grpo"], "model": "c"}
    both["dev_accuracy"]["rft"] = acc(0.6, 0.5)
    both["paired"]["dev"]["sft->rft"] = pair(0.05)
    found = targets(config(), [both, result(1)])
    rft = {k: v for k, v in found.items() if k.startswith("rft")}
    assert len(rft) == 3 and {t["state"] for t in rft.values()} == {"PENDING"}
    assert all(t["seeds_missing"] == [1] for t in rft.values())
    assert {t["state"] for k, t in found.items() if k.startswith("grpo")} == {"met"}


def test_all_families_target_reads_the_interval():
    found = states(config("all"), [result(0, grpo_acc=0.05), result(1, grpo_acc=0.2)])
    assert found == {"grpo: dev accuracy above 0 (95% lower bound > 0)": "MISSED"}


def test_family_verdict_and_section():
    lines, table = family_table([result(0), result(1)])
    assert table["ols"]["learned"] is False and table["describe_stat"]["learned"] is True
    assert any("ols" in line and "not learned at this budget" in line for line in lines)
    md, summary = report(config(), [result(0)])
    assert "**PENDING**" in md and "McNemar p = 0.0100" in md and summary["seeds"] == [0]


def test_rft_rounds_stop_at_grpo_minutes(monkeypatch, tmp_path):
    """``learning2.rft_branch``: one round more per pipeline run (earlier rounds reused, their
    seconds counted), until the training seconds reach GRPO's; a round that keeps nothing ends it."""
    import learning2

    calls = []

    def fake_run(spec, fresh):
        rounds = spec["rft"]["rounds"]
        calls.append(rounds)
        seconds = {f"rft_sample{i}": 100.0 for i in range(1, rounds + 1)}
        seconds |= {f"rft_sft{i}": 50.0 for i in range(1, rounds + 1)} | {"eval_rft": 30.0, "total": 1.0}
        # a round that keeps nothing trains nothing: the pipeline's model stays the last round's
        model = f"m{min(rounds, stop_at - 1)}" if stop_at else f"m{rounds}"
        return {
            "model": model,
            "seconds": seconds,
            "dev": {"rft": {}},
            "task_files": {"dev": str(tmp_path / "t" / "d")},
        }

    monkeypatch.setattr(learning2, "run_file", fake_run)
    monkeypatch.setattr(learning2, "headline", lambda folder: {"accuracy": 0.0})
    monkeypatch.setattr(learning2, "load_eval", lambda folder: ([], {}))
    cfg = learning2.config_for("two", tiny=False)
    stop_at = 0
    out = learning2.rft_branch(cfg, tmp_path, "sft", 0, grpo_train=400.0, shared_timed=600.0, fresh=False)
    assert calls == [1, 2, 3] and out["model"] == "m3"  # 150, 300, 450 s: the third reaches 400
    assert [r["train_seconds"] for r in out["rounds"]] == [150.0, 150.0, 150.0]
    assert out["train_seconds"] == 450.0 and out["timed_minutes"] == round((600 + 480) / 60, 1)
    calls.clear()
    stop_at = 2
    out = learning2.rft_branch(cfg, tmp_path, "sft", 0, grpo_train=400.0, shared_timed=0.0, fresh=False)
    assert calls == [1, 2] and len(out["rounds"]) == 1 and out["model"] == "m1"
