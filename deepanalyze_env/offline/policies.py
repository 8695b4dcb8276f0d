"""Policies that drive episodes outside a trainer (``deepanalyze-rl rollout``).

A policy maps the conversation so far to the next assistant turn. Three kinds:

- ``scripted`` replays the reference trajectories shipped with the tasks (smoke tests, demos,
  benchmarks — no model);
- ``openai`` is a teacher behind any OpenAI-compatible endpoint (vLLM, SGLang, OpenAI), one
  assistant turn per call, stopped at ``</Code>``/``</Answer>``; servers do not return the
  stop string, so it is put back, and token usage is reported for the record;
- ``transformers`` runs a local model (default: the embedded SmolLM2) with the same stop strings.

Every turn says how it ended (:attr:`PolicyTurn.end`, the driver's ``TurnEnd``,
``core/driver.py``), mapped onto the ends the TRL rollout reads from tokens, so an evaluated
episode is the game GRPO trains: a turn that reached a stop string is ``stop``; one whose
message ended without one (a teacher's ``finish_reason: "stop"`` with no stop string matched,
an EOS, a scripted turn without a closing tag) is ``eos`` and ends the episode; one cut by
``max_tokens`` is ``length``.

Policies are called from several threads at once (``--concurrency``); each keeps its own
thread-safety (the HTTP client is thread-safe; a local model batches the waiting turns into one
round of the KV-cache engine, ``generation/engine.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from deepanalyze_env.core.config import ConfigError
from deepanalyze_env.core.driver import TurnEnd
from deepanalyze_env.core.formats import get_format
from deepanalyze_env.core.tasks import read_jsonl
from deepanalyze_env.generation.turn_end import split_turn, text_turn_end, turn_stops

log = logging.getLogger(__name__)

LAYOUTS = ("chat", "continue")
TAGS = get_format("tags")  # the teacher's format: its stop strings are the tags


@dataclass
class TurnContext:
    """What a policy may look at for one turn."""

    episode_id: str
    task_id: str
    label: str | None
    turn: int
    messages: list[dict[str, str]]  # the prompt, then assistant turns and observations so far
    prompt_len: int  # how many leading messages are the prompt

    @property
    def seed(self) -> int:
        """Per (episode, turn): a resumed run samples exactly what an uninterrupted one would."""
        digest = hashlib.sha256(f"{self.episode_id}/{self.turn}".encode()).digest()
        return int.from_bytes(digest[:4], "little")


@dataclass
class PolicyTurn:
    """One generated turn: its text, token usage when the backend reports it, why the backend says
    it stopped, and how the turn ended as the episode driver reads it (None: the policy did not
    say; the rollout reads it from the text, ``generation.turn_end.text_turn_end``)."""

    text: str
    usage: dict[str, int] | None = None  # {"prompt_tokens", "completion_tokens"} when known
    finish_reason: str | None = None
    end: TurnEnd | None = None


class PolicyError(RuntimeError):
    """The policy could not produce a turn (endpoint down, model failure): the episode is dropped,
    not recorded, so a teacher outage never becomes training data; ``--resume`` retries it."""


class Policy(Protocol):
    """What ``rollout`` and ``eval`` need from a policy: a name, an id for the records, and one turn per
    call."""

    name: str
    policy_id: str

    def act(self, ctx: TurnContext) -> PolicyTurn: ...


def continue_layout(messages: list[dict[str, str]], prompt_len: int) -> list[dict[str, str]]:
    """DeepAnalyze's token layout: the episode so far as one assistant message to be continued."""
    head = [dict(m) for m in messages[:prompt_len]]
    body = "".join(m["content"] for m in messages[prompt_len:])
    return [*head, {"role": "assistant", "content": body}] if body else head


# ---------------------------------------------------------------------------- scripted


@dataclass
class ScriptedPolicy:
    """Replays ``trajectories.jsonl`` lines ``{"task_id", "label", "turns": [...]}``."""

    scripts: dict[tuple[str, str], list[str]]
    name: str = "scripted"
    policy_id: str = "scripted"
    action_format: str = "tags"  # tools: each tag turn is replayed as the same cell or answer, as a tool call

    @classmethod
    def from_files(cls, paths: Iterable[str | Path]) -> ScriptedPolicy:
        scripts: dict[tuple[str, str], list[str]] = {}
        for path in paths:
            for line in read_jsonl(path):
                scripts[(line["task_id"], line.get("label", "good"))] = list(line["turns"])
        if not scripts:
            raise ConfigError("no scripted trajectories found")
        return cls(scripts)

    def labels_for(self, task_id: str) -> list[str]:
        return sorted(label for (tid, label) in self.scripts if tid == task_id)

    def act(self, ctx: TurnContext) -> PolicyTurn:
        script = self.scripts.get((ctx.task_id, ctx.label or "good"))
        if script is None:
            raise ConfigError(f"no scripted trajectory for task {ctx.task_id!r} label {ctx.label!r}")
        # Past the end of its script the policy says nothing: an empty message, which ends the
        # episode (eos) as a model's immediate end-of-sequence token would.
        turn = script[ctx.turn] if ctx.turn < len(script) else ""
        if self.action_format == "tools" and turn:
            from deepanalyze_env.core.tool_calls import from_tags

            turn = from_tags(turn)
        # A scripted turn is a whole message: one that holds its format's stop string ended there
        # (stop); one without it is a message that ended without a stop string (eos).
        return PolicyTurn(turn, end=text_turn_end(turn, self.action_format))


# ---------------------------------------------------------------------------- openai


@dataclass
class OpenAIPolicy:
    """A teacher behind an OpenAI-compatible chat-completions endpoint.

    ``layout="chat"`` sends the conversation as the env keeps it (observations as user turns),
    which any endpoint accepts; ``"continue"`` sends the episode as one assistant message to be
    continued (vLLM's ``continue_final_message``), the layout DeepAnalyze models were trained on.
    """

    model: str
    base_url: str | None = None
    api_key: str | None = None
    temperature: float = 0.0
    max_tokens: int = 4096
    timeout_s: float = 600.0
    max_retries: int = 3
    layout: str = "chat"
    name: str = "openai"
    _client: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ConfigError(f"policy layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        import openai

        # The openai client is thread-safe (one httpx pool) and owns retries with backoff.
        self._client = openai.OpenAI(
            base_url=self.base_url,
            api_key=self.api_key or "EMPTY",
            timeout=self.timeout_s,
            max_retries=self.max_retries,
        )

    @property
    def policy_id(self) -> str:
        return f"openai:{self.model}"

    def act(self, ctx: TurnContext) -> PolicyTurn:
        import openai

        messages: list[dict[str, str]] = [dict(m) for m in ctx.messages]
        extra: dict[str, Any] = {}
        if self.layout == "continue" and ctx.turn > 0:
            messages = continue_layout(ctx.messages, ctx.prompt_len)
            extra["extra_body"] = {"continue_final_message": True, "add_generation_prompt": False}
        try:
            response = self._client.chat.completions.create(
                model=self.model,
                messages=messages,
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                stop=list(turn_stops().strings),
                seed=ctx.seed,
                **extra,
            )
        except openai.OpenAIError as exc:
            raise PolicyError(f"openai policy {self.model!r} at {self.base_url}: {exc}") from None
        if not response.choices:
            raise PolicyError(f"openai policy {self.model!r}: the response has no choices")
        choice = response.choices[0]
        finish = choice.finish_reason
        text, end = openai_turn_end(
            (choice.message.content or "") + tool_call_text(choice.message.tool_calls),
            finish,
            choice.model_extra or {},
        )
        usage = None
        if response.usage is not None:
            usage = {
                "prompt_tokens": int(response.usage.prompt_tokens or 0),
                "completion_tokens": int(response.usage.completion_tokens or 0),
            }
        return PolicyTurn(text, usage, finish, end)


def openai_turn_end(text: str, finish: str | None, extra: dict[str, object]) -> tuple[str, TurnEnd]:
    """A chat completion's text (stop string put back) and how its turn ended, by the token
    engine's ends: ``length`` → ``length``; ``tool_calls`` → ``stop`` (the call closed the turn,
    as ``</tool_call>`` does); ``stop`` → ``stop`` when a stop string matched, ``eos`` when the
    message ended by itself. vLLM names the match (``stop_reason``: the string; None or a token
    id for an end-of-sequence token); without it a reply that leaves a block open had its
    closing tag swallowed (the format's ``put_back``), and one that holds no stop string after that
    ended its message. Any other reason (``content_filter``) ended the message: ``eos``."""
    if finish == "length":
        return text, "length"
    if finish in ("tool_calls", "function_call"):
        return text, "stop"
    if finish != "stop":
        return text, "eos"
    if "stop_reason" in extra:
        hint = extra["stop_reason"]
        if isinstance(hint, str) and hint in turn_stops().strings:
            return TAGS.put_back(text, hint), "stop"
        return text, "eos"
    text = TAGS.put_back(text)
    return text, text_turn_end(text)


def tool_call_text(calls: Iterable[object] | None) -> str:
    """A completion's structured tool calls written as hermes text (``core/tool_calls.py``), the
    first one only (a turn is one call): what the tools format reads from a turn's text. An
    invalid call keeps its name and arguments as sent, so the env records why it fails."""
    from deepanalyze_env.core import tool_calls

    for call in calls or []:  # the openai client's tool-call objects
        function = getattr(call, "function", None)
        name, arguments = getattr(function, "name", None), getattr(function, "arguments", None)
        checked = tool_calls.check_call(name, arguments)
        if isinstance(checked, tool_calls.ToolCall):
            return "\n" + tool_calls.render_call(checked)
        payload = json.dumps({"name": name, "arguments": arguments}, default=str)
        return f"\n{tool_calls.CALL_OPEN}{payload}{tool_calls.CALL_CLOSE}"
    return ""


# ---------------------------------------------------------------------------- transformers


@dataclass
class _Request:
    """One turn waiting for a batched ``generate`` call."""

    ids: list[int]
    seed: int
    result: PolicyTurn | None = None
    error: BaseException | None = None
    done: bool = False


@dataclass
class TransformersPolicy:
    """A local causal LM (``embedded:NAME`` or a path/hub id).

    The default ``layout="continue"`` renders the prompt with the chat template and appends the
    episode's turns and observations as raw text — the token layout the TRL and SkyRL recipes
    train with (docs/design.md §11) — so a rollout sees what training would.

    Concurrent episodes share the model through one batched round: the first waiting turn
    leads, collects up to ``max_batch`` turns (waiting at most ``batch_wait_s`` for the other
    episodes' code cells to finish) and generates them together. With ``kv_cache`` (the default)
    the round goes through :class:`~deepanalyze_env.generation.engine.GenerationEngine`, which
    keeps each episode's keys and values across its turns (a turn prefills only the new
    observation) and seeds each sampled turn by its own (episode, turn) seed, so a resumed sampled
    run draws what the uninterrupted one drew whatever the batching (up to float rounding).
    ``kv_cache=False`` is the earlier path — one left-padded ``generate`` over the re-read
    conversations, a sampled batch seeded by its first turn — kept as the reference the engine is
    tested against. Greedy turns are the same either way (``benchmarks/generation.py`` measures
    the speed).
    """

    model: str = "embedded:smollm2"
    temperature: float = 0.0
    max_tokens: int = 512
    layout: str = "continue"
    device: str | None = None
    max_batch: int = 1  # the CLIs pass --concurrency
    batch_wait_s: float = 0.5
    kv_cache: bool = True
    name: str = "transformers"
    # the chat template's extra arguments (Qwen3's enable_thinking), the same SFT and GRPO render with
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # tools: the prompt carries the two tools' schemas, a turn ends on the end-of-message token and
    # tool results come framed by the chat template — TRL's environment_factory layout
    action_format: str = "tags"
    chat_template: str | None = None  # a template's text replacing the tokenizer's (e.g. trl:qwen3's)
    _tok: Any = field(default=None, repr=False)
    _model: Any = field(default=None, repr=False)
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _pending: list[_Request] = field(default_factory=list, repr=False)
    _busy: bool = field(default=False, repr=False)
    _engine: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ConfigError(f"policy layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.max_batch < 1:
            raise ConfigError(f"transformers policy max_batch must be >= 1, got {self.max_batch}")
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ConfigError(f"--policy transformers needs the trl extra: pip install -e '.[trl]' ({exc})")
        from deepanalyze_env.generation.models import resolve_model

        try:
            path = resolve_model(self.model)
            self._tok = AutoTokenizer.from_pretrained(path)
            if self.chat_template is not None:
                self._tok.chat_template = self.chat_template
            device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
            self._model = AutoModelForCausalLM.from_pretrained(
                path, dtype=torch.float32 if device == "cpu" else "auto"
            ).to(device)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--policy-model {self.model}: cannot load the model: {exc}")
        self._model.eval()
        self.device = device
        from deepanalyze_env.generation.engine import GenerationEngine

        eos = self._model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos if eos is not None else self._tok.eos_token_id]
        # entries of finished episodes age out: a few per episode in flight is plenty
        config = self._model.generation_config  # top-k/top-p as generate would apply them
        self._engine = GenerationEngine(
            self._tok,
            eos_ids=eos,
            stop_tags=self.action_format == "tags",
            temperature=self.temperature,
            top_k=getattr(config, "top_k", None) if self.temperature > 0 else None,
            top_p=getattr(config, "top_p", None) if self.temperature > 0 else None,
            max_entries=max(8, 4 * self.max_batch),
        )

    @property
    def policy_id(self) -> str:
        return f"transformers:{self.model}"

    def _prompt_ids(self, ctx: TurnContext) -> list[int]:
        from deepanalyze_env.generation.tokens import plain_token_ids, prompt_token_ids

        if self.action_format == "tools":
            from deepanalyze_env.generation.tokens import tool_episode_ids, tool_prompt_ids

            kwargs = self.chat_template_kwargs
            ids = tool_prompt_ids(self._tok, ctx.messages[: ctx.prompt_len], **kwargs)
            for piece, _ in tool_episode_ids(self._tok, ctx.messages[ctx.prompt_len :], **kwargs):
                ids += piece
            return ids
        if self.layout == "chat":
            return prompt_token_ids(self._tok, ctx.messages, **self.chat_template_kwargs)
        # each turn and observation tokenised on its own, as the TRL rollout and SFT build them:
        # one joined string would merge tokens across the boundaries the policy trained with
        ids = prompt_token_ids(self._tok, ctx.messages[: ctx.prompt_len], **self.chat_template_kwargs)
        for message in ctx.messages[ctx.prompt_len :]:
            ids += plain_token_ids(self._tok, message["content"])
        return ids

    def act(self, ctx: TurnContext) -> PolicyTurn:
        request = _Request(self._prompt_ids(ctx), ctx.seed)
        with self._cond:
            self._pending.append(request)
            self._cond.notify_all()
            while not request.done:
                if self._busy:
                    self._cond.wait()
                    continue
                self._busy = True  # this thread leads the next batch (not necessarily its own turn)
                deadline = time.monotonic() + self.batch_wait_s
                while len(self._pending) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
                batch = self._pending[: self.max_batch]
                del self._pending[: len(batch)]
                self._cond.release()
                try:
                    self._generate(batch)
                finally:
                    self._cond.acquire()
                    self._busy = False
                    for done in batch:
                        done.done = True
                    self._cond.notify_all()
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def _generate(self, batch: list[_Request]) -> None:
        """One round for the batch; never raises (errors go to each request)."""
        if self.kv_cache:
            self._generate_cached(batch)
        else:
            self._generate_reread(batch)

    def _generate_cached(self, batch: list[_Request]) -> None:
        import torch

        from deepanalyze_env.generation.engine import GenRequest

        started = time.monotonic()
        try:
            with torch.no_grad():
                outs = self._engine.generate(
                    self._model, [GenRequest(r.ids, self.max_tokens, r.seed) for r in batch]
                )
        except Exception as exc:  # handed to every waiting episode, raised there
            error = PolicyError(f"transformers policy {self.model}: generation failed: {exc}")
            for r in batch:
                r.error = error if isinstance(exc, RuntimeError) else exc
            return
        log.debug("generated %d turns in %.1fs (kv cache)", len(batch), time.monotonic() - started)
        pad_id = self._tok.pad_token_id if self._tok.pad_token_id is not None else self._tok.eos_token_id
        for r, out in zip(batch, outs, strict=True):
            self._finish(r, list(out.ids), pad_id)

    def _finish(self, r: _Request, row: list[int], pad_id: int) -> None:
        # how the turn ended, read from its ids before padding goes (a pad that is the EOS id
        # is the EOS that stopped the row): the TRL rollout's split_turn
        eos = set(self._engine.eos_ids)
        _, end = split_turn(self._tok, row, eos)
        cut = not any(token in eos for token in row)  # neither EOS nor (a pad that is) EOS came
        while row and row[-1] == pad_id:  # a row that stopped early is padded to the longest
            row.pop()
        text = get_format(self.action_format).cut(self._tok.decode(row, skip_special_tokens=True))
        if self.action_format == "tools":
            # a tools turn ends at the end-of-message token; one that holds a closed call ended at
            # its call (stop, as under a sampler stopped at ``</tool_call>``)
            end = text_turn_end(text, "tools", cut=cut)
        finish = "length" if end == "length" else "stop"
        usage = {"prompt_tokens": len(r.ids), "completion_tokens": len(row)}
        r.result = PolicyTurn(text, usage, finish, end)

    def _generate_reread(self, batch: list[_Request]) -> None:
        """One left-padded ``generate`` over the whole conversations (the reference path)."""
        import torch

        pad_id = self._tok.pad_token_id if self._tok.pad_token_id is not None else self._tok.eos_token_id
        sample = self.temperature > 0
        kwargs: dict[str, Any] = {
            "max_new_tokens": self.max_tokens,
            "do_sample": sample,
            "stop_strings": list(turn_stops().strings) if self.action_format == "tags" else None,
            "tokenizer": self._tok,
            "pad_token_id": pad_id,
        }
        if sample:
            kwargs["temperature"] = self.temperature
        else:  # silence "generation flags are not valid" warnings from the model's sampling defaults
            kwargs.update(temperature=None, top_p=None, top_k=None)
        width = max(len(r.ids) for r in batch)
        inputs = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):
            inputs[i, width - len(r.ids) :] = torch.tensor(r.ids, dtype=torch.long)
            mask[i, width - len(r.ids) :] = 1
        started = time.monotonic()
        try:
            with torch.no_grad():
                torch.manual_seed(batch[0].seed)
                out = self._model.generate(
                    inputs.to(self.device), attention_mask=mask.to(self.device), **kwargs
                )
        except RuntimeError as exc:
            error = PolicyError(f"transformers policy {self.model}: generation failed: {exc}")
            for r in batch:
                r.error = error
            return
        except Exception as exc:  # handed to every waiting episode, raised there
            for r in batch:
                r.error = exc
            return
        log.debug(
            "generated %d turns (prompt width %d, %d new) in %.1fs",
            len(batch),
            width,
            out.shape[1] - width,
            time.monotonic() - started,
        )
        for r, row in zip(batch, out[:, width:].tolist(), strict=True):
            self._finish(r, row, pad_id)


# ---------------------------------------------------------------------------- construction


def make_policy(kind: str, **options: Any) -> Any:
    """Build a policy from command-line options (``None`` values mean "the policy's default")."""
    options = {k: v for k, v in options.items() if v is not None}
    if kind == "scripted":
        policy = ScriptedPolicy.from_files(options["trajectories"])
        policy.action_format = options.get("action_format", "tags")
        return policy
    if kind == "openai":
        if not options.get("model"):
            raise ConfigError("--policy openai needs --policy-model (the served model's name)")
        if not options.get("base_url") and not options.get("api_key"):
            raise ConfigError(
                "--policy openai needs --policy-base-url (an OpenAI-compatible endpoint) or an API key "
                "in the variable named by --policy-api-key-env"
            )
        known = (
            "model",
            "base_url",
            "api_key",
            "temperature",
            "max_tokens",
            "timeout_s",
            "max_retries",
            "layout",
        )
        return OpenAIPolicy(**{k: options[k] for k in known if k in options})
    if kind == "transformers":
        known = ("model", "temperature", "max_tokens", "layout", "device", "max_batch")
        known += ("chat_template_kwargs", "action_format", "chat_template")
        return TransformersPolicy(**{k: options[k] for k in known if k in options})
    raise ConfigError(f"unknown policy {kind!r}; use scripted, openai or transformers")
