"""The paper's deterministic rules (Appendix C.1, Tables 14-15), as pure functions.

Each relation rule returns the *fired set*: the predicates (paper spelling) that
hold for the ordered pair (A, B). A positive statement passes iff its predicate
is in the set, a negated one iff it is not (``statement_passes``). Directional,
comparative and depth rules have a dead zone where the set is empty; proximity
never does (near and far are complements). A pair with an empty mask is
degenerate and fires nothing.

The public ``*_predicates`` functions return a ``frozenset``; the ``measure_*``
functions return the same set together with every number the decision used,
which verdicts record (the schema is in ``docs/results.md``): each value set
names its ``rule`` and holds the measured quantities *and* the constants, so the
fired set can be recomputed from the record alone. A degenerate pair (an empty
mask) records ``degenerate: 1`` and which mask was empty.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import ndimage

from negt2i.core.config import CURRENT, PREVIOUS, RuleConfig
from negt2i.core.geometry import FacingPair, MaskStats, facing_pairs, facing_surface, gap, mask_stats, mean_radius
from negt2i.core.perception import Detections
from negt2i.core.spec import Polarity
from negt2i.core.vocab import OVER_COUNT_EXEMPT

BoolMask = NDArray[np.bool_]
Number = float | int


@dataclass(frozen=True)
class Measurement:
    """A rule's fired predicate set and the numbers it was decided from."""

    predicates: frozenset[str]
    values: dict[str, Number | str] = field(default_factory=dict)


def _stats(mask: BoolMask | MaskStats) -> MaskStats:
    if isinstance(mask, MaskStats):
        return mask
    arr = np.asarray(mask)
    if arr.ndim != 2 or arr.dtype != np.bool_:
        raise ValueError(f"a mask must be a 2-D bool array (H, W), got dtype {arr.dtype} shape {arr.shape}")
    return mask_stats(arr)


def _degenerate(rule: str, sa: MaskStats, sb: MaskStats) -> Measurement:
    """An empty mask fires nothing; the record says which one was empty."""
    return Measurement(frozenset(), {"rule": rule, "degenerate": 1, "area_a": sa.area, "area_b": sb.area})


def _pair(a: BoolMask | MaskStats, b: BoolMask | MaskStats) -> tuple[MaskStats, MaskStats]:
    sa, sb = _stats(a), _stats(b)
    if sa.shape_hw != sb.shape_hw:
        raise ValueError(f"masks differ in shape: {sa.shape_hw} vs {sb.shape_hw}")
    return sa, sb


# --------------------------------------------------------------------------- directional


def measure_directional(a: BoolMask | MaskStats, b: BoolMask | MaskStats, config: RuleConfig = CURRENT) -> Measurement:
    """Directional rule (GenEval's position rule on refined-mask centroids and extents).

    o = c_A - c_B (x right, y down); o_e = max(|o| - tau * (w_A + w_B, h_A + h_B), 0) * sign(o);
    (d_x, d_y) = o_e / ||o||_2. Fires ``left of`` if d_x < -alpha, ``right of`` if d_x > alpha,
    ``above`` if d_y < -alpha, ``below`` if d_y > alpha. Current: tau = 0.075, alpha = 0.45
    (previous: 0.10, 0.50). Coincident centroids fire nothing.
    """
    sa, sb = _pair(a, b)
    if sa.empty or sb.empty:
        return _degenerate("directional", sa, sb)
    tau = config.directional.extent_margin
    alpha = config.directional.axis_threshold
    ox, oy = sa.cx - sb.cx, sa.cy - sb.cy
    norm = math.hypot(ox, oy)
    ex = max(abs(ox) - tau * (sa.width + sb.width), 0.0) * math.copysign(1.0, ox)
    ey = max(abs(oy) - tau * (sa.height + sb.height), 0.0) * math.copysign(1.0, oy)
    dx = ex / norm if norm > 0 else 0.0
    dy = ey / norm if norm > 0 else 0.0
    fired = set()
    if dx < -alpha:
        fired.add("left of")
    if dx > alpha:
        fired.add("right of")
    if dy < -alpha:
        fired.add("above")
    if dy > alpha:
        fired.add("below")
    values: dict[str, Number | str] = {
        "rule": "directional", "centroid_a_x": sa.cx, "centroid_a_y": sa.cy, "centroid_b_x": sb.cx,
        "centroid_b_y": sb.cy, "width_a": sa.width, "width_b": sb.width, "height_a": sa.height,
        "height_b": sb.height, "offset_x": ox, "offset_y": oy, "center_distance": norm,
        "extent_sum_x": sa.width + sb.width, "extent_sum_y": sa.height + sb.height,
        "dx": dx, "dy": dy, "axis_threshold": alpha, "extent_margin": tau,
    }  # fmt: skip
    return Measurement(frozenset(fired), values)


def directional_predicates(mask_a: BoolMask, mask_b: BoolMask, config: RuleConfig = CURRENT) -> frozenset[str]:
    """Fired directional predicates for (A, B); see ``measure_directional``."""
    return measure_directional(mask_a, mask_b, config).predicates


# --------------------------------------------------------------------------- proximity


def measure_proximity(
    a: BoolMask | MaskStats, b: BoolMask | MaskStats, config: RuleConfig = CURRENT, *, measured_gap: float | None = None
) -> Measurement:
    """Proximity rule: ``near`` iff g < gamma * R, ``far from`` iff g >= gamma * R.

    g = minimum distance between pixel centres of the masks (0 if they overlap),
    R = (sqrt(|A|/pi) + sqrt(|B|/pi)) / 2, gamma = 0.75 (previous: 0.50). Exactly one
    predicate fires for every pair of non-empty masks. ``measured_gap`` is g when the
    caller measured the image's pairs together (``geometry.gaps``; the verdict does).
    """
    sa, sb = _pair(a, b)
    if sa.empty or sb.empty:
        return _degenerate("proximity", sa, sb)
    gamma = config.proximity.gap_factor
    g = gap(sa, sb) if measured_gap is None else measured_gap
    r = mean_radius(sa, sb)
    fired = "near" if g < gamma * r else "far from"
    values: dict[str, Number | str] = {
        "rule": "proximity", "area_a": sa.area, "area_b": sb.area,
        "gap": g, "radius": r, "threshold": gamma * r, "gap_factor": gamma,
    }  # fmt: skip
    return Measurement(frozenset({fired}), values)


def proximity_predicates(mask_a: BoolMask, mask_b: BoolMask, config: RuleConfig = CURRENT) -> frozenset[str]:
    """Fired proximity predicate for (A, B); see ``measure_proximity``."""
    return measure_proximity(mask_a, mask_b, config).predicates


# --------------------------------------------------------------------------- comparative


def measure_comparative(a: BoolMask | MaskStats, b: BoolMask | MaskStats, config: RuleConfig = CURRENT) -> Measurement:
    """Comparative rule on mask area a and vertical extent h, with rho = 1.05 (previous: 1.15).

    ``bigger than`` iff a_A > rho a_B; ``smaller than`` iff a_B > rho a_A;
    ``taller than`` iff h_A > rho h_B; ``shorter than`` iff h_B > rho h_A.
    Pairs within the factor fire nothing on that axis (the dead zone).
    """
    sa, sb = _pair(a, b)
    if sa.empty or sb.empty:
        return _degenerate("comparative", sa, sb)
    rho = config.comparative.size_ratio
    fired = set()
    if sa.area > rho * sb.area:
        fired.add("bigger than")
    if sb.area > rho * sa.area:
        fired.add("smaller than")
    if sa.height > rho * sb.height:
        fired.add("taller than")
    if sb.height > rho * sa.height:
        fired.add("shorter than")
    values: dict[str, Number | str] = {
        "rule": "comparative", "area_a": sa.area, "area_b": sb.area, "area_ratio": sa.area / sb.area,
        "height_a": sa.height, "height_b": sb.height, "height_ratio": sa.height / sb.height,
        "size_ratio": rho,
    }  # fmt: skip
    return Measurement(frozenset(fired), values)


def comparative_predicates(mask_a: BoolMask, mask_b: BoolMask, config: RuleConfig = CURRENT) -> frozenset[str]:
    """Fired comparative predicates for (A, B); see ``measure_comparative``."""
    return measure_comparative(mask_a, mask_b, config).predicates


# --------------------------------------------------------------------------- depth


def measure_depth(
    a: BoolMask | MaskStats,
    b: BoolMask | MaskStats,
    disparity: NDArray[np.floating],
    config: RuleConfig = CURRENT,
    *,
    disparity_range: float | None = None,
    facing: FacingPair | None = None,
) -> Measurement:
    """Depth rule on facing surfaces with coupled confidence (Table 15).

    F_A = {p in A : d(p, B) <= g + w}, F_B likewise, w = 16 px; mean disparities
    delta_A, delta_B over F_A, F_B; Delta = max - min of the image's disparity. A
    predicate fires only if |delta_A - delta_B| / Delta >= beta0 + beta1 * g / R
    (beta0 = 0.05, beta1 = 0.10): ``in front of`` if delta_A > delta_B, ``behind``
    if delta_A < delta_B. Larger disparity is closer to the camera.

    ``facing`` is the pair's ``geometry.facing_pairs`` result when the caller measured
    several pairs of the image at once (the verdict does); it is computed here otherwise.

    With ``config.depth.rule == "contact_band"`` (the ``previous`` preset) this is
    ``measure_depth_contact_band`` instead (``facing`` is not used).
    """
    if config.depth.rule == "contact_band":
        return measure_depth_contact_band(a, b, disparity, config, disparity_range=disparity_range)
    sa, sb = _pair(a, b)
    disp = np.asarray(disparity)
    if disp.shape != sa.shape_hw:
        raise ValueError(f"disparity has shape {disp.shape}, expected (H, W) = {sa.shape_hw}")
    if sa.empty or sb.empty:
        return _degenerate("depth", sa, sb)
    cfg = config.depth
    span = float(disp.max() - disp.min()) if disparity_range is None else float(disparity_range)
    if facing is None:
        facing = facing_pairs([(sa, sb)], cfg.facing_window)[0]
    g, fa, fb = facing.gap, facing.a, facing.b
    r = mean_radius(sa, sb)
    mean_a = float(_values_at(disp, fa).mean(dtype=np.float64))
    mean_b = float(_values_at(disp, fb).mean(dtype=np.float64))
    required = cfg.base_margin + cfg.separation_slope * g / r
    normalized = abs(mean_a - mean_b) / span if span > 0 else 0.0
    fired: set[str] = set()
    if span > 0 and normalized >= required and mean_a != mean_b:
        fired.add("in front of" if mean_a > mean_b else "behind")
    values: dict[str, Number | str] = {
        "rule": "depth", "area_a": sa.area, "area_b": sb.area,
        "disparity_a": mean_a, "disparity_b": mean_b, "disparity_range": span,
        "normalized_difference": normalized, "required_margin": required,
        "gap": g, "radius": r, "facing_pixels_a": int(fa[0].size), "facing_pixels_b": int(fb[0].size),
        "facing_window": cfg.facing_window, "base_margin": cfg.base_margin,
        "separation_slope": cfg.separation_slope,
    }  # fmt: skip
    return Measurement(frozenset(fired), values)


def _values_at(values: NDArray[np.floating], pixels: tuple[NDArray[np.intp], NDArray[np.intp]]) -> NDArray[np.floating]:
    """``values[pixels]`` in the same order (through the flat array when it is contiguous: ~2x faster)."""
    if values.flags.c_contiguous:
        rows, cols = pixels
        picked: NDArray[np.floating] = values.reshape(-1)[rows * values.shape[1] + cols]
        return picked
    return np.asarray(values[pixels])


def rim(stats: MaskStats, width: float) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """(rows, cols) of the rim of a mask: its pixels within ``width`` of a pixel outside it,
    d = Euclidean distance between pixel centres (a pixel on the outline has d = 1; the image's
    edge counts as outside, so an object cut by the border has a rim there too)."""
    if stats.empty:
        return np.zeros(0, np.intp), np.zeros(0, np.intp)
    padded = np.pad(stats.crop, 1)
    dist = ndimage.distance_transform_edt(padded)[1:-1, 1:-1]
    rows, cols = np.nonzero(stats.crop & (dist <= width))
    return rows + stats.row0, cols + stats.col0


def measure_depth_contact_band(
    a: BoolMask | MaskStats,
    b: BoolMask | MaskStats,
    disparity: NDArray[np.floating],
    config: RuleConfig = PREVIOUS,
    *,
    disparity_range: float | None = None,
) -> Measurement:
    """Table 16's previous depth rule, the contact band (``depth.rule = "contact_band"``).

    The paper gives only its name and two constants (band width b = 12 px, at least m = 20 rim or
    contact pixels). This project's reading, where the paper is silent:

    - contact bands K_A = {p in A : d(p, B) <= b}, K_B = {q in B : d(q, A) <= b} (the pixels where
      the objects meet; d as in the current rule, Euclidean distance to the other mask's nearest pixel);
    - if |K_A| >= m and |K_B| >= m the objects are in contact and their depths are compared there
      (``surface = "contact"``); otherwise each object's rim, R_A = {p in A : d(p, not A) <= b}, is
      used (``surface = "rim"``); if a rim has fewer than m pixels too, nothing fires;
    - delta_A, delta_B are the mean disparities over the two surfaces, Delta the image's disparity
      range, and a predicate fires iff |delta_A - delta_B| / Delta >= beta0 (``depth.base_margin``,
      0.05; the previous rule has no separation term): ``in front of`` if delta_A > delta_B,
      ``behind`` if delta_A < delta_B. Larger disparity is closer to the camera.
    """
    sa, sb = _pair(a, b)
    disp = np.asarray(disparity)
    if disp.shape != sa.shape_hw:
        raise ValueError(f"disparity has shape {disp.shape}, expected (H, W) = {sa.shape_hw}")
    if sa.empty or sb.empty:
        return _degenerate("depth", sa, sb)
    cfg = config.depth
    band = float(cfg.band_width if cfg.band_width is not None else 12.0)
    need = int(cfg.min_band_pixels if cfg.min_band_pixels is not None else 20)
    span = float(disp.max() - disp.min()) if disparity_range is None else float(disparity_range)
    ka, kb = facing_surface(sa, sb, band), facing_surface(sb, sa, band)
    contact_a, contact_b = int(ka[0].size), int(kb[0].size)
    surface = "contact"
    fa, fb = ka, kb
    if contact_a < need or contact_b < need:
        surface = "rim"
        fa, fb = rim(sa, band), rim(sb, band)
    pixels_a, pixels_b = int(fa[0].size), int(fb[0].size)
    values: dict[str, Number | str] = {
        "rule": "depth", "depth_rule": "contact_band", "surface": surface, "area_a": sa.area, "area_b": sb.area,
        "contact_pixels_a": contact_a, "contact_pixels_b": contact_b,
        "surface_pixels_a": pixels_a, "surface_pixels_b": pixels_b, "disparity_range": span,
        "band_width": band, "min_band_pixels": need, "base_margin": cfg.base_margin,
    }  # fmt: skip
    if pixels_a < need or pixels_b < need:
        values["too_few_pixels"] = 1
        return Measurement(frozenset(), values)
    mean_a = float(disp[fa].mean(dtype=np.float64))
    mean_b = float(disp[fb].mean(dtype=np.float64))
    normalized = abs(mean_a - mean_b) / span if span > 0 else 0.0
    fired: set[str] = set()
    if span > 0 and normalized >= cfg.base_margin and mean_a != mean_b:
        fired.add("in front of" if mean_a > mean_b else "behind")
    values.update(disparity_a=mean_a, disparity_b=mean_b, normalized_difference=normalized,
                  required_margin=cfg.base_margin)  # fmt: skip
    return Measurement(frozenset(fired), values)


def depth_predicates(
    mask_a: BoolMask, mask_b: BoolMask, disparity: NDArray[np.floating], config: RuleConfig = CURRENT
) -> frozenset[str]:
    """Fired depth predicate for (A, B); see ``measure_depth``."""
    return measure_depth(mask_a, mask_b, disparity, config).predicates


# --------------------------------------------------------------------------- attributes


def attribute_confusion_set(scores: Mapping[str, float], beta: float) -> frozenset[str]:
    """C = {v : s_v >= max_u s_u - beta}; never empty (it holds the top value).

    beta = 0.5 for color (scored with ``gray`` as an extra answer), 0 for material
    (plain top-1, ties kept). Scores are 100 x cosine similarity.
    """
    if not scores:
        raise ValueError("attribute scores are empty")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    top = max(scores.values())
    return frozenset(v for v, s in scores.items() if s >= top - beta)


def statement_passes(predicate: str, fired: frozenset[str], polarity: Polarity) -> bool:
    """Positive: ``predicate in fired``; negated: ``predicate not in fired``."""
    return (predicate in fired) if polarity is Polarity.POSITIVE else (predicate not in fired)


# --------------------------------------------------------------------------- detection


@dataclass(frozen=True)
class InstanceSelection:
    """Which detections of one requested class count (Appendix C.1, detection and counting).

    ``kept``: detections at or above the prediction floor, highest score first, at
    most ``per_class_cap``. ``counted``: kept detections reaching the counting
    threshold, or the single most confident one when none does but the class is
    present (the fallback).
    """

    class_name: str
    requested: int
    kept: tuple[int, ...]
    counted: tuple[int, ...]
    present: bool
    fallback: bool
    top_score: float | None
    exempt: bool

    @property
    def over_count(self) -> bool:
        """More counted instances than requested (``skis`` exempt)."""
        return not self.exempt and len(self.counted) > self.requested

    @property
    def under_count(self) -> bool:
        """Present, but fewer counted instances than requested (only possible for count > 1)."""
        return self.present and len(self.counted) < self.requested


def _suppress(detections: Detections, order: list[int], iou: float) -> list[int]:
    """Greedy box NMS at ``iou`` (only used when a config enables suppression)."""
    keep: list[int] = []
    boxes = detections.xyxy
    for i in order:
        x0, y0, x1, y1 = boxes[i]
        ok = True
        for j in keep:
            u0, v0, u1, v1 = boxes[j]
            iw, ih = max(0.0, min(x1, u1) - max(x0, u0)), max(0.0, min(y1, v1) - max(y0, v0))
            inter = iw * ih
            union = (x1 - x0) * (y1 - y0) + (u1 - u0) * (v1 - v0) - inter
            if union > 0 and inter / union > iou:
                ok = False
                break
        if ok:
            keep.append(i)
    return keep


def select_instances(
    detections: Detections, class_name: str, requested: int = 1, config: RuleConfig = CURRENT
) -> InstanceSelection:
    """Presence and counting for one requested class.

    Kept: score >= floor (0.005), top ``per_class_cap`` (16) by score, no overlap
    suppression at IoU 1.0. Present: some kept score >= 0.03. Counted: kept scores
    >= 0.5; if none and present, the most confident detection alone. Over-count:
    more counted than requested, except for ``skis``.
    """
    cfg = config.detection
    order = [int(i) for i in detections.indices_of(class_name) if detections.scores[i] >= cfg.prediction_floor]
    if cfg.overlap_iou < 1.0:
        order = _suppress(detections, order, cfg.overlap_iou)
    kept = order[: cfg.per_class_cap]
    scores = detections.scores
    present = any(scores[i] >= cfg.presence_threshold for i in kept)
    counted = [i for i in kept if scores[i] >= cfg.count_threshold]
    fallback = False
    if not counted and present:
        counted = kept[:1]
        fallback = True
    return InstanceSelection(
        class_name=class_name,
        requested=requested,
        kept=tuple(kept),
        counted=tuple(counted),
        present=present,
        fallback=fallback,
        top_score=float(scores[kept[0]]) if kept else None,
        exempt=class_name in OVER_COUNT_EXEMPT,
    )


# --------------------------------------------------------------------------- mask refinement


def disk(radius: int) -> BoolMask:
    """A disk structuring element of the given radius: x^2 + y^2 <= r^2."""
    r = int(radius)
    yy, xx = np.mgrid[-r : r + 1, -r : r + 1]
    return np.asarray(xx * xx + yy * yy <= r * r)


def select_by_overlap(candidates: NDArray[np.bool_], reference: BoolMask) -> int:
    """Index of the candidate mask (K, H, W) with the highest IoU with the detector's mask.

    SAM's own confidence is ignored (Appendix C.1); ties go to the earlier candidate.
    """
    cands = np.asarray(candidates, dtype=bool)
    if cands.ndim != 3 or cands.shape[0] == 0 or cands.shape[1:] != reference.shape:
        raise ValueError(f"candidates must be (K, H, W) with K >= 1 and (H, W) = {reference.shape}, got {cands.shape}")
    ref = reference.reshape(1, -1)
    flat = cands.reshape(cands.shape[0], -1)
    inter = (flat & ref).sum(axis=1)
    union = (flat | ref).sum(axis=1)
    iou = np.where(union > 0, inter / np.maximum(union, 1), 0.0)
    return int(np.argmax(iou))


def postprocess_mask(mask: BoolMask, config: RuleConfig = CURRENT) -> BoolMask:
    """Morphological closing with a radius-5 disk, then drop components < 5% of the largest.

    The mask is padded before closing so that objects touching the image border are
    not eroded there. Components are 8-connected; larger disconnected pieces are kept
    (partially occluded objects). Runs on OpenCV (``cv2.dilate`` / ``cv2.erode`` with the
    ``disk`` element, ``cv2.connectedComponents``), only inside the mask's box
    grown by the radius; bit-exact with SciPy's ``binary_closing`` + ``label`` (the
    reference in ``tests/core/test_mask_postprocess.py``).
    """
    arr = np.asarray(mask, dtype=bool)
    if arr.ndim != 2:
        raise ValueError(f"mask must be 2-D (H, W), got shape {arr.shape}")
    stats = mask_stats(arr)
    if stats.empty:
        return arr.copy()
    cv2 = _cv2()
    r = config.masks.closing_radius
    h, w = arr.shape
    r0, r1 = max(stats.row0 - r, 0), min(stats.row1 + r, h - 1)
    c0, c1 = max(stats.col0 - r, 0), min(stats.col1 + r, w - 1)
    crop = arr[r0 : r1 + 1, c0 : c1 + 1].view(np.uint8)
    if r > 0:
        padded = np.pad(crop, r + 1)
        element = disk(r).astype(np.uint8)
        # Dilation then erosion (closing); the padding keeps both away from the array border.
        dilated = cv2.dilate(padded, element, borderType=cv2.BORDER_CONSTANT, borderValue=0)
        eroded = cv2.erode(dilated, element, borderType=cv2.BORDER_CONSTANT, borderValue=0)
        closed = np.ascontiguousarray(eroded[r + 1 : -(r + 1), r + 1 : -(r + 1)])
    else:
        closed = np.ascontiguousarray(crop)
    n, labels = cv2.connectedComponents(closed, connectivity=8, ltype=cv2.CV_32S)
    if n > 2:  # background + more than one component
        sizes = np.bincount(labels.ravel(), minlength=n)[1:]
        keep = np.zeros(n, dtype=bool)
        keep[1:] = sizes >= config.masks.min_component_fraction * sizes.max()
        result = keep[labels]
    else:
        result = closed.astype(bool)
    out = np.zeros_like(arr)
    out[r0 : r1 + 1, c0 : c1 + 1] = result
    return out


def _cv2() -> Any:
    """OpenCV, imported on first use (the ``models`` extra: ``opencv-python-headless``)."""
    try:
        import cv2
    except ModuleNotFoundError:  # pragma: no cover - depends on the installed extras
        raise ModuleNotFoundError(
            "mask post-processing needs OpenCV: from the repository root, pip install '.[demo]' or '.[models]' "
            "(opencv-python-headless)"
        ) from None
    return cv2
