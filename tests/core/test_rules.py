"""Every rule threshold, probed with hand-built masks on both sides (Appendix C.1, Tables 15-16)."""

from __future__ import annotations

import numpy as np
import pytest

from negt2i.core.config import CURRENT, PREVIOUS, DirectionalConfig, RuleConfig
from negt2i.core.perception import Detections
from negt2i.core.rules import (
    attribute_confusion_set,
    comparative_predicates,
    depth_predicates,
    directional_predicates,
    measure_depth,
    measure_directional,
    measure_proximity,
    postprocess_mask,
    proximity_predicates,
    select_by_overlap,
    select_instances,
)

from .helpers import rect, square_at

B_CENTER = square_at(50, 50)


# --------------------------------------------------------------------- directional
@pytest.mark.parametrize(
    ("dx", "dy", "config", "expected"),
    [
        # 10x10 squares: summed extents 20, margin tau*20 = 1.5 px per axis (current)
        (20, 11, CURRENT, {"right of"}),  # d_y = 9.5 / 22.83 = 0.416 < 0.45
        (20, 12, CURRENT, {"right of", "below"}),  # d_y = 10.5 / 23.32 = 0.450 > 0.45
        (-20, -12, CURRENT, {"left of", "above"}),  # mirror: y grows downward, so A is above B
        (20, 12, PREVIOUS, {"right of"}),  # alpha = 0.50 (Table 16): 0.450 no longer fires
        (0, 3, CURRENT, {"below"}),  # d_y = (3 - 1.5) / 3 = 0.5 > 0.45
        (0, 2, CURRENT, set()),  # d_y = (2 - 1.5) / 2 = 0.25: dead zone
        (0, 3, RuleConfig(directional=DirectionalConfig(extent_margin=0.10)), set()),  # tau only: (3-2)/3 = 0.33
        (0, 0, CURRENT, set()),  # coincident centroids fire nothing
    ],
)
def test_directional_thresholds(dx: int, dy: int, config: RuleConfig, expected: set[str]) -> None:
    a = square_at(50 + dy, 50 + dx)
    assert directional_predicates(a, B_CENTER, config) == expected


def test_directional_uses_extents_not_only_centroids() -> None:
    # Same 30 px vertical offset; tall masks (extents 30 each) eat 0.075 * 60 = 4.5 px of it, thin ones less.
    tall = measure_directional(rect(40, 0, 30, 4), rect(10, 0, 30, 4))
    assert tall.predicates == {"below"} and tall.values["dy"] == pytest.approx((30 - 4.5) / 30)
    # offset (x=8, y=10): square 10x10 margins 1.5 -> d_x = 6.5/12.8 = 0.51 fires; 40 px wide masks -> margin 6 -> 0.16
    assert directional_predicates(square_at(60, 58), B_CENTER) == {"right of", "below"}
    wide_a, wide_b = rect(55, 38, 10, 40), rect(45, 30, 10, 40)
    assert directional_predicates(wide_a, wide_b) == {"below"}


# --------------------------------------------------------------------- proximity
A_SQ = rect(0, 0, 10, 10)  # area 100 -> R = sqrt(100/pi) = 5.642, 0.75 R = 4.231


@pytest.mark.parametrize(
    ("b", "config", "expected", "gap"),
    [
        (rect(0, 13, 10, 10), CURRENT, {"near"}, 4.0),  # columns 9 -> 13: 4 < 4.231
        (rect(0, 14, 10, 10), CURRENT, {"far from"}, 5.0),  # 5 >= 4.231
        (rect(12, 12, 10, 10), CURRENT, {"far from"}, 3 * 2**0.5),  # Euclidean 4.243 (Chebyshev would say 3)
        (rect(5, 5, 10, 10), CURRENT, {"near"}, 0.0),  # overlap: gap 0
        (rect(0, 10, 10, 10), CURRENT, {"near"}, 1.0),  # touching: pixel centres 1 apart
        (rect(0, 11, 10, 10), PREVIOUS, {"near"}, 2.0),  # gamma 0.5: 2 < 2.821
        (rect(0, 12, 10, 10), PREVIOUS, {"far from"}, 3.0),  # 3 >= 2.821
    ],
)
def test_proximity_thresholds(b: np.ndarray, config: RuleConfig, expected: set[str], gap: float) -> None:
    m = measure_proximity(A_SQ, b, config)
    assert m.predicates == expected
    assert m.values["gap"] == pytest.approx(gap)
    assert m.values["radius"] == pytest.approx((100 / np.pi) ** 0.5)


def test_proximity_gap_with_non_convex_masks() -> None:
    # an L-shaped A whose bounding box contains B: the gap is to the vertical bar (column 4 -> 12)
    a = rect(0, 0, 30, 5) | rect(25, 0, 5, 30)
    b = rect(0, 12, 10, 10)
    assert measure_proximity(a, b).values["gap"] == pytest.approx(8.0)


# --------------------------------------------------------------------- comparative
@pytest.mark.parametrize(
    ("a", "config", "expected"),
    [
        (rect(0, 0, 22, 10), CURRENT, {"bigger than", "taller than"}),  # 220 vs 200, 22 vs 20: ratio 1.10
        (rect(0, 0, 21, 10), CURRENT, set()),  # ratio exactly 1.05 is not > 1.05: dead zone
        (rect(0, 0, 20, 11), CURRENT, {"bigger than"}),  # wider, same height
        (rect(0, 0, 22, 9), CURRENT, {"taller than"}),  # 198 vs 200: no area predicate either way
        (rect(0, 0, 19, 10), CURRENT, {"smaller than", "shorter than"}),  # 200 > 1.05 * 190 and 20 > 19.95
        (rect(0, 0, 22, 10), PREVIOUS, set()),  # rho 1.15 (Table 16): 1.10 is inside the dead zone
        (rect(0, 0, 24, 10), PREVIOUS, {"bigger than", "taller than"}),  # 1.20 > 1.15
    ],
)
def test_comparative_thresholds(a: np.ndarray, config: RuleConfig, expected: set[str]) -> None:
    b = rect(50, 50, 20, 10)  # area 200, height 20
    assert comparative_predicates(a, b, config) == expected


# --------------------------------------------------------------------- depth
def _depth_scene(a_value: float, b_value: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two 20x20 squares 11 px apart (R = 11.284): required margin 0.05 + 0.1 * 11 / 11.284 = 0.1475."""
    a, b = rect(40, 10, 20, 20), rect(40, 40, 20, 20)
    disp = np.zeros((100, 100), np.float32)
    disp[0, 0] = 1.0  # image disparity range = 1
    disp[a], disp[b] = a_value, b_value
    return a, b, disp


@pytest.mark.parametrize(
    ("a_value", "b_value", "expected"),
    [
        (0.50, 0.35, {"in front of"}),  # 0.15 >= 0.1475
        (0.50, 0.36, set()),  # 0.14 < 0.1475: dead zone
        (0.35, 0.50, {"behind"}),
        (0.36, 0.50, set()),
        (0.50, 0.50, set()),
    ],
)
def test_depth_margin_couples_gap_and_radius(a_value: float, b_value: float, expected: set[str]) -> None:
    a, b, disp = _depth_scene(a_value, b_value)
    m = measure_depth(a, b, disp)
    assert m.values["gap"] == 11.0
    assert m.values["required_margin"] == pytest.approx(0.05 + 0.1 * 11 / (400 / np.pi) ** 0.5)
    assert m.predicates == expected


def test_depth_touching_objects_need_only_the_base_margin() -> None:
    a, b = rect(40, 10, 20, 20), rect(40, 30, 20, 20)  # adjacent: gap 1
    for diff, expected in ((0.06, {"in front of"}), (0.055, set())):  # margin 0.05 + 0.1 / 11.28 = 0.0589
        disp = np.zeros((100, 100), np.float32)
        disp[0, 0] = 1.0
        disp[a], disp[b] = 0.5 + diff, 0.5
        assert depth_predicates(a, b, disp) == expected


def test_depth_uses_only_the_facing_surfaces() -> None:
    a, b = rect(40, 0, 20, 60), rect(40, 70, 20, 20)  # gap 11 -> window 27 px: A's columns 43..59 face B
    disp = np.zeros((100, 100), np.float32)
    disp[a] = 0.1
    disp[40:60, 43:60] = 0.9
    disp[b] = 0.5
    m = measure_depth(a, b, disp)
    # B's columns 70..86 face A likewise (d <= 27 from A's column 59)
    assert m.values["facing_pixels_a"] == 17 * 20 and m.values["facing_pixels_b"] == 17 * 20
    assert m.values["disparity_a"] == pytest.approx(0.9)
    assert m.predicates == {"in front of"}  # the whole-mask mean (0.33) would have said "behind"


def test_depth_flat_disparity_fires_nothing() -> None:
    a, b, _ = _depth_scene(0.0, 0.0)
    assert depth_predicates(a, b, np.zeros((100, 100), np.float32)) == frozenset()


# --------------------------------------------------------------------- attributes
@pytest.mark.parametrize(
    ("scores", "beta", "expected"),
    [
        ({"red": 10.0, "orange": 9.6, "gray": 3.0}, 0.5, {"red", "orange"}),  # within 0.5 of the top
        ({"red": 10.0, "orange": 9.5, "gray": 3.0}, 0.5, {"red", "orange"}),  # exactly max - beta counts
        ({"red": 10.0, "orange": 9.4, "gray": 3.0}, 0.5, {"red"}),
        ({"wooden": 5.0, "metal": 4.99, "glass": 1.0}, 0.0, {"wooden"}),  # material: top-1
        ({"wooden": 5.0, "metal": 5.0, "glass": 1.0}, 0.0, {"wooden", "metal"}),  # exact tie keeps both
    ],
)
def test_attribute_confusion_set(scores: dict[str, float], beta: float, expected: set[str]) -> None:
    assert attribute_confusion_set(scores, beta) == expected


# --------------------------------------------------------------------- detection and counting
def _dets(scores: list[float], classes: list[str] | None = None) -> Detections:
    classes = classes or ["cup"] * len(scores)
    masks = np.zeros((len(scores), 8, 8), bool)
    return Detections.from_masks(classes, scores, masks, (8, 8))


@pytest.mark.parametrize(
    ("scores", "present", "counted", "fallback", "over"),
    [
        ([0.029], False, 0, False, False),  # below presence 0.03
        ([0.03], True, 1, True, False),  # present; nothing reaches 0.5: the top one is kept
        ([0.004, 0.004], False, 0, False, False),  # below the prediction floor: discarded
        ([0.49, 0.2], True, 1, True, False),  # fallback keeps only the most confident
        ([0.5], True, 1, False, False),
        ([0.5, 0.5], True, 2, False, True),  # two counted instances of a count-1 object: over-count
        ([0.9, 0.49], True, 1, False, False),  # the 0.49 one is not counted
    ],
)
def test_presence_and_counting(scores: list[float], present: bool, counted: int, fallback: bool, over: bool) -> None:
    sel = select_instances(_dets(scores), "cup", 1)
    assert (sel.present, len(sel.counted), sel.fallback, sel.over_count) == (present, counted, fallback, over)


def test_per_class_cap_and_no_suppression() -> None:
    sel = select_instances(_dets([0.9] * 20 + [0.6], ["cup"] * 20 + ["dog"]), "cup", 16)
    assert len(sel.kept) == 16 and len(sel.counted) == 16 and not sel.over_count  # capped at 16
    # identical boxes are not suppressed (IoU threshold 1.0)
    boxes = np.array([[0, 0, 4, 4], [0, 0, 4, 4]], np.float32)
    same = Detections(("cup", "cup"), np.array([0.9, 0.8], np.float32), boxes, np.zeros((2, 8, 8), bool), (8, 8))
    assert len(select_instances(same, "cup", 1).counted) == 2
    nms = RuleConfig(detection=CURRENT.detection.model_copy(update={"overlap_iou": 0.5}))
    assert len(select_instances(same, "cup", 1, nms).counted) == 1


def test_skis_are_exempt_from_over_count() -> None:
    assert not select_instances(_dets([0.9, 0.8], ["skis", "skis"]), "skis", 1).over_count
    assert select_instances(_dets([0.9, 0.8], ["skateboard"] * 2), "skateboard", 1).over_count


def test_under_count_for_larger_requests() -> None:
    sel = select_instances(_dets([0.9, 0.3]), "cup", 2)
    assert sel.present and len(sel.counted) == 1 and sel.under_count


# --------------------------------------------------------------------- mask refinement
def test_select_by_overlap_ignores_candidate_order_and_confidence() -> None:
    ref = rect(10, 10, 20, 20)
    cands = np.stack([rect(0, 0, 60, 60), rect(11, 11, 18, 18), rect(50, 50, 10, 10)])
    assert select_by_overlap(cands, ref) == 1
    with pytest.raises(ValueError, match=r"candidates must be \(K, H, W\)"):
        select_by_overlap(cands[:0], ref)


def test_postprocess_closes_small_holes_and_drops_small_components() -> None:
    mask = rect(20, 20, 40, 40)
    mask[38:41, 38:41] = False  # a 3x3 hole: closed by a radius-5 disk
    big_piece = rect(70, 70, 10, 10)  # 100 px = 6.25% of the 1600 px body: kept
    small_piece = rect(5, 80, 8, 8)  # 64 px = 4% : dropped
    out = postprocess_mask(mask | big_piece | small_piece)
    assert out[38:41, 38:41].all()
    assert out[70:80, 70:80].all() and not out[5:13, 80:88].any()
    assert (out & ~(mask | big_piece | small_piece)).sum() == 9  # closing added only the hole


def test_postprocess_does_not_erode_at_the_image_border() -> None:
    mask = rect(0, 0, 30, 30)
    np.testing.assert_array_equal(postprocess_mask(mask), mask)


def test_rules_reject_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match=r"masks differ in shape: \(100, 100\) vs \(50, 50\)"):
        directional_predicates(rect(0, 0, 5, 5), rect(0, 0, 5, 5, (50, 50)))
    with pytest.raises(ValueError, match="2-D bool array"):
        proximity_predicates(np.zeros((4, 4), np.uint8), np.zeros((4, 4), bool))  # type: ignore[arg-type]


def test_empty_masks_are_degenerate() -> None:
    empty = np.zeros((100, 100), bool)
    for fn in (directional_predicates, proximity_predicates, comparative_predicates):
        assert fn(empty, A_SQ) == frozenset()
    assert depth_predicates(empty, A_SQ, np.zeros((100, 100), np.float32)) == frozenset()
