"""One rank of the two-process lockstep test (``test_lockstep.py`` starts two of these).

Each rank runs its own episodes through TRL's real server-mode ``VLLMGeneration`` (gather to
rank 0, one request, broadcast, per-rank slice); only the vLLM server is scripted (vLLM needs a
GPU). The episodes are uneven on purpose: rank 0 has one episode that answers at once, rank 1 has
two that run two and one code turns first, so the ranks need different numbers of turns.
Usage: ``python -m tests.trl.lockstep_worker OUT_DIR`` with RANK, WORLD_SIZE, MASTER_ADDR/PORT set.
"""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import timedelta
from pathlib import Path

from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

from deepanalyze_env.trainers.trl.rollout_func import DeepAnalyzeRollout, trl_prompt
from tests.conftest import build_tiny_tokenizer, qa_extras
from tests.trl.vllm_stub import ScriptedServer, StubServerGeneration, stub_trainer

CODE_TURNS = {"r0e0": 0, "r1e0": 2, "r1e1": 1}  # code turns before the answer, per episode marker
MINE = {0: ["r0e0"], 1: ["r1e0", "r1e1"]}


def main(out_dir: str) -> None:
    accelerator = Accelerator(
        cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=120))]
    )
    rank = accelerator.process_index
    tok = build_tiny_tokenizer()

    def reply(prompt: list[int]):
        text = tok.decode(prompt)
        marker = re.search(r"\[(r\de\d)\]", text).group(1)
        done = text.count("</Execute>")
        if done < CODE_TURNS[marker]:
            turn = f"<Analyze>{marker}</Analyze>\n<Code>\n```python\nprint({done} + 40)\n```\n</Code>"
        else:
            turn = f"<Analyze>{marker}</Analyze>\n<Answer>\nAnswer: B\n</Answer>"
        ids = tok.encode(turn, add_special_tokens=False)
        return ids, [-0.5] * len(ids)

    server = ScriptedServer(reply) if rank == 0 else None
    generation = StubServerGeneration(
        server, model=None, accelerator=accelerator, processing_class=tok, max_completion_length=1024
    )
    root = Path(out_dir) / "root"
    (root / "data" / "ws").mkdir(parents=True, exist_ok=True)
    (root / "data" / "ws" / "sales.csv").write_text("store,revenue\nA,10\nB,32\n")
    rows = [
        {"prompt": [{"role": "user", "content": f"Which store? [{m}]"}], "task_id": m, **qa_extras()}
        for m in MINE[rank]
    ]
    rollout = DeepAnalyzeRollout(rows, {"workspace_root": str(root)}, max_turn_tokens=200)
    trainer = stub_trainer(tok, accelerator, generation, 1024)
    out = rollout([trl_prompt(r) for r in rows], trainer)
    result = {
        "markers": MINE[rank],
        "texts": [tok.decode(ids) for ids in out["completion_ids"]],
        "termination": out["termination"],
        "env_reward": out["env_reward"],
        "requests": server.requests if server else None,
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    main(sys.argv[1])
