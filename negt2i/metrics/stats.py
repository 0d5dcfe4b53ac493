"""Agreement statistics as small vectorised functions (each checked against scikit-learn / scipy in tests).

Binary agreement from the confusion counts of a reference r and a decision d
(TP: r = d = 1, TN: r = d = 0, FP: r = 0, d = 1, FN: r = 1, d = 0), n = TP + TN + FP + FN:

- accuracy ``p_o = (TP + TN) / n``; precision ``TP / (TP + FP)``; recall ``TP / (TP + FN)``;
  called correct ``(TP + FP) / n``; specificity ``TN / (TN + FP)``;
- Cohen's kappa ``(p_o - p_e) / (1 - p_e)`` with
  ``p_e = [(TP + FP)(TP + FN) + (TN + FN)(TN + FP)] / n^2``.

Every count accepts *weights* (how often each item is drawn in a bootstrap
replicate), shape (n,) or (B, n), so B replicates are computed at once; a
replicate with weights w is the same as the statistic on the multiset that
repeats item i w_i times.

Rank agreement of a continuous reference x with a score y, over pairs of items:

- Kendall's tau-b ``(P - Q) / sqrt((n0 - n1)(n0 - n2))`` (``scipy.stats.kendalltau``);
  with weights, ``P - Q = 1/2 w^T S w``, ``S_ij = sign(x_i - x_j) sign(y_i - y_j)``, and the
  pairs untied in x (resp. y) ``1/2 w^T [x_i != x_j] w``;
- Spearman's rho: Pearson correlation of average ranks (``scipy.stats.spearmanr``);
- pairwise ranking accuracy: among pairs with ``x_i != x_j``, the share that y orders the
  same way, a tie in y counting one half:
  ``PA = (w^T C w + 1/2 w^T E w) / w^T D w`` with ``D_ij = [x_i != x_j]``,
  ``C_ij = D_ij [sign(y_i - y_j) = sign(x_i - x_j)]``, ``E_ij = D_ij [y_i = y_j]``.

Fleiss' kappa for N items, each rated by m raters into k categories, n_ij raters
putting item i in category j:
``P_i = (sum_j n_ij^2 - m) / (m (m - 1))``, ``P_bar = mean_i P_i``,
``p_j = sum_i n_ij / (N m)``, ``P_e = sum_j p_j^2``, ``kappa = (P_bar - P_e) / (1 - P_e)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats as sps

Float = NDArray[np.float64]


def _weights(n: int, weights: ArrayLike | None) -> Float:
    if weights is None:
        return np.ones(n)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape[-1] != n:
        raise ValueError(f"weights have {w.shape[-1]} columns, expected one per item ({n})")
    return w


def confusion(reference: ArrayLike, decision: ArrayLike, weights: ArrayLike | None = None) -> dict[str, Float]:
    """Weighted TP / TN / FP / FN of binary ``decision`` against binary ``reference``."""
    r = np.asarray(reference, dtype=bool)
    d = np.asarray(decision, dtype=bool)
    if r.shape != d.shape or r.ndim != 1:
        raise ValueError(f"reference and decision must be 1-D of equal length, got {r.shape} and {d.shape}")
    w = _weights(r.size, weights)
    return {
        "tp": w @ (r & d).astype(np.float64),
        "tn": w @ (~r & ~d).astype(np.float64),
        "fp": w @ (~r & d).astype(np.float64),
        "fn": w @ (r & ~d).astype(np.float64),
    }


def _ratio(num: Any, den: Any) -> Any:
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return out if out.ndim else float(out)


def binary_scores(tp: Any, tn: Any, fp: Any, fn: Any) -> dict[str, Any]:
    """Cohen's kappa, accuracy, precision, recall, specificity, called correct and reference rate from counts.

    Undefined ratios (zero denominators, or p_e = 1 for kappa) are NaN.
    """
    tp, tn, fp, fn = (np.asarray(v, dtype=np.float64) for v in (tp, tn, fp, fn))
    n = tp + tn + fp + fn
    po = _ratio(tp + tn, n)
    pe = _ratio((tp + fp) * (tp + fn) + (tn + fn) * (tn + fp), n * n)
    return {
        "kappa": _ratio(np.asarray(po) - np.asarray(pe), 1.0 - np.asarray(pe)),
        "accuracy": po,
        "precision": _ratio(tp, tp + fp),
        "recall": _ratio(tp, tp + fn),
        "specificity": _ratio(tn, tn + fp),
        "called_correct": _ratio(tp + fp, n),
        "reference_rate": _ratio(tp + fn, n),
    }


def _sign_matrix(v: Float) -> NDArray[np.int8]:
    return np.sign(v[:, None] - v[None, :]).astype(np.int8)


def _quad(w: Float, m: NDArray[Any]) -> Float:
    """``w^T M w`` for each row of w (shape (n,) or (B, n))."""
    mf = m.astype(np.float64)
    return np.asarray(np.sum((w @ mf) * w, axis=-1), dtype=np.float64)


def rank_scores(reference: ArrayLike, score: ArrayLike, weights: ArrayLike | None = None) -> dict[str, Any]:
    """Kendall's tau-b and pairwise ranking accuracy of ``score`` against ``reference`` (weighted, vectorised)."""
    x = np.asarray(reference, dtype=np.float64)
    y = np.asarray(score, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"reference and score must be 1-D of equal length, got {x.shape} and {y.shape}")
    w = _weights(x.size, weights)
    sx, sy = _sign_matrix(x), _sign_matrix(y)
    d = sx != 0
    num = _quad(w, sx * sy)
    untied_x = _quad(w, d)
    untied_y = _quad(w, sy != 0)
    concordant = _quad(w, d & (sx == sy))
    ties_y = _quad(w, d & (sy == 0))
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = _ratio(num, np.sqrt(untied_x * untied_y))
    return {"kendall_tau": tau, "pair_accuracy": _ratio(concordant + 0.5 * ties_y, untied_x)}


def spearman_rows(x: Float, y: Float) -> Float:
    """Spearman's rho per row of (B, n) arrays (average ranks, then Pearson); NaN for a constant row."""
    rx = sps.rankdata(x, axis=-1)
    ry = sps.rankdata(y, axis=-1)
    rx = rx - rx.mean(axis=-1, keepdims=True)
    ry = ry - ry.mean(axis=-1, keepdims=True)
    den = np.sqrt((rx * rx).sum(axis=-1) * (ry * ry).sum(axis=-1))
    return np.asarray(_ratio((rx * ry).sum(axis=-1), den), dtype=np.float64)


def kendall_tau(reference: ArrayLike, score: ArrayLike) -> float:
    """Kendall's tau-b (``scipy.stats.kendalltau``); NaN when either side is constant."""
    x, y = np.asarray(reference, float), np.asarray(score, float)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(sps.kendalltau(x, y).statistic)


def spearman_rho(reference: ArrayLike, score: ArrayLike) -> float:
    """Spearman's rho (``scipy.stats.spearmanr``); NaN when either side is constant."""
    x, y = np.asarray(reference, float), np.asarray(score, float)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(sps.spearmanr(x, y).statistic)


def fleiss_kappa(counts: ArrayLike) -> float:
    """Fleiss' kappa of an (items x categories) table of rater counts, equal raters per item (formula above)."""
    table = np.asarray(counts, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] == 0:
        raise ValueError(f"counts must be a non-empty (items, categories) table, got shape {table.shape}")
    per_item = table.sum(axis=1)
    m = per_item[0]
    if not np.all(per_item == m):
        raise ValueError(
            f"Fleiss' kappa needs the same number of raters for every item, got {sorted(set(per_item.tolist()))}"
        )
    if m < 2:
        raise ValueError(f"Fleiss' kappa needs at least two raters per item, got {int(m)}")
    p_i = ((table**2).sum(axis=1) - m) / (m * (m - 1))
    p_j = table.sum(axis=0) / (table.shape[0] * m)
    p_e = float((p_j**2).sum())
    if p_e == 1.0:
        return float("nan")
    return float((p_i.mean() - p_e) / (1 - p_e))


def resample_weights(n: int, n_resamples: int, rng: np.random.Generator) -> tuple[NDArray[np.intp], Float]:
    """Bootstrap draws: indices (B, n) with replacement and the matching counts per item (B, n)."""
    idx = rng.integers(0, n, size=(n_resamples, n))
    w = np.zeros((n_resamples, n))
    np.add.at(w, (np.arange(n_resamples)[:, None], idx), 1.0)
    return idx, w
