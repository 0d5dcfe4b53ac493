"""The report's content as tables and sections, independent of the output format.

``sections(report)`` turns the dict of ``negt2i.metrics.report.build_report`` into
an ordered list of ``Section`` (an anchor, a title, a lead paragraph, the tables
and the plot files it shows); the Markdown and HTML writers render exactly
these, with a table of contents. A new section is a function
``report -> list[Section]`` added with ``register_section`` (e.g. the probe-set
sections of another module); it is placed before the inputs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from negt2i.metrics.records import CATEGORY_LABELS, CATEGORY_ORDER, CAUSES, ROW_CLASSES, SETTING_ORDER, setting_label

LOAD_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Load 1", ("pos1_neg0", "pos0_neg1")),
    ("Load 2", ("pos2_neg0", "pos1_neg1", "pos0_neg2")),
    ("Load 3", ("pos2_neg1", "pos1_neg2")),
    ("Load 4", ("pos2_neg2",)),
)
CATEGORY_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Attributes", ("color", "material")),
    ("Relations", ("comparative", "depth", "directional", "proximity")),
)


@dataclass(slots=True)
class Table:
    """A rendered table: string cells, optional column groups (label, span), bold cells (row, col)."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    groups: list[tuple[str, int]] | None = None
    bold: set[tuple[int, int]] = field(default_factory=set)
    note: str = ""


@dataclass(slots=True)
class Section:
    """One part of the report: ``key`` is its anchor; ``figures`` are plot file names (``plots/``)."""

    key: str
    title: str
    tables: list[Table] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    lead: str = ""


SectionBuilder = Callable[[dict[str, Any]], list[Section]]
_EXTRA_SECTIONS: list[SectionBuilder] = []


def register_section(builder: SectionBuilder) -> SectionBuilder:
    """Add sections to every report (placed after the built-in results, before the inputs); usable as a decorator."""
    if builder not in _EXTRA_SECTIONS:
        _EXTRA_SECTIONS.append(builder)
    return builder


def slug(text: str) -> str:
    """A file- and anchor-safe name: runs of other characters become ``-``."""
    return re.sub(r"[^A-Za-z0-9._]+", "-", text).strip("-").lower() or "model"


def model_slugs(names: Sequence[str]) -> dict[str, str]:
    """Model name -> a unique slug (a suffix ``-2``, ``-3`` ... where two names collide)."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for name in names:
        base = s = slug(name)
        k = 1
        while s in used:
            k += 1
            s = f"{base}-{k}"
        used.add(s)
        out[name] = s
    return out


def category_label(category: str) -> str:
    """Table 3's short column name of a category (the name itself when unknown)."""
    return CATEGORY_LABELS.get(category, category)


def pct(v: float | None, digits: int = 1) -> str:
    """A fraction as a percentage string, ``n/a`` for missing / undefined (a cell without images)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{100 * v:.{digits}f}"


def pct_ci(v: float | None, ci: Sequence[float] | None) -> str:
    if ci is None or v is None:
        return pct(v)
    return f"{pct(v)} [{pct(ci[0])}, {pct(ci[1])}]"


def pts(v: float | None, ci: Sequence[float] | None) -> str:
    if v is None:
        return "-"
    s = f"{100 * v:+.1f}"
    return s if ci is None else f"{s} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"


def table3(report: dict[str, Any]) -> Table:
    cols = report["comparison"]["columns"]
    names = list(report["comparison"]["rows"])
    rows: list[list[str]] = []
    bold: set[tuple[int, int]] = set()
    for i, name in enumerate(names):
        r = report["comparison"]["rows"][name]
        rows.append([name, *(pct(r[c]) for c in cols)])
        for j, c in enumerate(cols):
            if len(names) > 1 and name in report["comparison"]["best"].get(c, []):
                bold.add((i, j + 1))
    headers = [
        "Model",
        *(setting_label(c) for c in SETTING_ORDER),
        *(CATEGORY_LABELS[c.value] for c in CATEGORY_ORDER),
        "Overall",
    ]
    groups = [("", 1), *((g, len(s)) for g, s in LOAD_GROUPS), *((g, len(c)) for g, c in CATEGORY_GROUPS), ("", 1)]
    return Table(
        "Image accuracy (%) by polarity and statement load, and by category (Table 3)",
        headers,
        rows,
        groups,
        bold,
        "P:N = P asserted and N negated statements; categories are averaged over the eight settings; "
        "Overall is the mean of the six categories." + (" Bold: best value per column." if len(names) > 1 else ""),
    )


def accuracy_tables(name: str, m: dict[str, Any]) -> list[Table]:
    """One model's accuracy with intervals (overall, per category, per setting) and per cell."""
    iv = m["intervals"]
    out: list[Table] = []
    summary = [
        [
            "Overall",
            pct_ci(m["image_accuracy"]["overall"], iv["image_accuracy"]["overall"]),
            pct_ci(m["prompt_accuracy"]["overall"], iv["prompt_accuracy"]["overall"]),
        ]
    ]
    for c, v in m["image_accuracy"]["by_category"].items():
        summary.append(
            [
                CATEGORY_LABELS.get(c, c),
                pct_ci(v, iv["image_accuracy"]["by_category"][c]),
                pct_ci(m["prompt_accuracy"]["by_category"][c], iv["prompt_accuracy"]["by_category"][c]),
            ]
        )
    for s, v in m["image_accuracy"]["by_setting"].items():
        summary.append(
            [
                setting_label(s),
                pct_ci(v, iv["image_accuracy"]["by_setting"][s]),
                pct_ci(m["prompt_accuracy"]["by_setting"][s], iv["prompt_accuracy"]["by_setting"][s]),
            ]
        )
    out.append(
        Table(
            f"{name}: accuracy (%) with {iv['confidence']:.0%} intervals",
            ["Scope", "Image accuracy", "Prompt accuracy"],
            summary,
            note=f"{m['scored_images']} images ({m['correct_images']} correct) of {m['prompts']} prompts; "
            f"intervals resample prompts ({iv['n_resamples']} resamples, seed {iv['seed']}).",
        )
    )
    cats = [c.value for c in CATEGORY_ORDER if c.value in m["image_accuracy"]["by_category"]]
    cell_rows = []
    for s in SETTING_ORDER:
        if s not in m["image_accuracy"]["by_setting"]:
            continue
        cell_rows.append([setting_label(s), *(pct(m["image_accuracy"]["by_cell"].get(f"{c}/{s}")) for c in cats)])
    out.append(
        Table(
            f"{name}: image accuracy (%) per category x setting",
            ["Setting", *(CATEGORY_LABELS[c] for c in cats)],
            cell_rows,
        )
    )

    return out


def failure_tables(name: str, m: dict[str, Any]) -> list[Table]:
    """One model's failed statements by cause (Figure 3) and incorrect images by row class (Appendix E.2)."""
    out: list[Table] = []
    f = m["failures"]
    frows: list[list[str]] = []
    for group, label in (("by_setting", setting_label), ("by_category", category_label)):
        for key, b in f[group].items():
            frows.append([label(key), str(b["failed"]), *(pct(b["shares"][c]) for c in CAUSES)])
    frows.append(["All", str(f["overall"]["failed"]), *(pct(f["overall"]["shares"][c]) for c in CAUSES)])
    out.append(
        Table(
            f"{name}: failed statements by cause (% of failed statements; Figure 3)",
            ["Group", "Failed", *(c.replace("_", " ") for c in CAUSES)],
            frows,
            note=f"{f['failed_statements']} of {f['statements']} statements failed; "
            f"negated violations are {pct(f['negated_violation_share'])}% of failed statements.",
        )
    )
    r = m["row_failures"]
    rrows = [
        [setting_label(k), str(b["incorrect"]), *(pct(b["shares"][c]) for c in ROW_CLASSES)]
        for k, b in r["by_setting"].items()
    ]
    rrows += [
        [CATEGORY_LABELS.get(k, k), str(b["incorrect"]), *(pct(b["shares"][c]) for c in ROW_CLASSES)]
        for k, b in r["by_category"].items()
    ]
    rrows.append(["All", str(r["overall"]["incorrect"]), *(pct(r["overall"]["shares"][c]) for c in ROW_CLASSES)])
    out.append(
        Table(
            f"{name}: incorrect images by row-level failure class (%; Appendix E.2)",
            ["Group", "Incorrect", *(c.replace("_", " ") for c in ROW_CLASSES)],
            rrows,
            note=f"{r['error_lines']} error lines (images that could not be judged) are counted separately.",
        )
    )
    return out


def dead_zone_table(name: str, m: dict[str, Any]) -> Table:
    """One model's dead-zone exposure (Table 19)."""
    dz = m["dead_zone"]
    return Table(
        f"{name}: dead-zone exposure among passed negated relation statements (Table 19)",
        ["Category", "Negated", "Evaluable", "Passed", "Dead-zone passes", "Share of passes (%)"],
        [
            [
                CATEGORY_LABELS.get(k, "Total"),
                str(v["total"]),
                str(v["evaluable"]),
                str(v["passed"]),
                str(v["dead_zone_passes"]),
                pct(v["share_of_passes"]),
            ]
            for k, v in dz.items()
        ],
    )


def _num(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def view_tables(report: dict[str, Any]) -> list[Table]:
    """The views of ``negt2i.metrics.views``: polarity imbalance, positive accuracy vs drop, GenEval's tasks."""
    from negt2i.metrics.views import GENEVAL_TASKS, MIXED_SETTINGS

    models = report["models"]
    names = list(models)
    out: list[Table] = []
    imbalance = [m["polarity_imbalance"]["by_setting"] for m in models.values()]
    settings = [s for s in MIXED_SETTINGS if any(s in by for by in imbalance)]
    if settings:
        out.append(
            Table(
                "Per-statement polarity imbalance: failed negated / failed positive statements, per statement",
                ["Setting", *names],
                [[setting_label(s), *(_factor(by.get(s)) for by in imbalance)] for s in settings],
                note="factor = (failed negated / negated statements) / (failed positive / positive statements); "
                "failures of every cause (Figure 3). The paper reads 1.3-2.0x over the four mixed settings.",
            )
        )
    rows: list[list[str]] = []
    for c in (c.value for c in CATEGORY_ORDER):
        cells = [m["positive_vs_drop"]["by_category"].get(c) for m in models.values()]
        if any(cells):
            rows.append([CATEGORY_LABELS[c], *(_pos_drop(x) for x in cells)])
    if rows:
        rhos = [_num(m["positive_vs_drop"]["spearman_rho"]) for m in models.values()]
        rows.append(["Spearman rho (positive vs drop)", *rhos])
        pooled = report.get("cross_model", {}).get("positive_vs_drop")
        note = "Acc(1:0) / drop = Acc(1:0) - Acc(0:1), per category; rho over the categories with both cells"
        if pooled is not None and len(names) > 1:
            note += f"; over the models' mean accuracies: rho = {_num(pooled['spearman_rho'])}"
        out.append(Table("Positive accuracy vs polarity drop across categories (Load 1)", ["Category", *names],
                         rows, note=note + ". The paper reads rho = 0.94."))  # fmt: skip
    tasks = [m.get("geneval") for m in models.values()]
    if any(tasks):
        rows = []
        for tag in GENEVAL_TASKS:
            if any(t and tag in t["tasks"] for t in tasks):
                rows.append([tag, *(_task(t["tasks"].get(tag)) if t else "–" for t in tasks)])
        rows.append(["Overall (mean over tasks)", *(pct(t["overall"]) if t else "–" for t in tasks)])
        out.append(
            Table(
                "GenEval's tasks (as GenEval's summary_scores.py groups them)",
                ["Task", *names],
                rows,
                note="task: correct images / images of the prompts with that tag; overall: unweighted mean over the "
                "tasks present (error lines count as incorrect). The rules are this evaluator's (see the rule "
                "config in Inputs; the `geneval` preset uses GenEval's constants where they map).",
            )
        )
    return out


def _factor(row: dict[str, Any] | None) -> str:
    return "–" if row is None or row["factor"] is None else f"{row['factor']:.2f}x"


def _pos_drop(row: dict[str, Any] | None) -> str:
    return "–" if row is None else f"{pct(row['positive'])} / {pct(row['drop'])}"


def _task(t: dict[str, Any] | None) -> str:
    return "–" if t is None else f"{pct(t['accuracy'])} ({t['correct']}/{t['images']})"


def paired_table(report: dict[str, Any]) -> Table | None:
    if not report["paired"]:
        return None
    rows = []
    for key, p in report["paired"].items():
        d, iv = p["difference"], p["interval"]
        rows.append(
            [
                key,
                str(p["prompts"]),
                pts(d["overall"], iv["overall"]),
                *(pts(d["by_category"].get(c.value), iv["by_category"].get(c.value)) for c in CATEGORY_ORDER),
            ]
        )
    return Table(
        "Paired differences in image accuracy (points, with intervals from the same prompt resamples)",
        ["Models", "Prompts", "Overall", *(CATEGORY_LABELS[c.value] for c in CATEGORY_ORDER)],
        rows,
    )


def inputs_lines(report: dict[str, Any]) -> list[str]:
    """One line per results file, config and stage model, per model."""
    out: list[str] = []
    for name, inp in report["inputs"].items():
        for f in inp["files"]:
            out.append(f"{name}: results {f['path']} ({f['lines']} lines, sha256 {f['sha256'][:16]})")
        for c in inp["configs"]:
            out.append(f"{name}: rule config {c['name']} (digest {c['digest']}, {c['lines']} lines)")
        for md in inp["models"]:
            out.append(f"{name}: {md['stage']} {md['model']} ({md['lines']} lines)")
        for v, n in inp["evaluator_versions"].items():
            out.append(f"{name}: evaluator negt2i {v} ({n} lines)")
    return out


def matched_load_tables(report: dict[str, Any]) -> list[Table]:
    """The headline view: per load with a pure-positive and a pure-negated setting, per category and model,
    accuracy on the positive vs the negated setting and the gap (points), with prompt-bootstrap intervals."""
    names = list(report["models"])
    out: list[Table] = []
    loads: dict[str, tuple[str, str]] = {}
    for m in report["models"].values():
        for key, v in m.get("matched_load", {}).items():
            loads.setdefault(key, (v["positive_setting"], v["negated_setting"]))
    for key, (pos_s, neg_s) in loads.items():
        rows: list[list[str]] = []
        cats = [c.value for c in CATEGORY_ORDER]
        for c in [*cats, "mean"]:
            for name in names:
                ml = report["models"][name].get("matched_load", {}).get(key)
                r = None if ml is None else (ml["mean"] if c == "mean" else ml["by_category"].get(c))
                if r is None:
                    continue
                rows.append(
                    [
                        "Mean of categories" if c == "mean" else category_label(c),
                        name,
                        pct_ci(r["positive"], r["positive_ci"]),
                        pct_ci(r["negated"], r["negated_ci"]),
                        pts(r["gap"], r["gap_ci"]),
                    ]
                )
        if not rows:
            continue
        p, n = setting_label(pos_s), setting_label(neg_s)
        out.append(
            Table(
                f"Matched load {p} vs {n}: image accuracy (%) with {p.split(':')[0]} positive vs "
                f"{n.split(':')[1]} negated statement(s), per category and model",
                ["Category", "Model", f"{p} positive", f"{n} negated", f"Gap {p} - {n} (points)"],
                rows,
                note=f"Both settings name the same number of objects and statements; they differ only in polarity. "
                f"Gap > 0: the model does worse when the statement is negated. Intervals: "
                f"{_confidence(report)} prompt bootstrap within each cell (the gap from the same replicates).",
            )
        )
    return out


def _confidence(report: dict[str, Any]) -> str:
    for m in report["models"].values():
        return f"{m['intervals']['confidence']:.0%}"
    return ""


def sections(report: dict[str, Any]) -> list[Section]:
    """The report's sections, in order (see the module docstring)."""
    names = list(report["models"])
    slugs = model_slugs(names)
    out = [
        Section(
            "summary",
            "Summary: accuracy by polarity setting and category",
            [table3(report)],
            (["comparison.png"] if len(names) > 1 else []) + ["polarity-gap.png"],
        ),
        Section(
            "matched-load",
            "Negation at matched load",
            matched_load_tables(report),
            ["matched-load.png"],
            "The paper's headline comparison: one positive statement (1:0) against one negated statement (0:1), "
            "same objects and load, per category and model (and 2:0 against 0:2).",
        ),
    ]
    p = paired_table(report)
    if p is not None:
        out.append(Section("paired", "Paired differences between models", [p]))
    for name in names:
        m = report["models"][name]
        out.append(
            Section(
                f"model-{slugs[name]}",
                f"Model {name}",
                [*accuracy_tables(name, m), *failure_tables(name, m), dead_zone_table(name, m)],
                [f"heatmap-{slugs[name]}.png", f"failures-{slugs[name]}.png"],
            )
        )
    views = view_tables(report)
    if views:
        out.append(
            Section(
                "views",
                "Polarity imbalance, positive accuracy vs drop, GenEval's tasks",
                views,
                lead="Section 5's per-statement reading of Figure 3 and its rank correlation across categories; "
                "GenEval's own task breakdown when the results hold GenEval prompts.",
            )
        )
    out.extend(probe_sections(report))
    for builder in _EXTRA_SECTIONS:
        out.extend(builder(report))
    return out


PROBE_FIGURES: tuple[tuple[str, str], ...] = (
    ("negation_following", "negation-following.png"),
    ("wording_robustness", "wording-robustness.png"),
)


def probe_sections(report: dict[str, Any]) -> list[Section]:
    """The probe-set section (negation following, wording robustness; ``negt2i.metrics.probes``), if any."""
    from negt2i.metrics import probes

    data = report.get("probes")
    if not data:
        return []
    present = [k for k, _ in PROBE_FIGURES if any(k in m for m in data["models"].values())]
    lead = " ".join(f"How to read {k.replace('_', ' ')}: {data['guide'][k]}" for k in present)
    return [
        Section(
            "probes",
            "Probe sets: negation following and wording robustness",
            [Table(title, columns, rows, note=note) for title, columns, rows, note in probes.tables(report)],
            [f for k, f in PROBE_FIGURES if k in present],
            lead,
        )
    ]


def all_tables(report: dict[str, Any]) -> list[Table]:
    """Every table of every section, in order."""
    return [t for s in sections(report) for t in s.tables]


def anchor(title: str) -> str:
    """An HTML / Markdown anchor for a table title."""
    return "t-" + slug(title)[:80]
