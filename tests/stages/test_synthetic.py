"""The synthetic test backends: exact, hand-checkable answers on drawn scenes."""

from __future__ import annotations

import numpy as np
import pytest

from negt2i.core.config import CURRENT, MaskConfig, RuleConfig
from negt2i.core.vocab import COCO_CLASSES, COLOR_ANSWERS, MATERIALS
from negt2i.stages import registry
from negt2i.stages.base import AttributeScorer, DepthEstimator, Detector, Segmenter
from negt2i.stages.synthetic import (
    BACKGROUND,
    CLASS_COLORS,
    COLOR_REFERENCE,
    MATERIAL_REFERENCE,
    SceneObject,
    SyntheticAttributeScorer,
    SyntheticDepthEstimator,
    SyntheticDetector,
    SyntheticSegmenter,
    render_scene,
    shape_mask,
)


def test_palette_is_unambiguous():
    colors = list(CLASS_COLORS.values())
    assert len(CLASS_COLORS) == len(COCO_CLASSES) == len(set(colors))
    swatches = set(COLOR_REFERENCE.values()) | set(MATERIAL_REFERENCE.values())
    # no swatch or background colour can be mistaken for a class
    assert not swatches & set(colors)
    assert BACKGROUND not in colors
    assert set(COLOR_REFERENCE) == set(COLOR_ANSWERS)
    assert set(MATERIAL_REFERENCE) == set(MATERIALS)


def test_registered_under_synthetic_and_satisfy_protocols():
    for stage, proto in (
        ("detector", Detector),
        ("segmenter", Segmenter),
        ("attributes", AttributeScorer),
        ("depth", DepthEstimator),
    ):
        assert "synthetic" in registry.available(stage)
        backend = registry.create(stage, "synthetic", device="cpu", weights_dir=None, config=CURRENT)
        assert isinstance(backend, proto)
        assert backend.info.stage == stage
        assert backend.info.backend == "synthetic"


def test_detector_finds_each_shape_with_its_filled_mask():
    objs = [
        SceneObject("cup", (10, 12, 30, 40), value="red"),  # swatch must not punch a hole
        SceneObject("dog", (50, 50, 90, 80), shape="ellipse"),
        SceneObject("cup", (100, 100, 120, 110)),
    ]
    image = render_scene(objs, (128, 128))
    det = SyntheticDetector().detect([image])[0]
    # classes in COCO order (dog before cup), components in scan order
    assert det.class_names == ("dog", "cup", "cup")
    np.testing.assert_array_equal(det.masks[0], shape_mask(objs[1], (128, 128)))
    np.testing.assert_array_equal(det.masks[1], shape_mask(objs[0], (128, 128)))
    np.testing.assert_array_equal(det.xyxy[1], [10, 12, 30, 40])
    np.testing.assert_array_equal(det.xyxy[2], [100, 100, 120, 110])
    assert np.all(det.scores == np.float32(0.9))


def test_detector_empty_scene_and_tiny_components():
    image = render_scene([SceneObject("cat", (5, 5, 6, 7))], (32, 32))  # 2 px < min_area 4
    det = SyntheticDetector().detect([image, render_scene([], (16, 24))])
    assert len(det[0]) == 0 and det[0].shape_hw == (32, 32)
    assert len(det[1]) == 0 and det[1].shape_hw == (16, 24)


def test_detector_score_option():
    image = render_scene([SceneObject("cat", (5, 5, 20, 20))], (32, 32))
    assert SyntheticDetector(score=0.2).detect([image])[0].scores.tolist() == [pytest.approx(0.2)]
    with pytest.raises(ValueError, match="score"):
        SyntheticDetector(score=1.5)


def test_segmenter_returns_reference_through_postprocessing_in_chunks():
    objs = [SceneObject("cat", (4 + 6 * i, 4, 8 + 6 * i, 20)) for i in range(5)]
    image = render_scene(objs, (32, 40))
    det = SyntheticDetector().detect([image])[0]
    seg = SyntheticSegmenter(config=RuleConfig(masks=MaskConfig(box_chunk_size=2)))
    out = seg.refine(image, det.xyxy, det.masks)
    assert seg.calls == 3  # 5 boxes in chunks of 2
    assert out.shape == (5, 32, 40)
    np.testing.assert_array_equal(out, det.masks)


def test_segmenter_closes_gaps_in_reference():
    image = render_scene([SceneObject("cat", (4, 4, 28, 28))], (32, 32))
    ref = shape_mask(SceneObject("cat", (4, 4, 28, 28)), (32, 32))
    holed = ref.copy()
    holed[10:12, 10:20] = False  # a 2-px slit that closing (radius 5) repairs
    out = SyntheticSegmenter().refine(image, np.array([[4, 4, 28, 28]], np.float32), holed[None])
    np.testing.assert_array_equal(out[0], ref)


def test_segmenter_rejects_mismatched_inputs():
    image = render_scene([], (16, 16))
    with pytest.raises(ValueError, match="reference masks"):
        SyntheticSegmenter().refine(image, np.zeros((2, 4), np.float32), np.zeros((1, 16, 16), bool))


@pytest.mark.parametrize("value", [*COLOR_ANSWERS])
def test_scorer_tops_the_drawn_color(value):
    obj = SceneObject("cup", (8, 8, 40, 40), value=value)
    image = render_scene([obj], (48, 48))
    mask = shape_mask(obj, (48, 48))
    scores = SyntheticAttributeScorer().score(image, mask[None], ["cup"], COLOR_ANSWERS)
    assert scores.shape == (1, len(COLOR_ANSWERS))
    assert scores[0, COLOR_ANSWERS.index(value)] == pytest.approx(100.0)
    others = np.delete(scores[0], COLOR_ANSWERS.index(value))
    assert others.max() < 100.0 - 0.5  # beyond the colour confusion buffer


@pytest.mark.parametrize("value", MATERIALS)
def test_scorer_tops_the_drawn_material(value):
    obj = SceneObject("chair", (8, 8, 40, 40), shape="ellipse", value=value)
    image = render_scene([obj], (48, 48))
    scores = SyntheticAttributeScorer().score(image, shape_mask(obj, (48, 48))[None], ["chair"], MATERIALS)
    assert MATERIALS[int(np.argmax(scores[0]))] == value


def test_scorer_rejects_unknown_answers():
    image = render_scene([], (16, 16))
    with pytest.raises(ValueError, match="no answer 'shiny'"):
        SyntheticAttributeScorer().score(image, np.zeros((1, 16, 16), bool), ["cup"], ["shiny"])


def test_depth_is_ground_contact_and_closer_wins():
    far = SceneObject("horse", (10, 10, 40, 30))  # bottom row 29
    near = SceneObject("dog", (30, 20, 60, 50))  # bottom row 49, drawn over the horse
    image = render_scene([far, near], (64, 64))
    disp = SyntheticDepthEstimator().disparity([image])[0]
    assert disp.shape == (64, 64) and disp.dtype == np.float32
    assert disp[15, 15] == pytest.approx(30 / 64)
    assert disp[40, 45] == pytest.approx(50 / 64)
    assert disp[25, 35] == pytest.approx(50 / 64)  # overlap: the closer object
    assert disp[60, 5] == 0.0
