"""Plots of the probe-set sections (``negt2i.metrics.probes``): negation effects and wording differences.

Each takes the report dict (with ``report["probes"]``) and returns a matplotlib figure;
``probe_figures`` lists those the report has data for (none without probe sections).
Requires the ``reports`` extra (matplotlib).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from negt2i.metrics.records import CATEGORY_LABELS, CATEGORY_ORDER

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _points(ax: Axes, xs: list[float], rows: list[dict[str, Any] | None], key: str, label: str) -> None:
    """Points at ``100 * row[key]`` with their interval as error bars (missing rows skipped)."""
    px, py, lo, hi = [], [], [], []
    for x, r in zip(xs, rows, strict=True):
        if r is None or r[key] is None:
            continue
        v = 100 * r[key]
        ci = r["interval"][key]
        px.append(x)
        py.append(v)
        lo.append(v - 100 * ci[0] if ci else 0.0)
        hi.append(100 * ci[1] - v if ci else 0.0)
    ax.errorbar(px, py, yerr=np.array([lo, hi]), fmt="o", capsize=3, label=label)


def negation_effects(report: dict[str, Any]) -> Figure:
    """Negation effect (negated statements) and positive effect per category, one marker per model, with intervals."""
    models = {n: m["negation_following"] for n, m in report["probes"]["models"].items() if "negation_following" in m}
    scopes = [c.value for c in CATEGORY_ORDER] + ["all"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.9), layout="constrained", sharey=True)
    width = 0.6 / max(len(models), 1)
    for ax, polarity, title in (
        (axes[0], "negated", "(a) negated statements: control - prompt"),
        (axes[1], "positive", "(b) positive statements: prompt - control"),
    ):
        for k, (name, rows) in enumerate(models.items()):
            by = {r["category"]: r for r in rows if r["polarity"] == polarity}
            xs = [i - 0.3 + width * (k + 0.5) for i in range(len(scopes))]
            _points(ax, xs, [by.get(s) for s in scopes], "effect", name)
        ax.axhline(0, color="#888", lw=0.8)
        ax.set_xticks(range(len(scopes)), [CATEGORY_LABELS.get(s, "All") for s in scopes])
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("effect (points)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Negation following: effect of the prompt over its control (above 0: the prompt is followed)")
    return fig


def wording_differences(report: dict[str, Any]) -> Figure:
    """Accuracy difference (form - original wording) per form, overall, one marker per model, with intervals."""
    models = {n: m["wording_robustness"] for n, m in report["probes"]["models"].items() if "wording_robustness" in m}
    forms = list(dict.fromkeys(r["form"] for rows in models.values() for r in rows))
    fig, ax = plt.subplots(figsize=(7.5, 3.6), layout="constrained")
    width = 0.6 / max(len(models), 1)
    for k, (name, rows) in enumerate(models.items()):
        by = {r["form"]: r for r in rows if r["scope"] == "overall"}
        xs = [i - 0.3 + width * (k + 0.5) for i in range(len(forms))]
        _points(ax, xs, [by.get(f) for f in forms], "difference", name)
    ax.axhline(0, color="#888", lw=0.8)
    ax.set_xticks(range(len(forms)), forms)
    ax.set_ylabel("image accuracy difference (points)")
    ax.set_title("Wording robustness: each form vs the original wording, paired by source prompt")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def probe_figures(report: dict[str, Any]) -> list[tuple[str, str, Figure]]:
    """(caption, file name, figure) for the probe sections the report has."""
    probes = report.get("probes")
    if not probes:
        return []
    out: list[tuple[str, str, Figure]] = []
    if any("negation_following" in m for m in probes["models"].values()):
        out.append(("Negation following: prompt vs control, per category", "negation-following.png",
                    negation_effects(report)))  # fmt: skip
    if any("wording_robustness" in m for m in probes["models"].values()):
        out.append(("Wording robustness: accuracy difference per negation form", "wording-robustness.png",
                    wording_differences(report)))  # fmt: skip
    return out
