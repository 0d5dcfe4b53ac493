"""RF-DETR-Seg-XL backend: class-id mapping, output conversion, and the real architecture with random weights."""

from __future__ import annotations

import numpy as np
import pytest

from negt2i.core.config import CURRENT
from negt2i.core.vocab import COCO_CLASSES
from negt2i.stages.rfdetr_backend import GENEVAL_SPELLING, RFDETRDetector, class_names_by_id, to_detections
from tests.stages.same_detections import assert_same_detections


def test_rfdetr_class_ids_map_onto_the_80_benchmark_classes():
    names = class_names_by_id()
    assert len(names) == 80
    assert set(names.values()) == set(COCO_CLASSES)
    # COCO category ids are sparse (12, 26, 29, ... are unused) and in COCO order
    assert [names[k] for k in sorted(names)] == list(COCO_CLASSES)
    assert names[1] == "person" and names[90] == "toothbrush"
    assert names[72] == "tv"
    assert names[74] == "computer mouse"
    assert names[75] == "tv remote"
    assert names[76] == "computer keyboard"
    assert 12 not in names and 0 not in names


def test_mapping_rejects_unknown_spellings():
    with pytest.raises(ValueError, match="no benchmark spelling"):
        class_names_by_id({1: "person", 2: "hoverboard"})
    assert GENEVAL_SPELLING == {"mouse": "computer mouse", "remote": "tv remote", "keyboard": "computer keyboard"}


def test_to_detections_drops_unknown_ids_and_low_scores_and_clips_boxes():
    names = class_names_by_id()
    masks = np.zeros((4, 10, 20), bool)
    masks[0, 2:5, 3:9] = True
    masks[3, 0:2, 0:2] = True
    det = to_detections(
        class_id=np.array([74, 12, 18, 1]),  # computer mouse, unused id, dog (below floor), person
        confidence=np.array([0.9, 0.8, 0.001, 1.0000001]),
        xyxy=np.array([[3, 2, 9, 5], [0, 0, 1, 1], [0, 0, 1, 1], [-3.5, -1, 25, 12]], np.float32),
        mask=masks,
        shape_hw=(10, 20),
        names=names,
        floor=0.005,
    )
    assert det.class_names == ("person", "computer mouse")  # by score, highest first (detection_order)
    np.testing.assert_allclose(det.scores, [1.0, 0.9])
    np.testing.assert_array_equal(det.xyxy, [[0, 0, 20, 10], [3, 2, 9, 5]])
    np.testing.assert_array_equal(det.masks[0], masks[3])
    np.testing.assert_array_equal(det.masks[1], masks[0])


def test_to_detections_empty_and_maskless():
    names = class_names_by_id()
    empty = to_detections(np.zeros(0), np.zeros(0), np.zeros((0, 4)), None, (8, 8), names=names, floor=0.005)
    assert len(empty) == 0 and empty.shape_hw == (8, 8)
    with pytest.raises(ValueError, match="no masks"):
        to_detections(np.array([1]), np.array([0.5]), np.zeros((1, 4)), None, (8, 8), names=names, floor=0.005)


@pytest.mark.slow
def test_real_architecture_with_random_weights():
    """The XL architecture, random weights: the detector runs RF-DETR's inference-optimised graph by default,
    with the same output as the training graph's ``predict()`` (classes, scores, boxes, masks)."""
    torch = pytest.importorskip("torch")
    from rfdetr import RFDETRSegXLarge

    from negt2i.stages.base import Detector, ModelInfo

    torch.manual_seed(0)
    model = RFDETRSegXLarge(pretrain_weights=None, device="cpu")  # the XL architecture, nothing downloaded
    assert sum(p.numel() for p in model.model.model.parameters()) == pytest.approx(38.1e6, rel=0.01)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (64, 80, 3), dtype=np.uint8), rng.integers(0, 255, (72, 48, 3), dtype=np.uint8)]
    info = ModelInfo(stage="detector", backend="rfdetr-seg-xl", model="RFDETRSegXLarge", revision="random-init")
    reference = RFDETRDetector(model, info, floor=CURRENT.detection.prediction_floor, shape=(96, 96), optimize=False)
    expected = reference.detect(images)  # the training graph (model.model.model)
    assert not model._is_optimized_for_inference
    detector = RFDETRDetector(model, info, floor=CURRENT.detection.prediction_floor, shape=(96, 96))
    assert detector.optimized and model._is_optimized_for_inference
    assert isinstance(detector, Detector)
    out = detector.detect(images)
    assert [d.shape_hw for d in out] == [(64, 80), (72, 48)]
    for d, e in zip(out, expected, strict=True):  # as float32 allows: tests/stages/same_detections.py says why
        assert len(d) > 0 and assert_same_detections(d, e, floor=CURRENT.detection.prediction_floor) >= len(e) - 5
        assert set(d.class_names) <= set(COCO_CLASSES)
        assert len(d) <= 300  # num_select of the XL config
        assert (d.scores >= 0.005).all()
        assert (d.xyxy[:, 2] <= d.shape_hw[1]).all() and (d.xyxy[:, 3] <= d.shape_hw[0]).all()
    for d in (reference, detector):  # both graphs: the same tensors and detections as RF-DETR's own predict()
        assert_prepared_like_predict(d, images)
    again = detector.detect(images[:1])[0]  # a batch of one: other kernels, as float32 allows
    assert assert_same_detections(again, out[0], floor=CURRENT.detection.prediction_floor) >= len(out[0]) - 5
    assert detector.detect([]) == []
    assert detector.info.dtype == "float32"
    with pytest.raises(ValueError, match="square shape"):
        RFDETRDetector(model, info, shape=(96, 64))
    with pytest.raises(ValueError, match="unknown dtype"):
        RFDETRDetector(model, info, shape=(96, 96), dtype="int8")


def assert_prepared_like_predict(detector: RFDETRDetector, images: list[np.ndarray]) -> None:
    """``prepare`` (run off the model thread) builds exactly the batch RF-DETR's ``predict`` builds inside its
    call (the previous path), and ``run_prepared`` gives exactly the detections ``predict`` gives."""
    import torch

    rf = detector.model
    target = rf.model.inference_model if rf._is_optimized_for_inference else rf.model.model
    seen: list[torch.Tensor] = []
    hook = target.register_forward_pre_hook(lambda _module, args: seen.append(args[0].clone()))
    try:
        with torch.inference_mode():
            preds = rf.predict(images, threshold=detector.floor, include_source_image=False, shape=detector.shape)
    finally:
        hook.remove()
    expected = [
        to_detections(p.class_id, p.confidence, p.xyxy, p.mask, im.shape[:2], names=detector.names,
                      floor=detector.floor)
        for p, im in zip(preds, images, strict=True)
    ]  # fmt: skip
    prepared = [detector.prepare(im) for im in images]
    batch = torch.stack([p.pixels for p in prepared])
    assert len(seen) == 1 and seen[0].shape == batch.shape
    assert torch.equal(seen[0], batch.to(seen[0].dtype))  # bit for bit
    got = detector.run_prepared(prepared)
    for d, e in zip(got, expected, strict=True):
        assert len(e) > 0 and d.class_names == e.class_names
        np.testing.assert_array_equal(d.scores, e.scores)
        np.testing.assert_array_equal(d.xyxy, e.xyxy)
        np.testing.assert_array_equal(d.masks, e.masks)
