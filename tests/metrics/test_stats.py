"""Agreement statistics against scikit-learn / scipy, a textbook Fleiss example, and the paper's Tables 2, 9 and 10."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps
from sklearn.metrics import accuracy_score, cohen_kappa_score, confusion_matrix, precision_score, recall_score

from negt2i.metrics.stats import (
    binary_scores,
    confusion,
    fleiss_kappa,
    kendall_tau,
    rank_scores,
    resample_weights,
    spearman_rho,
    spearman_rows,
)

# Table 9 (per-element mode; 600 images against the majority of three annotators), with Table 2's
# Cohen's kappa (pos. column; NegT2IBench's single mode) and Table 10's "Acc. pos." for the same rows.
# evaluator, TP, TN, FP, FN, precision, recall, called correct (%), kappa, accuracy
TABLE9 = [
    ("Qwen3-VL-32B, pos.", 169, 362, 32, 37, 84.1, 82.0, 33.5, 74.3, 88.5),
    ("Qwen3-VL-8B, pos.", 161, 358, 36, 45, 81.7, 78.2, 32.8, 69.7, 86.5),
    ("InternVL3.5-38B, pos.", 162, 356, 38, 44, 81.0, 78.6, 33.3, 69.5, 86.3),
    ("InternVL3.5-8B, pos.", 169, 346, 48, 37, 77.9, 82.0, 36.2, 69.0, 85.8),
    ("InternVL3-8B, pos.", 148, 344, 50, 58, 74.7, 71.8, 33.0, 59.7, 82.0),
    ("Qwen2.5-VL-7B, pos.", 117, 364, 30, 89, 79.6, 56.8, 24.5, 52.8, 80.2),
    ("VQAScore, pos.", 134, 332, 62, 72, 68.4, 65.0, 32.7, 49.9, 77.7),
    ("mPLUG, pos.", 36, 377, 17, 170, 67.9, 17.5, 8.8, 16.0, 68.8),
    ("NegT2IBench (ours)", 175, 348, 46, 31, 79.2, 85.0, 36.8, 72.0, 87.2),
]
PRINTED = 0.05 + 1e-9  # the paper prints one decimal


def _labels(tp: int, tn: int, fp: int, fn: int) -> tuple[np.ndarray, np.ndarray]:
    ref = np.array([1] * tp + [0] * tn + [0] * fp + [1] * fn, bool)
    dec = np.array([1] * tp + [0] * tn + [1] * fp + [0] * fn, bool)
    return ref, dec


@pytest.mark.parametrize(("name", "tp", "tn", "fp", "fn", "prec", "rec", "called", "kappa", "acc"), TABLE9)
def test_table9_rows_reproduce_tables_2_9_10(
    name: str, tp: int, tn: int, fp: int, fn: int, prec: float, rec: float, called: float, kappa: float, acc: float
) -> None:
    s = binary_scores(tp, tn, fp, fn)
    assert abs(100 * s["precision"] - prec) <= PRINTED, name
    assert abs(100 * s["recall"] - rec) <= PRINTED, name
    assert abs(100 * s["called_correct"] - called) <= PRINTED, name
    assert abs(100 * s["kappa"] - kappa) <= PRINTED, name
    assert abs(100 * s["accuracy"] - acc) <= PRINTED, name
    # Humans accept 34.3% of the images: the same reference for every row.
    assert abs(100 * s["reference_rate"] - 34.3) <= PRINTED
    # ... and the same numbers from scikit-learn on the expanded labels.
    ref, dec = _labels(tp, tn, fp, fn)
    assert s["kappa"] == pytest.approx(cohen_kappa_score(ref, dec), abs=1e-12)
    assert s["precision"] == pytest.approx(precision_score(ref, dec), abs=1e-12)
    assert s["recall"] == pytest.approx(recall_score(ref, dec), abs=1e-12)


def test_negt2ibench_row_numbers_quoted_in_the_text() -> None:
    """Section 4 / B.5: kappa 72.0, 46 false passes and 31 false failures, accepts 36.8%, humans 34.3%."""
    s = binary_scores(175, 348, 46, 31)
    assert round(100 * s["kappa"], 1) == 72.0
    assert round(100 * s["called_correct"], 1) == 36.8


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 3)), min_size=2, max_size=40))
def test_weighted_binary_scores_match_sklearn_on_the_expanded_multiset(items: list[tuple[bool, bool, int]]) -> None:
    ref = np.array([r for r, _, _ in items])
    dec = np.array([d for _, d, _ in items])
    w = np.array([k for _, _, k in items], float)
    if w.sum() == 0:
        return
    s = binary_scores(**confusion(ref, dec, w))
    rep_r, rep_d = np.repeat(ref, w.astype(int)), np.repeat(dec, w.astype(int))
    cm = confusion_matrix(rep_r, rep_d, labels=[False, True])
    assert s["accuracy"] == pytest.approx(accuracy_score(rep_r, rep_d))
    assert s["called_correct"] == pytest.approx(rep_d.mean())
    assert (cm[1, 1], cm[0, 0], cm[0, 1], cm[1, 0]) == tuple(
        confusion(ref, dec, w)[k] for k in ("tp", "tn", "fp", "fn")
    )
    if len(set(rep_r)) > 1 or len(set(rep_d)) > 1:
        expected = cohen_kappa_score(rep_r, rep_d)
        if np.isfinite(expected):
            assert s["kappa"] == pytest.approx(expected, abs=1e-12)


def test_undefined_ratios_are_nan_not_errors() -> None:
    s = binary_scores(0, 5, 0, 0)  # nothing positive anywhere, perfect agreement on one class
    assert np.isnan(s["precision"]) and np.isnan(s["recall"]) and np.isnan(s["kappa"])
    assert s["accuracy"] == 1.0


def test_confusion_shape_errors() -> None:
    with pytest.raises(ValueError, match="1-D of equal length"):
        confusion([True, False], [True])
    with pytest.raises(ValueError, match=r"weights have 3 columns, expected one per item \(2\)"):
        confusion([True, False], [True, True], np.ones((4, 3)))


def _pair_accuracy_reference(x: np.ndarray, y: np.ndarray) -> float:
    num = den = 0.0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            if x[i] == x[j]:
                continue
            den += 1
            if y[i] == y[j]:
                num += 0.5
            elif (y[i] > y[j]) == (x[i] > x[j]):
                num += 1
    return num / den


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), st.floats(0, 1), st.integers(0, 3)),
        min_size=3,
        max_size=30,
    )
)
def test_weighted_rank_scores_match_scipy_on_the_expanded_multiset(items: list[tuple[float, float, int]]) -> None:
    x = np.array([a for a, _, _ in items])
    y = np.round(np.array([b for _, b, _ in items]), 1)  # ties on both sides
    w = np.array([k for _, _, k in items], float)
    rx, ry = np.repeat(x, w.astype(int)), np.repeat(y, w.astype(int))
    if len(rx) < 2 or np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return
    got = rank_scores(x, y, w)
    assert got["kendall_tau"] == pytest.approx(sps.kendalltau(rx, ry).statistic, abs=1e-12)
    assert got["pair_accuracy"] == pytest.approx(_pair_accuracy_reference(rx, ry), abs=1e-12)
    assert spearman_rows(rx[None], ry[None])[0] == pytest.approx(sps.spearmanr(rx, ry).statistic, abs=1e-12)


def test_point_rank_scores_and_batched_replicates_agree() -> None:
    rng = np.random.default_rng(3)
    x = rng.integers(0, 5, 60) / 4
    y = rng.random(60)
    idx, w = resample_weights(60, 25, rng)
    batched = rank_scores(x, y, w)
    for b in range(25):
        assert batched["kendall_tau"][b] == pytest.approx(kendall_tau(x[idx[b]], y[idx[b]]), abs=1e-12)
    assert spearman_rows(x[idx], y[idx])[7] == pytest.approx(spearman_rho(x[idx[7]], y[idx[7]]), abs=1e-12)
    assert np.isnan(kendall_tau(np.ones(5), np.arange(5.0)))
    assert w.sum(axis=1).tolist() == [60.0] * 25


def test_fleiss_kappa_textbook_example() -> None:
    """Fleiss (1971) as worked in Wikipedia's "Fleiss' kappa": 10 items, 14 raters, 5 categories, kappa = 0.210."""
    table = [
        [0, 0, 0, 0, 14],
        [0, 2, 6, 4, 2],
        [0, 0, 3, 5, 6],
        [0, 3, 9, 2, 0],
        [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0],
        [3, 2, 6, 3, 0],
        [2, 5, 3, 2, 2],
        [6, 5, 2, 1, 0],
        [0, 2, 2, 3, 7],
    ]
    assert fleiss_kappa(table) == pytest.approx(0.20993, abs=5e-5)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=2, max_size=40))
def test_fleiss_kappa_with_two_raters_is_scotts_pi(pairs: list[tuple[bool, bool]]) -> None:
    a = np.array([p[0] for p in pairs])
    b = np.array([p[1] for p in pairs])
    po = float(np.mean(a == b))
    p1 = (a.sum() + b.sum()) / (2 * len(a))
    pe = p1**2 + (1 - p1) ** 2
    table = np.stack([a.astype(int) + b.astype(int), 2 - a.astype(int) - b.astype(int)], axis=1)
    if pe == 1:
        assert np.isnan(fleiss_kappa(table))
    else:
        assert fleiss_kappa(table) == pytest.approx((po - pe) / (1 - pe), abs=1e-12)


def test_fleiss_kappa_errors() -> None:
    with pytest.raises(ValueError, match="same number of raters for every item"):
        fleiss_kappa([[1, 2], [2, 2]])
    with pytest.raises(ValueError, match="at least two raters"):
        fleiss_kappa([[1, 0], [0, 1]])
    with pytest.raises(ValueError, match="non-empty"):
        fleiss_kappa(np.zeros((0, 2)))


def test_fleiss_kappa_matches_statsmodels_when_installed() -> None:
    inter_rater = pytest.importorskip("statsmodels.stats.inter_rater")
    rng = np.random.default_rng(5)
    table = rng.multinomial(4, [0.5, 0.3, 0.2], size=30)
    assert fleiss_kappa(table) == pytest.approx(inter_rater.fleiss_kappa(table, method="fleiss"), abs=1e-12)
