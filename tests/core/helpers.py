"""Tiny hand-built masks and perception records for the rule tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from negt2i.core.perception import AttributeScores, Detections, DisparityMap, ImagePerception, RefinedMasks

H = W = 100


def rect(r0: int, c0: int, h: int, w: int, shape: tuple[int, int] = (H, W)) -> np.ndarray:
    """A bool mask with rows r0..r0+h-1 and columns c0..c0+w-1 set."""
    m = np.zeros(shape, dtype=bool)
    m[r0 : r0 + h, c0 : c0 + w] = True
    return m


def square_at(cy: int, cx: int, size: int = 10, shape: tuple[int, int] = (H, W)) -> np.ndarray:
    """A size x size square with its top-left corner at (cy - size // 2, cx - size // 2)."""
    half = size // 2
    return rect(cy - half, cx - half, size, size, shape)


def perception(
    classes: Sequence[str],
    masks: Sequence[np.ndarray],
    scores: Sequence[float] | None = None,
    *,
    refined: bool = True,
    attributes: Mapping[int, Mapping[str, float]] | None = None,
    answers: Sequence[str] = (),
    disparity: np.ndarray | None = None,
) -> ImagePerception:
    shape = masks[0].shape if masks else (H, W)
    dets = (
        Detections.from_masks(classes, scores if scores is not None else [0.9] * len(classes), masks, shape)
        if classes
        else Detections.empty(shape)
    )
    return ImagePerception(
        detections=dets,
        refined=RefinedMasks(dict(enumerate(masks)), shape) if refined else None,
        attributes=AttributeScores(attributes, tuple(answers)) if attributes is not None else None,
        disparity=DisparityMap(disparity, shape) if disparity is not None else None,
    )
