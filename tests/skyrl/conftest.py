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

    def __init__(self, tokenizer, plans: dict, stop_reason: str = "stop", turn_marker: str = "</Execute>"):
        self.tok = tokenizer
        self.plans = plans
        self.stop_reason = stop_reason
        self.turn_marker = turn_marker  # one per observation in the context (tools: "</tool_response>")
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
            turn = plan[min(context.count(self.turn_marker), len(plan) - 1)]
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


class VllmLikeEngine(ScriptedEngine):
    """A ``ScriptedEngine`` that stops the way vLLM does, for tests about stopping (no GPU here).

    Each scripted turn is what the model *would* write if nothing stopped it. The turn is
    "sampled" token by token with the sampling params SkyRL sends to vLLM
    (``get_sampling_params_for_backend``): it ends on a token in ``stop_token_ids`` or EOS
    (that token is kept in the ids), as soon as the text decoded with ``skip_special_tokens``
    contains a stop string (every id sampled so far is kept — the last one may carry text past
    the string), or at ``max_tokens`` (stop reason ``length``). The returned text is the ids
    decoded with ``batch_decode``, which is what SkyRL 0.4's client does with vLLM's ids.
    ``sampled`` keeps the ids of every call.
    """

    def __init__(self, tokenizer, plans, turn_marker: str = "</Execute>"):
        super().__init__(tokenizer, plans, turn_marker=turn_marker)
        self.sampled: list[list[int]] = []
        self.stop_reasons: list[str] = []

    async def generate(self, input_batch, model=None):
        params = input_batch.get("sampling_params") or {}
        stop = list(params.get("stop") or [])
        stop_ids = set(params.get("stop_token_ids") or []) | {self.tok.eos_token_id}
        skip = params.get("skip_special_tokens", True)
        limit = params.get("max_tokens") or 10**9
        responses, ids_out, logprobs, reasons = [], [], [], []
        for prompt_ids in input_batch["prompt_token_ids"]:
            context = self.tok.decode(prompt_ids)
            marker = next((m for m in self.plans if m in context), None)
            assert marker is not None, "no plan matches this prompt"
            plan = self.plans[marker]
            turn = plan[min(context.count(self.turn_marker), len(plan) - 1)]
            wanted = [*self.tok.encode(turn, add_special_tokens=False), self.tok.eos_token_id]
            out, reason = [], "length"
            for token in wanted:
                out.append(token)
                if token in stop_ids:
                    reason = "stop"
                    break
                if stop and any(s in self.tok.decode(out, skip_special_tokens=skip) for s in stop):
                    reason = "stop"
                    break
                if len(out) >= limit:
                    break
            self.sampled.append(list(out))
            self.stop_reasons.append(reason)
            self.calls.append({"marker": marker, "n_ids": len(out)})
            responses.append(self.tok.batch_decode([out])[0])
            ids_out.append(list(out))
            logprobs.append([-0.25] * len(out))
            reasons.append(reason)
        return {
            "responses": responses,
            "response_ids": ids_out,
            "stop_reasons": reasons,
            "response_logprobs": logprobs if params.get("logprobs") is not None else None,
        }


def vllm_params(params) -> dict[str, Any]:
    """The sampling params SkyRL's trainer sends to vLLM for these config params."""
    from skyrl.backends.skyrl_train.inference_servers.engine_utils import get_sampling_params_for_backend

    return get_sampling_params_for_backend("vllm", params)


# Qwen2's pre-tokenisation rule: a run of punctuation takes the newlines after it, so BPE can merge
# ">" with "\n" (as Qwen and Llama-3 tokenizers do) and the token that completes "</Code>" is ">\n".
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)


def build_qwen_like_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tests.conftest import CHAT_TEMPLATE, CORPUS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|pad|>", "<|end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|end|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


TAGS = ["<Analyze>", "</Analyze>", "<Code>", "</Code>", "<Answer>", "</Answer>", "<Execute>", "</Execute>"]


def with_special_tags(tokenizer, tags=TAGS):
    """The tokenizer with the tags added as special tokens (as in DeepAnalyze's extended vocab)."""
    from tokenizers import AddedToken

    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in tags], special_tokens=True)
    return tokenizer


@pytest.fixture(scope="session")
def qwen_like_tokenizer():
    return build_qwen_like_tokenizer()


@pytest.fixture
def judge_free_data(tmp_path) -> list[str]:
    """Overrides for a training file whose rows are all usable: the shipped datatask tasks as
    dataset rows, scored by their code alone (no judge), and the shipped workspaces."""
    rows = [r for r in shipped_rows().values() if r["reward_spec"]["method"] == "datatask"]
    for r in rows:
        r["reward_spec"] = {"method": "datatask"}
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [f"data.train_data=['{path}']", f"environment.skyrl_gym.deepanalyze.workspace_root={DATA}"]


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
    """What SkyRL's trainer builds from a dataset batch (``prepare_generator_input``, with the
    sampling params it sends to vLLM)."""
    from skyrl.train.generators.utils import prepare_generator_input

    prompts = [
        {"prompt": r["prompt"], "env_class": "deepanalyze", "env_extras": env_extras(r), "uid": str(i)}
        for i, r in enumerate(rows)
    ]
    gen_input, uids = prepare_generator_input(
        prompts, n_samples, vllm_params(cfg.generator.sampling_params), "deepanalyze", "train", 0
    )
    return gen_input, uids


@pytest.fixture
def rows():
    return shipped_rows()


def run_vllm_episode(cfg, tok, plan: list[str], turn_marker: str = "</Execute>", task_id: str = "t-stop"):
    """One episode of the "Which store?" task through SkyRL's generator, the turns of ``plan``
    sampled with vLLM's stopping rules (:class:`VllmLikeEngine`): (SkyRL's output, the engine)."""
    from tests.conftest import qa_extras

    row = {"prompt": [{"role": "user", "content": "Which store?"}], "task_id": task_id, **qa_extras()}
    engine = VllmLikeEngine(tok, {"Which store?": plan}, turn_marker=turn_marker)
    return run_agent_loop(cfg, tok, engine, row, sampling_params=vllm_params(cfg.generator.sampling_params))


def run_agent_loop(cfg, tok, engine, row, **extra):
    """One episode of ``row`` through SkyRL's generator (``agent_loop``) over ``engine``, with the
    config's token limits: (SkyRL's output, the engine)."""
    import asyncio

    gen = make_generator(cfg, tok, engine)
    out = asyncio.run(
        gen.agent_loop(
            row["prompt"],
            "deepanalyze",
            env_extras(row),
            max_tokens=cfg.generator.sampling_params.max_generate_length,
            max_input_length=cfg.generator.max_input_length,
            **extra,
        )
    )
    return out, engine
