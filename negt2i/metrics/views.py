"""Views of one model's results that the paper reads beside Table 3 (issue 30).

- **GenEval's six tasks** (``geneval_tasks``): every image of a prompt whose ``tag`` is
  one of GenEval's tasks (``single_object``, ``two_object``, ``counting``, ``colors``,
  ``position``, ``color_attr``) is grouped by that tag, as GenEval's
  ``evaluation/summary_scores.py`` does: task accuracy = correct images / images of the
  task, and GenEval's overall score = the unweighted mean over the tasks present
  ("Overall score (avg. over tasks)"). Error lines of such a prompt count as incorrect
  images (GenEval itself has no error lines). ``None`` when no GenEval prompt was scored.
- **Per-statement polarity imbalance** (``polarity_imbalance``; Section 5, "by a factor
  of 1.3 to 2.0"): in each mixed setting (both polarities present), the share of failed
  negated statements among negated statements over the same share for positive ones,
  ``(F_neg / S_neg) / (F_pos / S_pos)``, where F counts failed statements of every cause
  (Figure 3) and S the statements of judged images. Because every image of a setting has
  the same P and N, this equals the paper's "failures per statement of each polarity"
  ratio (e.g. 1:2: 56% of failures from two negated statements vs 14% from one positive
  statement, 28 / 14 = 2.0).
- **Positive accuracy vs polarity drop** (``positive_vs_drop``; Section 5, "Spearman
  rho = 0.94 across the six categories"): per category, image accuracy at 1:0 and at
  0:1, drop = Acc(1:0) - Acc(0:1), and Spearman's rho between the positive accuracy
  and the drop across the categories that have both cells (``scipy.stats.spearmanr``;
  ``None`` with fewer than three categories or a constant column).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from scipy import stats

from negt2i.metrics.records import CATEGORY_ORDER, SETTING_ORDER

if TYPE_CHECKING:
    from negt2i.metrics.benchmark import BenchmarkState

GENEVAL_TASKS: tuple[str, ...] = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
"""GenEval's six tasks (the ``tag`` of its prompts), in the order of its paper's table."""

MIXED_SETTINGS: tuple[str, ...] = tuple(
    s for s in SETTING_ORDER if not s.startswith("pos0_") and not s.endswith("_neg0")
)
"""The settings with statements of both polarities (1:1, 2:1, 1:2, 2:2)."""


def geneval_tasks(state: BenchmarkState) -> dict[str, Any] | None:
    """GenEval's task breakdown and overall score (module docstring); ``None`` without GenEval prompts."""
    images: Counter[str] = Counter()
    correct: Counter[str] = Counter()
    prompts: Counter[str] = Counter()
    for tally in state.prompts.values():
        if tally.tag in GENEVAL_TASKS:
            images[tally.tag] += tally.images
            correct[tally.tag] += tally.correct
            prompts[tally.tag] += 1
    if not images:
        return None
    tasks = {
        tag: {
            "prompts": prompts[tag],
            "images": images[tag],
            "correct": correct[tag],
            "accuracy": correct[tag] / images[tag],
        }
        for tag in GENEVAL_TASKS
        if images[tag]
    }
    return {
        "tasks": tasks,
        "overall": sum(t["accuracy"] for t in tasks.values()) / len(tasks),
        "missing_tasks": [t for t in GENEVAL_TASKS if t not in tasks],
    }


def polarity_imbalance(state: BenchmarkState) -> dict[str, Any]:
    """Per mixed setting: failed-statement rates by polarity and their ratio (module docstring)."""
    totals: Counter[tuple[str, str]] = Counter()
    failed: Counter[tuple[str, str]] = Counter()
    for (_, setting, polarity), n in state.statements.items():
        totals[(setting, polarity)] += n
    for (_, setting, polarity, _), n in state.failed_statements.items():
        failed[(setting, polarity)] += n
    out: dict[str, Any] = {}
    for setting in MIXED_SETTINGS:
        s_pos, s_neg = totals[(setting, "positive")], totals[(setting, "negated")]
        if not s_pos or not s_neg:
            continue
        f_pos, f_neg = failed[(setting, "positive")], failed[(setting, "negated")]
        rate_pos, rate_neg = f_pos / s_pos, f_neg / s_neg
        out[setting] = {
            "statements": {"positive": s_pos, "negated": s_neg},
            "failed": {"positive": f_pos, "negated": f_neg},
            "failure_rate": {"positive": rate_pos, "negated": rate_neg},
            "factor": rate_neg / rate_pos if rate_pos else None,
        }
    factors = [v["factor"] for v in out.values() if v["factor"] is not None]
    return {
        "by_setting": out,
        "range": [min(factors), max(factors)] if factors else None,
    }


def positive_vs_drop(cell_accuracy: dict[tuple[str, str], float]) -> dict[str, Any]:
    """Per category Acc(1:0), Acc(0:1) and the drop; Spearman's rho of positive accuracy vs drop."""
    rows: dict[str, dict[str, float]] = {}
    for category in (c.value for c in CATEGORY_ORDER):
        pos, neg = cell_accuracy.get((category, "pos1_neg0")), cell_accuracy.get((category, "pos0_neg1"))
        if pos is not None and neg is not None:
            rows[category] = {"positive": pos, "negated": neg, "drop": pos - neg}
    return {"by_category": rows, **spearman([r["positive"] for r in rows.values()], [r["drop"] for r in rows.values()])}


def spearman(x: list[float], y: list[float]) -> dict[str, Any]:
    """``{"spearman_rho", "p_value", "n"}`` from ``scipy.stats.spearmanr`` (``None`` where undefined)."""
    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return {"spearman_rho": None, "p_value": None, "n": len(x)}
    result = stats.spearmanr(x, y)
    rho, p = float(result.statistic), float(result.pvalue)
    return {
        "spearman_rho": None if math.isnan(rho) else rho,
        "p_value": None if math.isnan(p) else p,
        "n": len(x),
    }


def pooled_positive_vs_drop(per_model: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The paper's reading over several models: per category the mean over models of Acc(1:0) and Acc(0:1)
    (models that have both cells), and Spearman's rho of the mean positive accuracy vs the mean drop."""
    pos: dict[str, list[float]] = {}
    neg: dict[str, list[float]] = {}
    for metrics in per_model.values():
        for category, row in metrics["positive_vs_drop"]["by_category"].items():
            pos.setdefault(category, []).append(row["positive"])
            neg.setdefault(category, []).append(row["negated"])
    if not pos:
        return None
    rows = {
        c: {
            "positive": sum(pos[c]) / len(pos[c]),
            "negated": sum(neg[c]) / len(neg[c]),
            "drop": sum(pos[c]) / len(pos[c]) - sum(neg[c]) / len(neg[c]),
            "models": len(pos[c]),
        }
        for c in pos
    }
    return {"by_category": rows, **spearman([r["positive"] for r in rows.values()], [r["drop"] for r in rows.values()])}
