"""SAM 2.1 backend: the real hiera-small architecture from the package's Hydra config, random weights."""

from __future__ import annotations

import numpy as np
import pytest

from negt2i.core.config import MaskConfig, RuleConfig
from negt2i.core.rules import postprocess_mask, select_by_overlap

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
    """Records the image batches the real predictor's image encoder runs on and the box batches it is prompted
    with (its ``model.forward_image`` and ``_predict`` patched on the instance while in the ``with`` block)."""

    def __init__(self, inner):
        self.inner = inner
        self.image_batches: list[int] = []
        self.box_batches: list[int] = []

    def __enter__(self):
        inner = self.inner
        forward, predict = inner.model.forward_image, inner._predict

        def forward_image(batch):
            self.image_batches.append(len(batch))
            return forward(batch)

        def _predict(coords, labels, box, mask_input, multimask_output, **kwargs):
            assert multimask_output is True  # three candidates per box; we choose by overlap
            self.box_batches.append(len(box))
            return predict(coords, labels, box, mask_input, multimask_output, **kwargs)

        inner.model.forward_image, inner._predict = forward_image, _predict
        return inner

    def __exit__(self, *exc):
        del self.inner.model.forward_image, self.inner._predict


def scene(rng, hw, boxes):
    image = rng.integers(0, 255, (*hw, 3), dtype=np.uint8)
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    refs = np.zeros((len(boxes), *hw), bool)
    for k, (x0, y0, x1, y1) in enumerate(boxes.astype(int)):
        refs[k, y0:y1, x0:x1] = True
    return image, boxes, refs


@pytest.mark.slow
def test_refine_chunks_boxes_and_chooses_candidates_by_overlap(predictor):
    rng = np.random.default_rng(0)
    image, boxes, refs = scene(rng, (64, 72), [[4, 4, 30, 40], [30, 10, 70, 60], [10, 40, 40, 63]])
    config = RuleConfig(masks=MaskConfig(box_chunk_size=2))
    counting = CountingPredictor(predictor)
    seg = SAM2Segmenter(
        predictor, ModelInfo(stage="segmenter", backend="sam2.1-hiera-small", model="random"), config=config
    )
    assert isinstance(seg, Segmenter)
    with counting:
        out = seg.refine(image, boxes, refs)
    assert out.shape == (3, 64, 72) and out.dtype == np.bool_
    assert counting.box_batches == [2, 1]  # chunks of box_chunk_size
    # the same choice computed by hand from SAM's public one-image API (set_image + predict)
    predictor.set_image(image)
    cands, _, _ = predictor.predict(box=boxes, multimask_output=True)
    predictor.reset_predictor()
    cands = np.asarray(cands > 0.5)
    assert cands.shape == (3, 3, 64, 72)
    for k in range(3):
        expected = postprocess_mask(cands[k, select_by_overlap(cands[k], refs[k])], config)
        np.testing.assert_array_equal(out[k], expected)


@pytest.mark.slow
def test_refine_batch_encodes_images_together_with_the_per_image_result(predictor):
    """Images of different sizes, one without boxes: one backbone call per ``image_batch_size`` images, and
    every image's refined masks identical to refining it alone."""
    rng = np.random.default_rng(1)
    items = [
        scene(rng, (64, 72), [[4, 4, 30, 40], [30, 10, 70, 60]]),
        scene(rng, (48, 40), []),
        scene(rng, (80, 56), [[10, 40, 40, 63]]),
        scene(rng, (64, 72), [[0, 0, 72, 64], [20, 20, 30, 30]]),
    ]
    counting = CountingPredictor(predictor)
    info = ModelInfo(stage="segmenter", backend="sam2.1-hiera-small", model="random")
    seg = SAM2Segmenter(predictor, info, image_batch_size=2)
    with counting:
        batched = seg.refine_batch(items)
    assert counting.image_batches == [2, 1]  # three images with boxes, two per backbone call
    alone = SAM2Segmenter(predictor, info)
    for (image, boxes, refs), out in zip(items, batched, strict=True):
        assert out.shape == (len(boxes), *image.shape[:2])
        np.testing.assert_array_equal(out, alone.refine(image, boxes, refs))


def test_refine_without_boxes(predictor):
    seg = SAM2Segmenter(predictor, ModelInfo(stage="segmenter", backend="sam2.1-hiera-small", model="random"))
    out = seg.refine(np.zeros((16, 16, 3), np.uint8), np.zeros((0, 4), np.float32), np.zeros((0, 16, 16), bool))
    assert out.shape == (0, 16, 16)
    with pytest.raises(ValueError, match="reference masks"):
        seg.refine(np.zeros((16, 16, 3), np.uint8), np.zeros((1, 4), np.float32), np.zeros((0, 16, 16), bool))


class PerImage:
    """A segmenter with only the per-image method: the pipeline calls it once per image."""

    def __init__(self, inner):
        self.inner, self.info = inner, inner.info

    def refine(self, image, boxes, reference_masks):
        return self.inner.refine(image, boxes, reference_masks)


@pytest.mark.slow
def test_pipeline_batches_sam_across_images_with_the_per_image_verdicts(predictor):
    """The pipeline hands every image's boxes to ``refine_batch`` in one call (two backbone calls of two
    images here); verdicts and refined masks equal those of one ``refine`` per image."""
    from negt2i.core.spec import parse_prompt
    from negt2i.pipeline import Pipeline, Stages
    from negt2i.stages.synthetic import SceneObject, SyntheticDepthEstimator, SyntheticDetector, render_scene

    def prompt(category, predicate):
        statement = {"kind": "relation", "subject": 0, "target": 1, "predicate": predicate, "polarity": "positive"}
        return parse_prompt({"id": category, "category": category, "prompt": category,
                             "include": [{"class": "cup"}, {"class": "dog"}], "statements": [statement]})  # fmt: skip

    def image(a, b):
        return render_scene([SceneObject("cup", a), SceneObject("dog", b, shape="ellipse")], (64, 64))

    prompts = [prompt("directional", "left of"), prompt("proximity", "near"), prompt("comparative", "bigger than"),
               prompt("depth", "in front of")]  # fmt: skip
    images = [image((4, 20, 24, 40), (40, 20, 60, 44)), image((10, 10, 30, 30), (32, 10, 50, 30)),
              image((2, 2, 40, 40), (44, 44, 60, 60)), image((4, 40, 24, 62), (40, 4, 60, 24))]  # fmt: skip
    counting = CountingPredictor(predictor)
    info = ModelInfo(stage="segmenter", backend="sam2.1-hiera-small", model="random")
    batched = SAM2Segmenter(predictor, info, image_batch_size=2)
    depth = SyntheticDepthEstimator()
    with counting:
        together = Pipeline(Stages(SyntheticDetector(), batched, depth=depth)).run(prompts, images)
    assert counting.image_batches == [2, 2]  # four images, two per backbone call, in one refine_batch call
    alone = Pipeline(Stages(SyntheticDetector(), PerImage(SAM2Segmenter(predictor, info)), depth=depth)).run(
        prompts, images
    )
    assert all(r.ok for r in together), [r.error for r in together]
    assert [r.verdict.to_json() for r in together] == [r.verdict.to_json() for r in alone]
    for a, b in zip(alone, together, strict=True):
        assert a.perception.refined.masks.keys() == b.perception.refined.masks.keys()
        for k, mask in a.perception.refined.masks.items():
            np.testing.assert_array_equal(b.perception.refined.masks[k], mask)


@pytest.mark.slow
def test_prepared_images_are_the_tensors_set_image_batch_makes(predictor):
    """``prepare`` (run off the model thread) gives exactly the tensors SAM 2's own ``set_image_batch`` makes
    from the images inside its call (the previous path), the image encoder's features from them are the same
    bit for bit, and so are the refined masks."""
    from functools import partial

    from negt2i.stages.common import refine_with_candidates

    rng = np.random.default_rng(2)
    items = [scene(rng, (64, 72), [[4, 4, 30, 40], [30, 10, 70, 60]]), scene(rng, (80, 56), [[10, 40, 40, 63]])]
    info = ModelInfo(stage="segmenter", backend="sam2.1-hiera-small", model="random")
    seg = SAM2Segmenter(predictor, info)
    prepared = [seg.prepare(item) for item in items]
    images = [image for image, _, _ in items]
    assert torch.equal(torch.stack([p.pixels for p in prepared]), predictor._transforms.forward_batch(images))
    assert seg.prepare(scene(rng, (16, 16), [])).pixels is None  # nothing to refine: no transform

    with torch.inference_mode():
        predictor.set_image_batch(images)  # the previous path: SAM 2 transforms inside the model call
        features, orig_hw = predictor._features, predictor._orig_hw
        expected = [
            refine_with_candidates(hw, b, r, partial(seg.candidates, shape_hw=hw, img_idx=j), seg.config)
            for j, ((hw, b, r)) in enumerate((im.shape[:2], b, r) for im, b, r in items)
        ]
        predictor.reset_predictor()
        seg._encode(prepared)
        assert predictor._orig_hw == orig_hw
        assert torch.equal(predictor._features["image_embed"], features["image_embed"])
        for a, b in zip(predictor._features["high_res_feats"], features["high_res_feats"], strict=True):
            assert torch.equal(a, b)
        predictor.reset_predictor()
    for got, want in zip(seg.run_prepared(prepared), expected, strict=True):
        np.testing.assert_array_equal(got, want)
