"""Fit rule thresholds on labelled images (Appendix D: "fitted against 140 human-annotated images").

``negt2i calibrate`` re-judges saved perception (``negt2i.core.rejudge``; no model runs) under every point of a
documented grid and keeps, per block of parameters, the point with the best Cohen's kappa against the labels
(``negt2i.core.labels``) on a fit split. Ties are broken toward the paper's value (Table 15): the smallest
sum over the block's parameters of |value - paper| / grid step, then grid order.

Blocks (each fitted on the labelled elements its parameters can change, independently of the others):

=========== ============================================================ ===========================
``--fit``   parameters (default grid: start, stop, step; inclusive)      elements scored
=========== ============================================================ ===========================
detection   ``detection.presence_threshold`` 0.01-0.30 / 0.01,           ``object:I`` (all images)
            ``detection.count_threshold`` 0.05-0.95 / 0.05
relations   directional: ``directional.extent_margin`` 0-0.20 / 0.025,   ``statement:K`` of the
            ``directional.axis_threshold`` 0.30-0.70 / 0.05;             block's category
            proximity: ``proximity.gap_factor`` 0.25-1.50 / 0.05;
            comparative: ``comparative.size_ratio`` 1.00-1.30 / 0.01;
            depth: ``depth.base_margin`` 0-0.15 / 0.01,
            ``depth.separation_slope`` 0-0.30 / 0.05 (facing surfaces)
attributes  color: ``attributes.color_beta`` 0-2 / 0.1;                  ``statement:K`` of color /
            material: ``attributes.material_beta`` 0-2 / 0.1             material prompts
=========== ============================================================ ===========================

``--grid PATH=START:STOP:STEP`` (or ``PATH=V1,V2,...``) replaces a parameter's grid. The labelled images are
split once (``--holdout`` fraction, seeded): the search sees only the fit split; the held-out split reports
kappa and agreement, with percentile bootstrap intervals over images (``negt2i.metrics.bootstrap``), for
the fitted values and for the paper's. Kappa comes from ``negt2i.metrics.stats`` (tested against
``sklearn.metrics.cohen_kappa_score``); it is undefined (reported as null) when labels and decisions are
both constant.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from negt2i import __version__
from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.labels import Labels
from negt2i.core.rejudge import SavedImage, SavedRun, check_config, detector_id, same_detector
from negt2i.core.rules import select_instances
from negt2i.core.verdict import Verdict
from negt2i.core.vocab import Category
from negt2i.metrics.bootstrap import percentile_interval
from negt2i.metrics.stats import binary_scores, confusion, resample_weights

FITS: tuple[str, ...] = ("detection", "relations", "attributes")

GridSpec = tuple[float, float, float]

DEFAULT_GRID: dict[str, GridSpec] = {
    "detection.presence_threshold": (0.01, 0.30, 0.01),
    "detection.count_threshold": (0.05, 0.95, 0.05),
    "directional.extent_margin": (0.0, 0.20, 0.025),
    "directional.axis_threshold": (0.30, 0.70, 0.05),
    "proximity.gap_factor": (0.25, 1.50, 0.05),
    "comparative.size_ratio": (1.00, 1.30, 0.01),
    "depth.base_margin": (0.0, 0.15, 0.01),
    "depth.separation_slope": (0.0, 0.30, 0.05),
    "attributes.color_beta": (0.0, 2.0, 0.1),
    "attributes.material_beta": (0.0, 2.0, 0.1),
}
"""Each parameter's default grid: (start, stop, step), stop included."""


@dataclass(frozen=True)
class Block:
    """Parameters fitted together, on the elements they can change."""

    name: str
    fit: str
    params: tuple[str, ...]
    category: Category | None
    """Only statements of prompts of this category (None: object elements of every image)."""


BLOCKS: tuple[Block, ...] = (
    Block("detection", "detection", ("detection.presence_threshold", "detection.count_threshold"), None),
    Block("directional", "relations", ("directional.extent_margin", "directional.axis_threshold"),
          Category.DIRECTIONAL),
    Block("proximity", "relations", ("proximity.gap_factor",), Category.PROXIMITY),
    Block("comparative", "relations", ("comparative.size_ratio",), Category.COMPARATIVE),
    Block("depth", "relations", ("depth.base_margin", "depth.separation_slope"), Category.DEPTH),
    Block("color", "attributes", ("attributes.color_beta",), Category.COLOR),
    Block("material", "attributes", ("attributes.material_beta",), Category.MATERIAL),
)  # fmt: skip


class CalibrationError(ValueError):
    """Calibration inputs that cannot be used (nothing is written)."""


# --------------------------------------------------------------------------- grids and configs


def grid_values(spec: GridSpec | Sequence[float]) -> tuple[float, ...]:
    """The values of a grid: ``(start, stop, step)`` with stop included, or an explicit list."""
    if isinstance(spec, tuple) and len(spec) == 3 and not isinstance(spec, list):
        start, stop, step = (float(v) for v in spec)
        if step <= 0 or stop < start:
            return ()
        n = math.floor((stop - start) / step + 1e-9) + 1
        return tuple(round(start + k * step, 10) for k in range(n))
    return tuple(float(v) for v in spec)


def parse_grid(text: str) -> tuple[str, tuple[float, ...]]:
    """``PATH=START:STOP:STEP`` or ``PATH=V1,V2,...`` (``--grid``); raises on an unknown path or an empty grid."""
    path, sep, body = text.partition("=")
    path = path.strip()
    if not sep:
        raise CalibrationError(f"--grid {text!r}: expected PATH=START:STOP:STEP or PATH=V1,V2,...")
    if path not in DEFAULT_GRID:
        raise CalibrationError(f"--grid {text!r}: unknown parameter {path!r}; one of {', '.join(DEFAULT_GRID)}")
    try:
        if ":" in body:
            parts = tuple(float(v) for v in body.split(":"))
            if len(parts) != 3:
                raise ValueError
            values = grid_values((parts[0], parts[1], parts[2]))
        else:
            values = tuple(float(v) for v in body.split(",") if v.strip())
    except ValueError:
        raise CalibrationError(f"--grid {text!r}: values must be numbers (START:STOP:STEP or V1,V2,...)") from None
    if not values:
        raise CalibrationError(f"--grid {text!r}: the grid is empty")
    return path, values


def with_values(config: RuleConfig, values: Mapping[str, float], name: str | None = None) -> RuleConfig:
    """``config`` with some constants (``group.field`` paths) replaced; validated like any config."""
    data = config.model_dump()
    for path, v in values.items():
        group, key = path.split(".")
        current = data[group][key]
        data[group][key] = int(v) if isinstance(current, int) and not isinstance(current, bool) else float(v)
    if name is not None:
        data["name"] = name
    return RuleConfig.model_validate(data)


def paper_value(path: str) -> float:
    group, key = path.split(".")
    return float(getattr(getattr(CURRENT, group), key))


# --------------------------------------------------------------------------- scoring


def element_outcomes(verdict: Verdict, elements: Sequence[str]) -> list[bool]:
    """Whether the evaluator satisfies each element: ``object:I`` present with a valid count, ``statement:K``
    passed (the same reading as ``negt2i agreement``)."""
    out: list[bool] = []
    for e in elements:
        kind, _, idx = e.partition(":")
        k = int(idx)
        out.append(verdict.objects[k].ok if kind == "object" else verdict.statements[k].passed)
    return out


def kappa(reference: NDArray[np.bool_], decision: NDArray[np.bool_], weights: ArrayLike | None = None) -> Any:
    """Cohen's kappa, NaN where undefined (p_e = 1: no variation); ``weights`` (n,) or bootstrap counts (B, n)
    give one value per row. ``negt2i.metrics.stats`` (checked against ``sklearn.metrics.cohen_kappa_score``)."""
    if np.asarray(reference).size == 0:
        return float("nan")
    return binary_scores(**confusion(reference, decision, weights))["kappa"]


def agreement(reference: NDArray[np.bool_], decision: NDArray[np.bool_], weights: ArrayLike | None = None) -> Any:
    """The share of elements where decision and reference agree (weighted like ``kappa``)."""
    if np.asarray(reference).size == 0:
        return float("nan")
    return binary_scores(**confusion(reference, decision, weights))["accuracy"]


@dataclass(frozen=True, eq=False)
class Scored:
    """The labelled elements of a set of images, in a fixed order, with their image index."""

    images: list[SavedImage]
    elements: list[list[str]]
    """Per image, the labelled elements a block scores."""
    reference: NDArray[np.bool_]
    image_of: NDArray[np.intp]
    memo: list[dict[Any, list[bool]]] = field(default_factory=list)
    kept: list[list[NDArray[np.float32]]] = field(default_factory=list)

    def decisions(self, config: RuleConfig, *, objects_only: bool) -> NDArray[np.bool_]:
        """Each labelled element's outcome under ``config``. Objects only (presence and counting), an image's
        outcomes depend on the thresholds only through how many of each object's kept scores reach each of
        them (``select_instances`` compares scores with thresholds and nothing else), so the judge runs once
        per distinct count signature of an image (floor, cap and suppression are the base config's)."""
        if objects_only and not self.kept:
            for im in self.images:
                scores = im.perception.detections.scores
                self.kept.append([scores[list(select_instances(im.perception.detections, o.class_name, o.count,
                                                               config).kept)] for o in im.prompt.objects])  # fmt: skip
                self.memo.append({})
        out: list[bool] = []
        det = config.detection
        for k, (im, els) in enumerate(zip(self.images, self.elements, strict=True)):
            if objects_only:
                key = tuple((int((s >= det.presence_threshold).sum()), int((s >= det.count_threshold).sum()))
                            for s in self.kept[k])  # fmt: skip
                if key not in self.memo[k]:
                    self.memo[k][key] = element_outcomes(im.judge(config, objects_only=True), els)
                out += self.memo[k][key]
            else:
                out += element_outcomes(im.judge(config), els)
        return np.asarray(out, dtype=bool)


def scored(images: Sequence[SavedImage], labels: Labels, block: Block) -> Scored:
    """The elements ``block`` is fitted on, for the labelled ``images``."""
    keep: list[SavedImage] = []
    elements: list[list[str]] = []
    ref: list[bool] = []
    owner: list[int] = []
    for im in images:
        if block.category is not None and im.prompt.category is not block.category:
            continue
        kind = "object" if block.category is None else "statement"
        els = sorted(
            (e for (f, e) in labels.elements if f == im.filename and e.startswith(kind + ":")),
            key=lambda e: int(e.partition(":")[2]),
        )
        if not els:
            continue
        owner += [len(keep)] * len(els)
        keep.append(im)
        elements.append(els)
        ref += [labels.elements[(im.filename, e)] for e in els]
    return Scored(keep, elements, np.asarray(ref, dtype=bool), np.asarray(owner, dtype=np.intp))


def summary(
    ref: NDArray[np.bool_],
    dec: NDArray[np.bool_],
    image_of: NDArray[np.intp],
    *,
    n_images: int,
    n_resamples: int,
    seed: int,
    confidence: float,
) -> dict[str, Any]:
    """n, agreement and kappa with percentile bootstrap intervals (images resampled, their elements together)."""
    out: dict[str, Any] = {"n_images": n_images, "n_elements": int(ref.size), "agreement": _num(agreement(ref, dec)),
                           "kappa": _num(kappa(ref, dec))}  # fmt: skip
    if n_resamples > 0 and n_images > 0:
        _, w = resample_weights(n_images, n_resamples, np.random.default_rng(seed))
        ew = w[:, image_of]
        ka = np.asarray(kappa(ref, dec, ew), dtype=np.float64)
        ag = np.asarray(agreement(ref, dec, ew), dtype=np.float64)
        out["kappa_interval"] = [_num(v) for v in percentile_interval(ka, confidence)]
        out["agreement_interval"] = [_num(v) for v in percentile_interval(ag, confidence)]
    return out


def _num(v: Any) -> float | None:
    return None if v is None or not math.isfinite(float(v)) else round(float(v), 6)


# --------------------------------------------------------------------------- the search


@dataclass(frozen=True)
class BlockResult:
    block: Block
    grid: dict[str, tuple[float, ...]]
    fitted: dict[str, float]
    paper: dict[str, float]
    fit_scores: dict[str, Any]
    heldout: dict[str, Any] | None
    candidates: int


def _closeness(values: Mapping[str, float], grid: Mapping[str, Sequence[float]]) -> float:
    total = 0.0
    for path, v in values.items():
        g = sorted(grid[path])
        step = min((b - a for a, b in itertools.pairwise(g) if b > a), default=1.0)
        total += abs(v - paper_value(path)) / step
    return total


def search_block(
    block: Block,
    fit: Scored,
    base: RuleConfig,
    grid: Mapping[str, Sequence[float]],
    *,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[dict[str, float], dict[str, Any], int]:
    """The best grid point of ``block`` on the fit split: (values, its scores, candidates tried)."""
    axes = [tuple(grid[p]) for p in block.params]
    points = list(itertools.product(*axes))
    if not points:
        raise CalibrationError(f"{block.name}: the grid is empty")
    objects_only = block.category is None
    best: tuple[float, float, int] | None = None
    chosen: dict[str, float] = {}
    chosen_scores: dict[str, Any] = {}
    for k, point in enumerate(points):
        values = dict(zip(block.params, point, strict=True))
        try:
            config = with_values(base, values)
        except ValueError as exc:
            raise CalibrationError(f"{block.name}: grid point {values} is not a valid config: {exc}") from None
        dec = fit.decisions(config, objects_only=objects_only)
        kp = float(kappa(fit.reference, dec))
        key = (-(kp if math.isfinite(kp) else -math.inf), _closeness(values, grid), k)
        if best is None or key < best:
            best = key
            chosen = values
            chosen_scores = {"kappa": _num(kp), "agreement": _num(agreement(fit.reference, dec))}
        if progress is not None:
            progress(k + 1, len(points))
    return chosen, chosen_scores, len(points)


@dataclass(frozen=True)
class Calibration:
    """What ``calibrate`` found: the fitted config and the provenance recorded with it."""

    config: RuleConfig
    provenance: dict[str, Any]
    results: list[BlockResult]

    def rules_file(self) -> dict[str, Any]:
        """The rules file: ``RuleConfig.record()`` (what ``--rules`` / ``NEGT2I_RULES`` read) plus ``provenance``."""
        return {**self.config.record(), "provenance": self.provenance}


def split_images(images: Sequence[str], holdout: float, seed: int) -> tuple[set[str], set[str]]:
    """(fit, held-out) filenames: a seeded permutation of the sorted names, the first ``holdout`` share held out."""
    if not 0.0 <= holdout < 1.0:
        raise CalibrationError(f"--holdout must be in [0, 1), got {holdout}")
    names = sorted(images)
    order = np.random.default_rng(seed).permutation(len(names))
    n_out = round(holdout * len(names))
    if holdout > 0 and (n_out == 0 or n_out == len(names)):
        raise CalibrationError(
            f"{len(names)} labelled images cannot be split with --holdout {holdout} (each split needs an image)"
        )
    out = {names[i] for i in order[:n_out]}
    return set(names) - out, out


def base_detector(base_source: str) -> Mapping[str, Any] | None:
    """The detector a rules file was fitted for (its provenance), or None (a preset, or no provenance)."""
    p = Path(base_source)
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    prov = data.get("provenance") if isinstance(data, dict) else None
    det = prov.get("detector") if isinstance(prov, dict) else None
    return det if isinstance(det, dict) else None


def check_detector(run: SavedRun, rules_source: str) -> None:
    """Refuse a rules file fitted for another detector than the one that made the saved perception."""
    det = base_detector(rules_source)
    if det is not None and not same_detector(det, run.detector):
        raise CalibrationError(
            f"rules file {rules_source} was fitted for detector {detector_id(det)}, but the perception comes from "
            f"{run.detector_name}: fit rules for this detector (negt2i calibrate) or use its own rules file"
        )


def calibrate(
    run: SavedRun,
    labels: Labels,
    fits: Sequence[str],
    *,
    base: RuleConfig = CURRENT,
    base_source: str = "current",
    grid: Mapping[str, Sequence[float]] | None = None,
    holdout: float = 0.3,
    seed: int = 0,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    name: str | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> Calibration:
    """Fit ``fits`` (``detection`` / ``relations`` / ``attributes``); see the module docstring."""
    started = time.perf_counter()
    unknown = [f for f in fits if f not in FITS]
    if unknown or not fits:
        raise CalibrationError(f"--fit must name one or more of {', '.join(FITS)}, got {list(fits)}")
    if labels.form == "coco" and set(fits) - {"detection"}:
        raise CalibrationError(
            "COCO object ground truth labels objects only: it can fit detection, not "
            f"{', '.join(sorted(set(fits) - {'detection'}))} (use human element labels)"
        )
    check_detector(run, base_source)
    check_config(run, base)
    full_grid = {p: grid_values(spec) for p, spec in DEFAULT_GRID.items()}
    for p, given in (grid or {}).items():
        full_grid[p] = tuple(given)
    blocks = [b for b in BLOCKS if b.fit in fits]
    if any(b.name == "depth" for b in blocks) and base.depth.rule != "facing_surfaces":
        blocks = [b if b.name != "depth" else Block("depth", "relations", ("depth.base_margin",), Category.DEPTH)
                  for b in blocks]  # fmt: skip
    for b in blocks:
        empty = [p for p in b.params if not full_grid[p]]
        if empty:
            raise CalibrationError(f"the grid of {', '.join(empty)} is empty")
    by_name = {im.filename: im for im in run.images}
    fit_names, out_names = split_images(labels.images, holdout, seed)
    fit_images = [by_name[f] for f in sorted(fit_names)]
    out_images = [by_name[f] for f in sorted(out_names)]
    fitted: dict[str, float] = {}
    results: list[BlockResult] = []
    for b in blocks:
        fit_set = scored(fit_images, labels, b)
        if fit_set.reference.size == 0:
            continue  # no labelled element of this block: its parameters keep the base values
        report: Callable[[int, int], None] | None = None
        if progress is not None:
            report = functools.partial(progress, b.name)
        values, fit_scores, tried = search_block(b, fit_set, base, full_grid, progress=report)
        paper = {p: paper_value(p) for p in b.params}
        paper_fit = fit_set.decisions(with_values(base, paper), objects_only=b.category is None)
        fit_scores = {"fitted": fit_scores, "paper": {"kappa": _num(kappa(fit_set.reference, paper_fit)),
                      "agreement": _num(agreement(fit_set.reference, paper_fit))},
                      "n_images": len(fit_set.images), "n_elements": int(fit_set.reference.size)}  # fmt: skip
        heldout: dict[str, Any] | None = None
        out_set = scored(out_images, labels, b)
        if out_set.reference.size:
            kw: dict[str, Any] = {"n_images": len(out_set.images), "n_resamples": n_resamples, "seed": seed,
                                  "confidence": confidence}  # fmt: skip
            only = b.category is None
            heldout = {
                "fitted": summary(out_set.reference, out_set.decisions(with_values(base, values), objects_only=only),
                                  out_set.image_of, **kw),
                "paper": summary(out_set.reference, out_set.decisions(with_values(base, paper), objects_only=only),
                                 out_set.image_of, **kw),
            }  # fmt: skip
        fitted.update(values)
        results.append(BlockResult(b, {p: tuple(full_grid[p]) for p in b.params}, values, paper, fit_scores,
                                   heldout, tried))  # fmt: skip
    if not results:
        raise CalibrationError(f"the labels have no element that --fit {' '.join(fits)} can be fitted on")
    label = name or f"fitted-{'-'.join(fits)}-{run.detector.get('backend', 'detector')}"
    config = with_values(base, fitted, name=label)
    provenance = {
        "tool": "negt2i calibrate",
        "evaluator_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fit": list(fits),
        "labels": labels.record(),
        "detector": dict(run.detector),
        "perception": run.sources,
        "saved_rules": {"name": run.config.get("name"), "digest": run.config.get("digest")},
        "base": {"source": base_source, "name": base.name, "digest": base.digest()},
        "split": {"seed": seed, "holdout": holdout, "fit_images": len(fit_images), "heldout_images": len(out_images)},
        "bootstrap": {"resamples": n_resamples, "confidence": confidence, "unit": "image"},
        "tie_break": "best kappa, then closest to the paper's values (sum of |value - paper| / step), then grid order",
        "blocks": {
            r.block.name: {
                "params": list(r.block.params),
                "grid": {p: list(v) for p, v in r.grid.items()},
                "candidates": r.candidates,
                "fitted": r.fitted,
                "paper": r.paper,
                "fit_split": r.fit_scores,
                "heldout": r.heldout,
            }
            for r in results
        },
        "seconds": round(time.perf_counter() - started, 3),
    }
    return Calibration(config, provenance, results)


def check_out(out: str | Path) -> None:
    """Refuse an existing ``--out`` that ``negt2i calibrate`` did not write (user data); checked before any work."""
    path = Path(out)
    if path.exists():
        try:
            prior = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            prior = None
        made_here = isinstance(prior, dict) and (prior.get("provenance") or {}).get("tool") == "negt2i calibrate"
        if not made_here:
            raise CalibrationError(f"{path} exists and was not written by negt2i calibrate: not replacing it")


def write_rules(calibration: Calibration, out: str | Path) -> Path:
    """Write the rules file whole (a temporary file renamed into place). An existing file is replaced only when
    it is itself a ``negt2i calibrate`` output; any other file is user data and is refused."""
    path = Path(out)
    check_out(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(calibration.rules_file(), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
