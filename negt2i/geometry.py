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
        crop = self.crop
        inner = crop.copy()
        inner[1:] &= crop[:-1]
        inner[:-1] &= crop[1:]
        inner[:, 1:] &= crop[:, :-1]
        inner[:, :-1] &= crop[:, 1:]
        inner[[0, -1], :] = False  # the box's edge rows / columns always touch the outside
        inner[:, [0, -1]] = False
        rows, cols = np.nonzero(crop & ~inner)
        out = np.empty((rows.size, 2), dtype=np.float64)
        out[:, 0] = rows + self.row0
        out[:, 1] = cols + self.col0
        return out

    @cached_property
    def tree(self) -> cKDTree:
        """k-d tree over ``boundary_points``."""
        return cKDTree(self.boundary_points)

    @cached_property
    def pyramid(self) -> list[BoolMask]:
        """Occupancy of ``crop`` at cell sizes 32, 8, 4, 2 and 1 px (see ``facing_surface``)."""
        return _pyramid(self)


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
    row_counts = np.count_nonzero(crop, axis=1)
    col_counts = np.count_nonzero(crop, axis=0)
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
    # Lower bound per boundary point of A: its distance to B's bounding box. Query B's
    # boundary tree in order of that bound and stop once no remaining point can be closer.
    pts = a.boundary_points
    dr = np.maximum(np.maximum(b.row0 - pts[:, 0], pts[:, 0] - b.row1), 0.0)
    dc = np.maximum(np.maximum(b.col0 - pts[:, 1], pts[:, 1] - b.col1), 0.0)
    bound = np.hypot(dr, dc)
    order = np.argsort(bound, kind="stable")
    best = math.inf
    for start in range(0, order.size, _GAP_CHUNK):
        chunk = order[start : start + _GAP_CHUNK]
        if bound[chunk[0]] >= best:
            break
        dist, _ = b.tree.query(pts[chunk], k=1, distance_upper_bound=best)
        best = min(best, float(dist.min()))
    return best


_GAP_CHUNK = 64


def mean_radius(a: MaskStats, b: MaskStats) -> float:
    """R = (sqrt(|A|/pi) + sqrt(|B|/pi)) / 2."""
    return (a.radius + b.radius) / 2.0


_SLACK = 1e-9
_CELL_SIZES = (32, 8, 4, 2, 1)
"""Cell sizes of the occupancy pyramid ``facing_surface`` refines through (coarse to pixels)."""


def _pool2(grid: BoolMask) -> BoolMask:
    """2x2 OR-pooling of a grid with even sides."""
    out: BoolMask = grid[0::2, 0::2] | grid[1::2, 0::2]
    out |= grid[0::2, 1::2]
    out |= grid[1::2, 1::2]
    return out


def _pyramid(stats: MaskStats) -> list[BoolMask]:
    """Occupancy of the mask's crop at each of ``_CELL_SIZES`` (cells anchored at the box's top-left)."""
    s0 = _CELL_SIZES[0]
    h, w = stats.crop.shape
    padded = np.zeros((-(-h // s0) * s0, -(-w // s0) * s0), dtype=bool)
    padded[:h, :w] = stats.crop
    by_size = {1: padded}
    grid, size = padded, 1
    while size < s0:
        grid, size = _pool2(grid), size * 2
        by_size[size] = grid
    return [by_size[s] for s in _CELL_SIZES]


def _children(rows: NDArray[np.intp], cols: NDArray[np.intp], f: int) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """Grid coordinates of the f x f sub-cells of the given cells."""
    offsets = np.arange(f)
    kr = (rows[:, None, None] * f + offsets[None, :, None]).repeat(f, axis=2).ravel()
    kc = (cols[:, None, None] * f + offsets[None, None, :]).repeat(f, axis=1).ravel()
    return kr, kc


def facing_surface(a: MaskStats, b: MaskStats, limit: float) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """(rows, cols) of F_A = {p in A : d(p, B) <= limit}, d = Euclidean distance to B's nearest pixel.

    Exact and independent of how far apart the masks are. Pixels of A inside B have
    d = 0. For the others d equals D, the distance to B's 4-boundary pixels (the
    nearest pixel of B to an outside point is always on its boundary), and D is
    1-Lipschitz: a cell of side s whose centre has D > limit + (s - 1) / sqrt(2)
    holds no facing pixel, one with D <= limit - (s - 1) / sqrt(2) only facing
    pixels. Cells of A's occupancy pyramid (32, 8, 4, 2 px) are classified from
    their centres with a k-d tree over B's boundary, undecided cells are split, and
    only the pixels of undecided 2 px cells are measured one by one.
    """
    grids = a.pyramid
    padded = grids[-1]
    cr, cc = np.nonzero(grids[0])
    found_r: list[NDArray[np.intp]] = []
    found_c: list[NDArray[np.intp]] = []
    for level, size in enumerate(_CELL_SIZES):
        if cr.size == 0:
            break
        # a cell's pixels lie within `reach` of its centre; the slack keeps rounding from
        # deciding a cell whose farthest pixel sits exactly at `limit` (exact test: pixels)
        reach = (size - 1) / math.sqrt(2.0) + (_SLACK if size > 1 else 0.0)
        cy = a.row0 + cr * size + (size - 1) / 2
        cx = a.col0 + cc * size + (size - 1) / 2
        # the distance to B's box bounds D from below: cells beyond limit + reach of it are out
        near = (
            np.hypot(
                np.maximum(np.maximum(b.row0 - cy, cy - b.row1), 0.0),
                np.maximum(np.maximum(b.col0 - cx, cx - b.col1), 0.0),
            )
            - reach
            <= limit
        )
        cr, cc, cy, cx = cr[near], cc[near], cy[near], cx[near]
        dist, _ = b.tree.query(np.column_stack((cy, cx)), k=1)
        if size == 1:
            keep = dist <= limit
            found_r.append(cr[keep])
            found_c.append(cc[keep])
            break
        inside = dist + reach <= limit
        if inside.any():  # every pixel of A in these cells faces B
            pr, pc = _children(cr[inside], cc[inside], size)
            occupied = padded[pr, pc]
            found_r.append(pr[occupied])
            found_c.append(pc[occupied])
        unsure = ~inside & (dist - reach <= limit)
        kr, kc = _children(cr[unsure], cc[unsure], size // _CELL_SIZES[level + 1])
        occupied = grids[level + 1][kr, kc]
        cr, cc = kr[occupied], kc[occupied]
    rows = np.concatenate(found_r) if found_r else np.zeros(0, np.intp)
    cols = np.concatenate(found_c) if found_c else np.zeros(0, np.intp)
    # pixels of A inside B (only where the masks overlap) are at distance 0
    r0, r1 = max(a.row0, b.row0), min(a.row1, b.row1)
    c0, c1 = max(a.col0, b.col0), min(a.col1, b.col1)
    if r0 <= r1 and c0 <= c1:
        both = (
            a.crop[r0 - a.row0 : r1 - a.row0 + 1, c0 - a.col0 : c1 - a.col0 + 1]
            & b.crop[r0 - b.row0 : r1 - b.row0 + 1, c0 - b.col0 : c1 - b.col0 + 1]
        )
        orow, ocol = np.nonzero(both)
        if orow.size:
            width = padded.shape[1]
            flat = np.union1d(rows * width + cols, (orow + r0 - a.row0) * width + (ocol + c0 - a.col0))
            rows, cols = np.divmod(flat, width)
    return rows + a.row0, cols + a.col0
