"""Peak memory of a GRPO step and of a generation round on the embedded SmolLM2-135M, against
episode length and batch, beside the floor measured in the same run (issue 37).

Every measurement runs in a fresh process (a peak is a process's high-water mark; one process per
point keeps points independent):

- **GRPO step**: ``python -m deepanalyze_env.trainers.trl.memory_check`` — one real
  ``GRPOTrainer`` step of ``recipes/trl_cpu_smoke.yaml`` with the main job's GRPO settings
  (``recipes/learn_cpu.yaml``'s ``grpo.set``) on ``batch`` synthetic episodes of a 300-token prompt
  and ``length`` completion tokens, groups of 3 with rewards that differ (a full backward). It
  reports the floor (weights + gradients + AdamW state + runtime, after a step on 8 tokens) and the
  update's peak (the process's exact high-water mark during the update).
- **"before"**: the same step with the settings main had when the main job ran out of memory
  (micro-batch = the whole batch, no gradient checkpointing, glibc's default allocator behaviour),
  run in a memory cgroup capped at ``--before-cap-gib`` so a point that would exhaust the machine
  is recorded as "> cap" instead of taking the host down (needs root and cgroup v1; skipped
  otherwise).
- **generation round**: the KV-cache engine (``generation/engine.py``) generating ``batch`` rows of
  ``length`` tokens from 300-token prompts in one call (EOS and stop tags off, so every row runs
  to its cap), its peak resident set beside the model's.

Target (issue 37): the update's peak within 2x the floor plus one micro-batch's activations, and
flat (not quadratic) in the batch.

    python benchmarks/memory.py --out /tmp/memory.json            # the whole grid
    python benchmarks/memory.py --lengths 256 --batches 3 --no-before  # one point, without "before"
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
GIB = 1024**3
PROMPT = 300


def main_job_grpo_overrides() -> list[str]:
    """The main job's GRPO settings (``recipes/learn_cpu.yaml``), less what the check sets."""
    pipe = yaml.safe_load((REPO / "recipes" / "learn_cpu.yaml").read_text())
    skip = {
        "max_steps",
        "trl.max_completion_length",
        "trl.num_generations",
        "trl.gradient_accumulation_steps",
    }
    return [f"{k}={v}" for k, v in pipe["grpo"]["set"].items() if k not in skip]


def grpo_point(length: int, batch: int, before: bool, cap_gib: float) -> dict:
    overrides = main_job_grpo_overrides()
    if before:
        overrides += [f"trl.per_device_train_batch_size={batch}", "trl.gradient_checkpointing=false"]
    cmd = [sys.executable, "-m", "deepanalyze_env.trainers.trl.memory_check", "recipes/trl_cpu_smoke.yaml"]
    cmd += [*overrides, "--batch", str(batch), "--completion-tokens", str(length)]
    cmd += ["--prompt-tokens", str(PROMPT), *(["--glibc-default"] if before else [])]
    return _run(cmd, cap_gib if before else None)


def generation_point(length: int, batch: int) -> dict:
    cmd = [sys.executable, __file__, "--generation-point", str(length), str(batch)]
    return _run(cmd, None)


def _run(cmd: list[str], cap_gib: float | None) -> dict:
    group = _cgroup(cap_gib) if cap_gib else None
    start = time.monotonic()

    def enter() -> None:
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, preexec_fn=enter)
    seconds = round(time.monotonic() - start, 1)
    if group is not None:
        group.rmdir()
    if proc.returncode == -9 and cap_gib:
        return {"over_cap_gib": cap_gib, "seconds": seconds}
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()
        return {"error": tail[-1] if tail else f"exit {proc.returncode}"}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_seconds": seconds}


def _cgroup(cap_gib: float) -> Path | None:
    root = Path("/sys/fs/cgroup/memory")
    if os.geteuid() != 0 or not (root / "memory.limit_in_bytes").exists():
        return None
    group = root / f"deepanalyze-bench-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(int(cap_gib * GIB)))
    return group


def generation_measure(length: int, batch: int) -> dict:
    """In this (fresh) process: the engine generating ``batch`` rows of ``length`` tokens."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from deepanalyze_env.core.memory import own_hwm, reset_own_hwm, return_freed_buffers
    from deepanalyze_env.generation.engine import GenerationEngine, GenRequest
    from deepanalyze_env.generation.models import resolve_model

    return_freed_buffers()
    path = resolve_model("embedded:smollm2")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    engine = GenerationEngine(tok, eos_ids=[], stop_tags=False, temperature=1.0)
    rng = random.Random(0)
    vocab = [i for i in range(len(tok)) if i not in set(tok.all_special_ids)]
    requests = [
        GenRequest([rng.choice(vocab) for _ in range(PROMPT)], max_new=length, seed=i) for i in range(batch)
    ]
    import gc

    gc.collect()
    model_rss = own_hwm() or 0
    reset_own_hwm()
    start = time.monotonic()
    with torch.no_grad():
        out = engine.generate(model, requests)
    assert all(len(r.ids) == length for r in out), "a row stopped before its cap"
    return {
        "model_rss_bytes": model_rss,
        "peak_bytes": own_hwm() or 0,
        "cached_episodes": engine.cached_episodes,
        "batch": batch,
        "length": length,
        "seconds": round(time.monotonic() - start, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 768, 1536])
    parser.add_argument("--batches", type=int, nargs="+", default=[3, 9, 24])
    parser.add_argument("--before-cap-gib", type=float, default=16.0)
    parser.add_argument("--no-before", action="store_true", help="skip the 'before' settings")
    parser.add_argument("--no-generation", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("/tmp/memory_benchmark.json"))
    parser.add_argument(
        "--generation-point", type=int, nargs=2, metavar=("LENGTH", "BATCH"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.generation_point:
        print(json.dumps(generation_measure(*args.generation_point)))
        return 0
    results: dict = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        "prompt_tokens": PROMPT,
        "grpo_overrides": main_job_grpo_overrides(),
        "points": [],
    }
    for length in args.lengths:
        for batch in args.batches:
            point: dict = {"length": length, "batch": batch, "grpo": grpo_point(length, batch, False, 0)}
            if not args.no_before:
                point["grpo_before"] = grpo_point(length, batch, True, args.before_cap_gib)
            if not args.no_generation:
                point["generation"] = generation_point(length, batch)
            results["points"].append(point)
            print(json.dumps(point), flush=True)
            args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))
    return 0


def _g(n: int | None) -> str:
    return "?" if not n else f"{n / GIB:.2f}"


def table(results: dict) -> str:
    """The grid as a markdown table (GiB)."""
    lines = [
        "| length | batch | floor | update peak | peak / floor | step s | before: update peak "
        "| generation peak (model) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in results["points"]:
        g = p["grpo"]
        before = p.get("grpo_before") or {}
        if "over_cap_gib" in before:
            before_text = f"> {before['over_cap_gib']:g} (killed at the cap)"
        else:
            before_text = _g(before.get("update_peak_bytes")) if before else "-"
        gen = p.get("generation") or {}
        gen_text = f"{_g(gen.get('peak_bytes'))} ({_g(gen.get('model_rss_bytes'))})" if gen else "-"
        ratio = (
            f"{g['update_peak_bytes'] / g['floor_bytes']:.2f}"
            if g.get("floor_bytes") and g.get("update_peak_bytes")
            else g.get("error", "?")
        )
        lines.append(
            f"| {p['length']} | {p['batch']} | {_g(g.get('floor_bytes'))} "
            f"| {_g(g.get('update_peak_bytes'))} | "
            f"{ratio} | {g.get('seconds', '?')} | {before_text} | {gen_text} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
