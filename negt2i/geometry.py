"""Mask measurements the relation rules use, computed on cropped regions.

Conventions (``DESIGN.md``): x = column, y = row (growing downward); centroid =
mean pixel coordinate; extent = max - min + 1 pixels per axis; area = pixel
count; gap = minimum Euclidean distance between pixel centres of two masks (0
when they overlap); R = (sqrt(|A|/pi) + sqrt(|B|/pi)) / 2.

Everything works inside bounding boxes: a mask's statistics are computed once
(``MaskStats``), gaps from boundary pixels with a k-d tree, and distance
transforms only over a window around the other mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import NDArray
from scipy import ndimage
from scipy.spatial import cKDTree

BoolMask = NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class MaskStats:
    """A mask's bounding box (inclusive rows / columns), area, centroid and extents.

    ``crop`` is the mask restricted to its bounding box. An empty mask has
    ``area == 0`` and no meaningful geometry.
    """

    shape_hw: tuple[int, int]
    row0: int
    row1: int
    col0: int
    col1: int
    area: int
    cx: float
    cy: float
    crop: BoolMask

    @property
    def empty(self) -> bool:
        return self.area == 0

    @property
    def width(self) -> int:
        """Horizontal extent: max column - min column + 1."""
        return self.col1 - self.col0 + 1 if self.area else 0

    @property
    def height(self) -> int:
        """Vertical extent: max row - min row + 1."""
        return self.row1 - self.row0 + 1 if self.area else 0

    @property
    def radius(self) -> float:
        """Equivalent-circle radius sqrt(area / pi)."""
        return math.sqrt(self.area / math.pi)

    @cached_property
    def boundary_points(self) -> NDArray[np.float64]:
        """(row, col) of mask pixels with a 4-neighbour outside the mask (or the image)."""
        padded = np.pad(self.crop, 1)
        interior = padded[1:-1, 1:-1] & padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
        rows, cols = np.nonzero(self.crop & ~interior)
        return np.column_stack((rows + self.row0, cols + self.col0)).astype(np.float64)

    @cached_property
    def tree(self) -> cKDTree:
        return cKDTree(self.boundary_points)


def mask_stats(mask: BoolMask) -> MaskStats:
    """Measure a (H, W) bool mask."""
    h, w = mask.shape
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size == 0:
        return MaskStats((h, w), 0, -1, 0, -1, 0, math.nan, math.nan, np.zeros((0, 0), bool))
    r0, r1 = int(rows[0]), int(rows[-1])
    band = mask[r0 : r1 + 1]
    cols = np.flatnonzero(band.any(axis=0))
    c0, c1 = int(cols[0]), int(cols[-1])
    crop = band[:, c0 : c1 + 1]
    row_counts = crop.sum(axis=1)
    col_counts = crop.sum(axis=0)
    area = int(row_counts.sum())
    cy = r0 + float(row_counts @ np.arange(crop.shape[0])) / area
    cx = c0 + float(col_counts @ np.arange(crop.shape[1])) / area
    return MaskStats((h, w), r0, r1, c0, c1, area, cx, cy, crop)


def _overlap(a: MaskStats, b: MaskStats) -> bool:
    r0, r1 = max(a.row0, b.row0), min(a.row1, b.row1)
    c0, c1 = max(a.col0, b.col0), min(a.col1, b.col1)
    if r0 > r1 or c0 > c1:
        return False
    ca = a.crop[r0 - a.row0 : r1 - a.row0 + 1, c0 - a.col0 : c1 - a.col0 + 1]
    cb = b.crop[r0 - b.row0 : r1 - b.row0 + 1, c0 - b.col0 : c1 - b.col0 + 1]
    return bool((ca & cb).any())


def gap(a: MaskStats, b: MaskStats) -> float:
    """g = min over p in A, q in B of ||p - q||_2 (pixel centres); 0 when the masks overlap.

    The closest pair always lies on the two masks' 4-boundaries, so only boundary
    pixels enter the k-d tree query. Raises ``ValueError`` on an empty mask.
    """
    if a.empty or b.empty:
        raise ValueError("gap of an empty mask is undefined")
    if _overlap(a, b):
        return 0.0
    small, large = (a, b) if len(a.boundary_points) <= len(b.boundary_points) else (b, a)
    dist, _ = large.tree.query(small.boundary_points, k=1)
    return float(dist.min())


def mean_radius(a: MaskStats, b: MaskStats) -> float:
    """R = (sqrt(|A|/pi) + sqrt(|B|/pi)) / 2."""
    return (a.radius + b.radius) / 2.0


def facing_surface(a: MaskStats, b: MaskStats, limit: float) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """(rows, cols) of F_A = {p in A : d(p, B) <= limit}, d = Euclidean distance to B's nearest pixel.

    The distance transform of ~B runs on B's bounding box grown by ``limit`` (every
    pixel within ``limit`` of B lies there, and all of B does, so distances in the
    window are exact).
    """
    h, w = a.shape_hw
    m = math.floor(limit) + 1
    r0, r1 = max(b.row0 - m, 0), min(b.row1 + m, h - 1)
    c0, c1 = max(b.col0 - m, 0), min(b.col1 + m, w - 1)
    # A's part of the window
    ar0, ar1 = max(r0, a.row0), min(r1, a.row1)
    ac0, ac1 = max(c0, a.col0), min(c1, a.col1)
    if ar0 > ar1 or ac0 > ac1:
        return np.zeros(0, np.intp), np.zeros(0, np.intp)
    # Shrink the window to what covers both B and A's part of it.
    wr0, wr1 = min(b.row0, ar0), max(b.row1, ar1)
    wc0, wc1 = min(b.col0, ac0), max(b.col1, ac1)
    not_b = np.ones((wr1 - wr0 + 1, wc1 - wc0 + 1), dtype=bool)
    not_b[b.row0 - wr0 : b.row1 - wr0 + 1, b.col0 - wc0 : b.col1 - wc0 + 1] &= ~b.crop
    dist = ndimage.distance_transform_edt(not_b)
    a_part = a.crop[ar0 - a.row0 : ar1 - a.row0 + 1, ac0 - a.col0 : ac1 - a.col0 + 1]
    d_part = dist[ar0 - wr0 : ar1 - wr0 + 1, ac0 - wc0 : ac1 - wc0 + 1]
    rows, cols = np.nonzero(a_part & (d_part <= limit))
    return rows + ar0, cols + ac0
