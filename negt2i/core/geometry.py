"""Mask measurements the relation rules use, computed on cropped regions.

Conventions (``docs/design.md``): x = column, y = row (growing downward); centroid =
mean pixel coordinate; extent = max - min + 1 pixels per axis; area = pixel
count; gap = minimum Euclidean distance between pixel centres of two masks (0
when they overlap); R = (sqrt(|A|/pi) + sqrt(|B|/pi)) / 2.

Everything works inside bounding boxes: a mask's statistics are computed once
(``MaskStats``), gaps from boundary pixels with a k-d tree, and facing surfaces
from an occupancy pyramid classified against it (no distance transform).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import NDArray
from scipy.spatial import cKDTree

BoolMask = NDArray[np.bool_]

_TURNS = 64
"""Number of directions of ``MaskStats.support`` (one every 360/64 degrees)."""
_DIRECTIONS = np.column_stack(
    (np.sin(np.arange(_TURNS) * (2 * math.pi / _TURNS)), np.cos(np.arange(_TURNS) * (2 * math.pi / _TURNS)))
)
"""Unit vectors n_k = (sin, cos) of the angles 2 pi k / _TURNS, as (row, col) components."""
_TURN_ROW = np.concatenate((_DIRECTIONS[:, 0], _DIRECTIONS[:, 0], _DIRECTIONS[:1, 0]))
_TURN_COL = np.concatenate((_DIRECTIONS[:, 1], _DIRECTIONS[:, 1], _DIRECTIONS[:1, 1]))
"""n_k's components for k = -_TURNS .. _TURNS, indexed k + _TURNS (the two sides of an angle without a wrap)."""


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
        # interior: the pixel and its four neighbours set; the box's edge rows / columns
        # always touch the outside
        core = crop[1:-1, 1:-1] & crop[:-2, 1:-1]
        core &= crop[2:, 1:-1]
        core &= crop[1:-1, :-2]
        core &= crop[1:-1, 2:]
        inner = np.zeros(crop.shape, dtype=bool)
        inner[1:-1, 1:-1] = core
        rows, cols = _nonzero(crop > inner)
        out = np.empty((rows.size, 2), dtype=np.float64)
        out[:, 0] = rows + self.row0
        out[:, 1] = cols + self.col0
        return out

    @cached_property
    def support(self) -> NDArray[np.float64]:
        """h_k = max over boundary pixels q of n_k . q for the unit vectors ``_DIRECTIONS`` n_k.

        Every pixel of the mask lies in the half-plane n_k . x <= h_k, so for any point c
        n_k . c - h_k <= d(c, mask): lower bounds of distances that need no k-d tree call.
        """
        return self._support_and_points[0]

    @cached_property
    def support_points(self) -> NDArray[np.float64]:
        """(row, col) of a boundary pixel attaining each h_k of ``support``: for a convex mask, about
        the nearest pixel to a point far out in direction n_k (any pixel gives an upper bound)."""
        return self._support_and_points[1]

    @cached_property
    def _support_and_points(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        along = _DIRECTIONS @ self.boundary_points.T
        best = along.argmax(axis=1)
        return along[np.arange(_TURNS), best], self.boundary_points[best]

    @cached_property
    def pyramid(self) -> list[BoolMask]:
        """Occupancy of ``crop`` at cell sizes 32, 8, 4, 2 and 1 px (see ``facing_surface``)."""
        return _pyramid(self)


def _nonzero(grid: BoolMask) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """``np.nonzero`` of a 2-D grid, row-major (the same arrays; NumPy's 2-D path is ~10x slower)."""
    rows, cols = np.divmod(np.flatnonzero(grid), grid.shape[1])
    return rows, cols


def _rows_occupied(mask: BoolMask) -> NDArray[np.bool_]:
    """``mask.any(axis=1)``, eight pixels at a time where the rows allow it."""
    occupied: NDArray[np.bool_]
    if mask.flags.c_contiguous and mask.shape[1] % 8 == 0:
        occupied = np.bitwise_or.reduce(mask.view(np.uint64), axis=1) != 0
    else:
        occupied = np.asarray(mask.any(axis=1))
    return occupied


def mask_stats(mask: BoolMask) -> MaskStats:
    """Measure a (H, W) bool mask."""
    if mask.dtype != np.bool_:
        mask = mask != 0
    h, w = mask.shape
    rows = np.flatnonzero(_rows_occupied(mask))
    if rows.size == 0:
        return MaskStats((h, w), 0, -1, 0, -1, 0, math.nan, math.nan, np.zeros((0, 0), bool))
    r0, r1 = int(rows[0]), int(rows[-1])
    band = mask[r0 : r1 + 1]
    cols = np.flatnonzero(band.any(axis=0))
    c0, c1 = int(cols[0]), int(cols[-1])
    crop = band[:, c0 : c1 + 1]
    pixels = crop.view(np.uint8)
    row_counts = np.add.reduce(pixels, axis=1, dtype=np.int32)
    col_counts = np.add.reduce(pixels, axis=0, dtype=np.int32)
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


class BoundaryIndex:
    """One k-d tree over the 4-boundaries of several masks of one image, for batched queries.

    Each mask's boundary pixels (row, col) are lifted to (row, col, k * spacing) for the
    mask's number k, with ``spacing`` larger than any distance within the image: the
    nearest point of a query (row, col, k * spacing) is then always a pixel of mask k, at
    exactly the in-plane distance (the third coordinates are equal, the squared distances
    of these integer and half-integer coordinates exact). So ``nearest`` answers points
    against different masks with one ``cKDTree.query`` whatever their number: SciPy's fixed
    ~15-45 us per call, not the work per point, dominated the depth rule's queries.
    """

    def __init__(self, masks: list[MaskStats]) -> None:
        unique: dict[int, MaskStats] = {}
        for m in masks:
            if m.empty:
                raise ValueError("a boundary index over an empty mask is undefined")
            unique.setdefault(id(m), m)
        self._slot = {key: k for k, key in enumerate(unique)}
        self._members = list(unique.values())
        self._support: NDArray[np.float64] | None = None  # (mask, direction) raveled
        self._support_points: NDArray[np.float64] | None = None  # (mask * _TURNS + direction, 2)
        self._tree: cKDTree | None = None
        self._points = np.zeros((0, 2))
        height, width = self._members[0].shape_hw if self._members else (0, 0)
        self._spacing = 4.0 * (height + width) + 256.0  # beyond any query's in-plane distance

    def lower_bound(
        self,
        rows: NDArray[np.float64],
        cols: NDArray[np.float64],
        away_rows: NDArray[np.float64],
        away_cols: NDArray[np.float64],
        slots: NDArray[np.intp],
    ) -> NDArray[np.float64]:
        """A lower bound of the distance from each point (row, col) to the boundary of mask ``slots[i]``.

        max over the two directions n_k of ``_DIRECTIONS`` either side of the direction
        (away_rows[i], away_cols[i]) of n_k . p - h_k (``MaskStats.support``): the distance to a
        half-plane that holds the mask. Valid whatever that direction is; close to the distance
        when it points from the nearest boundary pixel to the point (a good choice: from a pixel
        near that one).
        """
        if self._support is None:
            # per mask, the support of directions -K .. K (index + K), so that k and k + 1 need no wrap
            table = np.stack([m.support for m in self._members])
            self._support = np.concatenate((table, table, table[:, :1]), axis=1).ravel()
        span = 2 * _TURNS + 1
        turn = np.floor(np.arctan2(away_rows, away_cols) * (_TURNS / (2 * math.pi))).astype(np.intp) + _TURNS
        best: NDArray[np.float64] = rows * _TURN_ROW[turn] + cols * _TURN_COL[turn] - self._support[slots * span + turn]
        turn += 1
        second = rows * _TURN_ROW[turn] + cols * _TURN_COL[turn] - self._support[slots * span + turn]
        np.maximum(best, second, out=best)
        return best

    def support_point(
        self, away_rows: NDArray[np.float64], away_cols: NDArray[np.float64], slots: NDArray[np.intp]
    ) -> NDArray[np.float64]:
        """(row, col) of mask ``slots[i]``'s support pixel in the direction of ``_DIRECTIONS`` nearest to
        (away_rows[i], away_cols[i]) (``MaskStats.support_points``): a boundary pixel, so an upper bound
        of the distance from any point."""
        if self._support_points is None:
            self._support_points = np.concatenate([m.support_points for m in self._members])
        turn = np.rint(np.arctan2(away_rows, away_cols) * (_TURNS / (2 * math.pi))).astype(np.intp) % _TURNS
        found: NDArray[np.float64] = self._support_points[slots * _TURNS + turn]
        return found

    def slot(self, mask: MaskStats) -> int:
        """The number of ``mask`` in this index (it must be one the index was built over)."""
        return self._slot[id(mask)]

    def nearest(
        self, points: NDArray[np.float64], slots: NDArray[np.intp], upper: float = math.inf
    ) -> NDArray[np.float64]:
        """Distance from each (row, col) point to the nearest boundary pixel of mask ``slots[i]``.

        Distances not below ``upper`` may come back as ``inf`` (SciPy's ``distance_upper_bound``).
        """
        return self.nearest_points(points, slots, upper)[0]

    def nearest_points(
        self, points: NDArray[np.float64], slots: NDArray[np.intp], upper: float = math.inf
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``nearest`` and the (row, col) of each nearest boundary pixel (NaN where the distance is inf)."""
        if self._tree is None:
            self._points = np.concatenate([m.boundary_points for m in self._members])
            sizes = [len(m.boundary_points) for m in self._members]
            layer = np.repeat(np.arange(len(self._members)) * self._spacing, sizes)
            # sliding-midpoint splits, no node compaction, leaves of 64: the cheapest to build and
            # to ask for the few hundred hard queries left per image (the points sit ~200 px away)
            lifted = np.column_stack((self._points, layer))
            self._tree = cKDTree(lifted, leafsize=64, compact_nodes=False, balanced_tree=False)
        dist, i = self._tree.query(np.column_stack((points, slots * self._spacing)), k=1, distance_upper_bound=upper)
        where = np.full((points.shape[0], 2), math.nan)
        found = i < len(self._points)
        where[found] = self._points[i[found]]
        return np.asarray(dist, dtype=np.float64), where


_MARGIN = 1e-9
"""Absolute margin (px) under which an upper bound of D settles a cell without asking the tree."""


def _above(value: float) -> float:
    """A query bound safely above ``value`` (SciPy compares squared distances strictly)."""
    return value * (1.0 + 1e-9) + 1e-6


def gaps(pairs: list[tuple[MaskStats, MaskStats]], index: BoundaryIndex | None = None) -> list[float]:
    """``gap`` of each pair, all pairs advancing together (one k-d tree call per round).

    The closest pair always lies on the two masks' 4-boundaries. Each pair is measured
    from the mask that appears in fewer pairs towards the one that appears in more (the
    gap is symmetric), so a star prompt's pairs all measure against the subject. The
    querying mask's boundary pixels are ordered by a lower bound of their distance to the
    other mask (the larger of the distances to its bounding box and to its support
    half-planes in 16 directions, ``MaskStats.support``) and asked in chunks of
    ``_GAP_CHUNK``; a pair is done once no remaining pixel's bound is below its best.
    """
    uses: dict[int, int] = {}
    for a, b in pairs:
        uses[id(a)] = uses.get(id(a), 0) + 1
        uses[id(b)] = uses.get(id(b), 0) + 1
    out = [0.0] * len(pairs)
    todo: list[tuple[int, MaskStats, NDArray[np.float64], NDArray[np.float64], NDArray[np.intp]]] = []
    for i, (first, second) in enumerate(pairs):
        if first.empty or second.empty:
            raise ValueError("gap of an empty mask is undefined")
        if _overlap(first, second):
            continue
        a, b = (second, first) if uses[id(first)] > uses[id(second)] else (first, second)
        pts = a.boundary_points
        dr = np.maximum(np.maximum(b.row0 - pts[:, 0], pts[:, 0] - b.row1), 0.0)
        dc = np.maximum(np.maximum(b.col0 - pts[:, 1], pts[:, 1] - b.col1), 0.0)
        # the distance to B's box and to B's support half-planes in 16 directions bound D from below
        planes = (pts @ _DIRECTIONS[::4].T - b.support[::4]).max(axis=1) - _MARGIN
        bound = np.maximum(np.hypot(dr, dc), planes)
        todo.append((i, b, pts, bound, np.argsort(bound, kind="stable")))
    if not todo:
        return out
    index = index or BoundaryIndex([b for _, b, *_ in todo])
    best = [math.inf] * len(todo)
    start = 0
    while True:
        groups = []
        for k, (_, b, pts, bound, order) in enumerate(todo):
            chunk = order[start : start + _GAP_CHUNK]
            if chunk.size and bound[chunk[0]] < best[k]:
                groups.append((k, pts[chunk], index.slot(b)))
        if not groups:
            break
        upper = _above(max(best[k] for k, _, _ in groups)) if start else math.inf
        found = _batched_min(index, [(p, slot) for _, p, slot in groups], upper)
        for (k, _, _), d in zip(groups, found, strict=True):
            best[k] = min(best[k], d)
        start += _GAP_CHUNK
    for (i, *_), d in zip(todo, best, strict=True):
        out[i] = d
    return out


def _batched_min(
    index: BoundaryIndex, groups: list[tuple[NDArray[np.float64], int]], upper: float = math.inf
) -> list[float]:
    """min over each group's points of the distance to its mask (inf for an empty group)."""
    sizes = [len(pts) for pts, _ in groups]
    if sum(sizes) == 0:
        return [math.inf] * len(groups)
    pts = np.concatenate([p for p, _ in groups])
    slots = np.repeat(np.array([s for _, s in groups], dtype=np.intp), sizes)
    dist = index.nearest(pts, slots, upper)
    out: list[float] = []
    begin = 0
    for n in sizes:
        out.append(float(dist[begin : begin + n].min()) if n else math.inf)
        begin += n
    return out


def gap(a: MaskStats, b: MaskStats) -> float:
    """g = min over p in A, q in B of ||p - q||_2 (pixel centres); 0 when the masks overlap.

    The closest pair always lies on the two masks' 4-boundaries, so only boundary
    pixels enter the k-d tree query (see ``gaps``). Raises ``ValueError`` on an empty mask.
    """
    return gaps([(a, b)])[0]


_GAP_CHUNK = 32


def mean_radius(a: MaskStats, b: MaskStats) -> float:
    """R = (sqrt(|A|/pi) + sqrt(|B|/pi)) / 2."""
    return (a.radius + b.radius) / 2.0


_SLACK = 1e-9
_CELL_SIZES = (32, 8, 4, 2, 1)
"""Cell sizes of the occupancy pyramid ``facing_surface`` refines through (coarse to pixels)."""


def _pool2(grid: BoolMask) -> BoolMask:
    """2x2 OR-pooling of a C-contiguous grid with even sides (a pair of bools read as one uint16)."""
    pairs = grid.view(np.uint16) != 0  # OR of horizontal pairs
    out: BoolMask = pairs[0::2] | pairs[1::2]
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


def _children(
    req: NDArray[np.intp], rows: NDArray[np.intp], cols: NDArray[np.intp], f: int
) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.intp]]:
    """Request numbers and grid coordinates of the f x f sub-cells of the given cells (row-major per cell)."""
    offsets = np.arange(f)
    kr = ((rows * f)[:, None] + offsets.repeat(f)).ravel()
    kc = ((cols * f)[:, None] + np.tile(offsets, f)).ravel()
    return req.repeat(f * f), kr, kc


def facing_surface(a: MaskStats, b: MaskStats, limit: float) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """(rows, cols) of F_A = {p in A : d(p, B) <= limit}, d = Euclidean distance to B's nearest pixel.

    See ``facing_surfaces`` (this is the one-request case).
    """
    return facing_surfaces([(a, b, limit)])[0]


def facing_surfaces(
    requests: list[tuple[MaskStats, MaskStats, float]], index: BoundaryIndex | None = None
) -> list[tuple[NDArray[np.intp], NDArray[np.intp]]]:
    """F_A = {p in A : d(p, B) <= limit} for each request (A, B, limit), as (rows, cols).

    Exact and independent of how far apart the masks are. Pixels of A inside B have
    d = 0. For the others d equals D, the distance to B's 4-boundary pixels (the
    nearest pixel of B to an outside point is always on its boundary), and D is
    1-Lipschitz: a cell of side s whose centre has D > limit + (s - 1) / sqrt(2)
    holds no facing pixel, one with D <= limit - (s - 1) / sqrt(2) only facing
    pixels. Cells of A's occupancy pyramid (32, 8, 4, 2 px) are classified from
    their centres with a k-d tree over B's boundary, undecided cells are split, and
    only the pixels of undecided 2 px cells are measured one by one. Most cells need
    no query: the distance to the pixel of B found for the parent cell bounds D from
    above (settles "inside"), and the distance to B's support half-plane in the
    direction away from that pixel bounds it from below (settles "outside", and
    "undecided" together with the upper bound). Bounds only skip queries: each cell is
    decided as its exact D would decide it, so the pixels and their order are those of
    querying every cell.

    All requests advance level by level together: their cells live in one set of
    arrays (with the request each belongs to), so a level costs one k-d tree call
    (``BoundaryIndex``; ``index`` must cover every B and is built here when not given)
    and one pass of array operations, whatever the number of requests. Each
    request's pixels come back in the order a request alone would produce.
    """
    if not requests:
        return []
    if index is None:
        index = BoundaryIndex([b for _, b, _ in requests])
    n = len(requests)
    # per-request constants, indexed by each cell's request number
    a_row0 = np.array([a.row0 for a, _, _ in requests], np.float64)
    a_col0 = np.array([a.col0 for a, _, _ in requests], np.float64)
    b_box = np.array([(b.row0, b.row1, b.col0, b.col1) for _, b, _ in requests], np.float64).T
    limits = np.array([limit for _, _, limit in requests], np.float64)
    shift = np.array([index.slot(b) for _, b, _ in requests], np.intp)
    # each level's occupancy grids of the distinct A masks, flattened into one array
    owners: dict[int, int] = {}
    for a, _, _ in requests:
        owners.setdefault(id(a), len(owners))
    distinct = list({id(a): a for a, _, _ in requests}.values())
    owner = np.array([owners[id(a)] for a, _, _ in requests], np.intp)
    flat: list[BoolMask] = []
    offset: list[NDArray[np.intp]] = []
    width: list[NDArray[np.intp]] = []
    for level in range(len(_CELL_SIZES)):
        if level == 0:  # the top level's cells are listed directly (below); only children are looked up
            flat.append(np.zeros(0, bool))
            offset.append(np.zeros(0, np.intp))
            width.append(np.zeros(0, np.intp))
            continue
        grids = [m.pyramid[level] for m in distinct]
        sizes = np.array([g.size for g in grids], np.intp)
        flat.append(np.concatenate([g.ravel() for g in grids]))
        offset.append((np.cumsum(sizes) - sizes)[owner])
        width.append(np.array([g.shape[1] for g in grids], np.intp)[owner])
    req = np.repeat(np.arange(n), [int(np.count_nonzero(a.pyramid[0])) for a, _, _ in requests])
    cr, cc = (np.concatenate(x) for x in zip(*(_nonzero(a.pyramid[0]) for a, _, _ in requests), strict=True))
    # a pixel of B near each cell's nearest (the one found for its parent; at the top, B's
    # support pixel facing the cell): the distance to it bounds D from above
    b_centre = np.array([(b.cy, b.cx) for _, b, _ in requests], np.float64).T
    hint = np.zeros((cr.size, 2))
    found_q: list[NDArray[np.intp]] = []
    found_r: list[NDArray[np.intp]] = []
    found_c: list[NDArray[np.intp]] = []
    for level, size in enumerate(_CELL_SIZES):
        if cr.size == 0:
            break
        # a cell's pixels lie within `reach` of its centre; the slack keeps rounding from
        # deciding a cell whose farthest pixel sits exactly at `limit` (exact test: pixels)
        reach = (size - 1) / math.sqrt(2.0) + (_SLACK if size > 1 else 0.0)
        cy = a_row0[req] + cr * size + (size - 1) / 2
        cx = a_col0[req] + cc * size + (size - 1) / 2
        lim = limits[req]
        if size in (_CELL_SIZES[0], 1):
            # the distance to B's box bounds D from below: cells beyond limit + reach of it are
            # out (children of undecided cells are near B: below the top the test decides next to
            # nothing, and is kept on pixels only so that they are decided exactly as before)
            near = (
                np.hypot(
                    np.maximum(np.maximum(b_box[0][req] - cy, cy - b_box[1][req]), 0.0),
                    np.maximum(np.maximum(b_box[2][req] - cx, cx - b_box[3][req]), 0.0),
                )
                - reach
                <= lim
            )
            cr, cc, cy, cx, req, lim, hint = cr[near], cc[near], cy[near], cx[near], req[near], lim[near], hint[near]
        if level == 0:
            hint = index.support_point(cy - b_centre[0][req], cx - b_centre[1][req], shift[req])
        # D(c) <= |c - hint| (hint is a pixel of B): squared distances of these half-integer
        # coordinates are exact and the margin covers the last bit of SciPy's square root, so
        # a cell settled here is one the exact distance would have put inside as well
        hr, hc = cy - hint[:, 0], cx - hint[:, 1]
        upper = np.sqrt(hr * hr + hc * hc)
        settled = upper + reach <= lim - _MARGIN
        # a lower bound of D (B's support function, see ``BoundaryIndex.lower_bound``) settles
        # cells the other way: beyond limit + reach they are out; beyond limit - reach and, by
        # the hint, within limit + reach they are undecided (split) -- both as the exact
        # distance would have decided, the margin covering the bound's rounding
        low = index.lower_bound(cy, cx, hr, hc, shift[req]) - _MARGIN
        out = ~settled & (low - reach > lim)
        split = ~settled & ~out & (low + reach > lim) & (upper - reach <= lim)
        if level == 0 or size == 1:  # a pixel is in or out; at the top, undecided cells are asked
            split[:] = False  # (for the nearest pixel their children start from)
        ask = ~(settled | out | split)
        # farther than every limit + reach: out whatever the exact distance (inf from the tree)
        dist = np.full(cr.size, math.inf)
        found_at = hint.copy()  # a split cell's children keep its hint
        dist[ask], found_at[ask] = index.nearest_points(
            np.column_stack((cy[ask], cx[ask])), shift[req[ask]], _above(float(limits.max()) + reach)
        )
        if size == 1:
            keep = settled | (dist <= lim)
            found_q.append(req[keep])
            found_r.append(cr[keep])
            found_c.append(cc[keep])
            break
        inside = settled | (dist + reach <= lim)
        if inside.any():  # every pixel of A in these cells faces B
            pq, pr, pc = _children(req[inside], cr[inside], cc[inside], size)
            occupied = flat[-1][offset[-1][pq] + pr * width[-1][pq] + pc]
            found_q.append(pq[occupied])
            found_r.append(pr[occupied])
            found_c.append(pc[occupied])
        unsure = split | (~inside & (dist - reach <= lim))
        f = size // _CELL_SIZES[level + 1]
        kq, kr, kc = _children(req[unsure], cr[unsure], cc[unsure], f)
        occupied = flat[level + 1][offset[level + 1][kq] + kr * width[level + 1][kq] + kc]
        req, cr, cc = kq[occupied], kr[occupied], kc[occupied]
        hint = found_at[unsure].repeat(f * f, axis=0)[occupied]
    if found_q:
        q = np.concatenate(found_q)
        order = np.argsort(q, kind="stable")  # by request, each request's pixels in found order
        rows, cols = np.concatenate(found_r)[order], np.concatenate(found_c)[order]
        bounds = np.searchsorted(q[order], np.arange(n + 1))
    else:
        rows = cols = np.zeros(0, np.intp)
        bounds = np.zeros(n + 1, np.intp)
    return [
        _with_overlap(a, b, rows[bounds[k] : bounds[k + 1]], cols[bounds[k] : bounds[k + 1]])
        for k, (a, b, _) in enumerate(requests)
    ]


def _with_overlap(
    a: MaskStats, b: MaskStats, rows: NDArray[np.intp], cols: NDArray[np.intp]
) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """Image (rows, cols) of the facing pixels found (crop coordinates), plus A's pixels inside B."""
    padded = a.pyramid[-1]
    # pixels of A inside B (only where the masks overlap) are at distance 0
    r0, r1 = max(a.row0, b.row0), min(a.row1, b.row1)
    c0, c1 = max(a.col0, b.col0), min(a.col1, b.col1)
    if r0 <= r1 and c0 <= c1:
        both = (
            a.crop[r0 - a.row0 : r1 - a.row0 + 1, c0 - a.col0 : c1 - a.col0 + 1]
            & b.crop[r0 - b.row0 : r1 - b.row0 + 1, c0 - b.col0 : c1 - b.col0 + 1]
        )
        orow, ocol = _nonzero(both)
        if orow.size:
            width = padded.shape[1]
            flat = np.union1d(rows * width + cols, (orow + r0 - a.row0) * width + (ocol + c0 - a.col0))
            rows, cols = np.divmod(flat, width)
    return rows + a.row0, cols + a.col0


@dataclass(frozen=True, eq=False)
class FacingPair:
    """What the depth rule measures of a pair (A, B): the gap g and the facing surfaces F_A, F_B."""

    gap: float
    a: tuple[NDArray[np.intp], NDArray[np.intp]]
    b: tuple[NDArray[np.intp], NDArray[np.intp]]


def facing_pairs(pairs: list[tuple[MaskStats, MaskStats]], window: float) -> list[FacingPair]:
    """g, F_A and F_B (limit g + window) of every pair of one image, with one k-d tree for all.

    One k-d tree over the boundaries of all the masks (``BoundaryIndex``) answers every
    query: a star prompt's four pairs cost one call per gap round (usually one) and one
    per pyramid level of the eight surfaces. No mask may be empty.
    """
    if not pairs:
        return []
    index = BoundaryIndex([m for pair in pairs for m in pair])
    distances = gaps(pairs, index)
    requests: list[tuple[MaskStats, MaskStats, float]] = []
    for (a, b), g in zip(pairs, distances, strict=True):
        requests += [(a, b, g + window), (b, a, g + window)]
    surfaces = facing_surfaces(requests, index)
    return [FacingPair(g, surfaces[2 * i], surfaces[2 * i + 1]) for i, g in enumerate(distances)]
