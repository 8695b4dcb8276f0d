"""Throughput of the local eval/rollout policy: concurrent turns batched vs one at a time.

``deepanalyze-rl eval --model …`` and ``rollout --policy transformers`` run ``--concurrency``
episodes at once; their turns go to one ``TransformersPolicy``, which generates all waiting
turns in one left-padded ``generate`` (``max_batch`` = the concurrency). This measures one turn
for each of N episodes (the protocol system prompt and the shipped QA questions, greedy, a fixed
number of new tokens per turn) with ``max_batch=1`` (one ``generate`` per turn, the behaviour
before batching) and with ``max_batch=N``, on the embedded SmolLM2-135M-Instruct.

    python benchmarks/policy_batching.py --episodes 6 --tokens 128
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402

from deepanalyze_env.offline.policies import TransformersPolicy, TurnContext  # noqa: E402

console = Console()


def contexts(n: int) -> list[TurnContext]:
    system = (REPO / "deepanalyze_env" / "core" / "prompts" / "protocol.md").read_text()
    rows = [json.loads(x) for x in (REPO / "data" / "tasks" / "qa.jsonl").read_text().splitlines() if x]
    out = []
    for i in range(n):
        question = rows[i % len(rows)]["input_seq"]
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        out.append(TurnContext(f"bench-{i}", f"t{i}", None, 0, messages, 2))
    return out


def one_round(policy: TransformersPolicy, ctxs: list[TurnContext]) -> tuple[float, int]:
    start = time.perf_counter()
    with ThreadPoolExecutor(len(ctxs)) as pool:
        turns = list(pool.map(policy.act, ctxs))
    seconds = time.perf_counter() - start
    return seconds, sum(t.usage["completion_tokens"] for t in turns)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=6)
    p.add_argument("--tokens", type=int, default=128, help="new tokens per turn (stop strings off)")
    p.add_argument("--out", type=Path, help="write the numbers as JSON here")
    args = p.parse_args()
    policy = TransformersPolicy(max_tokens=args.tokens, device="cpu")
    # every turn generates exactly --tokens tokens, so both settings do the same work
    policy._model.generation_config.min_new_tokens = args.tokens
    ctxs = contexts(args.episodes)
    one_round(policy, ctxs[:1])  # warm-up
    results = {}
    for batch in (1, args.episodes):
        policy.max_batch = batch
        seconds, tokens = one_round(policy, ctxs)
        rate = tokens / seconds
        results[f"max_batch={batch}"] = {"seconds": round(seconds, 1), "tokens_per_s": round(rate, 1)}
        console.print(f"max_batch={batch}: {tokens} tokens in {seconds:.1f}s = {rate:.1f} tokens/s")
    a, b = (results[f"max_batch={x}"]["tokens_per_s"] for x in (1, args.episodes))
    console.print(f"speed-up: {b / a:.2f}x ({platform.machine()}, {platform.processor() or 'cpu'})")
    if args.out:
        summary = {"episodes": args.episodes, "tokens": args.tokens, **results}
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
