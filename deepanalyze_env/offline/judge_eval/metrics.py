"""From samples to a report: ordering accuracy over labelled pairs, per-label means, noise
across repeats, parse-failure rate, and the CI thresholds."""

from __future__ import annotations

import hashlib
import logging
import statistics
from collections.abc import Sequence
from typing import NotRequired, TypedDict

from deepanalyze_env.offline.judge_eval.fixtures import LABEL_RANK, LABELS, Candidate, FixtureCase
from deepanalyze_env.offline.judge_eval.scoring import Sample, SampleStatus
from deepanalyze_env.offline.report import mean as mean_of
from deepanalyze_env.offline.report import median, quantile
from rewards.judge import validate_prompts
from rewards.judge.session import JudgeCall
from rewards.judges import RUBRIC_OF

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------- shapes


class SampleRow(TypedDict):
    """One repeat of a candidate as ``cases.jsonl`` keeps it."""

    repeat: int
    status: SampleStatus
    score: float | None
    dimensions: dict[str, float] | None
    error: str | None
    calls: list[JudgeCall]


class CandidateRow(TypedDict):
    """One candidate of a case: its score over scored repeats and every repeat."""

    index: int
    label: str
    kind: str
    score: float | None  # None when no repeat scored
    std: float | None  # sample std over repeats; None with fewer than two
    scores: list[float | None]
    dimensions: dict[str, float] | None
    samples: list[SampleRow]


class RankedPair(TypedDict):
    """Two candidates of one case with different labels, and whether the judge ordered them so."""

    better: int  # candidate indexes
    worse: int
    labels: str  # "reference>wrong"
    better_score: float
    worse_score: float
    outcome: float  # 1, 0.5 on a tie, 0
    case_id: NotRequired[str]  # set in the run-wide list
    judge: NotRequired[str]


class CaseRow(TypedDict):
    """One line of ``cases.jsonl``."""

    id: str
    method: str
    judge: str
    task_id: str | None
    source: str
    ordering_accuracy: float | None
    n_pairs: int
    candidates: list[CandidateRow]
    pairs: list[RankedPair]


class PairAccuracy(TypedDict):
    """Ordering accuracy of one label pair (``reference>wrong``) over the run."""

    accuracy: float | None
    n_pairs: int


class JudgeFigures(TypedDict):
    """One judge function's figures (``per_judge``)."""

    n_cases: int
    per_label_mean: dict[str, float | None]
    ordering_accuracy: float | None
    n_pairs: int
    per_dimension_mean: NotRequired[dict[str, dict[str, float | None]]]  # label → dimension → mean


class _JudgeTally(TypedDict):
    n_cases: int
    labels: dict[str, list[float]]
    pairs: list[RankedPair]
    dims: dict[str, dict[str, list[float]]]


class CallFigures(TypedDict):
    """Counts over every judge call of the run (:func:`_call_metrics`)."""

    n_calls: int
    n_replies: int
    n_cached: int
    n_parse_failures: int
    n_call_errors: int
    n_other_errors: int
    parse_failure_rate: float | None
    latency_ms_p50: float | None
    latency_ms_p90: float | None


class JudgeEvalMetrics(CallFigures):
    """The aggregate metrics of a judge evaluation (:func:`evaluate_cases`): the call counts,
    then what the scores say."""

    n_cases: int
    n_candidates: int
    n_samples: int
    n_scored: int
    n_unscored_candidates: int
    per_label_mean: dict[str, float | None]
    per_label_n: dict[str, int]
    ordering_accuracy: float | None
    n_pairs: int
    ordering_by_pair: dict[str, PairAccuracy]
    score_std_across_repeats: float | None
    n_std_candidates: int
    per_judge: dict[str, JudgeFigures]


class PromptSet(TypedDict):
    """The rubric prompt files in use (:func:`prompt_set`)."""

    prompt_hash: str  # over the whole set
    prompt_hashes: dict[str, str]  # rubric → sha256
    prompt_dir: str | None


class ThresholdGate(TypedDict):
    """One CI gate of :func:`check_thresholds`."""

    limit: float
    value: float | None
    passed: bool


# ---------------------------------------------------------------------------------- metrics


def pair_outcome(better: float, worse: float) -> float:
    """1 when the better-labelled candidate scores higher, 0.5 on a tie, else 0."""
    if better > worse:
        return 1.0
    if better == worse:
        return 0.5
    return 0.0


def _ordering(pairs: Sequence[RankedPair]) -> float | None:
    return mean_of([p["outcome"] for p in pairs])


def _candidate_row(index: int, cand: Candidate, reps: Sequence[Sample]) -> CandidateRow:
    """One candidate of a case: its mean over scored repeats (None when none scored), their
    sample std, the mean of each judged dimension, and every repeat as recorded."""
    scores = [s.score for s in reps if s.status == "scored" and s.score is not None]
    dims = [s.dimensions for s in reps if s.status == "scored" and s.dimensions]
    dim_mean = (
        {name: sum(d[name] for d in dims) / len(dims) for name in dims[0] if all(name in d for d in dims)}
        if dims
        else None
    )
    return {
        "index": index,
        "label": cand.label,
        "kind": cand.kind,
        "score": mean_of(scores),
        "std": statistics.stdev(scores) if len(scores) >= 2 else None,
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


def _ranked_pairs(cand_rows: Sequence[CandidateRow]) -> list[RankedPair]:
    """Every (better label, worse label) pair of scored candidates of one case, with its outcome."""
    pairs: list[RankedPair] = []
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
    return pairs


def _per_judge(judge_stats: dict[str, _JudgeTally]) -> dict[str, JudgeFigures]:
    per_judge: dict[str, JudgeFigures] = {}
    for judge, stats in judge_stats.items():
        per_judge[judge] = {
            "n_cases": stats["n_cases"],
            "per_label_mean": {label: mean_of(v) for label, v in stats["labels"].items() if v},
            "ordering_accuracy": _ordering(stats["pairs"]),
            "n_pairs": len(stats["pairs"]),
        }
        if stats["dims"]:
            per_judge[judge]["per_dimension_mean"] = {
                label: {name: mean_of(values) for name, values in dims.items()}
                for label, dims in stats["dims"].items()
            }
    return per_judge


def _call_metrics(samples: Sequence[Sample]) -> CallFigures:
    """Counts over every judge call of the run: replies, cache hits, parse failures, latency."""
    calls = [call for s in samples for call in s.calls]
    replies = [call for call in calls if call.get("reply") is not None]
    parse_failures = [call for call in replies if call.get("parse_error")]
    latencies = [
        float(c["latency_ms"]) for c in replies if c.get("latency_ms") is not None and not c.get("cached")
    ]
    return {
        "n_calls": len(calls),
        "n_replies": len(replies),
        "n_cached": sum(1 for c in calls if c.get("cached")),
        "n_parse_failures": len(parse_failures),
        "n_call_errors": sum(1 for c in calls if c.get("reply") is None and c.get("error")),
        "n_other_errors": sum(1 for s in samples if s.status == "error"),
        "parse_failure_rate": len(parse_failures) / len(replies) if replies else None,
        "latency_ms_p50": median(latencies),
        "latency_ms_p90": quantile(latencies, 0.9),
    }


def evaluate_cases(
    cases: Sequence[FixtureCase], samples: Sequence[Sample]
) -> tuple[list[CaseRow], JudgeEvalMetrics]:
    """Per-case rows (for cases.jsonl) and the aggregate metrics (for report.json).

    A candidate's score is the mean of its scored repeats; candidates without one are left out
    of means and pairs (and counted). ``score_std_across_repeats`` is the sample standard
    deviation (n − 1) of each candidate's repeats, averaged over candidates with two or more.
    """
    by_key: dict[tuple[str, int], list[Sample]] = {}
    for sample in samples:
        by_key.setdefault((sample.case_id, sample.candidate), []).append(sample)

    rows: list[CaseRow] = []
    all_pairs: list[RankedPair] = []
    label_scores: dict[str, list[float]] = {label: [] for label in LABELS}
    judge_stats: dict[str, _JudgeTally] = {}
    cand_all: list[CandidateRow] = []
    for case in cases:
        cand_rows = [
            _candidate_row(index, cand, sorted(by_key.get((case.id, index), []), key=lambda s: s.repeat))
            for index, cand in enumerate(case.candidates)
        ]
        cand_all += cand_rows
        pairs = _ranked_pairs(cand_rows)
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

    by_pair: dict[str, PairAccuracy] = {}
    for better_i, better in enumerate(LABELS):
        for worse in LABELS[better_i + 1 :]:
            key = f"{better}>{worse}"
            chosen = [p for p in all_pairs if p["labels"] == key]
            by_pair[key] = {"accuracy": _ordering(chosen), "n_pairs": len(chosen)}
    stds = [row["std"] for row in cand_all if row["std"] is not None]
    calls = _call_metrics(samples)
    metrics: JudgeEvalMetrics = {
        "n_cases": len(cases),
        "n_candidates": sum(len(c.candidates) for c in cases),
        "n_samples": len(samples),
        "n_scored": sum(1 for s in samples if s.status == "scored"),
        "n_unscored_candidates": sum(1 for row in cand_all if row["score"] is None),
        **{k: calls[k] for k in ("n_calls", "n_replies", "n_cached", "n_parse_failures", "n_call_errors")},
        **{k: calls[k] for k in ("n_other_errors", "parse_failure_rate")},
        "per_label_mean": {label: mean_of(v) for label, v in label_scores.items() if v},
        "per_label_n": {label: len(v) for label, v in label_scores.items() if v},
        "ordering_accuracy": _ordering(all_pairs),
        "n_pairs": len(all_pairs),
        "ordering_by_pair": by_pair,
        "score_std_across_repeats": mean_of(stds),
        "n_std_candidates": len(stds),
        "latency_ms_p50": calls["latency_ms_p50"],
        "latency_ms_p90": calls["latency_ms_p90"],
        "per_judge": _per_judge(judge_stats),
    }
    return rows, metrics


def prompt_set(prompt_dir: str | None, cases: Sequence[FixtureCase], samples: Sequence[Sample]) -> PromptSet:
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
    metrics: JudgeEvalMetrics, min_ordering: float | None, max_parse_failure: float | None
) -> dict[str, ThresholdGate]:
    """Each requested gate with its value and verdict; a metric that could not be computed fails."""
    gates: dict[str, ThresholdGate] = {}
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
