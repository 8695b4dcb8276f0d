"""Property-based checks of every answer matcher against an independent oracle (issue 39).

The oracle, the strategies, the checks and the list of properties live in
``tests/matcher_oracle.py``; the long run (``benchmarks/matcher_properties.py``) runs the same
properties with millions of examples. Here each runs a bounded, derandomised number of examples,
so CI is deterministic and quick (about 20 s for all of them on a busy 2-core machine).

| property | what it says |
|---|---|
| answer_match | against the oracle, with and without a tolerance, numeric and text truths; no raise |
| answer_match_tolerance_edge | on, just inside and just outside the tolerance, decided exactly |
| qa_accuracy / qa_exact | the oracle; raw string equality |
| answer_parts | part by part against the oracle, per-part tolerances, parts left out |
| answer_parts_dabench | DABench's rule as its evaluation states it |
| dabench_parts_scan | the linear scan finds what DABench's pattern finds |
| file_match_cells (+ tolerance edge) | cells against the oracle with the file's tolerance |
| upstream_exact | raw ``==`` never raises, matches only the string itself |
| printings_match / within_tolerance_matches | the other direction: a number's own printings match |
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tests.matcher_oracle import PROPERTIES, Property

CI = settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None
)


@pytest.mark.parametrize("prop", PROPERTIES, ids=lambda p: p.name)
def test_matcher_property(prop: Property):
    @CI
    @given(prop.cases)
    def run(case):
        prop.check(case)

    run()
