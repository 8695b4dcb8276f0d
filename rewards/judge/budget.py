"""Fitting a judge prompt to the judge's context, counted in tokens (docs/design.md §7, "Judge budget").

A judge's limit is in tokens, and dense text — digits, CJK, other scripts — costs about a token
per character or more, so a character cap lets a policy overflow the judge with output it
printed (the server refuses the prompt, and the episode would be excluded from training). The
prompt is counted by the judge's own tokenizer when the config names one (``judge.tokenizer``,
or the local model of the ``transformers`` backend), otherwise by an upper bound: one token per
UTF-8 byte, which no byte-level BPE or byte-fallback tokenizer exceeds (one per ASCII character,
three per CJK one). A fixed :data:`TEMPLATE_MARGIN` covers the chat template around it.

When the prompt is over budget the middles of the **environment outputs** are elided, longest
first, all of them down to one common length (a water level), each cut shown by a marker line.
Only observations are elided: an analyst's turns, a candidate answer and the task's own fields
are shown whole, so a flood of printed output elides itself and never pushes the policy's own
claims out of the judge's view. No output is cut below :data:`FLOOR_TOKENS` (its head and tail,
where a traceback's last line stands): long analyst turns cannot starve the outputs that check
them. What still does not fit is not sent (the session decides whose failure that is).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rewards.judge.errors import JudgeConfigError
from rewards.judge.prompts import RenderedPrompt, render
from rewards.judge.transcript import Transcript

if TYPE_CHECKING:
    from rewards.judge.settings import JudgeSettings

log = logging.getLogger(__name__)

TEMPLATE_MARGIN = 64  # tokens of the chat template around the prompt (role markers, BOS, …)
_ROUNDS = 6  # refits when a proportional cut kept more tokens than its share
FLOOR_TOKENS = 200  # the least of an output that elision keeps (half head, half tail)


class TokenCounter(Protocol):
    """Counts the tokens a text costs the judge; ``name`` says how (in notes and errors)."""

    name: str

    def count(self, text: str) -> int: ...


@dataclass(frozen=True)
class Utf8Bytes:
    """The upper bound used when no tokenizer is named: one token per UTF-8 byte."""

    name: str = "estimated at one token per UTF-8 byte"

    def count(self, text: str) -> int:
        return len(text.encode("utf-8", "surrogatepass"))


class TokenizerCount:
    """A Hugging Face tokenizer loaded from a local folder or the local cache (never downloaded).
    ``context``: the model's context length as the tokenizer states it (``model_max_length``),
    None when it states none (transformers' huge placeholder)."""

    def __init__(self, tokenizer: object, ref: str):
        self._tokenizer = tokenizer
        self.name = f"counted by the tokenizer of {ref}"
        stated = getattr(tokenizer, "model_max_length", None)
        self.context = stated if isinstance(stated, int) and 0 < stated < 10**8 else None

    def count(self, text: str) -> int:
        encoded = self._tokenizer(text, add_special_tokens=False, verbose=False)  # type: ignore[operator]
        return len(encoded["input_ids"])


UTF8_BYTES = Utf8Bytes()


@functools.cache
def load_tokenizer(ref: str) -> TokenizerCount:
    """The tokenizer at ``ref`` (a folder, a ``.gguf`` file, or a model id already in the Hugging
    Face cache), or :class:`JudgeConfigError` naming why it cannot be loaded without a download."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise JudgeConfigError(f"judge.tokenizer needs transformers installed ({exc})")
    from rewards.judge.backends import resolve_model_path

    path, extra = resolve_model_path(ref)
    source = str(path) if path.exists() else ref
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True, **extra)
    except (OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise JudgeConfigError(
            f"judge tokenizer {ref!r} cannot be loaded from a local folder or the local cache "
            f"(nothing is downloaded at run time): {first}"
        )
    return TokenizerCount(tokenizer, ref)


def counter_for(settings: JudgeSettings) -> TokenCounter:
    """How this judge's prompts are counted: ``judge.tokenizer``; else the ``transformers``
    backend's own model folder; else :data:`UTF8_BYTES`."""
    if settings.tokenizer:
        return load_tokenizer(settings.tokenizer)
    model = settings.model or ""
    local = settings.backend == "transformers" and not model.startswith("embedded:")
    if local and model and Path(model).expanduser().exists():
        return load_tokenizer(model)
    return UTF8_BYTES


def prompt_budget(settings: JudgeSettings, counter: TokenCounter) -> int:
    """``judge.max_prompt_tokens``, lowered to the model's context less ``max_tokens`` when the
    tokenizer states a context (a local ``transformers`` judge has no server to refuse a longer
    prompt: it would fail, or read it truncated)."""
    context = getattr(counter, "context", None)
    if context is None:
        return settings.max_prompt_tokens
    return max(1, min(settings.max_prompt_tokens, context - settings.max_tokens))


@dataclass(frozen=True)
class Fitted:
    """A render of the prompt and what it costs: ``fits`` when ``tokens`` is within the budget;
    ``elided`` counts the characters cut from environment outputs."""

    prompt: RenderedPrompt
    tokens: int
    elided: int
    fits: bool


def prompt_tokens(prompt: str, counter: TokenCounter) -> int:
    """What a rendered prompt costs: its tokens plus the chat template's margin."""
    return counter.count(prompt) + TEMPLATE_MARGIN


def water_level(costs: Mapping[int, int], cut: int) -> int:
    """The largest level ``L`` such that cutting every cost above ``L`` down to ``L`` removes at
    least ``cut`` (0 when even removing everything is not enough)."""
    ordered = sorted(costs.values(), reverse=True)
    removed_above = 0  # what cutting the first i costs down to ordered[i] removes
    for i in range(1, len(ordered) + 1):
        floor = ordered[i] if i < len(ordered) else 0
        step = (ordered[i - 1] - floor) * i
        if removed_above + step >= cut:
            return max(0, ordered[i - 1] - (cut - removed_above + i - 1) // i)
        removed_above += step
    return 0


def fit(
    rubric: str,
    fields: Mapping[str, str | Transcript],
    prompt_dir: str | Path | None,
    counter: TokenCounter,
    budget: int,
) -> Fitted:
    """The prompt within ``budget`` tokens, environment outputs elided as needed (module docstring);
    ``fits`` False when even every output cut to :data:`FLOOR_TOKENS` leaves it over."""
    prompt = render(rubric, fields, prompt_dir)
    tokens = prompt_tokens(prompt.text, counter)
    transcript = next((v for v in fields.values() if isinstance(v, Transcript)), None)
    if tokens <= budget or transcript is None:
        return Fitted(prompt, tokens, 0, tokens <= budget)
    outputs = {
        i: part.text for i, part in enumerate(transcript.parts) if part.author == "environment" and part.text
    }
    costs = {i: counter.count(text) for i, text in outputs.items()}
    if not costs:
        return Fitted(prompt, tokens, 0, False)
    cut = tokens - budget
    for round_ in range(_ROUNDS + 1):
        level = max(water_level(costs, cut), FLOOR_TOKENS) if round_ < _ROUNDS else FLOOR_TOKENS
        keep = {i: len(outputs[i]) * level // costs[i] for i in costs if costs[i] > level}
        prompt = render(rubric, fields, prompt_dir, keep=keep)
        tokens = prompt_tokens(prompt.text, counter)
        elided = sum(len(outputs[i]) - kept for i, kept in keep.items())
        if tokens <= budget:
            return Fitted(prompt, tokens, elided, True)
        cut += tokens - budget  # markers, or a denser middle than average: cut deeper
    log.debug("rubric %s: %d tokens with every output elided, over %d", rubric, tokens, budget)
    return Fitted(prompt, tokens, elided, False)
