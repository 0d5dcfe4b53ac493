"""Detector backends return their detections in ``negt2i.stages.common.detection_order``: by score, highest
first, equal scores by class name and then by box, so that the order the rules break ties by (the earlier
detection wins) is the same on every machine, whatever order the model's own sort left equal scores in
(torchvision's batched NMS sorts with an unstable sort). The class filter inside the backends breaks ties
the same way, so a filtered call still returns exactly ``filter_detections`` of the unfiltered one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from negt2i.core.config import CURRENT
from negt2i.core.perception import Detections
from negt2i.stages import maskrcnn_backend, rfdetr_backend
from negt2i.stages.base import ModelInfo
from negt2i.stages.common import detection_order, filter_detections, select_requested

FLOOR = CURRENT.detection.prediction_floor
NAMES = {1: "person", 3: "car", 18: "dog"}
"""Label -> class; label 12 has no benchmark name (dropped)."""
HW = (16, 16)

_BOX = st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(0, 4), st.integers(0, 4)).map(
    lambda b: (b[0], b[1], b[0] + b[2], b[1] + b[3])  # inside the image: clipping never makes two boxes equal
)
_ROW = st.tuples(st.sampled_from([1, 3, 18, 12]), st.sampled_from([0.001, 0.25, 0.5, 1.0]), _BOX)
_ROWS = st.lists(_ROW, max_size=12, unique=True)  # few scores and boxes: many exact ties


def _key(name: str, score: float, box: Any) -> tuple[Any, ...]:
    return (-float(np.float32(score)), name, *(float(v) for v in box))


def _both(rows: list[tuple[int, float, tuple[int, int, int, int]]]) -> list[Detections]:
    """``rows`` through RF-DETR's and Mask R-CNN's ``to_detections``; each row's mask is its box."""
    labels = np.array([r[0] for r in rows], dtype=np.int64)
    scores = np.array([r[1] for r in rows], dtype=np.float32)
    boxes = np.array([r[2] for r in rows], dtype=np.float32).reshape(-1, 4)
    masks = np.zeros((len(rows), *HW), bool)
    for m, (_, _, (x0, y0, x1, y1)) in zip(masks, rows, strict=True):
        m[y0:y1, x0:x1] = True
    return [
        rfdetr_backend.to_detections(labels, scores, boxes, masks, HW, names=NAMES, floor=FLOOR),
        maskrcnn_backend.to_detections(labels, scores, boxes, masks[:, None].astype(np.float32), HW, names=NAMES,
                                       floor=FLOOR),
    ]  # fmt: skip


def _same(a: Detections, b: Detections) -> None:
    assert a.class_names == b.class_names
    np.testing.assert_array_equal(a.scores, b.scores)
    np.testing.assert_array_equal(a.xyxy, b.xyxy)
    np.testing.assert_array_equal(a.masks, b.masks)


@settings(max_examples=200, deadline=None)
@given(rows=_ROWS, data=st.data())
def test_the_order_is_the_detections_own_whatever_order_the_model_gave(rows: list[Any], data: st.DataObject):
    perm = data.draw(st.permutations(range(len(rows))))
    for det, shuffled in zip(_both(rows), _both([rows[i] for i in perm]), strict=True):
        _same(det, shuffled)  # the model's order does not matter
        keys = [_key(n, s, b) for n, s, b in zip(det.class_names, det.scores, det.xyxy, strict=True)]
        assert keys == sorted(keys)  # by score (high first), then class, then box
        kept = [r for r in rows if r[0] in NAMES and np.float32(r[1]) >= FLOOR]
        assert len(det) == len(kept)
        for name, box, mask in zip(det.class_names, det.xyxy, det.masks, strict=True):
            x0, y0, x1, y1 = (int(v) for v in box)
            assert mask[y0:y1, x0:x1].all() and mask.sum() == (x1 - x0) * (y1 - y0)  # masks travel with rows
            assert name in NAMES.values()


def test_equal_scores_are_ordered_by_class_then_box_and_the_cap_keeps_the_first():
    rows = [(1, 1.0, (8, 0, 12, 4)), (1, 1.0, (0, 0, 4, 4)), (18, 1.0, (4, 4, 8, 8)), (3, 1.0, (0, 8, 4, 12))]
    for det in _both(rows):
        assert det.class_names == ("car", "dog", "person", "person")
        np.testing.assert_array_equal(det.xyxy[2:], [[0, 0, 4, 4], [8, 0, 12, 4]])  # the left person first
        capped, idx = filter_detections(det, ["person"], 1)
        np.testing.assert_array_equal(capped.xyxy, [[0, 0, 4, 4]])
        assert idx.tolist() == [2]
    assert detection_order([], np.zeros(0), np.zeros((0, 4))).tolist() == []
    assert detection_order([None, "cup"], np.array([0.5, 0.5]), np.zeros((2, 4))).tolist() == [0, 1]  # "" first


def test_rfdetr_post_processing_breaks_ties_as_to_detections_when_filtering():
    """Six queries with the same cup score (RF-DETR's sort leaves them in query order, right to left) and a
    cap of 2: the filtered post-processing keeps the two leftmost cups, exactly ``filter_detections`` of the
    unfiltered answer in ``detection_order``."""
    torch = pytest.importorskip("torch")
    from rfdetr.models.postprocess import PostProcess

    names = rfdetr_backend.class_names_by_id()
    cup = next(k for k, v in names.items() if v == "cup")
    logits = torch.full((1, 300, 91), -12.0)
    logits[0, :6, cup] = 2.0  # six equal cup scores
    logits[0, 6:9, 1] = 3.0  # three persons, higher
    boxes = torch.full((1, 300, 4), 0.1)
    boxes[0, :9, 0] = torch.linspace(0.9, 0.1, 9)  # cx: query 0 rightmost
    masks = torch.randn(1, 300, 16, 16, generator=torch.Generator().manual_seed(0))
    outputs = {"pred_logits": logits, "pred_boxes": boxes, "pred_masks": masks}
    sizes = torch.tensor([[64, 64]])
    post = rfdetr_backend._FilteredPostProcess(PostProcess(num_select=300), names, FLOOR)

    def detections(result: dict[str, Any]) -> Detections:
        return rfdetr_backend.to_detections(result["labels"].numpy(), result["scores"].numpy(),
                                            result["boxes"].numpy(), result["masks"].squeeze(1).numpy(), (64, 64),
                                            names=names, floor=FLOOR)  # fmt: skip

    full = detections(post(outputs, sizes, score_threshold=FLOOR)[0])
    post.request = [(["cup"], 2)]
    got = detections(post(outputs, sizes, score_threshold=FLOOR)[0])
    want, _ = filter_detections(full, ["cup"], 2)
    _same(got, want)
    assert got.class_names == ("cup", "cup") and got.xyxy[0, 0] < got.xyxy[1, 0] < full.xyxy[-1, 0]
    keep, counts = select_requested(full.class_names, full.scores, ["cup"], 2)
    assert post.counts == [counts] == [{"cup": 6}] and len(keep) == 2


def test_maskrcnn_equal_scores_leave_the_real_model_in_detection_order():
    """Mask R-CNN rigged so that every box scores the same for one class (the classifier's weights zeroed):
    torchvision's NMS leaves the equal scores in its sort's order; the backend returns them in
    ``detection_order``, and the class filter's cap keeps the first of them, as ``filter_detections``."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")

    torch.manual_seed(0)
    model = maskrcnn_backend.build_model(floor=FLOOR, min_size=64, max_size=64, proposals=32, detections_per_img=40)
    info = ModelInfo(stage="detector", backend="maskrcnn-r50", model="maskrcnn_resnet50_fpn")
    detector = maskrcnn_backend.MaskRCNNDetector(model, info, floor=FLOOR)
    cls_score = model.roi_heads.box_predictor.cls_score
    with torch.no_grad():
        cls_score.weight.zero_()
        cls_score.bias.fill_(-20.0)
        cls_score.bias[1] = 20.0  # person: the same score for every box
    image = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    (full,) = detector.detect([image])
    assert len(full) > 3 and set(full.class_names) == {"person"} and len(set(full.scores.tolist())) == 1
    keys = [tuple(float(v) for v in box) for box in full.xyxy]
    assert keys == sorted(keys)  # equal scores: by box
    (got,) = detector.detect([image], classes=[["person"]], max_per_class=2)
    want, _ = filter_detections(full, ["person"], 2)
    _same(got, want)
    assert dict(got.class_counts or {}) == {"person": len(full)}
