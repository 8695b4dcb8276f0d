"""SkyRL tests: the real generator, trainer methods, registries and Ray, on CPU.

The one stand-in is ``ScriptedEngine``: vLLM needs a GPU, so the inference engine is replaced by
an object implementing SkyRL's ``InferenceEngineInterface`` that "generates" scripted turns
(tokenized with the real tokenizer). Everything it feeds — SkyRL's ``SkyRLGymGenerator``, the
skyrl_gym registry, our env with real kernels and workspaces, the judge over real HTTP — is real.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from skyrl.backends.skyrl_train.inference_servers.base import InferenceEngineInterface

from deepanalyze_env.core.tasks import env_extras, load_rows
from deepanalyze_env.trainers.skyrl.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"


def shipped_rows() -> dict[str, dict[str, Any]]:
    paths = sorted((DATA / "tasks").glob("*.jsonl"))
    return {row["task_id"]: row for row in load_rows(paths, str(DATA))}


def trajectories(label: str = "good") -> dict[str, list[str]]:
    out = {}
    for line in (DATA / "trajectories.jsonl").read_text().splitlines():
        if line.strip():
            t = json.loads(line)
            if t["label"] == label:
                out[t["task_id"]] = t["turns"]
    return out


class ScriptedEngine(InferenceEngineInterface):
    """Stands in for vLLM (no GPU here). ``plans`` maps a marker string found in the prompt to
    the turns to emit — or to ``{repetition: turns}`` to give each sample of a prompt its own
    trajectory (the repetition is read from SkyRL's session id). The k-th call of an episode
    emits turn k (k = ``</Execute>`` blocks in the context so far), as a policy continuing its
    own trajectory would."""

    def __init__(self, tokenizer, plans: dict[str, list[str]], stop_reason: str = "stop"):
        self.tok = tokenizer
        self.plans = plans
        self.stop_reason = stop_reason
        self.calls: list[dict[str, Any]] = []
        self.finished: list[str] = []

    @property
    def model_name(self) -> str:
        return "scripted"

    async def generate(self, input_batch, model=None):
        responses, ids_out, logprobs = [], [], []
        sessions = input_batch.get("session_ids") or [None] * len(input_batch["prompt_token_ids"])
        for ids, session in zip(input_batch["prompt_token_ids"], sessions, strict=True):
            context = self.tok.decode(ids)
            marker = next((m for m in self.plans if m in context), None)
            assert marker is not None, "no plan matches this prompt"
            plan = self.plans[marker]
            if isinstance(plan, dict):  # per sample: SkyRL's session id is "<uid>_<repetition>"
                plan = plan[int(str(session).rsplit("_", 1)[1])]
            turn = plan[min(context.count("</Execute>"), len(plan) - 1)]
            ids = self.tok.encode(turn, add_special_tokens=False)
            self.calls.append({"marker": marker, "n_ids": len(ids)})
            responses.append(self.tok.decode(ids))
            ids_out.append(ids)
            logprobs.append([-0.25] * len(ids))
        n = len(responses)
        return {
            "responses": responses,
            "response_ids": ids_out,
            "stop_reasons": [self.stop_reason] * n,
            "response_logprobs": logprobs,
        }

    async def finish_session(self, session_id: str) -> None:
        self.finished.append(session_id)

    def _unused(self, *args, **kwargs):
        raise NotImplementedError("not used by the generator in these tests")

    chat_completion = completion = get_endpoint_url = get_world_size = load_lora_adapter = _unused
    pause_generation = render_chat_completion = reset_prefix_cache = resume_generation = _unused
    sleep = teardown = update_named_weights = wake_up = _unused


def make_cfg(*overrides: str, workspace_root: Path = DATA):
    return parse_config(
        [
            "trainer.policy.model.path=/unused",
            f"environment.skyrl_gym.deepanalyze.workspace_root={workspace_root}",
            "environment.skyrl_gym.deepanalyze.executor.timeout_s=10",
            "environment.skyrl_gym.max_env_workers=4",
            "generator.max_input_length=200000",
            "generator.sampling_params.max_generate_length=4096",
            *overrides,
        ]
    )


def make_generator(cfg, tokenizer, engine):
    from skyrl.train.generators.skyrl_gym_generator import SkyRLGymGenerator

    return SkyRLGymGenerator(
        generator_cfg=cfg.generator,
        skyrl_gym_cfg=cfg.environment.skyrl_gym,
        inference_engine_client=engine,
        tokenizer=tokenizer,
    )


def generator_input(rows: list[dict[str, Any]], n_samples: int, cfg) -> dict[str, Any]:
    """What SkyRL's trainer builds from a dataset batch (``prepare_generator_input``)."""
    from dataclasses import asdict

    from skyrl.train.generators.utils import prepare_generator_input

    prompts = [
        {"prompt": r["prompt"], "env_class": "deepanalyze", "env_extras": env_extras(r), "uid": str(i)}
        for i, r in enumerate(rows)
    ]
    gen_input, uids = prepare_generator_input(
        prompts, n_samples, asdict(cfg.generator.sampling_params), "deepanalyze", "train", 0
    )
    return gen_input, uids


@pytest.fixture
def rows():
    return shipped_rows()
