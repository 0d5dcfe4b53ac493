"""Report sections of the probe sets: negation following (control) and wording robustness (paraphrase).

Inputs are results files (``negt2i evaluate`` / ``submit``) of one model: its main
results on the corpus, and its results on the control set and / or the paraphrase
set (``docs/corpus.md``). Everything is paired by *source prompt*: a control or
paraphrase line's ``source_id`` is the corpus prompt id of the main results.

**Negation following** (control set). For a statement ``k`` of source prompt ``p``
(category ``c``, polarity ``pol``), an image *shows* it when the statement was
evaluated (every object it names present with a valid count) and its outcome is
``holds`` (the value / predicate fired; a dead zone does not show it). Under the
prompt itself the statement is ``statements[k]`` of ``p``'s images; under the
control prompt it is ``probes[k]`` of the control images. With, per source prompt,
``a_p`` = images x statements showing it under the prompt, ``b_p`` = evaluated ones,
and ``c_p`` / ``d_p`` the same under the control, summed over the statements of
that polarity:

- ``rate_prompt = sum_p a_p / sum_p b_p``, ``rate_control = sum_p c_p / sum_p d_p``
  (sums over the source prompts of the category that have both results);
- negated statements: ``effect = rate_control - rate_prompt``: how much less often
  the forbidden value / relation appears because the prompt forbids it
  (0 = the negation is ignored; below 0 = naming the forbidden thing makes it more
  likely);
- positive statements: ``effect = rate_prompt - rate_control``: how much more often
  the required one appears because the prompt asks for it.

**Wording robustness** (paraphrase set). For form ``f``, per source prompt ``p``
with images in both: ``x_p`` correct of ``n_p`` images under ``f`` (error lines
count as incorrect images, as in the benchmark), ``y_p`` of ``m_p`` under the
original wording (the main results). ``accuracy_form = sum x / sum n``,
``accuracy_original = sum y / sum m`` (pooled image accuracy over the same source
prompts), ``difference = accuracy_form - accuracy_original``; per category, for
the positive-only settings (``pos*_neg0``) and those with a negation, and overall.

**Intervals.** Percentile bootstrap over source prompts (``scipy.stats.bootstrap``
with ``paired=True``: each replicate draws source prompts with replacement and
keeps *both* conditions of a drawn prompt, so the difference keeps the pairing),
``n_resamples`` replicates from ``numpy.random.default_rng(seed)``, percentiles as
``negt2i.metrics.bootstrap.percentile_interval`` (replicates whose denominator is
0 are ignored). Each scope resamples its own prompts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray
from scipy import stats as sps

from negt2i.metrics.bootstrap import percentile_interval
from negt2i.metrics.records import CATEGORY_LABELS, CATEGORY_ORDER, ImageRow, iter_rows

POLARITIES: Final[tuple[str, ...]] = ("negated", "positive")

GUIDE_NEGATION: Final[str] = (
    "Negation following compares how often the image shows a statement's value or relation under the prompt "
    "itself and under its control prompt (the same objects, no value, relation or negation). For negated "
    "statements the effect is control minus prompt: how much less often the forbidden thing appears because the "
    "prompt forbids it. 0 means the negation is ignored (a negated statement then passes only as often as the "
    "thing is absent by chance); below 0, naming the forbidden thing makes it more likely, the typical failure "
    "of text encoders that read 'non-red' as 'red'. For positive statements the effect is prompt minus control. "
    "Rates count evaluated statements (all objects present with a valid count); a dead zone does not show the "
    "relation. Intervals resample source prompts, keeping both conditions of each."
)
GUIDE_WORDING: Final[str] = (
    "Wording robustness compares image accuracy on the same source prompts worded in another negation form "
    "with their original wording (the main results). A difference near 0 whose interval covers 0 means the "
    "model is indifferent to the form; a clear negative difference means the form is harder for it. 'with "
    "negation' pools the settings with at least one negated statement, 'positive only' the pos*_neg0 settings, "
    "where only the positive statements were reworded. Intervals resample source prompts, keeping both "
    "wordings of each."
)


class ProbeInputError(ValueError):
    """Probe-set results that cannot be paired (wrong file, no source_id, no common prompts)."""


@dataclass
class Tally:
    """Counts of one (source prompt, statement) under one condition: evaluated images and those showing it."""

    evaluated: int = 0
    shows: int = 0


@dataclass
class _Acc:
    images: int = 0
    correct: int = 0


@dataclass
class ProbeData:
    """What the sections need, read from results rows (see ``read_main`` and friends)."""

    main_statements: dict[tuple[str, int], Tally] = field(default_factory=dict)
    """(prompt id, statement index) -> tally under the prompt."""
    main_polarity: dict[tuple[str, int], str] = field(default_factory=dict)
    main_category: dict[str, str] = field(default_factory=dict)
    main_setting: dict[str, str] = field(default_factory=dict)
    main_accuracy: dict[str, _Acc] = field(default_factory=dict)
    control: dict[tuple[str, int], Tally] = field(default_factory=dict)
    """(source id, probe index) -> tally under the control prompt."""
    control_polarity: dict[tuple[str, int], str] = field(default_factory=dict)
    control_images: int = 0
    paraphrase: dict[tuple[str, str], _Acc] = field(default_factory=dict)
    """(source id, form) -> images and correct images."""
    forms: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _statement_tallies(
    rows: Iterable[tuple[str, Sequence[Any]]],
    tallies: dict[tuple[str, int], Tally],
    polarity: dict[tuple[str, int], str],
) -> None:
    for pid, statements in rows:
        for k, st in enumerate(statements):
            t = tallies.setdefault((pid, k), Tally())
            polarity.setdefault((pid, k), st.polarity)
            if st.evaluated:
                t.evaluated += 1
                t.shows += int(st.outcome == "holds")


def read_main(data: ProbeData, rows: Iterable[ImageRow]) -> None:
    """The main results: per prompt, statement tallies, category, setting and image accuracy."""
    ok: list[tuple[str, Sequence[Any]]] = []
    for row in rows:
        if row.source_id is not None:
            raise ProbeInputError(
                f"{row.where}: a control / paraphrase line (source_id {row.source_id}) among the main results; "
                "pass those with --control / --paraphrase"
            )
        if row.prompt_id is None:
            continue
        acc = data.main_accuracy.setdefault(row.prompt_id, _Acc())
        acc.images += 1
        acc.correct += int(row.correct)
        if row.category is not None:
            data.main_category[row.prompt_id] = row.category
        if row.setting is not None:
            data.main_setting[row.prompt_id] = row.setting
        if row.status == "ok":
            ok.append((row.prompt_id, row.statements))
    _statement_tallies(ok, data.main_statements, data.main_polarity)


def _source_of(rows: list[ImageRow], what: str, data: ProbeData) -> dict[str, tuple[str, str | None]]:
    """prompt id -> (source id, form) learned from the judged lines; error lines are placed through it."""
    out: dict[str, tuple[str, str | None]] = {}
    for row in rows:
        if row.status == "ok" and row.prompt_id is not None:
            if row.source_id is None:
                raise ProbeInputError(f"{row.where}: a {what} results line without source_id; is this a {what} file?")
            out[row.prompt_id] = (row.source_id, row.form)
    unplaced = sum(1 for r in rows if r.status == "error" and (r.prompt_id is None or r.prompt_id not in out))
    if unplaced:
        data.warnings.append(f"{what}: {unplaced} error lines whose prompt has no judged image are left out")
    return out


def read_control(data: ProbeData, rows: Iterable[ImageRow]) -> None:
    """Control results: per (source, probe) tallies (error lines show nothing and are not evaluated)."""
    rows = list(rows)
    _source_of(rows, "control", data)
    ok = []
    for row in rows:
        if row.status == "ok":
            if row.statements:
                raise ProbeInputError(f"{row.where}: a control line has statements; is this a control file?")
            assert row.source_id is not None  # checked by _source_of
            ok.append((row.source_id, row.probes))
    data.control_images += len(rows)
    _statement_tallies(ok, data.control, data.control_polarity)


def read_paraphrase(data: ProbeData, rows: Iterable[ImageRow]) -> None:
    """Paraphrase results: per (source, form) images and correct images (error lines count as incorrect)."""
    rows = list(rows)
    source = _source_of(rows, "paraphrase", data)
    for row in rows:
        placed = source.get(row.prompt_id or "")
        if placed is None:
            continue
        sid, form = placed
        if form is None:
            raise ProbeInputError(f"{row.where}: a paraphrase results line without form; is this a paraphrase file?")
        acc = data.paraphrase.setdefault((sid, form), _Acc())
        acc.images += 1
        acc.correct += int(row.correct)
        if form not in data.forms:
            data.forms.append(form)


def load(main: Sequence[Path], control: Sequence[Path] = (), paraphrase: Sequence[Path] = ()) -> ProbeData:
    """Read one model's results files into ``ProbeData``."""
    data = ProbeData()
    for path in main:
        read_main(data, iter_rows(path))
    for path in control:
        read_control(data, iter_rows(path))
    for path in paraphrase:
        read_paraphrase(data, iter_rows(path))
    return data


# --------------------------------------------------------------------------- statistics


def _ratio(num: NDArray[np.float64], den: NDArray[np.float64], axis: int) -> NDArray[np.float64]:
    n, d = num.sum(axis=axis), den.sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(d > 0, n / np.where(d > 0, d, 1), np.nan)


def paired_rates(
    a: Sequence[int],
    b: Sequence[int],
    c: Sequence[int],
    d: Sequence[int],
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """``r1 = sum a / sum b``, ``r2 = sum c / sum d`` and ``r1 - r2``, with paired percentile-bootstrap intervals.

    One entry per source prompt in each sequence (same order). Intervals are ``None`` with fewer than two
    prompts (nothing to resample).
    """
    arrays = [np.asarray(x, dtype=np.float64) for x in (a, b, c, d)]
    n = len(arrays[0])
    if any(len(x) != n for x in arrays):
        raise ValueError("a, b, c and d need one entry per source prompt each")
    r1 = _ratio(arrays[0], arrays[1], 0)
    r2 = _ratio(arrays[2], arrays[3], 0)
    point = {"r1": float(r1), "r2": float(r2), "difference": float(r1 - r2)}
    intervals: dict[str, list[float] | None] = dict.fromkeys(point)
    if n >= 2:

        def statistic(
            a_: NDArray[np.float64],
            b_: NDArray[np.float64],
            c_: NDArray[np.float64],
            d_: NDArray[np.float64],
            axis: int,
        ) -> NDArray[np.float64]:
            x, y = _ratio(a_, b_, axis), _ratio(c_, d_, axis)
            return np.stack([x, y, x - y])

        res = sps.bootstrap(
            tuple(arrays),
            statistic,
            paired=True,
            vectorized=True,
            n_resamples=n_resamples,
            method="percentile",
            confidence_level=confidence,
            random_state=np.random.default_rng(seed),
        )
        dist = np.asarray(res.bootstrap_distribution)
        for i, key in enumerate(point):
            intervals[key] = percentile_interval(dist[i], confidence)
    return {"prompts": n, **{k: (None if np.isnan(v) else v) for k, v in point.items()}, "interval": intervals}


def negation_following(
    data: ProbeData, *, n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95
) -> list[dict[str, Any]]:
    """One row per (category, polarity), then per polarity over all categories (see the module docstring)."""
    per: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(lambda: {k: [] for k in "abcd"})
    sources = sorted({sid for sid, _ in data.control})
    for sid in sources:
        category = data.main_category.get(sid)
        if category is None:
            continue
        sums: dict[str, list[int]] = {pol: [0, 0, 0, 0, 0] for pol in POLARITIES}  # a b c d statements
        k = 0
        while (sid, k) in data.control:
            main = data.main_statements.get((sid, k))
            ctl = data.control[(sid, k)]
            pol = data.control_polarity[(sid, k)]
            if main is None or data.main_polarity.get((sid, k)) != pol:
                data.warnings.append(f"control: probe {k} of {sid} has no matching statement in the main results")
                break
            s = sums[pol]
            s[0] += main.shows
            s[1] += main.evaluated
            s[2] += ctl.shows
            s[3] += ctl.evaluated
            s[4] += 1
            k += 1
        for pol, s in sums.items():
            if s[4] == 0:
                continue
            for scope in (category, "all"):
                bucket = per[(scope, pol)]
                for key, count in zip("abcd", s[:4], strict=True):
                    bucket[key].append(count)
                bucket.setdefault("statements", []).append(s[4])
    rows: list[dict[str, Any]] = []
    order = [c.value for c in CATEGORY_ORDER] + ["all"]
    for scope in order:
        for pol in POLARITIES:
            if (scope, pol) not in per:
                continue
            v = per[(scope, pol)]
            r = paired_rates(v["a"], v["b"], v["c"], v["d"], n_resamples=n_resamples, seed=seed, confidence=confidence)
            sign = -1.0 if pol == "negated" else 1.0
            effect = None if r["difference"] is None else sign * r["difference"]
            diff_iv = r["interval"]["difference"]
            effect_iv = None if diff_iv is None else sorted(sign * x for x in diff_iv)
            rows.append(
                {
                    "category": scope,
                    "polarity": pol,
                    "prompts": r["prompts"],
                    "statements": sum(v["statements"]),
                    "evaluated_prompt": sum(v["b"]),
                    "evaluated_control": sum(v["d"]),
                    "rate_prompt": r["r1"],
                    "rate_control": r["r2"],
                    "effect": effect,
                    "interval": {
                        "rate_prompt": r["interval"]["r1"],
                        "rate_control": r["interval"]["r2"],
                        "effect": effect_iv,
                    },
                }
            )
    return rows


def wording_robustness(
    data: ProbeData, *, n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95
) -> list[dict[str, Any]]:
    """One row per (form, scope): overall, by category, positive only / with negation (module docstring)."""
    rows: list[dict[str, Any]] = []
    for form in data.forms:
        per: dict[str, dict[str, list[int]]] = defaultdict(lambda: {k: [] for k in "xnym"})
        for (sid, f), acc in sorted(data.paraphrase.items()):
            orig = data.main_accuracy.get(sid)
            if f != form or orig is None or orig.images == 0:
                continue
            category = data.main_category.get(sid, "-")
            setting = data.main_setting.get(sid, "")
            negation = "positive only" if setting.endswith("_neg0") else "with negation"
            for scope in ("overall", category, negation):
                for key, value in zip("xnym", (acc.correct, acc.images, orig.correct, orig.images), strict=True):
                    per[scope][key].append(value)
        order = ["overall", *(c.value for c in CATEGORY_ORDER), "positive only", "with negation"]
        for scope in [s for s in order if s in per]:
            v = per[scope]
            r = paired_rates(v["x"], v["n"], v["y"], v["m"], n_resamples=n_resamples, seed=seed, confidence=confidence)
            rows.append(
                {
                    "form": form,
                    "scope": scope,
                    "prompts": r["prompts"],
                    "images_form": sum(v["n"]),
                    "images_original": sum(v["m"]),
                    "accuracy_form": r["r1"],
                    "accuracy_original": r["r2"],
                    "difference": r["difference"],
                    "interval": {
                        "accuracy_form": r["interval"]["r1"],
                        "accuracy_original": r["interval"]["r2"],
                        "difference": r["interval"]["difference"],
                    },
                }
            )
    return rows


def probe_sections(
    inputs: dict[str, ProbeData],
    files: dict[str, dict[str, list[str]]] | None = None,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """``report["probes"]``: per model, negation following and / or wording robustness, with definitions."""
    models: dict[str, Any] = {}
    warnings: list[str] = []
    for name, data in inputs.items():
        entry: dict[str, Any] = {"files": (files or {}).get(name, {})}
        if data.control:
            nf = negation_following(data, n_resamples=n_resamples, seed=seed, confidence=confidence)
            if not nf:
                raise ProbeInputError(f"{name}: the control results share no source prompt with the main results")
            entry["negation_following"] = nf
        if data.paraphrase:
            wr = wording_robustness(data, n_resamples=n_resamples, seed=seed, confidence=confidence)
            if not wr:
                raise ProbeInputError(f"{name}: the paraphrase results share no source prompt with the main results")
            entry["wording_robustness"] = wr
        warnings.extend(f"{name}: {w}" for w in dict.fromkeys(data.warnings))
        models[name] = entry
    return {
        "definitions": {
            "negation_following": "per source prompt statement: image shows it = evaluated and outcome holds; "
            "rate = images showing / evaluated images, pooled over statements and source prompts; effect = "
            "control - prompt for negated statements, prompt - control for positive ones",
            "wording_robustness": "pooled image accuracy under each form vs the original wording on the same "
            "source prompts; difference = form - original",
            "intervals": f"{confidence:.0%} percentile bootstrap over source prompts (scipy.stats.bootstrap, "
            f"paired), {n_resamples} resamples, seed {seed}",
        },
        "guide": {"negation_following": GUIDE_NEGATION, "wording_robustness": GUIDE_WORDING},
        "models": models,
        "warnings": warnings,
    }


def add_to_report(
    report: dict[str, Any],
    main_files: dict[str, list[Path]],
    control: Sequence[tuple[str, list[Path]]] = (),
    paraphrase: Sequence[tuple[str, list[Path]]] = (),
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> None:
    """Add ``report["probes"]`` for the models given control / paraphrase results (``(name, files)`` pairs,
    ``name`` one of the report's models, whose main results are ``main_files[name]``); warnings join the report's.
    """
    by_model: dict[str, dict[str, list[Path]]] = {}
    for kind, specs in (("control", control), ("paraphrase", paraphrase)):
        for name, paths in specs:
            if name not in main_files:
                raise ProbeInputError(
                    f"--{kind} {name}=...: no model {name!r} among the main results ({', '.join(main_files)}); "
                    "name the probe results after the model they belong to"
                )
            by_model.setdefault(name, {"control": [], "paraphrase": []})[kind].extend(paths)
    if not by_model:
        return
    inputs = {name: load(main_files[name], kinds["control"], kinds["paraphrase"]) for name, kinds in by_model.items()}
    files = {
        name: {kind: [str(p) for p in paths] for kind, paths in kinds.items() if paths}
        for name, kinds in by_model.items()
    }
    section = probe_sections(inputs, files, n_resamples=n_resamples, seed=seed, confidence=confidence)
    report["probes"] = section
    report["warnings"].extend(section["warnings"])


# --------------------------------------------------------------------------- outputs


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def _pts(v: float | None, ci: Sequence[float] | None) -> str:
    if v is None:
        return "-"
    s = f"{100 * v:+.1f}"
    return s if ci is None else f"{s} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"


def _ci(v: float | None, ci: Sequence[float] | None) -> str:
    return _pct(v) if ci is None or v is None else f"{_pct(v)} [{_pct(ci[0])}, {_pct(ci[1])}]"


def _label(scope: str) -> str:
    return CATEGORY_LABELS.get(scope, "All" if scope == "all" else scope)


def tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]], str]]:
    """(title, columns, rows, note) of every probe table (empty when the report has no probe sections)."""
    probes = report.get("probes")
    if not probes:
        return []
    out: list[tuple[str, list[str], list[list[str]], str]] = []
    for name, m in probes["models"].items():
        if "negation_following" in m:
            rows = [
                [
                    _label(r["category"]),
                    r["polarity"],
                    str(r["prompts"]),
                    _ci(r["rate_prompt"], r["interval"]["rate_prompt"]),
                    _ci(r["rate_control"], r["interval"]["rate_control"]),
                    _pts(r["effect"], r["interval"]["effect"]),
                ]
                for r in m["negation_following"]
            ]
            out.append(
                (
                    f"{name}: negation following (% of evaluated statements showing the value / relation)",
                    [
                        "Category",
                        "Statements",
                        "Source prompts",
                        "Under the prompt",
                        "Under the control",
                        "Effect (points)",
                    ],
                    rows,
                    "Negated: effect = control - prompt (0 = negation ignored, below 0 = naming the forbidden thing "
                    "makes it more likely). Positive: effect = prompt - control.",
                )
            )
        if "wording_robustness" in m:
            rows = [
                [
                    r["form"],
                    _label(r["scope"]),
                    str(r["prompts"]),
                    _ci(r["accuracy_form"], r["interval"]["accuracy_form"]),
                    _ci(r["accuracy_original"], r["interval"]["accuracy_original"]),
                    _pts(r["difference"], r["interval"]["difference"]),
                ]
                for r in m["wording_robustness"]
            ]
            out.append(
                (
                    f"{name}: wording robustness (image accuracy %, paired by source prompt)",
                    [
                        "Form",
                        "Scope",
                        "Source prompts",
                        "Form accuracy",
                        "Original accuracy",
                        "Difference (points)",
                    ],
                    rows,
                    "Difference = form - original wording on the same source prompts (docs/corpus.md lists the forms).",
                )
            )
    return out


__all__ = [
    "GUIDE_NEGATION",
    "GUIDE_WORDING",
    "ProbeData",
    "ProbeInputError",
    "add_to_report",
    "load",
    "negation_following",
    "paired_rates",
    "probe_sections",
    "read_control",
    "read_main",
    "read_paraphrase",
    "tables",
    "wording_robustness",
]
