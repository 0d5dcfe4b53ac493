"""SAM 2.1 backend: the real hiera-small architecture from the package's Hydra config, random weights."""

from __future__ import annotations

import numpy as np
import pytest

from negt2i.config import MaskConfig, RuleConfig
from negt2i.rules import postprocess_mask, select_by_overlap

torch = pytest.importorskip("torch")
pytest.importorskip("sam2")

from negt2i.stages.base import ModelInfo, Segmenter  # noqa: E402
from negt2i.stages.sam2_backend import SAM2Segmenter, build_model, make_predictor  # noqa: E402


@pytest.fixture(scope="module")
def predictor():
    torch.manual_seed(0)
    model = build_model(None, "cpu", image_size=256)  # no checkpoint: random weights, nothing downloaded
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(46.1e6, rel=0.01)  # paper: 46.1M loaded
    return make_predictor(model)


class CountingPredictor:
    """Forwards to the real predictor and records the box batches it was asked for."""

    def __init__(self, inner):
        self.inner = inner
        self.box_batches: list[int] = []

    def set_image(self, image):
        self.inner.set_image(image)

    def reset_predictor(self):
        self.inner.reset_predictor()

    def predict(self, box, multimask_output):
        assert multimask_output is True  # three candidates per box; we choose by overlap
        self.box_batches.append(len(box))
        return self.inner.predict(box=box, multimask_output=multimask_output)


@pytest.mark.slow
def test_refine_chunks_boxes_and_chooses_candidates_by_overlap(predictor):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (64, 72, 3), dtype=np.uint8)
    boxes = np.array([[4, 4, 30, 40], [30, 10, 70, 60], [10, 40, 40, 63]], np.float32)
    refs = np.zeros((3, 64, 72), bool)
    for k, (x0, y0, x1, y1) in enumerate(boxes.astype(int)):
        refs[k, y0:y1, x0:x1] = True
    config = RuleConfig(masks=MaskConfig(box_chunk_size=2))
    counting = CountingPredictor(predictor)
    seg = SAM2Segmenter(
        counting, ModelInfo(stage="segmenter", backend="sam2.1-hiera-small", model="random"), config=config
    )
    assert isinstance(seg, Segmenter)
    out = seg.refine(image, boxes, refs)
    assert out.shape == (3, 64, 72) and out.dtype == np.bool_
    assert counting.box_batches == [2, 1]  # chunks of box_chunk_size
    # the same choice computed by hand from SAM's candidates
    predictor.set_image(image)
    cands = seg.candidates(boxes, (64, 72))
    predictor.reset_predictor()
    assert cands.shape == (3, 3, 64, 72)
    for k in range(3):
        expected = postprocess_mask(cands[k, select_by_overlap(cands[k], refs[k])], config)
        np.testing.assert_array_equal(out[k], expected)


def test_refine_without_boxes(predictor):
    seg = SAM2Segmenter(predictor, ModelInfo(stage="segmenter", backend="sam2.1-hiera-small", model="random"))
    out = seg.refine(np.zeros((16, 16, 3), np.uint8), np.zeros((0, 4), np.float32), np.zeros((0, 16, 16), bool))
    assert out.shape == (0, 16, 16)
    with pytest.raises(ValueError, match="reference masks"):
        seg.refine(np.zeros((16, 16, 3), np.uint8), np.zeros((1, 4), np.float32), np.zeros((0, 16, 16), bool))
