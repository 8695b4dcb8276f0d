"""Rubric prompt files: loading, hashing and rendering with injection-proof sections.

Prompts live as markdown files (one per rubric) so they can be reviewed, versioned and
overridden (``judge.prompt_dir``) without touching code; the sha256 of the file is the
prompt hash recorded with every judge call.

Rendering wraps each field in ``<<<BEGIN NAME id>>> … <<<END NAME id>>>`` lines. The id is a
hash of the rubric and *all* field texts, so it is deterministic (renders are cacheable and
replayable) yet a candidate cannot forge its own closing marker: the id depends on the very
text that would have to contain it. Runs of ``<<<``/``>>>`` inside field text are broken up
as well, so marker-looking text stays visibly inert; field text is read folded
(``core/fold.py``), so a look-alike run or observation tag is escaped like the real one.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from deepanalyze_env.core.fold import Folded, fold
from deepanalyze_env.core.protocol import OBSERVATION_TAG
from rewards.judge.errors import JudgeConfigError
from rewards.judge.transcript import Transcript

FIELDS = ("question", "reference", "candidate", "trajectory")
_PLACEHOLDER = re.compile(r"\{(" + "|".join((*FIELDS, "nonce")) + r")\}")
_MARKER_RUN = re.compile(r"<{3,}|>{3,}")
_HEADER_COMMENT = re.compile(r"\A(?:[ \t]*<!--.*?-->[ \t]*\r?\n)+", re.DOTALL)


@dataclass(frozen=True)
class Rubric:
    """A judge rubric file and how its reply is parsed (a final ``SCORE:`` line or a JSON of dimensions)
    and scaled."""

    name: str
    fields: tuple[str, ...]
    kind: str  # "score": a final "SCORE: N" line | "dimensions": one JSON object
    low: float = 1.0
    high: float = 5.0

    @property
    def filename(self) -> str:
        return f"{self.name}.md"


RUBRICS: dict[str, Rubric] = {
    "judge_analysis": Rubric("judge_analysis", ("question", "trajectory"), "score", 1.0, 5.0),
    "judge_accuracy": Rubric("judge_accuracy", ("question", "reference", "candidate"), "score", 0.0, 5.0),
    "judge_opendomain": Rubric("judge_opendomain", ("question", "reference", "candidate"), "dimensions"),
}


@dataclass(frozen=True)
class RenderedPrompt:
    """A rubric rendered for one episode, with the rubric file's hash (recorded in versions) and the
    nonce that fences the policy's text."""

    rubric: str
    text: str
    prompt_hash: str  # sha256 of the rubric file
    nonce: str  # the section id used in this render


def get_rubric(name: str) -> Rubric:
    try:
        return RUBRICS[name]
    except KeyError:
        raise JudgeConfigError(f"unknown judge rubric {name!r}; known: {', '.join(sorted(RUBRICS))}")


def prompt_path(name: str, prompt_dir: str | Path | None = None) -> Path:
    rubric = get_rubric(name)
    if prompt_dir is not None:
        path = Path(prompt_dir).expanduser() / rubric.filename
        if not path.is_file():
            raise JudgeConfigError(
                f"judge prompt file missing: {path} (judge.prompt_dir overrides all rubrics)"
            )
        return path
    return _shipped_dir() / rubric.filename


@functools.cache
def _shipped_dir() -> Path:
    """Resolved once: ``importlib.resources`` lookups cost ~100 µs, more than a whole render."""
    return Path(str(resources.files("rewards").joinpath("prompts")))


@dataclass(frozen=True)
class _Template:
    parts: tuple[str, ...]  # literal text and placeholder names, alternating (literal first)
    digest: str  # sha256 of the file


_templates: dict[tuple[str, str | Path | None], _Template] = {}


def _load(name: str, prompt_dir: str | Path | None) -> _Template:
    """The parsed template, read once per process and path.

    Cached without re-checking the file: the hash recorded with each call must describe the
    text actually rendered, and a file edited mid-run would otherwise mix two versions.
    """
    cached = _templates.get((name, prompt_dir))
    if cached is not None:
        return cached
    path = prompt_path(name, prompt_dir)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise JudgeConfigError(f"cannot read judge prompt file {path}: {exc}")
    text = raw.decode("utf-8")
    missing = [f for f in get_rubric(name).fields if "{" + f + "}" not in text]
    if missing:
        raise JudgeConfigError(
            f"judge prompt file {path} lacks placeholder(s) {', '.join('{' + f + '}' for f in missing)}"
        )
    body = _HEADER_COMMENT.sub("", text, count=1)
    template = _Template(tuple(_PLACEHOLDER.split(body)), hashlib.sha256(raw).hexdigest())
    _templates[(name, prompt_dir)] = template
    return template


def prompt_hash(name: str, prompt_dir: str | Path | None = None) -> str:
    """sha256 (hex) of the rubric's prompt file, as recorded with each judge call."""
    return _load(name, prompt_dir).digest


def validate_prompts(prompt_dir: str | Path | None = None, names: tuple[str, ...] | None = None) -> dict:
    """Load the named rubrics (all when None) once, raising on a missing file or placeholder; name → hash."""
    return {name: prompt_hash(name, prompt_dir) for name in (tuple(RUBRICS) if names is None else names)}


def _rewrite(text: str, folded: str, found: list[tuple[int, int, str]]) -> str:
    """``text`` with each ``(begin, end, replacement)`` of its fold replaced: the characters
    the policy typed whose folds cover ``folded[begin:end]`` give way to ``replacement``."""
    reading = None if folded is text else Folded.of(text)  # ASCII: the fold is the text
    pieces, pos = [], 0
    for begin, end, replacement in found:
        first, last = (begin, end) if reading is None else reading.covering(begin, end)
        pieces += [text[pos:first], replacement]
        pos = last
    return "".join([*pieces, text[pos:]])


def neutralise(text: str) -> str:
    """Break up runs that *fold* to ``<<<``/``>>>`` (``core.fold``: look-alike chevrons, invisible
    characters between them) so field text can never look like a section marker: the run is shown
    folded, one chevron at a time (``< < <``)."""
    folded = fold(text)
    if "<<<" not in folded and ">>>" not in folded:  # the common case, without a regex pass
        return text
    found = [(m.start(), m.end(), " ".join(m.group())) for m in _MARKER_RUN.finditer(folded)]
    return _rewrite(text, folded, found)


def escape_observation_tags(text: str) -> str:
    """``<Execute>`` → ``&lt;Execute&gt;`` (and ``<tool_response>``), for every tag the policy typed
    whose *fold* is one (``＜Execute＞``, ``<`` + ZERO WIDTH SPACE + ``Execute>``, a Cyrillic ``Е``,
    ``<Execute >``, ``<\nExecute>``): its brackets become entities, so it reads as text and cannot
    look like an environment block. The tag's own characters stay as typed."""
    folded = fold(text)
    if "<" not in folded:
        return text
    found = []
    for m in OBSERVATION_TAG.finditer(folded):
        found.append((m.start(), m.start() + 1, "&lt;"))
        if m.group(2):
            found.append((m.end() - 1, m.end(), "&gt;"))
    return _rewrite(text, folded, found) if found else text


def elision_marker(characters: int, nonce: str) -> str:
    """The line that stands where the middle of an environment output was cut to fit the judge's
    budget: fenced like the section markers, so no output or turn can forge or hide one."""
    return f"<<<{characters:,} CHARACTERS OF THIS OUTPUT ELIDED {nonce}>>>"


def _elided(text: str, kept: int, nonce: str) -> str:
    """``text`` with its middle cut to ``kept`` characters (head and tail halves) and the marker
    between them; each half escaped on its own, so no marker-like run forms across the cut."""
    head = text[: kept // 2]
    tail = text[len(text) - (kept - kept // 2) :] if kept > kept // 2 else ""
    marker = elision_marker(len(text) - len(head) - len(tail), nonce)
    return f"{neutralise(head)}\n{marker}\n{neutralise(tail)}"


def render_transcript(transcript: Transcript, nonce: str, keep: Mapping[int, int] | None = None) -> str:
    """The parts of ``transcript``, each under a marker line naming its author (ids as in sections).

    ``keep``: index of an environment part → the characters of it shown (its middle elided;
    ``rewards.judge.budget`` decides, docs/design.md §7 "Judge budget")."""
    if not transcript.parts:
        return "(the analyst took no turns)"
    keep = keep or {}
    lines, counts = [], {"analyst": 0, "recorded": 0}
    for index, part in enumerate(transcript.parts):
        body = neutralise(part.text)
        if part.author == "environment":
            if index in keep and keep[index] < len(part.text):
                body = _elided(part.text, keep[index], nonce)
            header = f"<<<ENVIRONMENT OUTPUT {nonce}>>>"
        else:
            counts[part.author] += 1
            header = f"<<<{part.author.upper()} TURN {counts[part.author]} {nonce}>>>"
            body = escape_observation_tags(body)
        body = body.strip("\n")
        lines.append(f"{header}\n{body}")
    return "\n".join(lines)


def section_nonce(rubric: str, fields: Mapping[str, str]) -> str:
    digest = hashlib.sha256(rubric.encode("utf-8"))
    for name in sorted(fields):
        digest.update(b"\x00" + name.encode("utf-8") + b"\x00" + fields[name].encode("utf-8"))
    return digest.hexdigest()[:16]


def render(
    name: str,
    fields: Mapping[str, str | Transcript],
    prompt_dir: str | Path | None = None,
    *,
    keep: Mapping[int, int] | None = None,
) -> RenderedPrompt:
    """Fill the rubric's template; every field must be given (as text, or as a :class:`Transcript`).

    ``keep`` elides environment outputs of the transcript field (:func:`render_transcript`); the
    section id is the full fields' either way."""
    rubric = get_rubric(name)
    missing = [f for f in rubric.fields if f not in fields]
    if missing:
        raise ValueError(f"rubric {name!r} needs field(s) {', '.join(missing)}")
    template = _load(name, prompt_dir)
    values = {f: fields[f] if isinstance(fields[f], Transcript) else str(fields[f]) for f in rubric.fields}
    nonce = section_nonce(
        name, {f: v.canonical() if isinstance(v, Transcript) else v for f, v in values.items()}
    )
    out = []
    for index, part in enumerate(template.parts):
        if index % 2 == 0:
            out.append(part)
        elif part == "nonce":
            out.append(nonce)
        elif part in values:
            label = part.upper()
            value = values[part]
            if isinstance(value, Transcript):
                body = render_transcript(value, nonce, keep)
            else:
                body = neutralise(value).strip("\n")
            out.append(f"<<<BEGIN {label} {nonce}>>>\n{body}\n<<<END {label} {nonce}>>>")
        else:  # a placeholder this rubric does not use: leave the text alone
            out.append("{" + part + "}")
    return RenderedPrompt(name, "".join(out), template.digest, nonce)
