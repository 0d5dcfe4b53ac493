"""Mask R-CNN R50-FPN backend (``maskrcnn-r50``, the Appendix D ablation detector): class-id mapping,
output conversion, the real architecture with random weights, and loading through the registry
from a locally saved state dict with a lock file. Nothing is downloaded."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from negt2i import weights
from negt2i.core.config import CURRENT
from negt2i.core.vocab import COCO_CLASSES
from negt2i.stages import registry
from negt2i.stages.base import Detector, ModelInfo
from negt2i.stages.maskrcnn_backend import (
    BACKEND,
    DETECTIONS_PER_IMAGE,
    MaskRCNNDetector,
    build_model,
    class_names_by_id,
    to_detections,
)
from tests.stages.same_detections import assert_same_detections

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

FLOOR = CURRENT.detection.prediction_floor
INFO = ModelInfo(stage="detector", backend=BACKEND, model="maskrcnn_resnet50_fpn", revision="random-init")


def _shrink(model, *, proposals: int = 16, detections: int = 12):
    """Test-size settings: 64 px input, few proposals and detections (the mask head dominates on CPU)."""
    model.transform.min_size = (64,)
    model.transform.max_size = 64
    model.rpn._post_nms_top_n["testing"] = proposals
    model.roi_heads.detections_per_img = detections
    return model


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model(floor=FLOOR, min_size=64, max_size=64, proposals=16, detections_per_img=12)


def _images():
    rng = np.random.default_rng(0)
    return [rng.integers(0, 255, (64, 64, 3), dtype=np.uint8), rng.integers(0, 255, (48, 80, 3), dtype=np.uint8)]


# --------------------------------------------------------------------------- class ids


def test_torchvision_labels_map_onto_the_80_benchmark_classes():
    from torchvision.models.detection import MaskRCNN_ResNet50_FPN_Weights

    categories = MaskRCNN_ResNet50_FPN_Weights.COCO_V1.meta["categories"]
    assert len(categories) == 91 and categories[0] == "__background__"
    names = class_names_by_id()
    assert len(names) == 80
    assert [names[k] for k in sorted(names)] == list(COCO_CLASSES)  # COCO order, nothing lost or doubled
    # labels are COCO category ids (1-90, sparse): no shift by the background or the N/A slots
    assert names[1] == "person" and names[2] == "bicycle" and names[90] == "toothbrush"
    assert names[11] == "fire hydrant" and names[13] == "stop sign"  # around the first N/A (12)
    assert names[72] == "tv" and names[73] == "laptop"
    assert names[74] == "computer mouse"
    assert names[75] == "tv remote"
    assert names[76] == "computer keyboard"
    assert names[77] == "cell phone" and names[84] == "book"
    unused = {0, 12, 26, 29, 30, 45, 66, 68, 69, 71, 83}  # __background__ and the ten N/A ids
    assert set(range(91)) - set(names) == unused
    assert all(categories[i] in {"__background__", "N/A"} for i in unused)


def test_same_ids_as_rfdetr():
    from negt2i.stages.rfdetr_backend import class_names_by_id as rfdetr_names

    assert class_names_by_id() == rfdetr_names()


def test_mapping_rejects_unknown_or_misaligned_lists():
    good = ["__background__", *(["N/A"] * 90)]
    with pytest.raises(ValueError, match="no benchmark spelling"):
        class_names_by_id([*good[:1], "hoverboard", *good[2:]])
    with pytest.raises(ValueError, match="91 COCO categories"):
        class_names_by_id(good[1:])  # without __background__ every id would be off by one


# --------------------------------------------------------------------------- output conversion


def test_to_detections_drops_unused_ids_and_low_scores_thresholds_masks_and_clips_boxes():
    names = class_names_by_id()
    h, w = 10, 20
    soft = np.zeros((5, 1, h, w), np.float32)
    soft[0, 0, 2:5, 3:9] = 0.5  # exactly the threshold: inside the mask
    soft[0, 0, 5, 3:9] = 0.4999  # just below: outside
    soft[4, 0] = 0.7
    det = to_detections(
        labels=np.array([74, 12, 18, 0, 1]),  # computer mouse, N/A, dog (below floor), background, person
        scores=np.array([0.9, 0.8, 0.004, 0.9, 1.0000001]),
        boxes=np.array([[3, 2, 9, 5], [0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1], [-3.5, -1, 25, 12]], np.float32),
        soft_masks=soft,
        shape_hw=(h, w),
        names=names,
        floor=FLOOR,
    )
    assert det.class_names == ("person", "computer mouse")  # by score, highest first (detection_order)
    np.testing.assert_allclose(det.scores, [1.0, 0.9])
    np.testing.assert_array_equal(det.xyxy, [[0, 0, 20, 10], [3, 2, 9, 5]])
    assert det.masks.dtype == bool
    expected = np.zeros((h, w), bool)
    expected[2:5, 3:9] = True
    assert det.masks[0].all()
    np.testing.assert_array_equal(det.masks[1], expected)


def test_to_detections_keeps_the_floor_itself_and_does_no_suppression():
    names = class_names_by_id()
    masks = np.ones((3, 1, 8, 8), np.float32)
    box = [1, 1, 6, 6]
    det = to_detections(
        np.array([18, 18, 18]), np.array([FLOOR, 0.6, 0.5]), np.array([box, box, box], np.float32), masks, (8, 8),
        names=names, floor=FLOOR,
    )  # fmt: skip
    assert det.class_names == ("dog", "dog", "dog")  # identical boxes of one class: all kept
    np.testing.assert_allclose(det.scores, [0.6, 0.5, FLOOR])  # by score, highest first


def test_to_detections_empty_and_bad_masks():
    names = class_names_by_id()
    empty = to_detections(np.zeros(0), np.zeros(0), np.zeros((0, 4)), np.zeros((0, 1, 8, 8)), (8, 8), names=names,
                          floor=FLOOR)  # fmt: skip
    assert len(empty) == 0 and empty.shape_hw == (8, 8) and empty.masks.shape == (0, 8, 8)
    with pytest.raises(ValueError, match="masks have shape"):
        to_detections(np.array([1]), np.array([0.5]), np.zeros((1, 4)), np.zeros((1, 1, 4, 4)), (8, 8), names=names,
                      floor=FLOOR)  # fmt: skip


# --------------------------------------------------------------------------- the real architecture


def test_architecture_is_the_published_one(model):
    from torchvision.models.detection import MaskRCNN_ResNet50_FPN_Weights, maskrcnn_resnet50_fpn

    meta = MaskRCNN_ResNet50_FPN_Weights.COCO_V1.meta
    assert sum(p.numel() for p in model.parameters()) == meta["num_params"]  # 44,401,393
    reference = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=91)
    keys = {k for k in reference.state_dict() if not k.endswith("num_batches_tracked")}
    assert set(model.state_dict()) == keys  # the published file's keys, loadable strictly
    published = build_model()  # the settings from_weights uses
    assert published.roi_heads.detections_per_img == DETECTIONS_PER_IMAGE == 300
    assert np.float32(published.roi_heads.score_thresh) < np.float32(FLOOR)
    assert np.nextafter(np.float32(published.roi_heads.score_thresh), np.float32(1)) == np.float32(FLOOR)
    assert published.roi_heads.nms_thresh == 0.5  # the model's own per-class NMS, nothing else
    assert (published.transform.min_size, published.transform.max_size) == ((800,), 1333)
    assert not published.training


def test_real_inference_with_random_weights(model):
    detector = MaskRCNNDetector(model, INFO, floor=FLOOR, batch_size=1)
    assert isinstance(detector, Detector)
    images = _images()
    out = detector.detect(images)
    assert [d.shape_hw for d in out] == [(64, 64), (48, 80)]
    assert sum(len(d) for d in out) > 0  # random weights: roughly uniform class scores, above the floor
    for d in out:
        assert set(d.class_names) <= set(COCO_CLASSES)
        assert len(d) <= 12
        assert (d.scores >= FLOOR).all()
        assert d.masks.dtype == bool and d.masks.shape == (len(d), *d.shape_hw)
        assert (d.xyxy[:, 2] <= d.shape_hw[1]).all() and (d.xyxy[:, 3] <= d.shape_hw[0]).all()
    # batching does not change results (as float32 allows: tests/stages/same_detections.py says why)
    both = MaskRCNNDetector(model, INFO, floor=FLOOR, batch_size=8).detect(images)
    for a, b in zip(out, both, strict=True):
        assert assert_same_detections(b, a, floor=FLOOR) >= len(a) - 1
    again = detector.detect(images)  # the same path again: deterministic, bit for bit
    for a, b in zip(out, again, strict=True):
        assert a.class_names == b.class_names
        np.testing.assert_array_equal(a.scores, b.scores)
        np.testing.assert_array_equal(a.masks, b.masks)
    assert detector.detect([]) == []


def test_labels_reach_our_spelling_through_the_real_post_processing(model):
    """Rig the box classifier to one label and check the name that comes out: no off-by-one anywhere."""
    cls_score = model.roi_heads.box_predictor.cls_score
    saved = {k: v.clone() for k, v in cls_score.state_dict().items()}
    detector = MaskRCNNDetector(model, INFO, floor=FLOOR)
    image = _images()[:1]
    try:
        with torch.no_grad():
            cls_score.weight.zero_()
            for label, name in [(74, "computer mouse"), (75, "tv remote"), (76, "computer keyboard"), (72, "tv")]:
                cls_score.bias.fill_(-20.0)
                cls_score.bias[label] = 20.0
                (d,) = detector.detect(image)
                assert len(d) > 0 and set(d.class_names) == {name}
            cls_score.bias.fill_(-20.0)
            cls_score.bias[12] = 20.0  # an N/A slot: everything else scores ~0, nothing passes
            (d,) = detector.detect(image)
            assert len(d) == 0
    finally:
        cls_score.load_state_dict(saved)


def test_a_score_threshold_above_the_floor_is_refused():
    fake = type("M", (), {"roi_heads": type("R", (), {"score_thresh": 0.05})()})()
    with pytest.raises(ValueError, match="above the floor"):
        MaskRCNNDetector(fake, INFO, floor=FLOOR)


# --------------------------------------------------------------------------- loading through the registry


def _save_weights(root: Path, model) -> str:
    """A weights folder as ``negt2i weights fetch maskrcnn-r50`` writes it; returns the file's SHA-256."""
    e = weights.entry(BACKEND)
    folder = root / e.name
    folder.mkdir(parents=True)
    torch.save(model.state_dict(), folder / e.main_file)
    sha = weights.file_digest(folder / e.main_file)
    lock = {"name": e.name, "revision": "local-test", "files": {e.main_file: {"sha256": sha, "size": 1}}}
    (folder / weights.LOCK_NAME).write_text(json.dumps(lock))
    return sha


def test_weights_entry():
    e = weights.entry(BACKEND)
    assert (e.stage, e.source, e.model) == ("detector", "url", "maskrcnn_resnet50_fpn")
    assert e.repo == "https://download.pytorch.org/models/maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth"
    from torchvision.models.detection import MaskRCNN_ResNet50_FPN_Weights

    assert e.repo == MaskRCNN_ResNet50_FPN_Weights.COCO_V1.url
    assert e.files == (e.main_file,) == ("maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth",)  # torch.hub's file name
    assert e.sha256_prefix == "bf2d0c1e"


def test_missing_weights_error_says_how_to_fetch(tmp_path):
    with pytest.raises(weights.WeightsMissingError) as info:
        registry.create("detector", BACKEND, device="cpu", weights_dir=tmp_path)
    msg = str(info.value)
    assert "maskrcnn-r50 (maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth)" in msg
    assert f"negt2i weights fetch --dir {tmp_path} maskrcnn-r50" in msg


def test_from_weights_through_the_registry(tmp_path, monkeypatch, model):
    sha = _save_weights(tmp_path, model)
    # random weights cannot have the published hash: the prefix check refuses them ...
    with pytest.raises(weights.WeightsError, match="does not start with the published bf2d0c1e"):
        registry.create("detector", BACKEND, device="cpu", weights_dir=tmp_path)
    # ... and without it the lock vouches for the file
    table = dict(weights.WEIGHTS)
    table[BACKEND] = dataclasses.replace(table[BACKEND], sha256_prefix="")
    monkeypatch.setattr(weights, "WEIGHTS", table)
    detector = registry.create("detector", BACKEND, device="cpu", weights_dir=tmp_path, config=CURRENT)
    assert isinstance(detector, MaskRCNNDetector)
    assert (detector.info.sha256, detector.info.revision, detector.info.device) == (sha, "local-test", "cpu")
    assert detector.info.library.startswith("torchvision ")
    assert detector.info.model == "maskrcnn_resnet50_fpn"
    assert detector.model.roi_heads.detections_per_img == 300
    loaded = detector.model.state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(loaded[k], v), k
    _shrink(detector.model)
    images = _images()
    got = detector.detect(images)
    want = MaskRCNNDetector(model, INFO, floor=FLOOR).detect(images)
    for a, b in zip(got, want, strict=True):
        assert a.class_names == b.class_names
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-4, atol=1e-6)


def test_fetch_checks_the_published_hash_prefix(tmp_path):
    def fake_download(e, folder: Path) -> str:
        (folder / e.main_file).write_bytes(b"not the published weights")
        return e.revision

    with pytest.raises(weights.WeightsError, match="does not start with the published bf2d0c1e"):
        weights.fetch([BACKEND], tmp_path, downloader=fake_download, log=lambda m: None)
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind
