"""The memory a recipe's GRPO update needs, measured: one real ``GRPOTrainer`` step on synthetic
episodes of a chosen length, beside the floor measured in the same process.

Why synthetic episodes: what the update holds depends on the episodes' token counts, the group
batch and the recipe's micro-batching, not on what the tokens say; sampling episodes long enough
to probe the worst case would take the model minutes per step on a CPU and would still depend
on luck. So a rollout function hands TRL ``batch`` episodes of exactly ``prompt_tokens`` +
``completion_tokens`` random tokens with rewards that differ within every group (a non-zero
loss, the full backward), and the trainer does what it does in a real run: the recipe's
``GRPOConfig`` (micro-batch, gradient accumulation, checkpointing), its policy loading, its
optimizer. The **floor** is the same process after a forward, backward and optimizer step on a
handful of tokens: weights, gradients, optimizer state and the runtime, with no activations to
speak of. ``python -m deepanalyze_env.trainers.trl.memory_check RECIPE`` prints one JSON object;
``benchmarks/memory.py`` and the memory test run it in a fresh process each.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.core.memory import PeakWatch, own_hwm, reset_own_hwm

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from deepanalyze_env.trainers.trl.rollout_func import RolloutOutput
    from deepanalyze_env.trainers.trl.turns import RolloutTrainer

GROUP = 3  # episodes per group in the synthetic batch by default (benchmarks/memory.py's runs)


class MemoryCheck(TypedDict):
    """What one check measured (bytes): the floor, the update's and the rollout's peak, and the
    settings that produced them."""

    floor_bytes: int
    update_peak_bytes: int
    rollout_peak_bytes: int
    batch: int
    micro_batch: int
    gradient_accumulation_steps: int
    prompt_tokens: int
    completion_tokens: int
    gradient_checkpointing: bool
    attn_implementation: str
    loss: float | None
    seconds: float


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


def _measure_floor(model: PreTrainedModel) -> int:
    """Resident bytes with weights, gradients and AdamW state allocated (a step on 8 tokens)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=0.0)
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    gc.collect()
    floor = _rss()
    optimizer.zero_grad(set_to_none=True)
    del optimizer
    gc.collect()
    return floor


def run_check(
    recipe_path: str,
    overrides: list[str],
    *,
    batch: int,
    completion_tokens: int,
    prompt_tokens: int = 300,
    seed: int = 0,
    glibc_default: bool = False,
    group: int = GROUP,
) -> MemoryCheck:
    """One GRPO step of ``recipe_path`` (with ``overrides``) on ``batch`` synthetic episodes; the
    recipe's micro-batch is kept and gradient accumulation makes up the batch."""
    import trl
    from datasets import Dataset

    from deepanalyze_env.generation.models import load_tokenizer, resolve_model
    from deepanalyze_env.trainers.recipes import load_recipe
    from deepanalyze_env.trainers.trl.policy import load_trainable
    from deepanalyze_env.trainers.trl.rollout_func import environment_reward
    from deepanalyze_env.trainers.trl.train import _grpo_config

    recipe = load_recipe(recipe_path, overrides)
    micro = int(recipe.trl.get("per_device_train_batch_size", 1))
    if group < 2 or batch % micro or batch % group:
        raise ValueError(f"batch {batch}: a multiple of the micro-batch {micro} and the group {group} (≥ 2)")
    recipe.trl.update(
        num_generations=group,
        gradient_accumulation_steps=batch // micro,
        max_completion_length=completion_tokens + 1,
        seed=seed,
    )
    recipe.max_steps = 1
    out = Path(recipe.output_dir) / "memory-check"
    config = _grpo_config(recipe, out, cuda=False)
    config.save_strategy = "no"
    model_dir = resolve_model(recipe.model)
    tokenizer = load_tokenizer(recipe.model, where=recipe.source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = load_trainable(model_dir, cuda=False, return_freed=not glibc_default)
    floor = _measure_floor(model)

    rng = random.Random(seed)
    vocab = [i for i in range(len(tokenizer)) if i not in set(tokenizer.all_special_ids)]
    watch = PeakWatch(phase_name="setup")

    def rollout(prompts: list[list[JsonObject]], trainer: RolloutTrainer) -> RolloutOutput:
        watch.phase("rollout")
        n = len(prompts)
        result: RolloutOutput = {
            "prompt_ids": [[rng.choice(vocab) for _ in range(prompt_tokens)] for _ in range(n)],
            "completion_ids": [
                [rng.choice(vocab) for _ in range(completion_tokens)] + [tokenizer.eos_token_id]
                for _ in range(n)
            ],
            "logprobs": None,
            # rewards differ inside every group, so every episode has an advantage and a gradient
            "env_reward": [float(i % group) for i in range(n)],
            "reward_components": [{} for _ in range(n)],
            "reward_status": ["scored"] * n,
            "reward_error_cause": [None] * n,
            "termination": ["answer"] * n,
        }
        watch.phase("update")
        return result

    rows = [{"prompt": [{"role": "user", "content": f"task {i}"}], "task_id": str(i)} for i in range(batch)]
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[environment_reward],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        rollout_func=rollout,
    )
    gc.collect()
    start = time.monotonic()
    reset_own_hwm()
    watch.start()
    result = trainer.train()
    peaks = watch.drain()
    watch.stop()
    hwm = own_hwm() or 0
    update = peaks.get("update")
    rollout_peak = peaks.get("rollout")
    return MemoryCheck(
        floor_bytes=floor,
        update_peak_bytes=max(update["root_hwm_bytes"] or 0, update["peak_rss_bytes"]) if update else hwm,
        rollout_peak_bytes=rollout_peak["peak_rss_bytes"] if rollout_peak else 0,
        batch=batch,
        micro_batch=micro,
        gradient_accumulation_steps=batch // micro,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        gradient_checkpointing=bool(config.gradient_checkpointing),
        attn_implementation=str(model.config._attn_implementation),
        loss=float(result.training_loss) if result.training_loss is not None else None,
        seconds=round(time.monotonic() - start, 2),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.add_argument("--batch", type=int, default=9, help="episodes in the step (a multiple of --group)")
    parser.add_argument("--group", type=int, default=GROUP, help="episodes per group (trl.num_generations)")
    parser.add_argument("--completion-tokens", type=int, default=768)
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--glibc-default",
        action="store_true",
        help="keep glibc's allocator defaults (freed buffers stay resident)",
    )
    args = parser.parse_args(argv)
    check = run_check(
        args.recipe,
        args.overrides,
        batch=args.batch,
        completion_tokens=args.completion_tokens,
        prompt_tokens=args.prompt_tokens,
        seed=args.seed,
        glibc_default=args.glibc_default,
        group=args.group,
    )
    print(json.dumps(check))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
