"""Report plots (matplotlib, Agg backend, no display): model comparison, matched-load polarity comparison,
accuracy per setting, one heatmap and one failure-cause plot per model.

Each function takes the dict of ``negt2i.metrics.report.build_report`` and returns a
``matplotlib.figure.Figure``; ``report_figures`` renders them to PNG bytes (embedded
as base64 in the HTML page and written to ``plots/``). Requires the ``reports``
extra (matplotlib).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from negt2i.metrics.probe_plots import probe_figures
from negt2i.metrics.records import CATEGORY_LABELS, CATEGORY_ORDER, CAUSES, SETTING_ORDER, setting_label
from negt2i.metrics.report_tables import model_slugs

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CAUSE_COLORS = {
    "undetected_object": "#9e9e9e",
    "over_count": "#f2b134",
    "positive_violated": "#4a90d9",
    "negated_violated": "#d9534f",
    "dead_zone": "#7b5ea7",
}


def heatmap(report: dict[str, Any], model: str) -> Figure:
    """Image accuracy (%) per category (rows) x setting (columns) of one model, annotated."""
    m = report["models"][model]["image_accuracy"]
    cats = [c.value for c in CATEGORY_ORDER]
    grid = np.full((len(cats), len(SETTING_ORDER)), np.nan)
    for i, c in enumerate(cats):
        for j, s in enumerate(SETTING_ORDER):
            v = m["by_cell"].get(f"{c}/{s}")
            if v is not None:
                grid[i, j] = 100 * v
    fig, ax = plt.subplots(figsize=(8.5, 3.9), layout="constrained")
    im = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", vmin=0, vmax=100, aspect="auto")
    ax.set_facecolor("0.92")
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            if np.isnan(grid[i, j]):  # a cell without images: said, not left blank
                ax.text(j, i, "n/a", ha="center", va="center", fontsize=8, color="0.45")
            else:
                ax.text(
                    j,
                    i,
                    f"{grid[i, j]:.1f}",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if grid[i, j] < 55 else "black",
                )
    ax.set_xticks(range(len(SETTING_ORDER)), [setting_label(s) for s in SETTING_ORDER])
    ax.set_yticks(range(len(cats)), [CATEGORY_LABELS[c] for c in cats])
    ax.set_xlabel("setting (P asserted : N negated statements)")
    overall = m["overall"]
    ax.set_title(
        f"{model}: image accuracy (%) by category x setting (overall {100 * overall:.1f})"
        if overall is not None
        else model
    )
    fig.colorbar(im, ax=ax, label="%")
    return fig


def polarity_gap(report: dict[str, Any]) -> Figure:
    """Accuracy per setting, grouped by statement load, one bar per model with its interval."""
    names = list(report["models"])
    fig, ax = plt.subplots(figsize=(10, 3.8), layout="constrained")
    width = 0.8 / max(len(names), 1)
    positions: list[float] = []
    x = 0.0
    last_load = None
    for s in SETTING_ORDER:
        load = sum(int(ch) for ch in setting_label(s).split(":"))
        if last_load is not None and load != last_load:
            x += 0.6
        positions.append(x)
        x += 1
        last_load = load
    for k, name in enumerate(names):
        m = report["models"][name]
        vals = [m["image_accuracy"]["by_setting"].get(s) for s in SETTING_ORDER]
        iv = [m["intervals"]["image_accuracy"]["by_setting"].get(s) for s in SETTING_ORDER]
        xs = [p - 0.4 + width * (k + 0.5) for p in positions]
        ys = [100 * v if v is not None else np.nan for v in vals]
        err = np.array(
            [
                [y - 100 * c[0], 100 * c[1] - y] if c is not None and v is not None else [0, 0]
                for y, c, v in zip(ys, iv, vals, strict=True)
            ]
        ).T
        ax.bar(xs, ys, width=width * 0.95, yerr=err, capsize=2, label=name)
    ax.set_xticks(positions, [setting_label(s) for s in SETTING_ORDER])
    ax.set_ylabel("image accuracy (%)")
    ax.set_title("Polarity gap at each statement load (loads 1 | 2 | 3 | 4), 95% prompt-bootstrap intervals")
    ax.legend(fontsize=8, ncols=min(len(names), 4))
    ax.grid(axis="y", alpha=0.3)
    return fig


def failure_bars(report: dict[str, Any], model: str) -> Figure:
    """Figure 3 for one model: failed statements by cause, per setting (left) and per category (right)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained", width_ratios=[8, 6])
    failures = report["models"][model]["failures"]
    for ax, group, keys, label in (
        (axes[0], "by_setting", list(SETTING_ORDER), setting_label),
        (axes[1], "by_category", [c.value for c in CATEGORY_ORDER], lambda k: CATEGORY_LABELS[k]),
    ):
        counts = {k: failures[group][k]["counts"] for k in keys if k in failures[group]}
        present = [k for k in keys if k in counts and sum(counts[k].values())]
        bottom = np.zeros(len(present))
        totals = np.array([sum(counts[k].values()) for k in present], dtype=float)
        for cause in CAUSES:
            share = np.array([counts[k][cause] for k in present]) / np.where(totals > 0, totals, 1) * 100
            ax.bar(range(len(present)), share, bottom=bottom, color=CAUSE_COLORS[cause], label=cause.replace("_", " "))
            bottom += share
        for i, t in enumerate(totals):
            ax.text(i, 101, f"{int(t)}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(present)), [label(k) for k in present])
        ax.set_ylim(0, 110)
        ax.set_ylabel("% of failed statements")
    axes[0].set_title("(a) by setting")
    axes[1].set_title("(b) by category")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(CAUSES), fontsize=8, frameon=False)
    fig.suptitle(f"{model}: failed statements by cause (numbers above bars: failed statements)")
    return fig


def matched_load_plot(report: dict[str, Any], key: str = "load1") -> Figure:
    """Per category (one panel each, and the mean), per model: accuracy on the positive setting (blue) and on the
    negated setting of the same load (red), with intervals, joined by a line (the gap)."""
    names = [n for n in report["models"] if key in report["models"][n].get("matched_load", {})]
    cats = [c.value for c in CATEGORY_ORDER]
    panels = [*cats, "mean"]
    fig, grid = plt.subplots(2, 4, figsize=(11, 2 * (0.32 * len(names) + 0.9) + 0.6), layout="constrained", sharey=True)
    axes = list(grid.ravel())
    pos_s = neg_s = ""
    for ax, c in zip(axes, panels, strict=False):
        for y, name in enumerate(names):
            ml = report["models"][name]["matched_load"][key]
            pos_s, neg_s = ml["positive_setting"], ml["negated_setting"]
            r = ml["mean"] if c == "mean" else ml["by_category"].get(c)
            if r is None:
                continue
            p, n = 100 * r["positive"], 100 * r["negated"]
            ax.plot([n, p], [y + 0.15, y - 0.15], color="#bbb", lw=1.5, zorder=1)
            for v, ci, color, dy in ((p, r["positive_ci"], "#4a90d9", -0.15), (n, r["negated_ci"], "#d9534f", 0.15)):
                ax.errorbar(
                    v, y + dy, xerr=[[v - 100 * ci[0]], [100 * ci[1] - v]], fmt="o", color=color, ms=4, capsize=2
                )
        ax.set_title(CATEGORY_LABELS.get(c, "Mean of categories"), fontsize=9)
        ax.set_xlim(0, 100)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(labelsize=7)
    legend = axes[len(panels)]
    legend.axis("off")
    for ax in (axes[0], axes[4]):
        ax.set_yticks(range(len(names)), names)
    axes[0].set_ylim(len(names) - 0.5, -0.5)
    p_lab, n_lab = setting_label(pos_s), setting_label(neg_s)
    legend.errorbar([], [], xerr=[], fmt="o", color="#4a90d9", label=f"{p_lab} positive")
    legend.errorbar([], [], xerr=[], fmt="o", color="#d9534f", label=f"{n_lab} negated")
    legend.legend(loc="center", fontsize=8, frameon=False)
    fig.suptitle(
        f"Matched load: accuracy (%) on {p_lab} positive (blue) vs {n_lab} negated (red), 95% prompt-bootstrap "
        "intervals",
        fontsize=10,
    )
    return fig


def comparison(report: dict[str, Any]) -> Figure:
    """Overall image accuracy per model with its interval, best first."""
    rows = []
    for name, m in report["models"].items():
        v = m["image_accuracy"]["overall"]
        ci = m["intervals"]["image_accuracy"]["overall"]
        if v is not None:
            rows.append((100 * v, name, ci))
    rows.sort()
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.3), layout="constrained")
    ys = np.arange(len(rows))
    vals = np.array([r[0] for r in rows])
    err = np.array([[v - 100 * c[0], 100 * c[1] - v] for v, _, c in rows]).T
    ax.barh(ys, vals, xerr=err, capsize=3, color="#4a90d9")
    for y, (v, _, c) in zip(ys, rows, strict=True):
        ax.text(100 * c[1] + 1.0, float(y), f"{v:.1f} [{100 * c[0]:.1f}, {100 * c[1]:.1f}]", va="center", fontsize=8)
    ax.set_yticks(ys, [r[1] for r in rows])
    ax.set_xlabel("overall image accuracy (%), mean of the six categories")
    ax.set_title("Model comparison (95% prompt-bootstrap intervals)")
    ax.set_xlim(0, max(100.0, float(vals.max()) + 8) if len(vals) else 100)
    return fig


def to_png(fig: Figure, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def report_figures(report: dict[str, Any], *, max_models: int = 12) -> list[tuple[str, str, bytes]]:
    """(caption, file name, PNG bytes) for every plot of the report (per-model plots for the first
    ``max_models`` models; file names use the model's slug, ``negt2i.metrics.report_tables.model_slugs``)."""
    out: list[tuple[str, str, bytes]] = []

    def add(caption: str, filename: str, fig: Figure) -> None:
        out.append((caption, filename, to_png(fig)))

    if len(report["models"]) > 1:
        add("Overall image accuracy per model", "comparison.png", comparison(report))
    add("Image accuracy per setting, grouped by statement load", "polarity-gap.png", polarity_gap(report))
    if any("load1" in m.get("matched_load", {}) for m in report["models"].values()):
        add(
            "Matched load: one positive (1:0) vs one negated (0:1) statement, per category and model",
            "matched-load.png",
            matched_load_plot(report),
        )
    slugs = model_slugs(list(report["models"]))
    for name in list(report["models"])[:max_models]:
        add(f"{name}: image accuracy by category x setting", f"heatmap-{slugs[name]}.png", heatmap(report, name))
        add(f"{name}: failed statements by cause", f"failures-{slugs[name]}.png", failure_bars(report, name))
    for caption, filename, fig in probe_figures(report):  # control / paraphrase sections, if any
        add(caption, filename, fig)
    return out
