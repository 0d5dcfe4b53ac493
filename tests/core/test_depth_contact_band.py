"""Table 16's previous depth rule (the contact band): boundaries on both sides of each constant, with
hand-built masks, and its invariants with Hypothesis."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from negt2i.core.config import CURRENT, PREVIOUS, DepthConfig, load_config
from negt2i.core.geometry import mask_stats
from negt2i.core.rules import measure_depth, measure_depth_contact_band, rim
from negt2i.core.vocab import CONVERSE

from .helpers import rect

EXACT = PREVIOUS.model_copy(update={"depth": DepthConfig(rule="contact_band", base_margin=0.0625)})
"""The previous rule with a margin that float32 disparities hit exactly (0.0625 = 2^-4)."""


def _disp(*parts: tuple[np.ndarray, float]) -> np.ndarray:
    d = np.zeros((100, 100), np.float32)
    d[99, 99] = 1.0  # image disparity range = 1 (the corner is in no mask)
    for mask, value in parts:
        d[mask] = value
    return d


# --------------------------------------------------------------------- the margin
@pytest.mark.parametrize(
    ("a_value", "b_value", "expected"),
    [
        (0.75, 0.6875, {"in front of"}),  # difference 0.0625 = margin: fires (>=)
        (0.75, 0.6875 + 2**-10, set()),  # just below the margin: dead zone
        (0.6875, 0.75, {"behind"}),
        (0.6875 + 2**-10, 0.75, set()),
        (0.5, 0.5, set()),
    ],
)
def test_contact_margin_both_sides(a_value: float, b_value: float, expected: set[str]) -> None:
    a, b = rect(40, 10, 20, 20), rect(40, 30, 20, 20)  # adjacent squares: in contact
    m = measure_depth_contact_band(a, b, _disp((a, a_value), (b, b_value)), EXACT)
    assert m.values["surface"] == "contact"
    # A's columns 18..29 are within 12 px of B's column 30: 12 x 20 contact pixels on each side
    assert m.values["contact_pixels_a"] == 240 and m.values["contact_pixels_b"] == 240
    assert m.predicates == expected


def test_the_previous_preset_has_no_separation_term() -> None:
    """Far apart, 0.06 apart: the previous rule fires on the base margin alone; the current one needs more."""
    a, b = rect(10, 10, 20, 20), rect(60, 60, 20, 20)
    disp = _disp((a, 0.56), (b, 0.5))
    assert measure_depth(a, b, disp, PREVIOUS).predicates == {"in front of"}
    assert measure_depth(a, b, disp, CURRENT).predicates == frozenset()


# --------------------------------------------------------------------- the band width (12 px)
@pytest.mark.parametrize(
    ("column", "surface"),
    [
        (38, "contact"),  # the line is 12 px from B's column 50: inside the band
        (37, "rim"),  # 13 px: outside the band, so the rims are compared
    ],
)
def test_band_width_both_sides(column: int, surface: str) -> None:
    b = rect(40, 50, 20, 20)
    a = rect(40, column, 20, 1)  # a vertical line of 20 pixels, every one of them on its own rim
    # contact pixels read 0.9 / 0.1; B's rim reads 0.5 away from the contact band
    disp = _disp((a, 0.9), (b, 0.5), (rect(40, 50, 20, 12), 0.1))
    m = measure_depth_contact_band(a, b, disp, PREVIOUS)
    assert m.values["surface"] == surface
    assert m.values["contact_pixels_a"] == (20 if surface == "contact" else 0)
    if surface == "contact":
        assert m.values["disparity_b"] == pytest.approx(0.1)  # only B's band (columns 50..61 in reach)
    else:
        assert m.values["surface_pixels_b"] == 20 * 20  # a 20 px square is all rim at width 12
    assert m.predicates == {"in front of"}


# --------------------------------------------------------------------- the minimum pixels (20)
@pytest.mark.parametrize(
    ("pixels", "surface", "expected"),
    [
        (20, "contact", {"in front of"}),  # 20 contact pixels: enough
        (19, "rim", set()),  # 19: the rims are used, and a 19-pixel line has a 19-pixel rim: too few
    ],
)
def test_minimum_pixels_both_sides(pixels: int, surface: str, expected: set[str]) -> None:
    b = rect(30, 50, 40, 20)
    a = rect(40, 40, pixels, 1)  # a line 10 px from B: all of it in the band
    m = measure_depth_contact_band(a, b, _disp((a, 0.9), (b, 0.5)), PREVIOUS)
    assert m.values["surface"] == surface
    assert m.values["surface_pixels_a"] == pixels
    assert m.predicates == expected
    assert m.values.get("too_few_pixels", 0) == (0 if expected else 1)


@pytest.mark.parametrize(("side", "expected"), [(5, {"behind"}), (4, set())])
def test_small_objects_rim_minimum(side: int, expected: set[str]) -> None:
    """Apart, so the rims decide: a 5x5 square has a 25-pixel rim (enough), a 4x4 one 16 (too few)."""
    a, b = rect(10, 10, side, side), rect(60, 60, 30, 30)
    m = measure_depth_contact_band(a, b, _disp((a, 0.2), (b, 0.8)), PREVIOUS)
    assert m.values["surface"] == "rim"
    assert m.predicates == expected


def test_rim_is_the_outer_ring_of_band_width() -> None:
    """A 40x40 square apart from B: its rim is the 12 px ring (40^2 - 16^2 pixels); the core is ignored."""
    a, b = rect(5, 5, 40, 40), rect(70, 70, 20, 20)
    core = rect(17, 17, 16, 16)
    disp = _disp((a, 0.2), (core, 1.0), (b, 0.5))
    m = measure_depth_contact_band(a, b, disp, PREVIOUS)
    assert m.values["surface_pixels_a"] == 40 * 40 - 16 * 16
    assert m.values["disparity_a"] == pytest.approx(0.2)
    assert m.predicates == {"behind"}  # the whole-mask mean (0.33) would still say behind; the core alone front
    rows, _ = rim(mask_stats(a), 12.0)
    assert rows.size == 40 * 40 - 16 * 16
    assert rim(mask_stats(a), 11.0)[0].size == 40 * 40 - 18 * 18  # one pixel narrower on each side


# --------------------------------------------------------------------- the config
def test_presets_name_their_depth_rule_and_the_current_digest_is_unchanged() -> None:
    assert CURRENT.depth.rule == "facing_surfaces" and CURRENT.depth.band_width is None
    assert "band_width" not in CURRENT.record()["depth"]
    assert CURRENT.digest() == "a8af11ec4b18c939"  # the digest results files made before the contact band carry
    assert PREVIOUS.depth.rule == "contact_band"
    assert (PREVIOUS.depth.band_width, PREVIOUS.depth.min_band_pixels) == (12.0, 20)
    assert PREVIOUS.record()["depth"]["band_width"] == 12.0


def test_band_constants_only_with_the_contact_band(tmp_path: object) -> None:
    with pytest.raises(ValidationError, match=r"apply only to depth\.rule = 'contact_band'"):
        DepthConfig(band_width=10.0)
    assert DepthConfig(rule="contact_band").min_band_pixels == 20
    assert load_config("previous") is PREVIOUS


# --------------------------------------------------------------------- invariants
SIZE = 48


@st.composite
def blobs(draw: st.DrawFn) -> np.ndarray:
    mask = np.zeros((SIZE, SIZE), bool)
    for _ in range(draw(st.integers(1, 3))):
        r0, c0 = draw(st.integers(0, SIZE - 1)), draw(st.integers(0, SIZE - 1))
        h, w = draw(st.integers(1, 25)), draw(st.integers(1, 25))
        mask[r0 : r0 + h, c0 : c0 + w] = True
    return mask


@settings(max_examples=100, deadline=None)
@given(blobs(), blobs(), st.integers(0, 2**31 - 1), st.floats(0.1, 10.0), st.floats(-5.0, 5.0))
def test_contact_band_invariants(a: np.ndarray, b: np.ndarray, seed: int, scale: float, shift: float) -> None:
    """Antisymmetric (swapping A and B gives the converse), at most one predicate, nothing on a flat map, and
    unchanged by an affine change of disparity units (a positive scale and a shift)."""
    disp = np.random.default_rng(seed).random((SIZE, SIZE))
    ab = measure_depth_contact_band(a, b, disp, PREVIOUS).predicates
    assert len(ab) <= 1
    assert measure_depth_contact_band(b, a, disp, PREVIOUS).predicates == frozenset(CONVERSE[p] for p in ab)
    assert measure_depth_contact_band(a, b, np.full((SIZE, SIZE), 0.5), PREVIOUS).predicates == frozenset()
    m = measure_depth_contact_band(a, b, disp * scale + shift, PREVIOUS)
    n = measure_depth_contact_band(a, b, disp, PREVIOUS)
    if "normalized_difference" in n.values:  # far from the margin, rounding cannot flip the decision
        if abs(float(n.values["normalized_difference"]) - PREVIOUS.depth.base_margin) > 1e-9:
            assert m.predicates == ab


@settings(max_examples=60, deadline=None)
@given(blobs(), blobs(), st.integers(0, 2**31 - 1))
def test_contact_band_reads_only_its_surfaces(a: np.ndarray, b: np.ndarray, seed: int) -> None:
    """Disparity outside the two surfaces used (contact bands or rims) never changes the result."""
    rng = np.random.default_rng(seed)
    disp = rng.random((SIZE, SIZE))
    disp[0, 0], disp[0, 1] = 0.0, 1.0
    m = measure_depth_contact_band(a, b, disp, PREVIOUS)
    if m.values.get("degenerate") or m.values.get("too_few_pixels"):
        return
    sa, sb = mask_stats(a), mask_stats(b)
    from negt2i.core.geometry import facing_surface

    if m.values["surface"] == "contact":
        fa, fb = facing_surface(sa, sb, 12.0), facing_surface(sb, sa, 12.0)
    else:
        fa, fb = rim(sa, 12.0), rim(sb, 12.0)
    used = np.zeros((SIZE, SIZE), bool)
    used[fa] = True
    used[fb] = True
    used[0, 0] = used[0, 1] = True  # keep the range
    other = np.where(used, disp, rng.random((SIZE, SIZE)))
    assert measure_depth_contact_band(a, b, other, PREVIOUS, disparity_range=1.0).predicates == (
        measure_depth_contact_band(a, b, disp, PREVIOUS, disparity_range=1.0).predicates
    )
