"""TRL's real vLLM generation code with a stand-in for vLLM itself (vLLM needs a GPU; none here).

``StubServerGeneration`` is TRL's own ``VLLMGeneration`` in server mode — its gather, broadcast and
per-rank slicing run as written — with only the HTTP client to the vLLM server replaced by
:class:`ScriptedServer`, which answers every prompt through a Python function the way the server's
``/v1/completions`` would (``max_tokens`` honoured, one logprob per token). ``stub_trainer`` is the
slice of a ``GRPOTrainer`` the rollout reads on the vLLM path: no private TRL method, so a rollout
that called one would fail here.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from trl.generation.vllm_generation import VLLMGeneration


class ScriptedServer:
    """Answers ``generate`` like TRL's ``VLLMClient``; ``reply(prompt_ids) -> (ids, logprobs)``."""

    def __init__(self, reply: Callable[[list[int]], tuple[list[int], list[float | None]]]):
        self.reply = reply
        self.requests: list[dict[str, Any]] = []

    def generate(self, prompts, features=None, **sampling):
        self.requests.append({"n_prompts": len(prompts), **sampling})
        completions, logprobs = [], []
        for prompt in prompts:
            for _ in range(sampling["n"]):
                ids, lps = self.reply(list(prompt))
                completions.append(ids[: sampling["max_tokens"]])
                logprobs.append([[lp] for lp in lps[: sampling["max_tokens"]]])
        return {
            "prompt_ids": [list(p) for p in prompts],
            "completion_ids": completions,
            "logprobs": logprobs,
            "logprob_token_ids": [[[t] for t in ids] for ids in completions],
        }


class StubServerGeneration(VLLMGeneration):
    """TRL's VLLMGeneration in server mode; ``_init_vllm`` connects to the scripted server instead."""

    def __init__(self, server: ScriptedServer | None, **kwargs):
        self._server = server
        super().__init__(mode="server", **kwargs)

    def _init_vllm(self):
        self.vllm_client = self._server if self.accelerator.is_main_process else None


def stub_trainer(tok, accelerator, generation: VLLMGeneration, max_completion_length: int) -> SimpleNamespace:
    trainer = SimpleNamespace(
        processing_class=tok,
        args=SimpleNamespace(max_completion_length=max_completion_length, report_to=[]),
        eos_token_ids=[tok.eos_token_id],
        use_vllm=True,
        vllm_generation=generation,
        accelerator=accelerator,
    )
    return trainer


class ScriptedEngine:
    """Answers ``LLM.generate`` like vLLM's offline engine; ``params`` is what TRL passed as
    ``SamplingParams`` (see :func:`record_sampling_params`)."""

    def __init__(self, reply: Callable[[list[int]], tuple[list[int], list[float | None]]]):
        self.reply = reply
        self.requests: list[dict[str, Any]] = []

    def generate(self, prompts, sampling_params, use_tqdm=False):
        params = dict(vars(sampling_params))
        self.requests.append({"n_prompts": len(prompts), **params})
        outputs = []
        for prompt in prompts:
            ids, lps = self.reply(list(prompt["prompt_token_ids"]))
            ids, lps = ids[: params["max_tokens"]], lps[: params["max_tokens"]]
            logprobs = [
                {t: SimpleNamespace(rank=1, logprob=float("nan") if lp is None else lp)}
                for t, lp in zip(ids, lps, strict=True)
            ]
            seq = SimpleNamespace(token_ids=ids, logprobs=logprobs)
            outputs.append(SimpleNamespace(prompt_token_ids=prompt["prompt_token_ids"], outputs=[seq]))
        return outputs


class StubColocateGeneration(VLLMGeneration):
    """TRL's VLLMGeneration in colocate mode; ``_init_vllm`` builds the scripted engine instead."""

    def __init__(self, engine: ScriptedEngine, **kwargs):
        self._engine = engine
        super().__init__(mode="colocate", **kwargs)

    def _init_vllm(self):
        self.llm = self._engine


def record_sampling_params(monkeypatch) -> None:
    """vLLM's ``SamplingParams`` is not importable here: TRL's colocate path gets a plain record."""
    import trl.generation.vllm_generation as module

    monkeypatch.setattr(module, "SamplingParams", lambda **kw: SimpleNamespace(**kw), raising=False)
