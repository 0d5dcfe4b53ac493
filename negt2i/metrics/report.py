"""``negt2i report``: every benchmark number of one or more models, as JSON, CSV, Markdown and one HTML page.

``build_report`` reads each model's results files into one ``BenchmarkState``
per file and merges them (so a model split into shards is scored exactly as
its concatenation), computes the metrics of ``negt2i.metrics.benchmark`` with
the prompt-bootstrap intervals of ``negt2i.metrics.bootstrap``, a Table-3
comparison with the best value per column marked, and paired differences of
every model against the first (or ``baseline``). The report names every
results file (with its SHA-256), rule config and stage model it was computed
from and warns when they disagree. ``write_report`` writes:

- ``report.json``: every number (fractions in [0, 1]; ``null`` where undefined);
- ``table3.csv``, ``accuracy.csv``, ``failures.csv``, ``row_failures.csv``,
  ``dead_zone.csv``, ``paired.csv`` (percentages), and ``inputs.csv`` (results files,
  rule configs, stage models, evaluator versions and warnings behind every table);
- ``report.md`` and ``report.html`` (self-contained: CSS inline, plots as base64 PNG);
- ``plots/*.png``: the same plots as files.
"""

from __future__ import annotations

import base64
import csv
import glob
import hashlib
import html
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from negt2i import __version__
from negt2i.metrics import probes
from negt2i.metrics.benchmark import BenchmarkState, missing_cells
from negt2i.metrics.bootstrap import bootstrap_state, paired_difference
from negt2i.metrics.records import (
    CATEGORY_LABELS,
    CATEGORY_ORDER,
    CAUSES,
    ROW_CLASSES,
    SETTING_ORDER,
    iter_rows,
    setting_label,
)

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
TABLE3_COLUMNS: tuple[str, ...] = (*SETTING_ORDER, *(c.value for c in CATEGORY_ORDER), "overall")


@dataclass(slots=True)
class ModelResults:
    """One model: its name, its results files (sha256, lines) and the merged state."""

    name: str
    files: list[dict[str, Any]]
    state: BenchmarkState


def parse_inputs(specs: Sequence[str]) -> list[tuple[str, list[Path]]]:
    """``NAME=PATH`` or ``PATH`` (name = file stem) arguments -> models in first-seen order.

    A repeated NAME collects several files (shards) into one model; PATH may be a glob pattern.
    """
    order: list[str] = []
    files: dict[str, list[Path]] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or Path(spec).is_file():  # an existing file whose name contains "=" is a PATH
            name, path = Path(spec).stem, spec
        if not name:
            raise ValueError(f"{spec!r}: empty model name (use NAME=PATH)")
        matches = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
        if not matches:
            raise ValueError(f"{spec!r}: no file matches {path!r}")
        for m in matches:
            if not Path(m).is_file():
                raise ValueError(f"{spec!r}: {m} is not a file")
        if name not in files:
            order.append(name)
            files[name] = []
        files[name].extend(Path(m) for m in matches)
    for name, paths in files.items():
        if len(set(paths)) != len(paths):
            raise ValueError(f"model {name!r} lists the same file twice")
    return [(name, files[name]) for name in order]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_model(name: str, paths: Iterable[Path]) -> ModelResults:
    """Score each file on its own and merge the states (exactly equal to scoring the concatenation)."""
    state = BenchmarkState()
    files: list[dict[str, Any]] = []
    for path in paths:
        shard = BenchmarkState.from_rows(iter_rows(path))
        files.append({"path": str(path), "sha256": _sha256(path), "lines": shard.provenance.files[str(path)]})
        state.merge(shard)
    return ModelResults(name, files, state)


def _table3_row(metrics: dict[str, Any]) -> dict[str, float | None]:
    acc = metrics["image_accuracy"]
    row: dict[str, float | None] = {s: acc["by_setting"].get(s) for s in SETTING_ORDER}
    row.update({c.value: acc["by_category"].get(c.value) for c in CATEGORY_ORDER})
    row["overall"] = acc["overall"]
    return row


def _cross_model_warnings(models: Sequence[ModelResults]) -> list[str]:
    out: list[str] = []
    configs = {m.name: sorted(m.state.provenance.configs) for m in models}
    if len({tuple(v) for v in configs.values()}) > 1:
        seen = "; ".join(f"{name}: " + ", ".join(f"{n} ({d})" for n, d in cfgs) for name, cfgs in configs.items())
        out.append(f"models were scored with different rule configs: {seen}")
    stage_models = {m.name: m.state.provenance.stage_models() for m in models}
    stages = sorted({s for v in stage_models.values() for s in v})
    for stage in stages:
        per = {name: tuple(v.get(stage, [])) for name, v in stage_models.items()}
        if len(set(per.values())) > 1:
            seen = "; ".join(f"{name}: {', '.join(v) or 'none'}" for name, v in per.items())
            out.append(f"stage {stage} differs between models: {seen}")
    versions = {m.name: tuple(sorted(m.state.provenance.versions)) for m in models}
    if len(set(versions.values())) > 1:
        out.append("evaluator versions differ: " + "; ".join(f"{n}: {', '.join(v)}" for n, v in versions.items()))
    return out


def _model_warnings(m: ModelResults, metrics: dict[str, Any]) -> list[str]:
    out = m.state.provenance.warnings(m.name)
    missing = missing_cells(m.state)
    if missing:
        shown = ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else "")
        out.append(
            f"{m.name}: {len(missing)} of 48 category x setting cells have no results ({shown}); "
            "aggregates use the cells present"
        )
    counts = metrics["images_per_prompt"]
    if len(counts) > 1:
        mode = max(counts, key=lambda k: counts[k])
        odd = sum(v for k, v in counts.items() if k != mode)
        out.append(f"{m.name}: {odd} prompts do not have {mode} images (images per prompt: {counts})")
    errors = metrics["errors"]
    if errors["lines"]:
        out.append(
            f"{m.name}: {errors['lines']} images could not be judged (error lines, counted as incorrect)"
            + (
                f"; {errors['unplaced']} without a prompt id are left out of every accuracy"
                if errors["unplaced"]
                else ""
            )
        )
    if metrics["unscorable_prompts"]:
        n = len(metrics["unscorable_prompts"])
        out.append(
            f"{m.name}: {n} prompts have no category or setting (no statements, or only error lines); not scored"
        )
    return out


def build_report(
    models: Sequence[ModelResults],
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    baseline: str | None = None,
) -> dict[str, Any]:
    """Every number for ``models`` (see the module docstring); JSON-ready."""
    if not models:
        raise ValueError("no results to report on")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ValueError(f"model names must be unique, got {names}")
    if baseline is not None and baseline not in names:
        raise ValueError(f"baseline {baseline!r} is not one of the models ({', '.join(names)})")
    warnings: list[str] = []
    per_model: dict[str, Any] = {}
    for m in models:
        metrics = m.state.compute()
        metrics["intervals"] = bootstrap_state(m.state, n_resamples=n_resamples, seed=seed, confidence=confidence)
        metrics["missing_cells"] = missing_cells(m.state)
        per_model[m.name] = metrics
        warnings.extend(_model_warnings(m, metrics))
    warnings.extend(_cross_model_warnings(models))

    rows = {name: _table3_row(per_model[name]) for name in names}
    best: dict[str, list[str]] = {}
    for col in TABLE3_COLUMNS:
        vals = {n: v for n, r in rows.items() if (v := r[col]) is not None}
        if vals:
            top = max(vals.values())
            best[col] = [n for n, v in vals.items() if v == top]

    paired: dict[str, Any] = {}
    base = baseline or names[0]
    by_name = {m.name: m for m in models}
    for m in models:
        if m.name == base:
            continue
        diff = paired_difference(
            m.state, by_name[base].state, n_resamples=n_resamples, seed=seed, confidence=confidence
        )
        total = min(len(m.state.prompts), len(by_name[base].state.prompts))
        if diff["prompts"] < total:
            warnings.append(f"{m.name} - {base}: paired on the {diff['prompts']} prompts both were scored on")
        paired[f"{m.name} - {base}"] = {"a": m.name, "b": base, **diff}

    return {
        "generated_by": f"negt2i report (negt2i {__version__})",
        "definitions": {
            "image_accuracy": "cell: correct images / images; category: mean over settings; setting: mean over "
            "categories; overall: mean over the six categories (error lines count as incorrect images)",
            "prompt_accuracy": "cell: share of prompts with at least one correct image; aggregated like image accuracy",
            "intervals": f"{confidence:.0%} percentile bootstrap, {n_resamples} resamples of prompts within each "
            f"category x setting cell, seed {seed}; paired differences use the same resamples for both models",
        },
        "inputs": {
            m.name: {
                "files": m.files,
                **m.state.provenance.to_json(),
            }
            for m in models
        },
        "warnings": warnings,
        "models": per_model,
        "comparison": {"columns": list(TABLE3_COLUMNS), "rows": rows, "best": best},
        "paired": paired,
        "baseline": base if len(models) > 1 else None,
    }


# ----------------------------------------------------------------------------- tables


@dataclass(slots=True)
class Table:
    """A rendered table: string cells, optional column groups (label, span), bold cells (row, col)."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    groups: list[tuple[str, int]] | None = None
    bold: set[tuple[int, int]] = field(default_factory=set)
    note: str = ""


def category_label(category: str) -> str:
    """Table 3's short column name of a category (the name itself when unknown)."""
    return CATEGORY_LABELS.get(category, category)


def pct(v: float | None, digits: int = 1) -> str:
    """A fraction as a percentage string, ``-`` for missing / undefined."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{100 * v:.{digits}f}"


def pct_ci(v: float | None, ci: Sequence[float] | None) -> str:
    if ci is None or v is None:
        return pct(v)
    return f"{pct(v)} [{pct(ci[0])}, {pct(ci[1])}]"


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


def model_tables(name: str, m: dict[str, Any]) -> list[Table]:
    """Per-model tables: accuracy with intervals, cells, failures, row classes, dead zones."""
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
    dz = m["dead_zone"]
    out.append(
        Table(
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
    )
    return out


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
                _pts(d["overall"], iv["overall"]),
                *(_pts(d["by_category"].get(c.value), iv["by_category"].get(c.value)) for c in CATEGORY_ORDER),
            ]
        )
    return Table(
        "Paired differences in image accuracy (points, with intervals from the same prompt resamples)",
        ["Models", "Prompts", "Overall", *(CATEGORY_LABELS[c.value] for c in CATEGORY_ORDER)],
        rows,
    )


def _pts(v: float | None, ci: Sequence[float] | None) -> str:
    if v is None:
        return "-"
    s = f"{100 * v:+.1f}"
    return s if ci is None else f"{s} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"


def all_tables(report: dict[str, Any]) -> list[Table]:
    tables = [table3(report)]
    p = paired_table(report)
    if p is not None:
        tables.append(p)
    for name, m in report["models"].items():
        tables.extend(model_tables(name, m))
    return tables


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


# ----------------------------------------------------------------------------- writers


def _clean(obj: Any) -> Any:
    """JSON-safe: NaN / inf -> null, tuples -> lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def write_json(data: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(_clean(data), indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")


def markdown_table(t: Table) -> str:
    def cell(i: int, j: int, v: str) -> str:
        v = v.replace("|", "\\|")
        return f"**{v}**" if (i, j) in t.bold else v

    lines = [f"### {t.title}", ""]
    if t.groups and any(g for g, _ in t.groups):
        spans = [
            f"{g}: " + ", ".join(t.columns[k] for k in range(start, start + n))
            for g, n, start in _group_starts(t.groups)
            if g
        ]
        text = "Columns: " + "; ".join(spans)
        lines += [text if text.endswith(".") else text + ".", ""]
    lines.append("| " + " | ".join(t.columns) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(t.columns) - 1)) + "|")
    for i, row in enumerate(t.rows):
        lines.append("| " + " | ".join(cell(i, j, v) for j, v in enumerate(row)) + " |")
    if t.note:
        lines += ["", t.note]
    return "\n".join(lines) + "\n"


def _group_starts(groups: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
    out, start = [], 0
    for g, n in groups:
        out.append((g, n, start))
        start += n
    return out


def render_markdown(report: dict[str, Any]) -> str:
    parts = ["# NegT2IBench report", "", f"Generated by {report['generated_by']}.", "", "## Inputs", ""]
    parts += [f"- {line}" for line in inputs_lines(report)]
    parts += ["", "## Warnings", ""]
    parts += [f"- {w}" for w in report["warnings"]] or ["- none: all inputs agree on rule config and stage models."]
    parts += ["", "## Definitions", ""]
    parts += [f"- {k.replace('_', ' ')}: {v}" for k, v in report["definitions"].items()]
    parts += ["", "## Tables", ""]
    parts += [markdown_table(t) for t in all_tables(report)]
    parts.append(probes.markdown(report))  # control / paraphrase sections (negt2i.metrics.probes), if any
    return "\n".join(parts)


CSS = " ".join(
    (
        "body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1200px;",
        "color:#222;padding:0 1rem}h1{font-size:1.6rem}",
        "h2{margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.3rem}h3{font-size:1.05rem;margin-top:1.5rem}",
        "table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0}",
        "th,td{padding:.25rem .5rem;border-bottom:1px solid #eee;text-align:right}",
        "th:first-child,td:first-child{text-align:left}thead th{background:#f5f5f7;border-bottom:2px solid #ccc}",
        "th.group{text-align:center;border-bottom:1px solid #ccc}td.best{font-weight:700;background:#eef6ee}",
        ".warn{background:#fff4e5;border-left:4px solid #f0a020;padding:.5rem 1rem}",
        ".ok{background:#eef6ee;border-left:4px solid #4a4;padding:.5rem 1rem}",
        ".note{color:#666;font-size:.8rem}figure{margin:1rem 0}figure img{max-width:100%}",
        "figcaption{color:#555;font-size:.85rem}code{background:#f5f5f7;padding:0 .2rem}",
    )
)


def html_table(t: Table) -> str:
    e = html.escape
    out = [f"<h3>{e(t.title)}</h3>", "<table><thead>"]
    if t.groups and any(g for g, _ in t.groups):
        out.append("<tr>" + "".join(f'<th class="group" colspan="{n}">{e(g)}</th>' for g, n in t.groups) + "</tr>")
    out.append("<tr>" + "".join(f"<th>{e(c)}</th>" for c in t.columns) + "</tr></thead><tbody>")
    for i, row in enumerate(t.rows):
        cells = "".join(
            f'<td class="best">{e(v)}</td>' if (i, j) in t.bold else f"<td>{e(v)}</td>" for j, v in enumerate(row)
        )
        out.append(f"<tr>{cells}</tr>")
    out.append("</tbody></table>")
    if t.note:
        out.append(f'<p class="note">{e(t.note)}</p>')
    return "\n".join(out)


def render_html(report: dict[str, Any], figures: Sequence[tuple[str, str]] = ()) -> str:
    """The self-contained page; ``figures`` are (caption, base64 PNG) pairs."""
    e = html.escape
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>NegT2IBench report</title><style>{CSS}</style></head><body>",
        "<h1>NegT2IBench report</h1>",
        f"<p class='note'>Generated by {e(report['generated_by'])}.</p>",
    ]
    if report["warnings"]:
        parts.append(
            "<div class='warn'><strong>Warnings</strong><ul>"
            + "".join(f"<li>{e(w)}</li>" for w in report["warnings"])
            + "</ul></div>"
        )
    else:
        parts.append("<div class='ok'>All inputs agree on rule config and stage models.</div>")
    tables = all_tables(report)
    parts.append("<h2>Summary</h2>")
    parts.append(html_table(tables[0]))
    if figures:
        parts.append("<h2>Plots</h2>")
        for caption, b64 in figures:
            parts.append(
                f"<figure><img alt='{e(caption)}' src='data:image/png;base64,{b64}'>"
                f"<figcaption>{e(caption)}</figcaption></figure>"
            )
    parts.append("<h2>Details</h2>")
    parts += [html_table(t) for t in tables[1:]]
    parts.append(
        "<h2>Inputs</h2><ul>" + "".join(f"<li><code>{e(line)}</code></li>" for line in inputs_lines(report)) + "</ul>"
    )
    parts.append(
        "<h2>Definitions</h2><ul>"
        + "".join(
            f"<li><strong>{e(k.replace('_', ' '))}</strong>: {e(v)}</li>" for k, v in report["definitions"].items()
        )
        + "</ul>"
    )
    parts.append(probes.html_section(report))  # control / paraphrase sections (negt2i.metrics.probes), if any
    parts.append("</body></html>")
    return "\n".join(parts)


def _write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for row in rows:
            w.writerow(["" if v is None else (round(100 * v, 4) if isinstance(v, float) else v) for v in row])


def write_csvs(report: dict[str, Any], out: Path) -> list[Path]:
    """The long-format CSVs (percentages rounded to 4 decimals, blank where undefined)."""
    cols = report["comparison"]["columns"]
    written: list[Path] = []

    def emit(name: str, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        path = out / name
        _write_csv(path, header, rows)
        written.append(path)

    def configs(name: str) -> str:
        return " ".join(f"{c['name']}@{c['digest']}" for c in report["inputs"][name]["configs"])

    emit(
        "table3.csv",
        ["model", *cols, "rule_configs"],
        ([n, *(r[c] for c in cols), configs(n)] for n, r in report["comparison"]["rows"].items()),
    )

    def input_rows() -> Iterable[list[Any]]:
        for name, inp in report["inputs"].items():
            for f in inp["files"]:
                yield [name, "results", f["path"], f"sha256:{f['sha256']}", f["lines"]]
            for c in inp["configs"]:
                yield [name, "rule_config", c["name"], f"digest:{c['digest']}", c["lines"]]
            for md in inp["models"]:
                yield [name, "stage_model", md["stage"], md["model"], md["lines"]]
            for v, n in inp["evaluator_versions"].items():
                yield [name, "evaluator", "negt2i", v, n]
        for w in report["warnings"]:
            yield ["", "warning", "", w, ""]

    emit("inputs.csv", ["model", "kind", "name", "detail", "lines"], input_rows())

    def acc_rows() -> Iterable[list[Any]]:
        for name, m in report["models"].items():
            for metric in ("image_accuracy", "prompt_accuracy"):
                agg, iv = m[metric], m["intervals"][metric]
                yield [name, metric, "overall", "", "", agg["overall"], *(iv["overall"] or [None, None])]
                for c, v in agg["by_category"].items():
                    yield [name, metric, "category", c, "", v, *iv["by_category"][c]]
                for s, v in agg["by_setting"].items():
                    yield [name, metric, "setting", "", s, v, *iv["by_setting"][s]]
                for key, v in agg["by_cell"].items():
                    c, s = key.split("/")
                    yield [name, metric, "cell", c, s, v, *iv["by_cell"][key]]

    emit(
        "accuracy.csv",
        ["model", "metric", "scope", "category", "setting", "value_pct", "ci_low_pct", "ci_high_pct"],
        acc_rows(),
    )

    def failure_rows() -> Iterable[list[Any]]:
        for name, m in report["models"].items():
            f = m["failures"]
            for group in ("by_setting", "by_category", "by_setting_polarity"):
                for key, b in f[group].items():
                    for c in CAUSES:
                        yield [name, group.removeprefix("by_"), key, c, b["counts"][c], b["shares"][c]]
            for c in CAUSES:
                yield [name, "overall", "all", c, f["overall"]["counts"][c], f["overall"]["shares"][c]]

    emit("failures.csv", ["model", "group", "key", "cause", "count", "share_pct"], failure_rows())

    def row_rows() -> Iterable[list[Any]]:
        for name, m in report["models"].items():
            r = m["row_failures"]
            for group in ("by_setting", "by_category"):
                for key, b in r[group].items():
                    for c in ROW_CLASSES:
                        yield [name, group.removeprefix("by_"), key, c, b["counts"][c], b["shares"][c]]
            for c in ROW_CLASSES:
                yield [name, "overall", "all", c, r["overall"]["counts"][c], r["overall"]["shares"][c]]

    emit("row_failures.csv", ["model", "group", "key", "class", "count", "share_pct"], row_rows())
    emit(
        "dead_zone.csv",
        [
            "model",
            "category",
            "negated",
            "evaluable",
            "passed",
            "dead_zone_passes",
            "share_of_passes_pct",
            "share_of_all_pct",
        ],
        (
            [
                name,
                k,
                v["total"],
                v["evaluable"],
                v["passed"],
                v["dead_zone_passes"],
                v["share_of_passes"],
                v["share_of_all"],
            ]
            for name, m in report["models"].items()
            for k, v in m["dead_zone"].items()
        ),
    )

    def paired_rows() -> Iterable[list[Any]]:
        for p in report["paired"].values():
            d, iv = p["difference"], p["interval"]
            yield [p["a"], p["b"], p["prompts"], "overall", "all", d["overall"], *(iv["overall"] or [None, None])]
            for scope in ("by_category", "by_setting"):
                for k, v in d[scope].items():
                    yield [p["a"], p["b"], p["prompts"], scope.removeprefix("by_"), k, v, *iv[scope][k]]

    emit(
        "paired.csv",
        ["model_a", "model_b", "prompts", "scope", "key", "difference_pts", "ci_low_pts", "ci_high_pts"],
        paired_rows(),
    )
    written += probes.write_csvs(report, out)  # control / paraphrase tables (negt2i.metrics.probes), if any
    return written


def write_report(report: dict[str, Any], out: str | Path, *, plots: bool = True) -> list[Path]:
    """Write every output into ``out`` (created); returns the paths written. ``plots`` needs matplotlib."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(report, out / "report.json")
    written = [out / "report.json", *write_csvs(report, out)]
    (out / "report.md").write_text(render_markdown(report), encoding="utf-8")
    written.append(out / "report.md")
    figures: list[tuple[str, str]] = []
    if plots:
        from negt2i.metrics import plots as plotting

        (out / "plots").mkdir(exist_ok=True)
        for caption, filename, png in plotting.report_figures(report):
            (out / "plots" / filename).write_bytes(png)
            written.append(out / "plots" / filename)
            figures.append((caption, base64.b64encode(png).decode("ascii")))
    (out / "report.html").write_text(render_html(report, figures), encoding="utf-8")
    written.append(out / "report.html")
    return written
