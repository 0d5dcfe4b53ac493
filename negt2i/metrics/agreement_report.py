"""``negt2i agreement``: run the agreement study and write ``agreement.json``, ``agreement.md`` and CSVs.

Tables follow the paper's Appendix B: image-level agreement (Tables 2, 7, 9),
paired differences (Table 2's Δ, and each judge against NegT2IBench), Kendall's
tau and kappa per setting and per category (Tables 11, 12), element-level
agreement per block (Table 13) and agreement between annotators (Table 5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from negt2i import __version__
from negt2i.metrics.agreement import (
    BLOCKS,
    OURS,
    analyze,
    build_study,
    judge_costs,
    read_judge_runs,
    read_judges,
    read_labels,
)
from negt2i.metrics.benchmark import Provenance
from negt2i.metrics.records import iter_rows, setting_label
from negt2i.metrics.report import sha256_file as _sha256
from negt2i.metrics.report_csv import write_csv as _write_csv
from negt2i.metrics.report_csv import write_json
from negt2i.metrics.report_markdown import markdown_table
from negt2i.metrics.report_tables import Table, category_label, pct

RANK_KEYS: tuple[str, ...] = ("kendall_tau", "spearman_rho", "pair_accuracy")


def _ci(v: float, ci: Sequence[float] | None) -> str:
    return pct(v) if ci is None else f"{pct(v)} [{pct(ci[0])}, {pct(ci[1])}]"


def run_agreement(
    labels: str | Path,
    results: Sequence[str | Path],
    judges: Sequence[str | Path] = (),
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    absent_objects: str = "unsatisfied",
    loo_tie: str = "unsatisfied",
    allow_partial: bool = False,
    ours_cost: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Read the inputs, run ``analyze``, attach provenance (files with SHA-256, configs, stage models) and warnings.

    ``absent_objects``: the judge scoring rule (``negt2i.metrics.agreement.ABSENT_RULES``); ``loo_tie``: the
    leave-one-out tie rule (``LOO_TIES``)."""
    rows = [row for path in results for row in iter_rows(path)]
    provenance = Provenance()
    for row in rows:
        provenance.update(row)
    judge_rows = [j for path in judges for j in read_judges(path)]
    study = build_study(
        read_labels(labels), rows, judge_rows, absent_objects=absent_objects, allow_partial=allow_partial
    )
    out = analyze(study, n_resamples=n_resamples, seed=seed, confidence=confidence, loo_tie=loo_tie)
    out["judge_scoring"] = {"absent_objects": absent_objects}
    qpi = len(study.element_name) / len(study.images)
    out["element_questions_per_image"] = qpi
    out["costs"] = judge_costs(judge_rows, qpi, [r for path in judges for r in read_judge_runs(path)])
    if ours_cost:
        out["costs"][OURS] = dict(ours_cost)
    out["warnings"] = list(out["warnings"]) + provenance.warnings("results")
    out["generated_by"] = f"negt2i agreement (negt2i {__version__})"
    out["inputs"] = {
        "labels": {"path": str(labels), "sha256": _sha256(Path(labels))},
        "results": [{"path": str(p), "sha256": _sha256(Path(p))} for p in results],
        "judges": [{"path": str(p), "sha256": _sha256(Path(p))} for p in judges],
        **provenance.to_json(),
    }
    return out


def agreement_tables(a: dict[str, Any]) -> list[Table]:
    tables: list[Table] = []
    rows = []
    for name, s in a["image_level"].items():
        iv = s["interval"]
        if s["tp"] is None:  # a score-only evaluator: no binary columns (Appendix B.3)
            rows.append([name, str(s["n"]), *(["-"] * 9)] + [_ci(s[k], iv[k]) for k in RANK_KEYS])
            continue
        counts = [str(s[k]) for k in ("tp", "tn", "fp", "fn")]
        rows.append(
            [name, str(s["n"]), _ci(s["kappa"], iv["kappa"]), *(pct(s[k]) for k in ("accuracy", "precision", "recall"))]
            + [*counts, pct(s["called_correct"])]
            + [_ci(s[k], iv[k]) for k in ("kendall_tau", "spearman_rho", "pair_accuracy")]
        )
    h = a["inter_annotator"].get("image")
    if h:
        rows.append(
            ["H. inter-annotator", str(a["images"]), pct(h["kappa"]), pct(h["accuracy"]), *(["-"] * 6)]
            + [pct(h[k]) for k in ("called_correct", "kendall_tau", "spearman_rho", "pair_accuracy")]
        )
    bs = a["bootstrap"]
    tables.append(
        Table(
            "Image-level agreement with the annotator majority (Tables 2, 7, 9)",
            [
                "Evaluator",
                "n",
                "Cohen's κ",
                "Acc.",
                "Prec.",
                "Rec.",
                "TP",
                "TN",
                "FP",
                "FN",
                "Called correct",
                "Kendall τ",
                "Spearman ρ",
                "Pair acc.",
            ],
            rows,
            note=f"Binary label: every element satisfied by the majority of {a['annotators_per_image']} annotators "
            f"(humans accept {pct(a['human_accept_rate'])}%); τ, ρ and pair accuracy against the share of satisfied "
            f"elements. Intervals: {bs['confidence']:.0%} bootstrap over images ({bs['n_resamples']} resamples, "
            f"seed {bs['seed']}). H. inter-annotator: each annotator against the majority of the others, averaged.",
        )
    )
    if a["differences"]:
        drows = []
        for key, d in a["differences"].items():
            drows.append(
                [
                    key,
                    *(
                        _pts(d[k]["value"], d[k]["interval"])
                        for k in ("kappa", "kendall_tau", "spearman_rho", "pair_accuracy")
                    ),
                ]
            )
        tables.append(
            Table(
                "Paired differences (points; intervals from the same image resamples)",
                ["Evaluators", "Δ κ", "Δ τ", "Δ ρ", "Δ pair acc."],
                drows,
            )
        )
    if a["negation_probe"]:
        tables.append(
            Table(
                "Negated-question probe, over negated statements (Table 10)",
                ["Judge", "n", "Flip (%)", "Compl. err.", "Called corr. pos. (%)", "Called corr. neg. (%)"],
                [
                    [
                        j,
                        str(p["n"]),
                        pct(p["flip"]),
                        f"{p['complementarity_error']:.3f}",
                        pct(p["called_correct_pos"]),
                        pct(p["called_correct_neg"]),
                    ]
                    for j, p in a["negation_probe"].items()
                ],
                note="Flip: share of negated statements whose yes / no answer changes between the affirmative and the "
                "negated wording; Compl. err.: mean |p_pos + p_neg - 1|.",
            )
        )
    for key, title, label in (
        ("by_setting", "Agreement by polarity setting: κ / Kendall τ (Table 11)", setting_label),
        ("by_category", "Agreement by category: κ / Kendall τ (Table 12)", category_label),
    ):
        groups = list(a[key])
        names = list(a["image_level"])
        brows = [[name, *(_kt(a[key][g]["evaluators"][name]) for g in groups)] for name in names]
        brows.append(["H. inter-annotator", *(_kt(a[key][g]["inter_annotator"]) for g in groups)])
        brows.append(["n", *(str(a[key][g]["n"]) for g in groups)])
        tables.append(Table(title, ["Evaluator", *(label(g) for g in groups)], brows))
    erows = []
    for block in BLOCKS:
        if block not in a["element_level"]:
            continue
        e = a["element_level"][block]
        for name, s in e["evaluators"].items():
            erows.append(
                [
                    block,
                    name,
                    str(s["n"]),
                    pct(s["accuracy"]),
                    _ci(s["kappa"], s["kappa_interval"]),
                    pct(s["satisfied"]),
                    pct(s["unsatisfied"]),
                    pct(s["balanced"]),
                ]
            )
        h2 = e["inter_annotator"]
        erows.append(
            [
                block,
                "H. inter-annotator",
                str(h2["n"]),
                pct(h2["leave_one_out_accuracy"]),
                pct(h2["leave_one_out_kappa"]),
                "-",
                "-",
                "-",
            ]
        )
    tables.append(
        Table(
            "Element-level agreement by block (Table 13)",
            ["Block", "Evaluator", "n", "Acc.", "κ", "Satisfied", "Unsatisfied", "Balanced"],
            erows,
            note="Satisfied / Unsatisfied: share of the elements the majority marks satisfied / unsatisfied that the "
            "evaluator gets right; Balanced: their mean.",
        )
    )
    arows = []
    for block in BLOCKS:
        if block in a["element_level"]:
            h3 = a["element_level"][block]["inter_annotator"]
            arows.append(
                [block, str(h3["n"]), pct(h3["fleiss_kappa"]), pct(h3["unanimous"]), pct(h3["leave_one_out_kappa"])]
            )
    tables.append(
        Table(
            "Agreement between annotators (Table 5)",
            ["Elements", "n", "Fleiss' κ", "Unanimous", "Leave-one-out κ"],
            arows,
        )
    )
    return tables


def _kt(stats: dict[str, Any]) -> str:
    return f"{pct(stats.get('kappa'))} / {pct(stats.get('kendall_tau'))}"


def _pts(v: float, ci: Sequence[float]) -> str:
    if math.isnan(v):
        return "-"
    return f"{100 * v:+.1f} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"


def render_agreement_markdown(a: dict[str, Any]) -> str:
    parts = ["# NegT2IBench agreement study", "", f"Generated by {a['generated_by']}.", "", "## Inputs", ""]
    inp = a["inputs"]
    parts.append(f"- labels: {inp['labels']['path']} (sha256 {inp['labels']['sha256'][:16]})")
    parts += [f"- results: {r['path']} (sha256 {r['sha256'][:16]})" for r in inp["results"]]
    parts += [f"- judges: {j['path']} (sha256 {j['sha256'][:16]})" for j in inp["judges"]]
    parts += [f"- rule config {c['name']} (digest {c['digest']}, {c['lines']} lines)" for c in inp["configs"]]
    parts += [f"- {m['stage']}: {m['model']} ({m['lines']} lines)" for m in inp["models"]]
    rule = a.get("judge_scoring", {}).get("absent_objects", "unsatisfied")
    parts.append(
        f"- judge scoring: statements of an object the judge calls absent are {rule}"
        + (" (Appendix B.2)" if rule == "unsatisfied" else " (scored on their own: success by omission)")
    )
    tie = a.get("leave_one_out_tie", "unsatisfied")
    parts.append(f"- leave-one-out ties (a 1-1 split of the other two annotators) count as {tie}")
    parts += ["", "## Warnings", ""]
    parts += [f"- {w}" for w in a["warnings"]] or ["- none"]
    parts += ["", "## Tables", ""]
    parts += [markdown_table(t) for t in agreement_tables(a)]
    return "\n".join(parts)


def write_agreement(a: dict[str, Any], out: str | Path) -> list[Path]:
    """``agreement.json``, ``agreement.md`` and the CSVs (images, elements, inputs) in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(a, out / "agreement.json")
    (out / "agreement.md").write_text(render_agreement_markdown(a), encoding="utf-8")
    keys = (
        "kappa",
        "accuracy",
        "precision",
        "recall",
        "called_correct",
        "kendall_tau",
        "spearman_rho",
        "pair_accuracy",
    )
    _write_csv(
        out / "agreement_images.csv",
        [
            "evaluator",
            "n",
            "tp",
            "tn",
            "fp",
            "fn",
            *(f"{k}_pct" for k in keys),
            "kappa_ci_low_pct",
            "kappa_ci_high_pct",
            "kendall_tau_ci_low_pct",
            "kendall_tau_ci_high_pct",
        ],
        (
            [
                name,
                s["n"],
                s["tp"],
                s["tn"],
                s["fp"],
                s["fn"],
                *(s[k] for k in keys),
                *s["interval"]["kappa"],
                *s["interval"]["kendall_tau"],
            ]
            for name, s in a["image_level"].items()
        ),
    )
    _write_csv(
        out / "agreement_elements.csv",
        [
            "block",
            "evaluator",
            "n",
            "accuracy_pct",
            "kappa_pct",
            "kappa_ci_low_pct",
            "kappa_ci_high_pct",
            "satisfied_pct",
            "unsatisfied_pct",
            "balanced_pct",
        ],
        (
            [
                block,
                name,
                s["n"],
                s["accuracy"],
                s["kappa"],
                *s["kappa_interval"],
                s["satisfied"],
                s["unsatisfied"],
                s["balanced"],
            ]
            for block, e in a["element_level"].items()
            for name, s in e["evaluators"].items()
        ),
    )
    inp = a["inputs"]
    _write_csv(
        out / "agreement_inputs.csv",
        ["kind", "name", "detail", "lines"],
        [
            ["labels", inp["labels"]["path"], f"sha256:{inp['labels']['sha256']}", ""],
            *(["results", r["path"], f"sha256:{r['sha256']}", ""] for r in inp["results"]),
            *(["judges", j["path"], f"sha256:{j['sha256']}", ""] for j in inp["judges"]),
            *(["rule_config", c["name"], f"digest:{c['digest']}", c["lines"]] for c in inp["configs"]),
            *(["stage_model", m["stage"], m["model"], m["lines"]] for m in inp["models"]),
            *(["warning", "", w, ""] for w in a["warnings"]),
        ],
    )
    names = ("agreement.json", "agreement.md", "agreement_images.csv", "agreement_elements.csv", "agreement_inputs.csv")
    from negt2i.metrics.agreement_paper import write_paper_tables

    return [out / n for n in names] + write_paper_tables(a, out)


__all__ = ["OURS", "agreement_tables", "render_agreement_markdown", "run_agreement", "write_agreement"]
