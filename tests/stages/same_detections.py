"""The detections of one model through two code paths (images batched or one at a time, RF-DETR's optimised or
training graph) compared as float32 allows on any CPU: the same detections, each with its class, its score
and box within float32 tolerance and its mask up to a few pixels; an ordering among near-equal scores, and a
detection whose score sits at a cut (the model's top-K, the prediction floor), compared as float32 allows too.

Why tolerances, and these: the two paths run different float32 kernels. oneDNN and ATen pick kernels,
blocking and reduction order by the CPU's instruction set (SSE4.1, AVX2, AVX-512), the thread count and the
tensor shapes (a batch of 1 or 8), so sums of thousands of float32 products round differently (unit roundoff
6e-8), and the differences grow through the ~50 layers of a network with random weights. Measured, Mask R-CNN
R50-FPN with random weights, batch 1 vs 8: scores up to 1.06e-4 apart (relative) on the machine of issue 46,
1.2e-4 here with ``ONEDNN_MAX_CPU_ISA=SSE41 ATEN_CPU_CAPABILITY=default`` (another CPU, simulated), 4e-5 with
AVX2, 6e-5 on one thread; boxes up to 7e-4 px. ``SCORE_RTOL`` and ``BOX_ATOL_PX`` leave ten times that; a
real difference between the paths (another graph, other preprocessing, rows of another image) moves scores by
1e-2 and more, moves boxes by pixels, or changes the classes, and fails.

Orderings: a product sorts its detections by score, highest first, and breaks exact ties by a fixed rule
(RF-DETR: a stable sort, query then class index; torchvision's NMS: a stable sort by score), so one path is
deterministic. Across paths, two scores closer than their float32 error may swap (RF-DETR with random
weights has hundreds of scores between 0.04 and 0.1, 35 of them under 1e-5 apart), and a detection within
float32 error of the top-K cut or the prediction floor may be kept by one path only; no tie-break can order
values whose rounding differs, so these are compared as sets.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from negt2i.core.perception import Detections

SCORE_RTOL: Final = 1e-3
"""Relative score tolerance between two code paths (the module docstring says why)."""
SCORE_ATOL: Final = 1e-6
"""Absolute score tolerance (scores near 0)."""
BOX_ATOL_PX: Final = 0.01
"""Absolute box tolerance in pixels, on top of ``SCORE_RTOL`` relative to the coordinate."""
MASK_PIXELS: Final = 0.005
"""Largest share of the image's pixels two matched masks may differ by: a pixel flips only where the mask
logit (RF-DETR) or probability (Mask R-CNN) lies within float32 error of the threshold, on the mask's edge."""


def _tol(score: float) -> float:
    return SCORE_ATOL + SCORE_RTOL * abs(score)


def _at_a_cut(score: float, other: Detections, floor: float) -> bool:
    """Whether a detection of this score may be missing from ``other`` by float32 error alone: within tolerance
    of the floor, or of ``other``'s lowest score (the model's top-K cut lies at or below it)."""
    lowest = float(other.scores.min()) if len(other) else floor
    return score <= max(lowest, floor) + 2 * _tol(score)


def assert_same_detections(got: Detections, want: Detections, *, floor: float) -> int:
    """``got`` and ``want`` are the same detections (module docstring); returns how many were matched."""
    assert got.shape_hw == want.shape_hw
    for d in (got, want):  # each path in the product's order: by score, highest first
        assert (np.diff(d.scores) <= 0).all(), d.scores
    free = np.ones(len(got), dtype=bool)
    names = np.asarray(got.class_names, dtype=object)
    matched = 0
    for i, (name, score, box) in enumerate(zip(want.class_names, want.scores, want.xyxy, strict=True)):
        box_tol = BOX_ATOL_PX + SCORE_RTOL * np.abs(box)
        ok = (
            free
            & (names == name)
            & (np.abs(got.scores - score) <= _tol(float(score)))
            & (np.abs(got.xyxy - box) <= box_tol).all(axis=1)
        )
        if not ok.any():
            assert _at_a_cut(float(score), got, floor), f"want[{i}] {name} {score:.6f} {box} has no match in got"
            continue
        j = int(np.flatnonzero(ok)[np.argmin(np.abs(got.xyxy[ok] - box).max(axis=1))])
        free[j] = False
        matched += 1
        flipped = int(np.count_nonzero(got.masks[j] != want.masks[i]))
        assert flipped <= MASK_PIXELS * got.masks[j].size, f"want[{i}] {name}: {flipped} mask pixels differ"
    for j in np.flatnonzero(free):
        score = float(got.scores[j])
        assert _at_a_cut(score, want, floor), f"got[{j}] {got.class_names[j]} {score:.6f} has no match in want"
    return matched
