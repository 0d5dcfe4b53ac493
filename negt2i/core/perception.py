"""Frozen, validated records of what the perception stages saw in one image.

Conventions (``docs/design.md``): masks are bool arrays (H, W) at the image's
resolution, x = column, y = row growing downward, boxes ``xyxy`` in pixels.
Arrays are copied and made read-only at construction, so a record cannot change
after it was validated. Every shape error names the expected and actual values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

BoolMask = NDArray[np.bool_]
FloatArray = NDArray[np.float32]


def _frozen(array: NDArray[Any]) -> NDArray[Any]:
    out = np.array(array, copy=True)
    out.flags.writeable = False
    return out


def _check_hw(shape_hw: tuple[int, int]) -> tuple[int, int]:
    if len(shape_hw) != 2 or any(int(v) <= 0 for v in shape_hw):
        raise ValueError(f"shape_hw must be (height, width) with positive sizes, got {shape_hw}")
    return (int(shape_hw[0]), int(shape_hw[1]))


def as_mask(mask: ArrayLike, shape_hw: tuple[int, int], what: str = "mask") -> BoolMask:
    """A read-only bool copy of ``mask``; raises if it is not (H, W) = ``shape_hw``."""
    arr = np.asarray(mask)
    if arr.shape != tuple(shape_hw):
        raise ValueError(f"{what} has shape {arr.shape}, expected (H, W) = {tuple(shape_hw)}")
    if arr.dtype != np.bool_:
        if not np.isin(arr, (0, 1)).all():
            raise ValueError(f"{what} must be boolean (or 0/1), got dtype {arr.dtype} with other values")
        arr = arr.astype(bool)
    return _frozen(arr)


@dataclass(frozen=True, slots=True, eq=False)
class Detections:
    """Detector output for one image, as parallel arrays (N detections).

    ``class_names[i]`` (benchmark spelling), ``scores[i]`` in [0, 1],
    ``xyxy[i]`` = (x0, y0, x1, y1) with x0 <= x1, y0 <= y1, and ``masks[i]`` the
    detector's instance mask (H, W).

    ``class_counts``: for each class a class-filtered detector capped (``DetectItem.max_per_class``),
    how many detections of it the detector had at or above its floor before the cap; ``None`` or a
    class not in it: every detection of the class is here (``candidates``).
    """

    class_names: tuple[str, ...]
    scores: FloatArray
    xyxy: FloatArray
    masks: BoolMask
    shape_hw: tuple[int, int]
    class_counts: Mapping[str, int] | None = None

    def __post_init__(self) -> None:
        hw = _check_hw(self.shape_hw)
        n = len(self.class_names)
        scores = np.asarray(self.scores, dtype=np.float32)
        xyxy = (
            np.asarray(self.xyxy, dtype=np.float32).reshape(-1, 4)
            if n == 0
            else np.asarray(self.xyxy, dtype=np.float32)
        )
        masks = np.asarray(self.masks)
        if n == 0:
            masks = masks.reshape((0, *hw)) if masks.size == 0 else masks
        if scores.shape != (n,):
            raise ValueError(f"scores has shape {scores.shape}, expected ({n},) for {n} class names")
        if xyxy.shape != (n, 4):
            raise ValueError(f"xyxy has shape {xyxy.shape}, expected ({n}, 4)")
        if masks.shape != (n, *hw):
            raise ValueError(f"masks has shape {masks.shape}, expected (N, H, W) = ({n}, {hw[0]}, {hw[1]})")
        if n and (not np.isfinite(scores).all() or scores.min() < 0 or scores.max() > 1):
            raise ValueError("scores must be finite and in [0, 1]")
        if n and (not np.isfinite(xyxy).all() or (xyxy[:, 2] < xyxy[:, 0]).any() or (xyxy[:, 3] < xyxy[:, 1]).any()):
            raise ValueError("xyxy boxes must be finite with x0 <= x1 and y0 <= y1")
        if masks.dtype != np.bool_:
            raise ValueError(f"masks must be bool, got dtype {masks.dtype}")
        object.__setattr__(self, "shape_hw", hw)
        object.__setattr__(self, "class_names", tuple(str(c) for c in self.class_names))
        object.__setattr__(self, "scores", _frozen(scores))
        object.__setattr__(self, "xyxy", _frozen(xyxy))
        object.__setattr__(self, "masks", _frozen(masks))
        if self.class_counts is not None:
            counts = {str(c): int(k) for c, k in self.class_counts.items()}
            for c, k in counts.items():
                have = self.class_names.count(c)
                if k < have:
                    raise ValueError(f"class_counts says {k} detections of {c!r} before the cap, {have} are here")
            object.__setattr__(self, "class_counts", MappingProxyType(dict(sorted(counts.items()))) if counts else None)

    def __len__(self) -> int:
        return len(self.class_names)

    @classmethod
    def empty(cls, shape_hw: tuple[int, int]) -> Detections:
        """No detections in an image of size ``shape_hw``."""
        return cls((), np.zeros(0, np.float32), np.zeros((0, 4), np.float32), np.zeros((0, *shape_hw), bool), shape_hw)

    @classmethod
    def from_masks(
        cls,
        class_names: Sequence[str],
        scores: Sequence[float],
        masks: Sequence[ArrayLike] | NDArray[Any],
        shape_hw: tuple[int, int],
    ) -> Detections:
        """Detections whose boxes are the tight boxes of their masks (handy for tests and tools)."""
        stack = np.asarray(masks, dtype=bool).reshape((len(class_names), *shape_hw))
        boxes = np.array([mask_to_xyxy(m) for m in stack], dtype=np.float32).reshape(-1, 4)
        return cls(tuple(class_names), np.asarray(scores, np.float32), boxes, stack, shape_hw)

    def indices_of(self, class_name: str) -> NDArray[np.intp]:
        """Indices of this class's detections, highest score first (stable on ties)."""
        idx = np.flatnonzero(np.array([c == class_name for c in self.class_names], dtype=bool))
        return idx[np.argsort(-self.scores[idx], kind="stable")]

    def candidates(self, class_name: str) -> int:
        """Detections of ``class_name`` the detector had at or above its floor (before a cap it applied)."""
        counts = self.class_counts or {}
        return counts.get(class_name, self.class_names.count(class_name))

    def select(self, indices: Iterable[int]) -> Detections:
        """A new record with only ``indices`` (in that order)."""
        idx = np.asarray(list(indices), dtype=np.intp)
        return Detections(
            tuple(self.class_names[i] for i in idx), self.scores[idx], self.xyxy[idx], self.masks[idx], self.shape_hw
        )


def mask_to_xyxy(mask: BoolMask) -> tuple[float, float, float, float]:
    """Tight box of a mask in pixel-edge coordinates: (x0, y0, x1 + 1, y1 + 1); zeros if empty."""
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size == 0:
        return (0.0, 0.0, 0.0, 0.0)
    cols = np.flatnonzero(mask.any(axis=0))
    return (float(cols[0]), float(rows[0]), float(cols[-1] + 1), float(rows[-1] + 1))


@dataclass(frozen=True, slots=True, eq=False)
class RefinedMasks:
    """Refined (SAM 2) masks keyed by detection index."""

    masks: Mapping[int, BoolMask]
    shape_hw: tuple[int, int]

    def __post_init__(self) -> None:
        hw = _check_hw(self.shape_hw)
        checked = {int(k): as_mask(v, hw, f"refined mask for detection {k}") for k, v in self.masks.items()}
        object.__setattr__(self, "shape_hw", hw)
        object.__setattr__(self, "masks", MappingProxyType(checked))

    def __contains__(self, index: object) -> bool:
        return index in self.masks

    def __getitem__(self, index: int) -> BoolMask:
        return self.masks[index]


@dataclass(frozen=True, slots=True, eq=False)
class AttributeScores:
    """Attribute scores (100 x cosine similarity) per detection index: value -> score.

    ``answers`` lists the values every instance must be scored for (e.g. the ten
    colors plus gray); a missing or extra value is an error.
    """

    scores: Mapping[int, Mapping[str, float]]
    answers: tuple[str, ...]

    def __post_init__(self) -> None:
        answers = tuple(self.answers)
        if not answers or len(set(answers)) != len(answers):
            raise ValueError(f"answers must be non-empty and unique, got {answers}")
        checked: dict[int, Mapping[str, float]] = {}
        for key, per_value in self.scores.items():
            got = set(per_value)
            if got != set(answers):
                raise ValueError(f"scores for detection {key} cover {sorted(got)}, expected exactly {sorted(answers)}")
            values = {v: float(per_value[v]) for v in answers}
            if not all(np.isfinite(s) for s in values.values()):
                raise ValueError(f"scores for detection {key} must be finite")
            checked[int(key)] = MappingProxyType(values)
        object.__setattr__(self, "answers", answers)
        object.__setattr__(self, "scores", MappingProxyType(checked))

    def __contains__(self, index: object) -> bool:
        return index in self.scores

    def __getitem__(self, index: int) -> Mapping[str, float]:
        return self.scores[index]


@dataclass(frozen=True, slots=True, eq=False)
class DisparityMap:
    """Relative disparity (H, W) at image resolution: larger values are closer to the camera."""

    values: FloatArray
    shape_hw: tuple[int, int]
    value_range: float = field(init=False)

    def __post_init__(self) -> None:
        hw = _check_hw(self.shape_hw)
        arr = np.asarray(self.values, dtype=np.float32)
        if arr.shape != hw:
            raise ValueError(f"disparity has shape {arr.shape}, expected (H, W) = {hw}")
        if not np.isfinite(arr).all():
            raise ValueError("disparity must be finite everywhere")
        object.__setattr__(self, "shape_hw", hw)
        object.__setattr__(self, "values", _frozen(arr))
        object.__setattr__(self, "value_range", float(arr.max() - arr.min()))


@dataclass(frozen=True, slots=True, eq=False)
class ImagePerception:
    """Everything the stages returned for one image; the judge's only input besides the prompt."""

    detections: Detections
    refined: RefinedMasks | None = None
    attributes: AttributeScores | None = None
    disparity: DisparityMap | None = None

    def __post_init__(self) -> None:
        hw = self.detections.shape_hw
        n = len(self.detections)
        for name, part in (("refined", self.refined), ("disparity", self.disparity)):
            if part is not None and part.shape_hw != hw:
                raise ValueError(f"{name} is {part.shape_hw}, but detections are {hw}")
        keys: list[int] = []
        if self.refined is not None:
            keys += list(self.refined.masks)
        if self.attributes is not None:
            keys += list(self.attributes.scores)
        bad = sorted(k for k in keys if not 0 <= k < n)
        if bad:
            raise ValueError(f"refined masks / attribute scores refer to detections {bad}, but there are {n}")

    @property
    def shape_hw(self) -> tuple[int, int]:
        return self.detections.shape_hw
