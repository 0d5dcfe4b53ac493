"""``negt2i report``: every benchmark number of one or more models, as JSON, CSV, Markdown and one HTML page.

``build_report`` reads each model's results files into one ``BenchmarkState``
per file and merges them (so a model split into shards is scored exactly as
its concatenation), computes the metrics of ``negt2i.metrics.benchmark`` with
the prompt-bootstrap intervals of ``negt2i.metrics.bootstrap``, the paper's
matched-load polarity comparison (``matched_load``: 1:0 vs 0:1 and 2:0 vs 0:2
per category, with intervals), a Table-3 comparison with the best value per
column marked, and paired differences of every model against the first (or
``baseline``). The report names every results file (with its SHA-256), rule
config and stage model it was computed from and warns when they disagree.

The output formats live in their own modules: ``report_tables`` (the sections
and tables, format-independent), ``report_csv`` (CSVs and JSON),
``report_markdown``, ``report_html`` and ``plots``. ``write_report`` writes:

- ``report.json``: every number (fractions in [0, 1]; ``null`` where undefined);
- ``table3.csv``, ``matched_load.csv``, ``accuracy.csv``, ``failures.csv``, ``row_failures.csv``,
  ``dead_zone.csv``, ``paired.csv`` (percentages), and ``inputs.csv`` (results files,
  rule configs, stage models, evaluator versions and warnings behind every table);
- ``report.md`` and ``report.html`` (self-contained: CSS inline, plots as base64 PNG), with a table of contents;
- ``plots/*.png``: the same plots as files (heatmaps and failure plots named after the model);
- ``.negt2i-report.json``: the files this run wrote, with their SHA-256. A rerun into the same folder
  removes the files the previous run wrote and this one does not (e.g. plots after ``--no-plots``),
  and only those still unchanged since: a file the report did not write is never touched.

The files are made in a staging folder and moved into ``--out`` only when all of them are made: a run
that fails (no matplotlib for the plots, a full disk) leaves no partial report behind.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from negt2i import __version__
from negt2i.metrics.benchmark import BenchmarkState, missing_cells
from negt2i.metrics.bootstrap import bootstrap_state, matched_load, paired_difference
from negt2i.metrics.records import CATEGORY_ORDER, SETTING_ORDER, iter_rows
from negt2i.metrics.report_csv import write_csvs, write_json
from negt2i.metrics.report_html import render_html
from negt2i.metrics.report_markdown import render_markdown
from negt2i.metrics.report_tables import sections, table3
from negt2i.metrics.views import pooled_positive_vs_drop

TABLE3_COLUMNS: tuple[str, ...] = (*SETTING_ORDER, *(c.value for c in CATEGORY_ORDER), "overall")
MANIFEST = ".negt2i-report.json"
"""The list of files a report run wrote (and their SHA-256), in the output folder."""


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
        if not matches:  # a missing input: FileNotFoundError, exit code 2 like every command
            raise FileNotFoundError(f"{spec!r}: no file matches {path!r}")
        for m in matches:
            if not Path(m).is_file():
                raise FileNotFoundError(f"{spec!r}: {m} is not a file")
        if name not in files:
            order.append(name)
            files[name] = []
        files[name].extend(Path(m) for m in matches)
    for name, paths in files.items():
        if len(set(paths)) != len(paths):
            raise ValueError(f"model {name!r} lists the same file twice")
    return [(name, files[name]) for name in order]


def sha256_file(path: Path) -> str:
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
        files.append({"path": str(path), "sha256": sha256_file(path), "lines": shard.provenance.files[str(path)]})
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
            f"{m.name}: {n} prompts have no category or setting (no statements, or only error lines) and no GenEval "
            "task tag; not scored"
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
        metrics["matched_load"] = matched_load(m.state, n_resamples=n_resamples, seed=seed, confidence=confidence)
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
            "matched_load": "per category, image accuracy of the all-positive setting (1:0, 2:0) vs the all-negated "
            "setting of the same load (0:1, 0:2); gap = positive - negated; mean = mean over categories",
            "geneval": "GenEval prompts (tag single_object, two_object, counting, colors, position, color_attr) "
            "grouped by tag: task = correct images / images; overall = mean over the tasks present, as GenEval's "
            "summary_scores.py",
            "polarity_imbalance": "per mixed setting: (failed negated / negated statements) / (failed positive / "
            "positive statements), failures of every cause",
            "positive_vs_drop": "per category Acc(1:0) and drop = Acc(1:0) - Acc(0:1); Spearman rho (scipy) of the "
            "two across categories; cross_model: the same on the models' mean accuracies",
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
        "cross_model": {"positive_vs_drop": pooled_positive_vs_drop(per_model)},
    }


def _previous_outputs(out: Path) -> dict[str, str]:
    """Relative path -> SHA-256 of the files the last report run into ``out`` wrote (empty when none)."""
    try:
        data = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
        files = data["files"]
        return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _remove_stale(out: Path, previous: dict[str, str], written: Iterable[Path]) -> list[Path]:
    """Delete files the previous run wrote, this one did not, and nobody changed since; returns them."""
    now = {p.relative_to(out).as_posix() for p in written}
    removed: list[Path] = []
    root = out.resolve()
    for rel, digest in sorted(previous.items()):
        path = out / rel
        if rel in now or ".." in Path(rel).parts or Path(rel).is_absolute():
            continue
        if path.is_symlink() or not path.is_file() or not path.resolve().is_relative_to(root):
            continue
        if sha256_file(path) != digest:  # changed since the report wrote it: not ours any more
            continue
        path.unlink()
        removed.append(path)
        parent = path.parent
        if parent != out and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
    return removed


def write_report(report: dict[str, Any], out: str | Path, *, plots: bool = True) -> list[Path]:
    """Write every output into ``out`` (created); returns the paths written. ``plots`` needs matplotlib.

    All or nothing: every file is made first in a staging folder, and moved into ``out`` only once all of
    them are made, so a failure on the way (matplotlib missing, a plot that cannot be drawn, a full disk)
    leaves ``out`` as it was (not created when it did not exist) and no half-written report. Files the
    previous run into ``out`` wrote and this one does not are removed (see the module docstring); any other
    file in ``out`` is the user's and is never touched.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} exists and is not a folder")
    staging = Path(tempfile.mkdtemp(prefix=".negt2i-report-", dir=out.parent if out.parent.is_dir() else None))
    written: list[Path] = []
    try:
        names = _render(report, staging, plots=plots)
        blocked = [n for n in names if (out / n).exists() and ((out / n).is_symlink() or not (out / n).is_file())]
        if blocked:  # checked before anything moves: a folder or link where a report file goes
            raise FileExistsError(f"{out}: {', '.join(blocked)} exists and is not a file; nothing was written")
        out.mkdir(parents=True, exist_ok=True)
        previous = _previous_outputs(out)
        for name in names:
            target = out / name
            target.parent.mkdir(exist_ok=True)
            shutil.move(staging / name, target)  # a rename when both are on one filesystem
            written.append(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _remove_stale(out, previous, written)
    manifest = {
        "generated_by": report["generated_by"],
        "files": {p.relative_to(out).as_posix(): sha256_file(p) for p in written},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return written


def _render(report: dict[str, Any], into: Path, *, plots: bool) -> list[str]:
    """Make every output file in the empty folder ``into``; returns their paths relative to it, in order."""
    write_json(report, into / "report.json")
    written = [into / "report.json", *write_csvs(report, into)]
    parts = sections(report)
    (into / "report.md").write_text(render_markdown(report, parts), encoding="utf-8")
    written.append(into / "report.md")
    figures: dict[str, tuple[str, str]] = {}
    if plots:
        from negt2i.metrics import plots as plotting

        (into / "plots").mkdir()
        for caption, filename, png in plotting.report_figures(report):
            (into / "plots" / filename).write_bytes(png)
            written.append(into / "plots" / filename)
            figures[filename] = (caption, base64.b64encode(png).decode("ascii"))
    (into / "report.html").write_text(render_html(report, figures, parts), encoding="utf-8")
    written.append(into / "report.html")
    return [p.relative_to(into).as_posix() for p in written]


__all__ = [
    "MANIFEST",
    "TABLE3_COLUMNS",
    "ModelResults",
    "build_report",
    "load_model",
    "parse_inputs",
    "sha256_file",
    "table3",
    "write_report",
]
