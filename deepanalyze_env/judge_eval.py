"""Offline evaluation of an LLM judge against fixture answers (``deepanalyze-rl judge-eval``).

Before GPU hours go into training against a judge, one wants to know three things about it:
does it rank a sound analysis above a subtly broken one and both above a wrong one (ordering
accuracy), how much does its verdict move between samples of the same prompt (noise), and how
often can its reply not be read at all (parse failures, which become ``verifier_error``
episodes in training). This module answers them.

It deliberately scores through the same code the environment uses: the *registered* judge
reward function (so the same fields, rubric prompts, normalisation and parsing), a
:class:`~rewards.judge.JudgeSession` with the profile's score rule, and the process's shared
:class:`~rewards.judge.JudgeClient` (so the same cache, retries and concurrency cap). The only
addition is a repeat index, passed as the judge's ``sample`` so each repeat is a separate
draw with its own cache entry rather than the first reply read back from the cache.

A fixture line that cannot be used, a judge outage or an unparsable reply is recorded per item
and never aborts the run: a report with holes is more useful than no report, and the holes are
counted in it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import inspect
import json
import logging
import math
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepanalyze_env import protocol
from rewards.aio import background_loop
from rewards.judge import JudgeClient, JudgeError, JudgeParseError, JudgeSession, validate_prompts
from rewards.judges import RUBRIC_OF
from rewards.registry import RewardFunction, RewardSpecError, resolve

log = logging.getLogger(__name__)

# Expected order, best first. A pair of candidates with different labels in one case is
# "correctly ordered" when the better label scores strictly higher.
LABELS = ("reference", "perturbed", "wrong")
LABEL_RANK = {label: len(LABELS) - i for i, label in enumerate(LABELS)}

# The context fields judge-eval can build from a fixture line; a judge needing others
# (code_pass, workspace, …) cannot be evaluated offline.
PROVIDED_FIELDS = frozenset(
    {"question", "trajectory", "answer", "policy_text", "ground_truth", "reward_spec", "judge"}
)
CASE_KEYS = {"id", "method", "judge", "question", "ground_truth", "candidates", "task_id", "notes"}
REQUIRED_CASE_KEYS = ("id", "method", "judge", "question", "candidates")
CANDIDATE_KEYS = {"label", "text", "kind", "notes"}

_PROTOCOL_TAG = re.compile(r"</?(?:Analyze|Understand|Code|Execute|Answer)>")
MAX_MD_ROWS = 40  # longer tables in report.md are cut; cases.jsonl has every row
_EXECUTE_BLOCK = re.compile(r"\n?<Execute>.*?</Execute>\n?", re.DOTALL)


# ---------------------------------------------------------------------------------- fixtures


@dataclass(frozen=True)
class Candidate:
    label: str
    text: str
    kind: str | None = None


@dataclass(frozen=True)
class FixtureCase:
    id: str
    method: str
    judge: str
    question: str
    ground_truth: Any
    candidates: tuple[Candidate, ...]
    source: str  # "file:line", for messages and cases.jsonl
    task_id: str | None = None


@dataclass(frozen=True)
class BadLine:
    file: str
    line: int
    error: str

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "error": self.error}


class FixtureError(ValueError):
    """One fixture line is unusable; the message says why, in terms of the line's fields."""


def judge_function(name: str) -> RewardFunction:
    """The registered judge ``name`` (or ``module:attr``), checked to be evaluable offline."""
    try:
        fn = resolve(name)
    except RewardSpecError as exc:
        raise FixtureError(str(exc))
    if not fn.needs_judge:
        raise FixtureError(f"judge {name!r} is a reward function that does not use a judge")
    missing = sorted(set(fn.params) - PROVIDED_FIELDS)
    if missing:
        raise FixtureError(
            f"judge {name!r} needs context field(s) {', '.join(missing)}, which judge-eval cannot "
            f"build from a fixture (it provides {', '.join(sorted(PROVIDED_FIELDS))})"
        )
    return fn


def parse_case(obj: Any, source: str) -> FixtureCase:
    """Validate one decoded fixture line; raises :class:`FixtureError` naming the bad field."""
    if not isinstance(obj, dict):
        raise FixtureError(f"expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - CASE_KEYS)
    if unknown:
        raise FixtureError(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(CASE_KEYS))})")
    missing = [key for key in REQUIRED_CASE_KEYS if key not in obj]
    if missing:
        raise FixtureError(f"missing key(s) {', '.join(missing)}")
    for key in ("id", "method", "judge", "question"):
        if not isinstance(obj[key], str) or not obj[key].strip():
            raise FixtureError(f"{key!r} must be a non-empty string")
    judge_function(obj["judge"])
    raw = obj["candidates"]
    if not isinstance(raw, list) or not raw:
        raise FixtureError("'candidates' must be a non-empty list")
    candidates = []
    for index, cand in enumerate(raw):
        where = f"candidates[{index}]"
        if not isinstance(cand, dict):
            raise FixtureError(f"{where} must be an object with 'label' and 'text'")
        extra = sorted(set(cand) - CANDIDATE_KEYS)
        if extra:
            raise FixtureError(f"{where}: unknown key(s) {', '.join(extra)}")
        label = cand.get("label")
        if label not in LABEL_RANK:
            raise FixtureError(f"{where}: label must be one of {', '.join(LABELS)}, got {label!r}")
        text = cand.get("text")
        if not isinstance(text, str) or not text.strip():
            raise FixtureError(f"{where}: 'text' must be a non-empty string")
        kind = cand.get("kind")
        candidates.append(Candidate(label, text, str(kind) if kind is not None else None))
    task_id = obj.get("task_id")
    return FixtureCase(
        id=obj["id"],
        method=obj["method"],
        judge=obj["judge"],
        question=obj["question"],
        ground_truth=obj.get("ground_truth", ""),
        candidates=tuple(candidates),
        source=source,
        task_id=str(task_id) if task_id is not None else None,
    )


def fixture_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files named, and the ``*.jsonl`` files of folders named, in a stable order."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(path.glob("*.jsonl"))
            if not found:
                raise FileNotFoundError(f"no *.jsonl fixture files in {path}")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"no such fixture file {path}")
    return list(dict.fromkeys(files))


def load_fixtures(paths: Iterable[str | Path]) -> tuple[list[FixtureCase], list[BadLine]]:
    """All usable cases and one :class:`BadLine` per unusable line (blank lines are skipped)."""
    cases: list[FixtureCase] = []
    bad: list[BadLine] = []
    seen: dict[str, str] = {}
    for path in fixture_files(paths):
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                source = f"{path}:{number}"
                try:
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise FixtureError(f"not valid JSON ({exc.msg} at column {exc.colno})")
                    case = parse_case(obj, source)
                    if case.id in seen:
                        raise FixtureError(f"duplicate case id {case.id!r} (first at {seen[case.id]})")
                except FixtureError as exc:
                    bad.append(BadLine(str(path), number, str(exc)))
                    log.warning("%s: skipped: %s", source, exc)
                    continue
                seen[case.id] = source
                cases.append(case)
    return cases, bad


# ---------------------------------------------------------------------------------- scoring


@dataclass
class Sample:
    """One repeat of one candidate: the verdict, or why there is none."""

    case_id: str
    candidate: int
    repeat: int
    status: str  # "scored" | "parse_error" | "call_error" | "error"
    score: float | None = None  # in [0, 1]; the mean over dimensions for a multi-dimension judge
    dimensions: dict[str, float] | None = None
    error: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)


class RepeatSession(JudgeSession):
    """A session whose judge calls carry the repeat index as their sample index.

    The built-in judge functions always ask for sample 0; offsetting it makes repeat *k* a
    separate draw (and a separate cache entry) while repeat 0 is exactly what training asks.
    """

    def __init__(self, client: JudgeClient, *, score_rule: str, repeat: int):
        super().__init__(client, score_rule=score_rule)
        self.repeat = repeat

    async def evaluate(
        self, rubric: str, fields: dict[str, str], *, sample: int = 0
    ) -> float | dict[str, float]:
        return await super().evaluate(rubric, fields, sample=sample + self.repeat)


def looks_like_trajectory(text: str) -> bool:
    return _PROTOCOL_TAG.search(text) is not None


def candidate_context(case: FixtureCase, candidate: Candidate, session: JudgeSession) -> dict[str, Any]:
    """The reward context the env would build for this candidate at the end of an episode.

    A candidate written in the tag protocol is a whole trajectory: the answer is extracted from
    the policy's text (observations removed) exactly as the env does, so an answer-only judge
    sees what it sees in training; a trajectory without an ``<Answer>`` has none, which the
    built-in answer judges score 0.0 without a call, as in training. Plain text (no protocol
    tags) is taken to be the answer itself.
    """
    text = candidate.text
    if looks_like_trajectory(text):
        policy_text = _EXECUTE_BLOCK.sub("\n", text)
        answer = protocol.extract_answer([policy_text])
    else:
        policy_text = text
        answer = text.strip()
    return {
        "question": case.question,
        "trajectory": text,
        "answer": answer,
        "policy_text": policy_text,
        "ground_truth": case.ground_truth,
        "reward_spec": {"method": case.method, "ground_truth": case.ground_truth, "function": [case.judge]},
        "judge": session,
    }


async def score_sample(
    case: FixtureCase, index: int, repeat: int, client: JudgeClient, score_rule: str
) -> Sample:
    """Score one candidate once through the registered judge function; never raises."""
    sample = Sample(case.id, index, repeat, "error")
    session = RepeatSession(client, score_rule=score_rule, repeat=repeat)
    try:
        fn = judge_function(case.judge)
        context = candidate_context(case, case.candidates[index], session)
        kwargs = {name: context[name] for name in fn.params}
        if fn.is_async:
            value = await fn.fn(**kwargs)
        else:  # a sync judge function must not block the loop that serves its judge calls
            value = await asyncio.to_thread(fn.fn, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        sample.score, sample.dimensions = _normalise(value)
        sample.status = "scored"
    except JudgeParseError as exc:
        sample.status, sample.error = "parse_error", str(exc)
    except JudgeError as exc:
        sample.status, sample.error = "call_error", f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        sample.status, sample.error = "error", f"{type(exc).__name__}: {exc}"
    sample.calls = [dict(call) for call in session.calls]
    if sample.error:
        log.info("%s candidate %d repeat %d: %s", case.id, index, repeat, sample.error)
    return sample


def _normalise(value: Any) -> tuple[float, dict[str, float] | None]:
    if isinstance(value, dict):
        if not value:
            raise ValueError("the judge function returned an empty dict")
        dims = {str(k): float(v) for k, v in value.items()}
        return sum(dims.values()) / len(dims), dims
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"the judge function returned {value!r}, not a number or a dict of numbers")
    if not math.isfinite(float(value)):
        raise ValueError(f"the judge function returned {value!r}")
    return float(value), None


def run_samples(
    cases: Sequence[FixtureCase],
    client: JudgeClient,
    *,
    repeats: int,
    score_rule: str,
    on_done: Callable[[Sample], None] | None = None,
) -> list[Sample]:
    """Every (case, candidate, repeat) scored concurrently on the background loop.

    At most ``concurrency`` samples run at once. The client would cap the calls anyway, but
    its latency clock starts before its own queue; submitting everything at once would make
    the reported latency the time spent waiting behind other samples rather than the judge's
    answer time. ``on_done`` runs in the calling thread as each sample finishes (progress).
    """
    loop = background_loop()
    gate = asyncio.Semaphore(client.settings.concurrency)

    async def bounded(case: FixtureCase, index: int, repeat: int) -> Sample:
        async with gate:
            return await score_sample(case, index, repeat, client, score_rule)

    futures = [
        asyncio.run_coroutine_threadsafe(bounded(case, index, repeat), loop)
        for case in cases
        for index in range(len(case.candidates))
        for repeat in range(repeats)
    ]
    try:
        for future in concurrent.futures.as_completed(futures):
            if on_done is not None:
                on_done(future.result())
    except BaseException:
        for future in futures:
            future.cancel()
        raise
    return [future.result() for future in futures]


# ---------------------------------------------------------------------------------- metrics


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def pair_outcome(better: float, worse: float) -> float:
    """1 when the better-labelled candidate scores higher, 0.5 on a tie, else 0."""
    if better > worse:
        return 1.0
    if better == worse:
        return 0.5
    return 0.0


def _ordering(pairs: list[dict[str, Any]]) -> float | None:
    return _mean([p["outcome"] for p in pairs])


def evaluate_cases(
    cases: Sequence[FixtureCase], samples: Sequence[Sample]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-case rows (for cases.jsonl) and the aggregate metrics (for report.json).

    A candidate's score is the mean of its scored repeats; candidates without one are left out
    of means and pairs (and counted). ``score_std_across_repeats`` is the sample standard
    deviation (n − 1) of each candidate's repeats, averaged over candidates with two or more.
    """
    by_key: dict[tuple[str, int], list[Sample]] = {}
    for sample in samples:
        by_key.setdefault((sample.case_id, sample.candidate), []).append(sample)

    rows: list[dict[str, Any]] = []
    all_pairs: list[dict[str, Any]] = []
    label_scores: dict[str, list[float]] = {label: [] for label in LABELS}
    judge_stats: dict[str, dict[str, Any]] = {}
    stds: list[float] = []
    n_unscored = 0
    for case in cases:
        cand_rows = []
        for index, cand in enumerate(case.candidates):
            reps = sorted(by_key.get((case.id, index), []), key=lambda s: s.repeat)
            scores = [s.score for s in reps if s.status == "scored" and s.score is not None]
            dims = [s.dimensions for s in reps if s.status == "scored" and s.dimensions]
            mean = _mean(scores)
            std = statistics.stdev(scores) if len(scores) >= 2 else None
            if std is not None:
                stds.append(std)
            if mean is None:
                n_unscored += 1
            dim_mean = (
                {
                    name: sum(d[name] for d in dims) / len(dims)
                    for name in dims[0]
                    if all(name in d for d in dims)
                }
                if dims
                else None
            )
            cand_rows.append(
                {
                    "index": index,
                    "label": cand.label,
                    "kind": cand.kind,
                    "score": mean,
                    "std": std,
                    "scores": [s.score for s in reps],
                    "dimensions": dim_mean,
                    "samples": [
                        {
                            "repeat": s.repeat,
                            "status": s.status,
                            "score": s.score,
                            "dimensions": s.dimensions,
                            "error": s.error,
                            "calls": s.calls,
                        }
                        for s in reps
                    ],
                }
            )
        pairs = []
        for a in cand_rows:
            for b in cand_rows:
                if LABEL_RANK[a["label"]] <= LABEL_RANK[b["label"]]:
                    continue
                if a["score"] is None or b["score"] is None:
                    continue
                pairs.append(
                    {
                        "better": a["index"],
                        "worse": b["index"],
                        "labels": f"{a['label']}>{b['label']}",
                        "better_score": a["score"],
                        "worse_score": b["score"],
                        "outcome": pair_outcome(a["score"], b["score"]),
                    }
                )
        all_pairs.extend({**p, "case_id": case.id, "judge": case.judge} for p in pairs)
        stats = judge_stats.setdefault(
            case.judge,
            {"n_cases": 0, "labels": {label: [] for label in LABELS}, "pairs": [], "dims": {}},
        )
        stats["n_cases"] += 1
        stats["pairs"].extend(pairs)
        for row in cand_rows:
            if row["score"] is None:
                continue
            label_scores[row["label"]].append(row["score"])
            stats["labels"][row["label"]].append(row["score"])
            if row["dimensions"]:
                per_label = stats["dims"].setdefault(row["label"], {})
                for name, value in row["dimensions"].items():
                    per_label.setdefault(name, []).append(value)
        rows.append(
            {
                "id": case.id,
                "method": case.method,
                "judge": case.judge,
                "task_id": case.task_id,
                "source": case.source,
                "ordering_accuracy": _ordering(pairs),
                "n_pairs": len(pairs),
                "candidates": cand_rows,
                "pairs": pairs,
            }
        )

    calls = [call for s in samples for call in s.calls]
    replies = [call for call in calls if call.get("reply") is not None]
    parse_failures = [call for call in replies if call.get("parse_error")]
    latencies = [
        float(c["latency_ms"]) for c in replies if c.get("latency_ms") is not None and not c.get("cached")
    ]
    by_pair: dict[str, dict[str, Any]] = {}
    for better_i, better in enumerate(LABELS):
        for worse in LABELS[better_i + 1 :]:
            key = f"{better}>{worse}"
            chosen = [p for p in all_pairs if p["labels"] == key]
            by_pair[key] = {"accuracy": _ordering(chosen), "n_pairs": len(chosen)}
    per_judge = {}
    for judge, stats in judge_stats.items():
        per_judge[judge] = {
            "n_cases": stats["n_cases"],
            "per_label_mean": {label: _mean(v) for label, v in stats["labels"].items() if v},
            "ordering_accuracy": _ordering(stats["pairs"]),
            "n_pairs": len(stats["pairs"]),
        }
        if stats["dims"]:
            per_judge[judge]["per_dimension_mean"] = {
                label: {name: _mean(values) for name, values in dims.items()}
                for label, dims in stats["dims"].items()
            }
    metrics = {
        "n_cases": len(cases),
        "n_candidates": sum(len(c.candidates) for c in cases),
        "n_samples": len(samples),
        "n_scored": sum(1 for s in samples if s.status == "scored"),
        "n_unscored_candidates": n_unscored,
        "n_calls": len(calls),
        "n_replies": len(replies),
        "n_cached": sum(1 for c in calls if c.get("cached")),
        "n_parse_failures": len(parse_failures),
        "n_call_errors": sum(1 for c in calls if c.get("reply") is None and c.get("error")),
        "n_other_errors": sum(1 for s in samples if s.status == "error"),
        "parse_failure_rate": len(parse_failures) / len(replies) if replies else None,
        "per_label_mean": {label: _mean(v) for label, v in label_scores.items() if v},
        "per_label_n": {label: len(v) for label, v in label_scores.items() if v},
        "ordering_accuracy": _ordering(all_pairs),
        "n_pairs": len(all_pairs),
        "ordering_by_pair": by_pair,
        "score_std_across_repeats": _mean(stds),
        "n_std_candidates": len(stds),
        "latency_ms_p50": _median(latencies),
        "latency_ms_p90": _quantile(latencies, 0.9),
        "per_judge": per_judge,
    }
    return rows, metrics


def prompt_set(
    prompt_dir: str | None, cases: Sequence[FixtureCase], samples: Sequence[Sample]
) -> dict[str, Any]:
    """Hashes of the rubric prompt files in use: per rubric, and one over the whole set.

    The set hash is what to compare between runs (and with training records): it changes when
    any rubric file used here changes, and it does not depend on the order cases were read.
    """
    rubrics = {RUBRIC_OF[c.judge] for c in cases if c.judge in RUBRIC_OF}
    hashes = dict(validate_prompts(prompt_dir, tuple(sorted(rubrics)))) if rubrics else {}
    for sample in samples:  # custom judges: whatever rubrics their calls used
        for call in sample.calls:
            hashes.setdefault(call["rubric"], call["prompt_hash"])
    digest = hashlib.sha256("".join(f"{k}:{hashes[k]}\n" for k in sorted(hashes)).encode()).hexdigest()
    return {"prompt_hash": digest, "prompt_hashes": dict(sorted(hashes.items())), "prompt_dir": prompt_dir}


def check_thresholds(
    metrics: dict[str, Any], min_ordering: float | None, max_parse_failure: float | None
) -> dict[str, dict[str, Any]]:
    """Each requested gate with its value and verdict; a metric that could not be computed fails."""
    gates: dict[str, dict[str, Any]] = {}
    if min_ordering is not None:
        value = metrics["ordering_accuracy"]
        gates["min_ordering_accuracy"] = {
            "limit": min_ordering,
            "value": value,
            "passed": value is not None and value >= min_ordering,
        }
    if max_parse_failure is not None:
        value = metrics["parse_failure_rate"]
        gates["max_parse_failure_rate"] = {
            "limit": max_parse_failure,
            "value": value,
            "passed": value is not None and value <= max_parse_failure,
        }
    return gates


# ---------------------------------------------------------------------------------- outputs


def write_outputs(out: Path, report: dict[str, Any], rows: Sequence[dict[str, Any]]) -> None:
    """``report.json``, ``cases.jsonl``, ``report.md`` and ``scores.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(
        json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    with (out / "cases.jsonl").open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    (out / "report.md").write_text(render_markdown(report, rows), encoding="utf-8")
    plot_scores(rows, out / "scores.png")


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _more(total: int) -> list[str]:
    extra = total - MAX_MD_ROWS
    return [f"\n… and {extra} more in cases.jsonl", ""] if extra > 0 else [""]


def render_markdown(report: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    """A human summary: headline numbers, gates, per judge, misordered pairs, failures, bad lines."""
    lines = [
        "# Judge evaluation",
        "",
        f"Judge: **{report['backend']}** model `{report['model']}`"
        + (f" at {report['base_url']}" if report.get("base_url") else "")
        + f", temperature {report['temperature']}, {report['repeats']} repeat(s) per candidate.",
        f"Prompt set hash `{report['prompt_hash'][:16]}`"
        + (f" from `{report['prompt_dir']}`" if report.get("prompt_dir") else " (shipped prompts)")
        + ".",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    for key in (
        "n_cases",
        "n_candidates",
        "n_calls",
        "ordering_accuracy",
        "n_pairs",
        "parse_failure_rate",
        "score_std_across_repeats",
        "latency_ms_p50",
        "n_call_errors",
        "n_other_errors",
        "n_bad_lines",
    ):
        lines.append(f"| {key} | {_fmt(report.get(key))} |")
    for label, value in report["per_label_mean"].items():
        lines.append(f"| mean score, {label} | {_fmt(value)} |")
    lines.append("")
    if report["thresholds"]:
        lines += ["## Gates", ""]
        for name, gate in report["thresholds"].items():
            verdict = "PASS" if gate["passed"] else "FAIL"
            lines.append(f"- **{verdict}** {name}: value {_fmt(gate['value'])}, limit {gate['limit']}")
        lines.append("")
    lines += [
        "## Per judge",
        "",
        "| judge | cases | ordering | " + " | ".join(LABELS) + " |",
        "|---|---|---|",
    ]
    lines[-1] += "---|" * len(LABELS)
    for judge, stats in report["per_judge"].items():
        means = " | ".join(_fmt(stats["per_label_mean"].get(label)) for label in LABELS)
        lines.append(f"| {judge} | {stats['n_cases']} | {_fmt(stats['ordering_accuracy'])} | {means} |")
    lines.append("")
    for judge, stats in report["per_judge"].items():
        dims = stats.get("per_dimension_mean")
        if not dims:
            continue
        names = sorted({name for per in dims.values() for name in per})
        lines += [f"Dimensions of {judge}:", "", "| label | " + " | ".join(names) + " |"]
        lines.append("|---|" + "---|" * len(names))
        for label in LABELS:
            if label in dims:
                lines.append(f"| {label} | " + " | ".join(_fmt(dims[label].get(n)) for n in names) + " |")
        lines.append("")
    misordered = [(row["id"], pair) for row in rows for pair in row["pairs"] if pair["outcome"] < 1.0]
    if misordered:
        lines += [
            "## Pairs not in label order",
            "",
            "| case | pair | scores | counted |",
            "|---|---|---|---|",
        ]
        for case_id, pair in misordered[:MAX_MD_ROWS]:
            scores = f"{_fmt(pair['better_score'])} vs {_fmt(pair['worse_score'])}"
            lines.append(f"| {case_id} | {pair['labels']} | {scores} | {pair['outcome']} |")
        lines += _more(len(misordered))
    failures = [
        (row["id"], cand, sample)
        for row in rows
        for cand in row["candidates"]
        for sample in cand["samples"]
        if sample["status"] != "scored"
    ]
    if failures:
        lines += ["## Samples without a score", "", "| case | candidate | repeat | status | error |"]
        lines.append("|---|---|---|---|---|")
        for case_id, cand, sample in failures[:MAX_MD_ROWS]:
            error = " ".join(str(sample["error"]).split())[:160].replace("|", "\\|")
            lines.append(
                f"| {case_id} | {cand['index']} ({cand['label']}) | {sample['repeat']} | {sample['status']} "
                f"| {error} |"
            )
        lines += _more(len(failures))
    if report["bad_lines"]:
        lines += ["## Fixture lines skipped", ""]
        lines += [f"- {b['file']}:{b['line']}: {b['error']}" for b in report["bad_lines"]]
        lines.append("")
    lines += [
        "## How to read this",
        "",
        "- **ordering_accuracy**: over every pair of candidates of one case with different labels, the "
        "share the judge ranked in the order reference > perturbed > wrong (ties count half). 0.5 is a "
        "judge that cannot tell them apart; below 0.5 it prefers the worse answer.",
        "- **per-label means** are scores in [0, 1] as the environment's reward sees them (the rubric "
        "score / 5; a multi-dimension judge's mean over dimensions). The gap between labels matters "
        "more than the level.",
        "- **parse_failure_rate**: share of replies with no readable verdict; in training each becomes "
        "a `verifier_error` episode that is left out of the gradient.",
        "- **score_std_across_repeats**: the judge's noise at this temperature (sample standard "
        "deviation over repeats, averaged over candidates); compare it with the per-label gaps.",
        "- Per-sample replies, errors and latencies are in `cases.jsonl`; `scores.png` shows the "
        "distribution per label and judge.",
        "",
    ]
    return "\n".join(lines)


def plot_scores(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """One panel per judge: each candidate's score by label, with the label mean marked.

    Uses matplotlib's object API with the Agg canvas, so no global backend or pyplot state is
    touched in the caller's process.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    judges = list(dict.fromkeys(row["judge"] for row in rows)) or ["(no cases)"]
    fig = Figure(figsize=(4.2 * len(judges), 3.8))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(judges), squeeze=False)[0]
    colours = {"reference": "#2a9d8f", "perturbed": "#e9c46a", "wrong": "#e76f51"}
    for ax, judge in zip(axes, judges, strict=True):
        for x, label in enumerate(LABELS):
            values = [
                cand["score"]
                for row in rows
                if row["judge"] == judge
                for cand in row["candidates"]
                if cand["label"] == label and cand["score"] is not None
            ]
            if not values:
                continue
            # deterministic spread so equal scores stay visible side by side
            offsets = [((i % 7) - 3) * 0.05 for i in range(len(values))]
            ax.scatter([x + o for o in offsets], values, color=colours[label], alpha=0.8, s=28, zorder=3)
            mean = sum(values) / len(values)
            ax.hlines(mean, x - 0.3, x + 0.3, color="black", linewidth=2, zorder=4)
        ax.set_xticks(range(len(LABELS)), LABELS)
        ax.set_xlim(-0.6, len(LABELS) - 0.4)
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(judge)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("score (0–1); bar = label mean")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
