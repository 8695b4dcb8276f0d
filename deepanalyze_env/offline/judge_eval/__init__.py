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

Modules: ``fixtures`` (reading cases), ``scoring`` (judge samples), ``metrics`` (the report
numbers and thresholds), ``outputs`` (files written).
"""

from __future__ import annotations

from deepanalyze_env.offline.judge_eval.fixtures import (
    LABELS,
    BadLine,
    Candidate,
    FixtureCase,
    FixtureError,
    load_fixtures,
    parse_case,
)
from deepanalyze_env.offline.judge_eval.metrics import (
    check_thresholds,
    evaluate_cases,
    pair_outcome,
    prompt_set,
)
from deepanalyze_env.offline.judge_eval.outputs import render_markdown, write_outputs
from deepanalyze_env.offline.judge_eval.scoring import Sample, candidate_context, run_samples

__all__ = [
    "LABELS",
    "BadLine",
    "Candidate",
    "FixtureCase",
    "FixtureError",
    "Sample",
    "candidate_context",
    "check_thresholds",
    "evaluate_cases",
    "load_fixtures",
    "pair_outcome",
    "parse_case",
    "prompt_set",
    "render_markdown",
    "run_samples",
    "write_outputs",
]
