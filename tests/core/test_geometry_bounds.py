"""The shortcuts of ``negt2i.core.geometry``: bounds that skip k-d tree queries and the fast mask statistics.

Each is checked against the plain computation it replaces: the bounds must never contradict the
exact distance (curved masks, where they are tight, and the image's odd widths), the statistics
must equal NumPy's direct readings for any memory layout and dtype.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import ndimage

from negt2i.core.geometry import BoundaryIndex, facing_surface, gap, mask_stats

H, W = 60, 69  # a width that is not a multiple of 8 (the row test's 8-pixel path does not apply)


@st.composite
def curved(draw: st.DrawFn, height: int = H, width: int = W) -> np.ndarray:
    """One or two ellipses, possibly cut by the image's edge (support half-planes are nearly tight on them)."""
    yy, xx = np.ogrid[:height, :width]
    mask = np.zeros((height, width), bool)
    for _ in range(draw(st.integers(1, 2))):
        cy, cx = draw(st.floats(-5, height + 5)), draw(st.floats(-5, width + 5))
        ry, rx = draw(st.floats(0.5, 25)), draw(st.floats(0.5, 25))
        mask |= ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0
    if not mask.any():
        mask[draw(st.integers(0, height - 1)), draw(st.integers(0, width - 1))] = True
    return mask


@settings(max_examples=150, deadline=None)
@given(curved(), curved(), st.one_of(st.sampled_from([0.0, 1.0, 2.0, 16.0]), st.floats(0, 30)))
def test_curved_masks_match_distance_transform(a: np.ndarray, b: np.ndarray, window: float) -> None:
    """Gap and facing surface of ellipses equal the full-image EDT (integer windows: pixels exactly at the limit)."""
    sa, sb = mask_stats(a), mask_stats(b)
    dist_to_b = ndimage.distance_transform_edt(~b)
    g = gap(sa, sb)
    assert g == float(dist_to_b[a].min())
    rows, cols = facing_surface(sa, sb, g + window)
    got = np.zeros_like(a)
    got[rows, cols] = True
    np.testing.assert_array_equal(got, a & (dist_to_b <= g + window))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(curved(), min_size=1, max_size=3),
    st.lists(st.tuples(st.floats(-40, H + 40), st.floats(-40, W + 40), st.floats(-50, 50), st.floats(-50, 50)),
             min_size=1, max_size=40),
)  # fmt: skip
def test_lower_bound_never_exceeds_the_distance(masks: list[np.ndarray], queries: list[tuple[float, ...]]) -> None:
    """``BoundaryIndex.lower_bound`` <= the exact distance to the boundary, whatever direction it is given."""
    stats = [mask_stats(m) for m in masks]
    index = BoundaryIndex(stats)
    q = np.array(queries)
    points, away = q[:, :2], q[:, 2:]
    slots = np.arange(len(q)) % len(stats)
    low = index.lower_bound(points[:, 0], points[:, 1], away[:, 0], away[:, 1], slots)
    exact = index.nearest(points, slots)
    assert np.all(low <= exact + 1e-9)
    dist, _ = index.nearest_points(points, slots)
    np.testing.assert_array_equal(dist, exact)
    # the one k-d tree over all masks answers as each mask alone (brute force over its boundary)
    for k, s in enumerate(stats):
        brute = np.sqrt(((points[slots == k, None, :] - s.boundary_points[None]) ** 2).sum(-1)).min(axis=1)
        np.testing.assert_array_equal(exact[slots == k], brute)


def test_bound_from_the_nearest_pixel_is_tight_on_a_disk() -> None:
    """Away from the nearest boundary pixel of a disk, the support bound is within a pixel of the distance."""
    yy, xx = np.ogrid[:200, :200]
    disk = (yy - 100.0) ** 2 + (xx - 100.0) ** 2 <= 40.0**2
    index = BoundaryIndex([mask_stats(disk)])
    angles = np.linspace(0, 2 * np.pi, 37)
    points = np.column_stack((100 + 90 * np.sin(angles), 100 + 90 * np.cos(angles)))
    slots = np.zeros(len(points), np.intp)
    dist, where = index.nearest_points(points, slots)
    away = points - where
    low = index.lower_bound(points[:, 0], points[:, 1], away[:, 0], away[:, 1], slots)
    assert np.all(low <= dist) and np.all(dist - low < 1.0)


def _reference(mask: np.ndarray) -> tuple[int, int, int, int, int, float, float]:
    ys, xs = np.nonzero(mask)
    box = (int(ys.min()), int(ys.max()), int(xs.min()), int(xs.max()))
    return (*box, int(ys.size), float(ys.mean()), float(xs.mean()))


@settings(max_examples=60, deadline=None)
@given(curved(height=37, width=45), st.sampled_from(["C", "F", "slice", "uint8"]))
def test_mask_stats_any_layout(mask: np.ndarray, layout: str) -> None:
    """Bounding box, area, centroid, boundary pixels and pyramid do not depend on the array's layout or dtype."""
    plain = mask_stats(np.ascontiguousarray(mask))
    given_mask = {
        "C": mask,
        "F": np.asfortranarray(mask),
        "slice": np.pad(mask, ((0, 0), (3, 5)))[:, 3:-5],  # a non-contiguous view
        "uint8": mask.astype(np.uint8) * 7,
    }[layout]
    s = mask_stats(given_mask)
    r0, r1, c0, c1, area, cy, cx = _reference(mask)
    assert (s.row0, s.row1, s.col0, s.col1, s.area) == (r0, r1, c0, c1, area) == (
        plain.row0, plain.row1, plain.col0, plain.col1, plain.area)  # fmt: skip
    assert (s.cy, s.cx) == (plain.cy, plain.cx) and np.allclose((s.cy, s.cx), (cy, cx))
    np.testing.assert_array_equal(s.boundary_points, plain.boundary_points)
    # 4-boundary: a pixel with a 4-neighbour outside the mask or the image
    inner = ndimage.binary_erosion(mask, structure=ndimage.generate_binary_structure(2, 1), border_value=0)
    ys, xs = np.nonzero(mask & ~inner)
    np.testing.assert_array_equal(s.boundary_points, np.column_stack((ys, xs)).astype(float))
    # each pyramid level is the OR over its cells of the crop, padded to whole 32 px cells
    crop = mask[r0 : r1 + 1, c0 : c1 + 1]
    for size, grid in zip((32, 8, 4, 2, 1), s.pyramid, strict=True):
        padded = np.zeros((grid.shape[0] * size, grid.shape[1] * size), bool)
        padded[: crop.shape[0], : crop.shape[1]] = crop
        expected = padded.reshape(grid.shape[0], size, grid.shape[1], size).any(axis=(1, 3))
        np.testing.assert_array_equal(grid, expected)
