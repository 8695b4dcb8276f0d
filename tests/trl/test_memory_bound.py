"""The memory rule of the GRPO update (docs/design.md §12, "Memory"): one real GRPO step of the
main job's GRPO settings on episodes as long as its budget allows holds at most twice the floor
(weights, gradients, optimizer state and runtime), both measured in the same fresh process.

The step is one group (the recipe's trl.num_generations episodes, each a micro-batch of the
recipe's 1) rather than the main job's four groups: with micro-batching the peak does not depend
on how many micro-batches a step accumulates (benchmarks/RESULTS.md: 256 tokens, batch 3 and 9
both 1.03 × the floor), and one group keeps the test near half a minute. A recipe whose
micro-batch grew past a group is refused by the check (the batch must be a multiple of it), so
this test fails on it too.

Under the settings main had before issue 37 (the whole batch in one forward and backward, no
checkpointing) the same step held several times the floor — the main job was OOM-killed at
23.6 GB — so this bound fails on them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _main_job_grpo() -> tuple[list[str], int, int]:
    """The pipeline's GRPO overrides (but its steps and accumulation), its completion budget and
    its group size (the step is one group: trl.num_generations episodes)."""
    grpo = yaml.safe_load((REPO / "recipes" / "learn_cpu.yaml").read_text())["grpo"]["set"]
    skip = ("max_steps", "trl.gradient_accumulation_steps")  # the check sets accumulation from --batch
    overrides = [f"{k}={v}" for k, v in grpo.items() if k not in skip]
    return overrides, int(grpo["trl.max_completion_length"]), int(grpo["trl.num_generations"])


@pytest.mark.usefixtures("smollm2_dir")
def test_one_grpo_step_at_the_main_jobs_longest_episodes_stays_within_twice_its_floor(tmp_path):
    overrides, budget, group = _main_job_grpo()
    cmd = [
        sys.executable,
        "-m",
        "deepanalyze_env.trainers.trl.memory_check",
        "recipes/trl_cpu_smoke.yaml",
        *overrides,
        f"output_dir={tmp_path}",
        "--batch",
        str(group),
        "--group",
        str(group),
        "--completion-tokens",
        str(budget - 1),  # the longest completion the budget allows (one token kept for EOS)
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = json.loads(proc.stdout.strip().splitlines()[-1])
    assert check["batch"] == group and check["completion_tokens"] == budget - 1
    assert check["loss"] is not None  # the step trained
    floor, peak = check["floor_bytes"], check["update_peak_bytes"]
    assert peak > floor  # the update was measured (it allocates activations on top of the floor)
    assert peak <= 2 * floor, (
        f"the update's peak {peak / 2**30:.2f} GiB is over twice its floor {floor / 2**30:.2f} GiB: "
        "its memory grows with the batch or the episode length again"
    )
