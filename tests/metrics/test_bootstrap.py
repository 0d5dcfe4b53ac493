"""Prompt-bootstrap intervals: seeded, stratified by cell, paired across models; checked against scipy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy import stats as sps

from negt2i.metrics.benchmark import BenchmarkState
from negt2i.metrics.bootstrap import bootstrap_state, common_cells, paired_difference, percentile_interval
from negt2i.metrics.records import parse_line
from negt2i.metrics.synthetic import make_prompts, make_results


def _state(records: list[dict[str, Any]]) -> BenchmarkState:
    return BenchmarkState.from_rows(parse_line(r) for r in records)


@pytest.fixture(scope="module")
def one_cell() -> BenchmarkState:
    prompts = make_prompts(60, cells=[("color", "pos0_neg1")], seed=4)
    return _state(list(make_results(prompts, {("color", "pos0_neg1"): 0.4}, seed=1)))


def test_intervals_are_seeded_and_bracket_the_estimate(one_cell: BenchmarkState) -> None:
    a = bootstrap_state(one_cell, n_resamples=400, seed=7)
    b = bootstrap_state(one_cell, n_resamples=400, seed=7)
    c = bootstrap_state(one_cell, n_resamples=400, seed=8)
    assert a == b and a != c
    lo, hi = a["image_accuracy"]["overall"]
    assert lo < 0.4 < hi
    # one cell: the category, setting and overall intervals are the cell's
    assert a["image_accuracy"]["by_cell"]["color/pos0_neg1"] == [lo, hi] == a["image_accuracy"]["by_category"]["color"]


def test_single_cell_interval_matches_scipy_bootstrap_of_the_ratio(one_cell: BenchmarkState) -> None:
    correct, images = one_cell.counts(one_cell.cells()[("color", "pos0_neg1")])
    ref = sps.bootstrap(
        (correct, images), lambda c, n, axis=-1: c.sum(axis=axis) / n.sum(axis=axis), paired=True,
        vectorized=True, n_resamples=4000, method="percentile", random_state=np.random.default_rng(0),
    )  # fmt: skip
    ours = bootstrap_state(one_cell, n_resamples=4000, seed=0)["image_accuracy"]["overall"]
    assert ours == pytest.approx([ref.confidence_interval.low, ref.confidence_interval.high], abs=0.012)


def test_paired_difference_with_itself_is_exactly_zero(one_cell: BenchmarkState) -> None:
    d = paired_difference(one_cell, one_cell, n_resamples=200)
    assert d["difference"]["overall"] == 0.0 and d["interval"]["overall"] == [0.0, 0.0]
    assert d["prompts"] == 60


def test_paired_difference_uses_common_prompts_and_is_tighter_than_separate_intervals() -> None:
    prompts = make_prompts(40, cells=[("depth", "pos1_neg0")], seed=2)
    recs_a = list(make_results(prompts, {("depth", "pos1_neg0"): 0.6}, seed=3))
    # model B: the same images, except that 10% of A's correct images fail (a paired, known difference)
    recs_b = []
    flipped = 0
    for rec in recs_a:
        if rec["correct"] and flipped < 10:
            rec = {**rec, "correct": False, "failure_class": "positive_violated"}  # noqa: PLW2901
            flipped += 1
        recs_b.append(rec)
    a, b = _state(recs_a), _state(recs_b[: len(recs_b) - 4])  # B lacks the last prompt
    assert sum(len(p) for p in common_cells(a, b).values()) == 39
    d = paired_difference(a, b, n_resamples=500, seed=1)
    assert d["prompts"] == 39
    assert d["difference"]["overall"] > 0
    lo, hi = d["interval"]["overall"]
    assert 0 < lo <= d["difference"]["overall"] <= hi
    sep_a = bootstrap_state(a, n_resamples=500, seed=1)["image_accuracy"]["overall"]
    assert hi - lo < sep_a[1] - sep_a[0]


def test_errors_are_explicit(one_cell: BenchmarkState) -> None:
    with pytest.raises(ValueError, match="n_resamples must be at least 1, got 0"):
        bootstrap_state(one_cell, n_resamples=0)
    with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\), got 1.5"):
        percentile_interval(np.zeros(3), 1.5)
    other = _state(list(make_results(make_prompts(2, cells=[("depth", "pos1_neg0")]), {("depth", "pos1_neg0"): 0.5})))
    with pytest.raises(ValueError, match="share no prompts"):
        paired_difference(one_cell, other)
