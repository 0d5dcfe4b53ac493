"""Perception records validate shapes at construction and are immutable; RLE matches pycocotools."""

from __future__ import annotations

import numpy as np
import pycocotools.mask as coco_mask
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from negt2i.core import rle
from negt2i.core.perception import AttributeScores, Detections, DisparityMap, ImagePerception, RefinedMasks

from .helpers import rect


def test_detections_shape_errors_name_expected_and_actual() -> None:
    masks = np.zeros((2, 8, 9), bool)
    with pytest.raises(ValueError, match=r"scores has shape \(3,\), expected \(2,\)"):
        Detections(("cup", "dog"), np.zeros(3, np.float32), np.zeros((2, 4), np.float32), masks, (8, 9))
    with pytest.raises(ValueError, match=r"masks has shape \(2, 8, 9\), expected \(N, H, W\) = \(2, 9, 8\)"):
        Detections(("cup", "dog"), np.zeros(2, np.float32), np.zeros((2, 4), np.float32), masks, (9, 8))
    with pytest.raises(ValueError, match=r"xyxy has shape \(2, 3\), expected \(2, 4\)"):
        Detections(("cup", "dog"), np.zeros(2, np.float32), np.zeros((2, 3), np.float32), masks, (8, 9))
    with pytest.raises(ValueError, match=r"scores must be finite and in \[0, 1\]"):
        Detections(("cup", "dog"), np.array([0.5, 1.5], np.float32), np.zeros((2, 4), np.float32), masks, (8, 9))
    with pytest.raises(ValueError, match="x0 <= x1"):
        Detections(("cup",), np.array([0.5], np.float32), np.array([[5, 0, 1, 1]], np.float32), masks[:1], (8, 9))


def test_detections_are_frozen_copies() -> None:
    mask = rect(1, 1, 3, 3, (8, 8))
    dets = Detections.from_masks(["cup"], [0.7], [mask], (8, 8))
    mask[:] = False  # the caller's array changing does not change the record
    assert dets.masks[0].sum() == 9
    assert dets.xyxy.tolist() == [[1, 1, 4, 4]]
    with pytest.raises(ValueError, match="read-only"):
        dets.masks[0, 0, 0] = True
    with pytest.raises(AttributeError):
        dets.scores = np.zeros(1)  # type: ignore[misc]


def test_indices_of_sorts_by_score_stably() -> None:
    m = np.zeros((4, 5, 5), bool)
    dets = Detections.from_masks(["cup", "dog", "cup", "cup"], [0.2, 0.9, 0.6, 0.6], m, (5, 5))
    assert dets.indices_of("cup").tolist() == [2, 3, 0]
    assert dets.indices_of("zebra").tolist() == []


def test_refined_attributes_disparity_validation() -> None:
    with pytest.raises(
        ValueError, match=r"refined mask for detection 0 has shape \(4, 4\), expected \(H, W\) = \(5, 5\)"
    ):
        RefinedMasks({0: np.zeros((4, 4), bool)}, (5, 5))
    with pytest.raises(ValueError, match=r"scores for detection 0 cover \['red'\], expected exactly \['blue', 'red'\]"):
        AttributeScores({0: {"red": 1.0}}, ("red", "blue"))
    with pytest.raises(ValueError, match=r"disparity has shape \(5, 4\), expected \(H, W\) = \(5, 5\)"):
        DisparityMap(np.zeros((5, 4), np.float32), (5, 5))
    with pytest.raises(ValueError, match="finite"):
        DisparityMap(np.full((5, 5), np.nan, np.float32), (5, 5))
    disp = DisparityMap(np.arange(25, dtype=np.float32).reshape(5, 5), (5, 5))
    assert disp.value_range == 24.0
    dets = Detections.empty((5, 5))
    with pytest.raises(ValueError, match=r"refer to detections \[0\], but there are 0"):
        ImagePerception(dets, refined=RefinedMasks({0: np.zeros((5, 5), bool)}, (5, 5)))
    with pytest.raises(ValueError, match=r"disparity is \(6, 5\), but detections are \(5, 5\)"):
        ImagePerception(dets, disparity=DisparityMap(np.zeros((6, 5), np.float32), (6, 5)))


def test_integer_masks_are_accepted_only_when_binary() -> None:
    RefinedMasks({0: np.eye(4, dtype=np.uint8)}, (4, 4))
    with pytest.raises(ValueError, match="must be boolean"):
        RefinedMasks({0: np.eye(4) * 3}, (4, 4))


@settings(max_examples=150, deadline=None)
@given(arrays(np.bool_, st.tuples(st.integers(1, 30), st.integers(1, 30))))
def test_rle_matches_pycocotools(mask: np.ndarray) -> None:
    ours = rle.encode(mask)
    ref = coco_mask.encode(np.asfortranarray(mask.astype(np.uint8)))
    assert ours["counts"] == ref["counts"].decode("ascii")
    assert ours["size"] == list(ref["size"])
    assert rle.area(ours) == int(coco_mask.area(ref)) == int(mask.sum())
    np.testing.assert_array_equal(rle.decode(ours), mask)
    np.testing.assert_array_equal(rle.decode(rle.encode(mask, compressed=False)), mask)
    np.testing.assert_array_equal(coco_mask.decode({"size": ours["size"], "counts": ours["counts"].encode()}), mask)


def test_rle_random_large_masks_match_pycocotools() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        mask = rng.random((rng.integers(50, 300), rng.integers(50, 300))) < rng.random()
        ref = coco_mask.encode(np.asfortranarray(mask.astype(np.uint8)))
        assert rle.encode(mask)["counts"] == ref["counts"].decode()
        np.testing.assert_array_equal(rle.decode({"size": ref["size"], "counts": ref["counts"].decode()}), mask)


def test_rle_rejects_inconsistent_records() -> None:
    with pytest.raises(ValueError, match=r"cover 5 pixels, expected 2 x 3 = 6"):
        rle.decode({"size": [2, 3], "counts": [2, 3]})
    with pytest.raises(ValueError, match="needs 'size'"):
        rle.decode({"counts": [1]})


def test_rle_long_runs_and_large_deltas_match_pycocotools() -> None:
    """4096 px masks: runs of millions of pixels and deltas of both signs (multi-group values)."""
    mask = np.zeros((4096, 4096), bool)
    mask[:, 1000:3000] = True  # one run of ~8M pixels
    mask[5:7, 3500] = True  # then tiny runs: large negative deltas
    mask[-1, -1] = True
    for m in (mask, ~mask, np.ones((4096, 4096), bool)):
        ref = coco_mask.encode(np.asfortranarray(m.astype(np.uint8)))
        ours = rle.encode(m)
        assert ours["counts"] == ref["counts"].decode()
        assert rle.area(ours) == int(m.sum())
        np.testing.assert_array_equal(rle.decode(ours), m)


def test_rle_rejects_malformed_compressed_strings() -> None:
    with pytest.raises(ValueError, match="truncated compressed RLE string"):
        rle.decode({"size": [2, 3], "counts": "6P"})  # 'P' = 32 + 48: a continuation group at the end
    with pytest.raises(ValueError, match="outside"):
        rle.decode({"size": [2, 3], "counts": "6~"})
    with pytest.raises(ValueError, match="cover"):
        rle.decode({"size": [2, 3], "counts": "50"})
