"""The budget check before GRPO: episodes rendered as the rollout builds them, measured against
``max_turn_tokens`` and ``max_completion_length``; counts checked against lengths computed with
plain tokenizer calls on the real SmolLM2 tokenizer (the tags are ordinary text there)."""

from __future__ import annotations

import json

import pytest

from deepanalyze_env.trainers.trl.budgets import measure_budgets, turn_lengths

SHORT = "<Analyze>a</Analyze><Answer>B</Answer>"
CODE = "<Analyze>look</Analyze><Code>\n```python\nprint(df.describe())\n```\n</Code>"
OBS = "\n<Execute>\n" + "count 10\nmean 4.5\n" * 20 + "</Execute>\n"


def record(turns: list[str], obs: list[str], capped: bool = False, episode_id: str = "e") -> dict:
    messages = [{"role": "user", "content": "Which store?"}]
    for i, turn in enumerate(turns):
        messages.append({"role": "assistant", "content": turn})
        if i < len(obs):
            messages.append({"role": "user", "content": obs[i]})
    exec_ = [{"status": "ok", "elapsed_ms": 1.0, "truncated": capped} for _ in obs]
    return {
        "episode_id": episode_id,
        "messages": messages,
        "turns": len(turns),
        "termination": "answer",
        "exec": exec_,
    }


def n(tok, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False))


def test_turn_lengths_are_the_runs_of_policy_tokens():
    assert turn_lengths([1, 1, 0, 0, 1, 0, 1, 1, 1]) == [2, 1, 3]
    assert turn_lengths([0, 0]) == []


def test_what_the_budgets_cut_is_counted_per_episode(smollm2_tokenizer):
    tok = smollm2_tokenizer
    short = record([SHORT], [])
    long_ = record([CODE, SHORT], [OBS], capped=True)
    completion_long = n(tok, CODE) + n(tok, OBS) + n(tok, SHORT) + 1  # + the closing EOS
    completion_short = n(tok, SHORT) + 1
    # a budget between the two: only the long episode is cut; a turn cap below CODE's length
    fit = measure_budgets(
        tok, [short, long_], max_completion_length=completion_long - 1, max_turn_tokens=n(tok, CODE) - 1
    )
    assert fit.episodes == 2 and fit.episode_cut == 1 and fit.turn_cut == 1 and fit.cut == 1
    assert fit.cut_fraction == 0.5
    assert fit.completion_tokens["max"] == completion_long
    assert fit.completion_tokens["p50"] in (completion_short, completion_long)
    assert fit.turn_tokens["max"] == n(tok, CODE)
    assert (fit.cells, fit.output_capped) == (1, 1)
    # budgets that hold both: nothing is cut
    roomy = measure_budgets(tok, [short, long_], max_completion_length=completion_long, max_turn_tokens=None)
    assert roomy.cut == 0 and roomy.turn_cut == 0
    assert json.loads(json.dumps(roomy.as_dict()))["cut_fraction"] == 0.0


def test_the_lines_say_what_will_be_cut(smollm2_tokenizer):
    fit = measure_budgets(smollm2_tokenizer, [record([CODE, SHORT], [OBS])], max_completion_length=16)
    text = "\n".join(fit.lines())
    assert "1 (100%) would be cut" in text and "max_completion_length 16: 1 over" in text


def test_a_recipe_budget_check_is_reported_by_train_check(tmp_path, smollm2_dir, workspace_root, capsys):
    from deepanalyze_env.cli import main

    records = tmp_path / "episodes.jsonl"
    records.write_text(
        json.dumps(record([CODE, SHORT], [OBS], episode_id="e1"))
        + "\n"
        + json.dumps(record([SHORT], [], episode_id="e2"))
        + "\n"
    )
    from tests.trl.test_train_command import _tasks

    tasks = _tasks(tmp_path, [{"method": "qa_plain", "ground_truth": "B"}])
    import yaml

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "backend": "trl",
                "output_dir": str(tmp_path / "run"),
                "max_steps": 1,
                "model": smollm2_dir,
                "data": [str(tasks)],
                "env": {"workspace_root": str(workspace_root)},
                "rollout": {"max_turn_tokens": 40, "budget_check": str(records)},
                "trl": {"max_completion_length": 64, "num_generations": 2, "per_device_train_batch_size": 2},
            }
        )
    )
    assert main(["train", "--check", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert "budget check over 2 episodes: 1 (50%) would be cut" in out
    assert not (tmp_path / "run").exists()  # --check touches nothing


def test_a_missing_budget_check_source_is_one_line(tmp_path, smollm2_dir, workspace_root, capsys):
    from deepanalyze_env.trainers.recipes import load_recipe
    from deepanalyze_env.trainers.trl.train import budget_check

    recipe_path = tmp_path / "r.yaml"
    recipe_path.write_text(
        "backend: trl\noutput_dir: o\nmodel: m\ndata: [t]\nrollout: {budget_check: "
        + str(tmp_path / "nope")
        + "}\n"
    )
    recipe = load_recipe(recipe_path)
    with pytest.raises(ValueError, match=r"rollout\.budget_check"):
        budget_check(recipe, None, 64)
