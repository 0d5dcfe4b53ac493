"""Bootstrap intervals that resample prompts (all images of a prompt together).

Resampling is stratified by category x setting cell: each replicate draws, with
replacement, as many prompts as the cell holds from that cell's prompts (the
corpus fixes cell sizes by design, so a replicate is another corpus of the same
shape). Every statistic is then recomputed from the replicate exactly as
``negt2i.metrics.benchmark`` computes it, and the interval is the percentile
interval ``[q_{alpha/2}, q_{1-alpha/2}]`` of the ``B`` replicates (alpha = 1 - confidence).

Paired intervals for the difference between two models use the prompts both
models were scored on and apply the *same* resampled prompt indices to both, so
``Acc_A* - Acc_B*`` keeps the pairing (a stronger test than two separate intervals).
Draws come from ``numpy.random.default_rng(seed)`` in sorted cell order, so a
given seed always gives the same intervals.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from negt2i.metrics.benchmark import BenchmarkState, aggregate, cell_order

Replicates = dict[tuple[str, str], NDArray[np.float64]]


def percentile_interval(replicates: NDArray[np.float64], confidence: float = 0.95) -> list[float]:
    """``[lo, hi]``: the (1-c)/2 and (1+c)/2 percentiles of the replicates (NaNs ignored; all NaN gives NaN)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    alpha = 1 - confidence
    if np.isnan(replicates).all():
        return [float("nan"), float("nan")]
    lo, hi = np.nanpercentile(replicates, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return [float(lo), float(hi)]


def _check(n_resamples: int) -> None:
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be at least 1, got {n_resamples}")


def _replicates(
    states: list[BenchmarkState], cells: dict[tuple[str, str], list[str]], n_resamples: int, seed: int
) -> list[tuple[Replicates, Replicates]]:
    """Per state: (image accuracy, prompt accuracy) replicates per cell, same resampled prompts for every state."""
    rng = np.random.default_rng(seed)
    out: list[tuple[Replicates, Replicates]] = [({}, {}) for _ in states]
    for cell in sorted(cells, key=cell_order):
        pids = cells[cell]
        idx = rng.integers(0, len(pids), size=(n_resamples, len(pids)))
        for k, state in enumerate(states):
            correct, images = state.counts(pids)
            c = correct[idx]
            out[k][0][cell] = c.sum(axis=1) / images[idx].sum(axis=1)
            out[k][1][cell] = (c > 0).mean(axis=1)
    return out


def _intervals(agg: dict[str, Any], confidence: float) -> dict[str, Any]:
    def ci(v: Any) -> Any:
        return None if v is None else percentile_interval(v, confidence)

    return {
        "overall": ci(agg["overall"]),
        "by_category": {k: ci(v) for k, v in agg["by_category"].items()},
        "by_setting": {k: ci(v) for k, v in agg["by_setting"].items()},
        "by_cell": {k: ci(v) for k, v in agg["by_cell"].items()},
    }


def bootstrap_state(
    state: BenchmarkState, *, n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95
) -> dict[str, Any]:
    """Intervals for every image- and prompt-accuracy aggregate of one model (same keys as ``compute()``)."""
    _check(n_resamples)
    ((img, prm),) = _replicates([state], state.cells(), n_resamples, seed)
    return {
        "n_resamples": n_resamples,
        "seed": seed,
        "confidence": confidence,
        "image_accuracy": _intervals(aggregate(img), confidence),
        "prompt_accuracy": _intervals(aggregate(prm), confidence),
    }


def common_cells(a: BenchmarkState, b: BenchmarkState) -> dict[tuple[str, str], list[str]]:
    """Cells -> prompt ids scored for both models, in the same cell in both."""
    cells_b = {pid: cell for cell, pids in b.cells().items() for pid in pids}
    out: dict[tuple[str, str], list[str]] = {}
    for cell, pids in a.cells().items():
        both = [p for p in pids if cells_b.get(p) == cell]
        if both:
            out[cell] = both
    return out


def paired_difference(
    a: BenchmarkState, b: BenchmarkState, *, n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95
) -> dict[str, Any]:
    """Differences A - B of image accuracy on the prompts both were scored on, with paired intervals.

    Returns ``{"prompts": n, "difference": {overall, by_category, by_setting}, "interval": {...}}``;
    differences are in accuracy units (multiply by 100 for points).
    """
    _check(n_resamples)
    cells = common_cells(a, b)
    if not cells:
        raise ValueError("the two results share no prompts; a paired comparison needs the same prompts")
    (ia, _), (ib, _) = _replicates([a, b], cells, n_resamples, seed)
    point_a = aggregate({c: _acc(a, p) for c, p in cells.items()})
    point_b = aggregate({c: _acc(b, p) for c, p in cells.items()})
    rep = aggregate({c: ia[c] - ib[c] for c in cells})

    def diff(x: Any, y: Any) -> Any:
        return None if x is None or y is None else float(x - y)

    return {
        "prompts": sum(len(p) for p in cells.values()),
        "difference": {
            "overall": diff(point_a["overall"], point_b["overall"]),
            "by_category": {
                k: diff(point_a["by_category"][k], point_b["by_category"][k]) for k in point_a["by_category"]
            },
            "by_setting": {k: diff(point_a["by_setting"][k], point_b["by_setting"][k]) for k in point_a["by_setting"]},
        },
        "interval": {k: v for k, v in _intervals(rep, confidence).items() if k != "by_cell"},
    }


def _acc(state: BenchmarkState, pids: list[str]) -> float:
    correct, images = state.counts(pids)
    return float(correct.sum() / images.sum())


MATCHED_LOADS: tuple[tuple[str, str, str], ...] = (
    ("load1", "pos1_neg0", "pos0_neg1"),
    ("load2", "pos2_neg0", "pos0_neg2"),
)
"""(key, all-positive setting, all-negated setting) of the loads where polarity alone differs."""


def matched_load(
    state: BenchmarkState, *, n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95
) -> dict[str, Any]:
    """The paper's headline view: per category, image accuracy with one (two) positive statements vs
    one (two) negated statements at the same load, and the gap ``positive - negated``.

    Cells are resampled exactly as ``bootstrap_state`` does (same seed, same draws), so the positive and
    negated intervals equal that cell's interval there; the gap's interval is the percentile interval of
    the per-replicate differences (the two cells hold different prompts, resampled independently).
    ``mean`` averages the categories that have both cells, per replicate. Keys of the result:
    ``load1`` / ``load2`` -> {positive_setting, negated_setting, by_category: {c: row}, mean: row}, with
    row = {positive, negated, gap, prompts_positive, prompts_negated, positive_ci, negated_ci, gap_ci}.
    """
    from negt2i.metrics.benchmark import category_order

    _check(n_resamples)
    cells = state.cells()
    ((img, _),) = _replicates([state], cells, n_resamples, seed)
    out: dict[str, Any] = {}

    def row(pos: Any, neg: Any, pos_rep: Any, neg_rep: Any, *, n_pos: int, n_neg: int) -> dict[str, Any]:
        return {
            "positive": pos,
            "negated": neg,
            "gap": pos - neg,
            "prompts_positive": n_pos,
            "prompts_negated": n_neg,
            "positive_ci": percentile_interval(pos_rep, confidence),
            "negated_ci": percentile_interval(neg_rep, confidence),
            "gap_ci": percentile_interval(pos_rep - neg_rep, confidence),
        }

    for key, pos_s, neg_s in MATCHED_LOADS:
        cats = sorted({c for c, s in cells if s == pos_s and (c, neg_s) in cells}, key=category_order)
        if not cats:
            continue
        rows: dict[str, Any] = {}
        for c in cats:
            p, n = cells[(c, pos_s)], cells[(c, neg_s)]
            rows[c] = row(_acc(state, p), _acc(state, n), img[(c, pos_s)], img[(c, neg_s)], n_pos=len(p), n_neg=len(n))
        pos_mean = float(np.mean([rows[c]["positive"] for c in cats]))
        neg_mean = float(np.mean([rows[c]["negated"] for c in cats]))
        mean = row(
            pos_mean,
            neg_mean,
            np.mean([img[(c, pos_s)] for c in cats], axis=0),
            np.mean([img[(c, neg_s)] for c in cats], axis=0),
            n_pos=sum(rows[c]["prompts_positive"] for c in cats),
            n_neg=sum(rows[c]["prompts_negated"] for c in cats),
        )
        out[key] = {"positive_setting": pos_s, "negated_setting": neg_s, "by_category": rows, "mean": mean}
    return out
