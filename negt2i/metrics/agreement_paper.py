"""The agreement study in the paper's layout: Tables 2, 5, 6, 7, 10, 11, 12 and 13 (Section 4, Appendix B).

``paper_tables`` turns ``negt2i.metrics.agreement.analyze``'s dict (plus the costs ``run_agreement`` adds)
into ``Table`` objects with the paper's rows and columns; ``write_paper_tables`` writes them as one
self-contained HTML page (``agreement.html``) and one CSV per table (``table2.csv`` ...), cells as printed
(percent points, intervals as ``x [lo, hi]``). Judges are grouped by name from the evaluator names
``"<judge> (<mode>)"``; a judge missing a mode gets ``-`` in that column. Intervals are the percentile
bootstrap intervals over images of ``analyze``; Δ = neg - pos is the paired difference on the same resamples.
"""

from __future__ import annotations

import csv
import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from negt2i.metrics.agreement import MODES, OURS, SCORE_MODE
from negt2i.metrics.records import setting_label
from negt2i.metrics.report_html import CSS, html_table
from negt2i.metrics.report_tables import Table, category_label, pct

DASH = "-"
H = "H. inter-annotator"


def judges_of(a: dict[str, Any]) -> list[str]:
    """Judge names in the study, ordered by their best per-element Kendall tau (as Table 7), then name."""
    names = {n.rsplit(" (", 1)[0] for n in a["image_level"] if n != OURS and n.endswith(")")} - set(scores_of(a))

    def best(j: str) -> float:
        taus = [a["image_level"][f"{j} ({m})"]["kendall_tau"] for m in MODES if f"{j} ({m})" in a["image_level"]]
        return -max((t for t in taus if not math.isnan(t)), default=float("-inf"))

    return sorted(names, key=lambda j: (best(j), j))


def scores_of(a: dict[str, Any]) -> list[str]:
    """Score-only evaluators (similarity and reward scores, mode ``score``), by best Kendall tau then name."""
    suffix = f" ({SCORE_MODE})"
    names = [n.removesuffix(suffix) for n in a["image_level"] if n.endswith(suffix)]

    def tau(j: str) -> float:
        t = a["image_level"][f"{j}{suffix}"]["kendall_tau"]
        return float("inf") if math.isnan(t) else -t

    return sorted(names, key=lambda j: (tau(j), j))


def _ev(a: dict[str, Any], judge: str, mode: str) -> dict[str, Any] | None:
    out: dict[str, Any] | None = a["image_level"].get(f"{judge} ({mode})")
    return out


def _ci(v: float | None, ci: Sequence[float] | None) -> str:
    if v is None or math.isnan(v):
        return DASH
    return pct(v) if not ci else f"{pct(v)} [{pct(ci[0])}, {pct(ci[1])}]"


def _mode_ci(a: dict[str, Any], judge: str, mode: str, key: str) -> str:
    e = _ev(a, judge, mode)
    return DASH if e is None else _ci(e[key], e["interval"][key])


def _delta(a: dict[str, Any], judge: str, key: str) -> str:
    d = a["differences"].get(f"{judge} (neg) - {judge} (pos)")
    if d is None:
        return DASH
    v, ci = d[key]["value"], d[key]["interval"]
    if math.isnan(v):
        return DASH
    return f"{100 * v:+.1f} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"


def _cost(a: dict[str, Any], name: str) -> list[str]:
    c = a.get("costs", {}).get(name) or {}
    gib, s_img = c.get("gpu_gib"), c.get("s_per_image")
    return [
        str(c.get("params") or DASH),
        f"{gib:.1f}" if isinstance(gib, int | float) else DASH,
        f"{s_img:.2f}" if isinstance(s_img, int | float) else DASH,
    ]


def table2(a: dict[str, Any]) -> Table:
    rows: list[list[str]] = []
    for j in judges_of(a):
        kappa = [_mode_ci(a, j, m, "kappa") for m in MODES]
        tau = [_mode_ci(a, j, m, "kendall_tau") for m in MODES]
        pos = _ev(a, j, "pos")
        pr = [pct(pos["precision"]), pct(pos["recall"])] if pos else [DASH, DASH]
        rows.append([j, *_cost(a, j), *kappa, _delta(a, j, "kappa"), *pr, *tau, _delta(a, j, "kendall_tau")])
    o = a["image_level"][OURS]
    rows.append(
        [
            f"{OURS} (ours)",
            *_cost(a, OURS),
            _ci(o["kappa"], o["interval"]["kappa"]),
            DASH,
            DASH,
            DASH,
            pct(o["precision"]),
            pct(o["recall"]),
            _ci(o["kendall_tau"], o["interval"]["kendall_tau"]),
            DASH,
            DASH,
            DASH,
        ]
    )
    h = a["inter_annotator"].get("image", {})
    rows.append(
        [
            H,
            DASH,
            DASH,
            DASH,
            pct(h.get("kappa")),
            DASH,
            DASH,
            DASH,
            DASH,
            DASH,
            pct(h.get("kendall_tau")),
            DASH,
            DASH,
            DASH,
        ]
    )
    bs = a["bootstrap"]
    return Table(
        "Table 2: Cost and agreement with human labels",
        [
            "Evaluator",
            "Params",
            "GiB",
            "s/img",
            "whole",
            "pos",
            "neg",
            "Δ",
            "Prec.",
            "Rec.",
            "whole",
            "pos",
            "neg",
            "Δ",
        ],
        rows,
        groups=[("", 1), ("Cost", 3), ("Cohen's κ", 4), ("Per element", 2), ("Kendall τ", 4)],
        note=f"{a['images']} images against the majority of {a['annotators_per_image']} annotators. Judge modes: whole "
        "prompt, per-element questions (pos), per-element with negated statements asked in negated form (neg); "
        "Δ = neg - pos, paired on the same resamples. Precision and recall use the per-element mode. "
        f"s/img = s/question x {a.get('element_questions_per_image', float('nan')):.2f} element questions per image. "
        f"Intervals: {bs['confidence']:.0%} bootstrap over images ({bs['n_resamples']} resamples). NegT2IBench has one "
        "mode (first column, as in the paper).",
    )


def table5(a: dict[str, Any]) -> Table:
    rows = []
    for block, label in (("all", "All statements"), ("asserted", "Affirmative"), ("negated", "Negated")):
        e = a["element_level"].get(block)
        if e is None:
            continue
        h = e["inter_annotator"]
        rows.append([label, str(h["n"]), pct(h["fleiss_kappa"]), pct(h["unanimous"]), pct(h["leave_one_out_kappa"])])
    return Table(
        "Table 5: Agreement between annotators",
        ["Statements", "n", "Fleiss' κ", "Unanimous", "Leave-one-out κ"],
        rows,
        note="As in the paper, 'All statements' counts every element and 'Affirmative' the objects and positive "
        f"statements. Leave-one-out ties count as {a.get('leave_one_out_tie', 'unsatisfied')}.",
    )


def table6(a: dict[str, Any]) -> Table:
    o = pct(a["image_level"][OURS]["kappa"])
    rows = [["Detector-based", "", "", ""], [f"{OURS} (ours)", DASH, o, o], ["VQA judges", "", "", ""]]
    for j in sorted(judges_of(a)):
        rows.append([j, *(pct(e["kappa"]) if (e := _ev(a, j, m)) else DASH for m in MODES)])
    rows.append([H, DASH, pct(a["inter_annotator"].get("image", {}).get("kappa")), DASH])
    return Table(
        "Table 6: Binary agreement (Cohen's κ), all scoring modes",
        ["Evaluator", "Whole prompt", "Per element", "Negated per element"],
        rows,
    )


def table7(a: dict[str, Any]) -> Table:
    rows: list[list[str]] = []
    labels = {"whole": "whole prompt", "pos": "pos. per element", "neg": "neg. per element"}
    for j in judges_of(a):
        rows.append([j, "", "", ""])
        for m in MODES:
            e = _ev(a, j, m)
            if e is not None:
                iv = e["interval"]
                rows.append(
                    [f"  {labels[m]}", *(_ci(e[k], iv[k]) for k in ("spearman_rho", "kendall_tau", "pair_accuracy"))]
                )
    scores = scores_of(a)
    if scores:
        rows.append(["Similarity and reward", "", "", ""])
        for j in scores:
            e = a["image_level"][f"{j} ({SCORE_MODE})"]
            iv = e["interval"]
            rows.append([j, *(_ci(e[k], iv[k]) for k in ("spearman_rho", "kendall_tau", "pair_accuracy"))])
    o = a["image_level"][OURS]
    rows.append(
        [f"{OURS} (ours)", *(_ci(o[k], o["interval"][k]) for k in ("spearman_rho", "kendall_tau", "pair_accuracy"))]
    )
    h = a["inter_annotator"].get("image", {})
    rows.append([H, *(pct(h.get(k)) for k in ("spearman_rho", "kendall_tau", "pair_accuracy"))])
    return Table(
        "Table 7: Rank agreement with the human score",
        ["Evaluator", "ρ", "τ", "Pair acc."],
        rows,
        note="Spearman ρ, Kendall τ and pairwise ranking accuracy against the share of satisfied elements, with "
        "bootstrap intervals over images; judges ordered by their best τ. Similarity and reward scores have no "
        "binary form, so rank agreement is their only comparison (Appendix B.3).",
    )


def _num(v: Any, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, int | float) and not math.isnan(v) else DASH


def table8(a: dict[str, Any]) -> Table:
    """Cost of one evaluation (Appendix B.4), from the judge files' cost fields and run headers."""
    costs = a.get("costs", {})
    rows: list[list[str]] = []
    for name in [*judges_of(a), *scores_of(a), OURS]:
        c = costs.get(name) or {}
        shown = f"{OURS} (ours)" if name == OURS else name
        rows.append([shown, str(c.get("params") or DASH), _num(c.get("s_per_question"), ".3f"),
                     _num(c.get("s_per_image"), ".2f"), _num(c.get("load_seconds"), ".1f"),
                     _num(c.get("gpu_gib"), ".1f")])  # fmt: skip
    return Table(
        "Table 8: Cost of one evaluation",
        ["Evaluator", "Params", "s/Q", "s/img", "Load (s)", "GPU GiB"],
        rows,
        note="Per judge: s/Q = mean wall time per element question (batch as run; the paper's protocol is batch 1), "
        f"s/img = s/Q x {a.get('element_questions_per_image', float('nan')):.2f} element questions per image "
        "(score-only evaluators: one call per image); model load excluded from both and listed apart; GPU GiB = "
        "torch.cuda.max_memory_allocated (- on the CPU).",
    )


def table10(a: dict[str, Any]) -> Table:
    rows = []
    for j in judges_of(a):
        acc = [pct(e["accuracy"]) if (e := _ev(a, j, m)) else DASH for m in MODES]
        p = a["negation_probe"].get(j)
        probe = (
            [
                pct(p["flip"]),
                f"{p['complementarity_error']:.3f}",
                pct(p["called_correct_pos"]),
                pct(p["called_correct_neg"]),
            ]
            if p
            else [DASH] * 4
        )
        rows.append([j, *acc, *probe])
    o = a["image_level"][OURS]
    rows.append([f"{OURS} (ours)", pct(o["accuracy"]), DASH, DASH, DASH, DASH, pct(o["called_correct"]), DASH])
    h = a["inter_annotator"].get("image", {})
    rows.append([H, pct(h.get("accuracy")), DASH, DASH, DASH, DASH, pct(a["human_accept_rate"]), DASH])
    return Table(
        "Table 10: Negated-question probe",
        [
            "Evaluator",
            "Acc. whole",
            "Acc. pos.",
            "Acc. neg.",
            "Flip (%)",
            "Compl. err.",
            "Called corr. pos. (%)",
            "Called corr. neg. (%)",
        ],
        rows,
        note="Flip: share of negated statements whose yes / no answer changes between the affirmative and the negated "
        "wording; Compl. err.: mean |p_pos + p_neg - 1|. The human row's called-correct is the human acceptance rate.",
    )


def _by(a: dict[str, Any], key: str, title: str, label: Any) -> Table:
    groups = list(a[key])
    rows: list[list[str]] = []
    labels = {"whole": "whole prompt", "pos": "pos. per element", "neg": "neg. per element"}
    for j in judges_of(a):
        rows.append([j, *([""] * len(groups)), ""])
        for m in MODES:
            name = f"{j} ({m})"
            if name in a["image_level"]:
                cells = [pct(a[key][g]["evaluators"][name]["kendall_tau"]) for g in groups]
                rows.append([f"  {labels[m]}", *cells, pct(a["image_level"][name]["kendall_tau"])])
    for j in scores_of(a):
        name = f"{j} ({SCORE_MODE})"
        rows.append([j, *(pct(a[key][g]["evaluators"][name]["kendall_tau"]) for g in groups),
                     pct(a["image_level"][name]["kendall_tau"])])  # fmt: skip
    rows.append([f"{OURS} (ours)", *(pct(a[key][g]["evaluators"][OURS]["kendall_tau"]) for g in groups),
                 pct(a["image_level"][OURS]["kendall_tau"])])  # fmt: skip
    rows.append([H, *(pct(a[key][g]["inter_annotator"].get("kendall_tau")) for g in groups),
                 pct(a["inter_annotator"].get("image", {}).get("kendall_tau"))])  # fmt: skip
    rows.append(["n", *(str(a[key][g]["n"]) for g in groups), str(a["images"])])
    return Table(title, ["Evaluator", *(label(g) for g in groups), "All"], rows,
                 note="Kendall τ against the continuous human score; the inter-annotator score is recomputed within "
                 "each column. Per-cell values have no intervals (the paper's are ~30 points wide).")  # fmt: skip


def table13(a: dict[str, Any]) -> Table:
    rows: list[list[str]] = []
    for block, label in (("asserted", "Affirmative statements"), ("negated", "Negated statements")):
        e = a["element_level"].get(block)
        if e is None:
            continue
        rows.append([label, "", "", "", "", "", ""])
        order = [OURS] + [f"{j} ({m})" for j in judges_of(a) for m in ("pos", "neg")]
        for name in order:
            s = e["evaluators"].get(name)
            if s is None or (block == "asserted" and name.endswith(" (neg)")):
                continue  # affirmative elements are asked the same way in both modes: pos only, as the paper
            shown = f"{OURS} (ours)" if name == OURS else name.replace(" (pos)", ", pos.").replace(" (neg)", ", neg.")
            rows.append([shown, str(s["n"]), pct(s["accuracy"]), _ci(s["kappa"], s["kappa_interval"]),
                         pct(s["satisfied"]), pct(s["unsatisfied"]), pct(s["balanced"])])  # fmt: skip
        h = e["inter_annotator"]
        rows.append([H, str(h["n"]), pct(h["leave_one_out_accuracy"]), pct(h["leave_one_out_kappa"]), DASH, DASH, DASH])
    return Table(
        "Table 13: Element-level agreement, by polarity",
        ["Evaluator", "n", "Acc.", "κ", "Satisfied", "Unsatisfied", "Balanced"],
        rows,
        note="One decision per object and statement. Affirmative: objects and positive statements; Satisfied / "
        "Unsatisfied: share of the elements the majority marks satisfied / unsatisfied that the evaluator gets "
        "right; Balanced: their mean. κ intervals: bootstrap over images.",
    )


def paper_tables(a: dict[str, Any]) -> list[tuple[str, Table]]:
    """(file stem, table) in the paper's order."""
    return [
        ("table2", table2(a)),
        ("table5", table5(a)),
        ("table6", table6(a)),
        ("table7", table7(a)),
        ("table8", table8(a)),
        ("table10", table10(a)),
        ("table11", _by(a, "by_setting", "Table 11: Kendall τ by polarity setting", setting_label)),
        ("table12", _by(a, "by_category", "Table 12: Kendall τ by semantic category", category_label)),
        ("table13", table13(a)),
    ]


def render_paper_html(a: dict[str, Any], tables: list[tuple[str, Table]]) -> str:
    e = html.escape
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>NegT2IBench agreement study</title><style>{CSS}</style></head><body>",
        "<h1>NegT2IBench agreement study</h1>",
        f"<p class='note'>Generated by {e(a.get('generated_by', 'negt2i agreement'))}; {a['images']} images, "
        f"{a['annotators_per_image']} annotators per image. Judge scoring: statements of an absent object are "
        f"{e(a.get('judge_scoring', {}).get('absent_objects', 'unsatisfied'))}.</p>",
    ]
    if a.get("warnings"):
        out.append("<div class='warn'><ul>" + "".join(f"<li>{e(w)}</li>" for w in a["warnings"]) + "</ul></div>")
    out += [html_table(t) for _, t in tables]
    out.append("</body></html>")
    return "\n".join(out)


def write_paper_tables(a: dict[str, Any], out: str | Path) -> list[Path]:
    """``agreement.html`` and ``table2.csv`` ... ``table13.csv`` in ``out``; returns the paths."""
    out = Path(out)
    tables = paper_tables(a)
    page = out / "agreement.html"
    page.write_text(render_paper_html(a, tables), encoding="utf-8")
    written = [page]
    for stem, t in tables:
        path = out / f"{stem}.csv"
        with path.open("w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            if t.groups:
                w.writerow([g for g, n in t.groups for _ in range(n)])
            w.writerow(t.columns)
            w.writerows(t.rows)
        written.append(path)
    return written
