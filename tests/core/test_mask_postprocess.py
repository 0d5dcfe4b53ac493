"""``postprocess_mask`` (OpenCV) is bit-exact with the SciPy implementation it replaced.

The SciPy version below is the reference: closing with a radius-r disk on the mask's box
grown by r and padded by r + 1, then 8-connected components smaller than the given
fraction of the largest dropped.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray
from scipy import ndimage

from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.rules import disk, postprocess_mask


def scipy_postprocess(mask: NDArray[np.bool_], radius: int, fraction: float) -> NDArray[np.bool_]:
    """The SciPy implementation (``binary_closing`` + ``label``), as it was before OpenCV."""
    arr = np.asarray(mask, dtype=bool)
    if not arr.any():
        return arr.copy()
    rows, cols = np.flatnonzero(arr.any(axis=1)), np.flatnonzero(arr.any(axis=0))
    h, w = arr.shape
    r = radius
    r0, r1 = max(int(rows[0]) - r, 0), min(int(rows[-1]) + r, h - 1)
    c0, c1 = max(int(cols[0]) - r, 0), min(int(cols[-1]) + r, w - 1)
    crop = arr[r0 : r1 + 1, c0 : c1 + 1]
    if r > 0:
        padded = np.pad(crop, r + 1)
        closed = ndimage.binary_closing(padded, structure=disk(r))[r + 1 : -(r + 1), r + 1 : -(r + 1)]
    else:
        closed = crop.copy()
    labels, n = ndimage.label(closed, structure=np.ones((3, 3), bool))
    if n > 1:
        sizes = np.bincount(labels.ravel())[1:]
        keep = np.flatnonzero(sizes >= fraction * sizes.max()) + 1
        closed = np.isin(labels, keep)
    out = np.zeros_like(arr)
    out[r0 : r1 + 1, c0 : c1 + 1] = closed
    return out


def config_with(radius: int, fraction: float) -> RuleConfig:
    masks = CURRENT.masks.model_copy(update={"closing_radius": radius, "min_component_fraction": fraction})
    return CURRENT.model_copy(update={"masks": masks})


@st.composite
def masks(draw: st.DrawFn) -> NDArray[np.bool_]:
    """Random masks: noise of a drawn density plus a few rectangles, some touching the border."""
    h = draw(st.integers(1, 72))
    w = draw(st.integers(1, 72))
    seed = draw(st.integers(0, 2**32 - 1))
    density = draw(st.sampled_from([0.0, 0.02, 0.1, 0.4, 0.7, 0.95]))
    rng = np.random.default_rng(seed)
    out = rng.random((h, w)) < density
    for _ in range(draw(st.integers(0, 4))):
        y0, x0 = int(rng.integers(0, h)), int(rng.integers(0, w))
        out[y0 : y0 + int(rng.integers(1, 30)), x0 : x0 + int(rng.integers(1, 30))] = True
    return out


@settings(max_examples=300, deadline=None)
@given(masks(), st.sampled_from([0, 1, 2, 5, 8]), st.sampled_from([0.0, 0.05, 0.3, 1.0]))
def test_opencv_postprocess_is_bit_exact_with_scipy(mask: NDArray[np.bool_], radius: int, fraction: float) -> None:
    out = postprocess_mask(mask, config_with(radius, fraction))
    assert out.dtype == bool and out.shape == mask.shape
    np.testing.assert_array_equal(out, scipy_postprocess(mask, radius, fraction))


def test_opencv_postprocess_is_bit_exact_at_1024_px() -> None:
    """Realistic size: SAM-like blobs with holes, specks and border contact at 1024 x 1024."""
    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[:1024, :1024]
    for k in range(4):
        cy, cx, rad = rng.integers(0, 1024), rng.integers(0, 1024), rng.integers(40, 400)
        mask = (yy - cy) ** 2 + (xx - cx) ** 2 < rad**2
        mask &= rng.random(mask.shape) > 0.05 * k  # holes
        mask |= rng.random(mask.shape) < 0.0005  # specks (dropped components)
        np.testing.assert_array_equal(postprocess_mask(mask), scipy_postprocess(mask, 5, 0.05))
