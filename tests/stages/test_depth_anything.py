"""Depth-Anything V2 backend: a tiny random DepthAnything built offline, real processor and resizing."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from negt2i.stages.base import DepthEstimator, ModelInfo  # noqa: E402
from negt2i.stages.depth_anything_backend import DepthAnythingEstimator, resize_disparity  # noqa: E402


@pytest.fixture(scope="module")
def estimator() -> DepthAnythingEstimator:
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config, DPTImageProcessor

    torch.manual_seed(0)
    backbone = Dinov2Config(
        image_size=28,
        patch_size=14,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=64,
        out_indices=[1, 2, 3, 4],
        reshape_hidden_states=False,
    )
    config = DepthAnythingConfig(
        backbone_config=backbone,
        patch_size=14,
        reassemble_hidden_size=32,
        neck_hidden_sizes=[8, 8, 16, 16],
        fusion_hidden_size=16,
        head_hidden_size=8,
    )
    model = DepthAnythingForDepthEstimation(config)
    # the published preprocessor config, at a tiny input size
    processor = DPTImageProcessor(
        size={"height": 42, "width": 42},
        keep_aspect_ratio=True,
        ensure_multiple_of=14,
        resample=3,
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    )
    info = ModelInfo(stage="depth", backend="depth-anything-v2-small", model="tiny-random")
    return DepthAnythingEstimator(model, processor, info, batch_size=2)


def test_disparity_at_image_size_grouped_by_shape(estimator):
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, s, dtype=np.uint8) for s in ((40, 56, 3), (30, 30, 3), (40, 56, 3), (40, 56, 3))]
    assert isinstance(estimator, DepthEstimator)
    maps = estimator.disparity(images)
    assert [m.shape for m in maps] == [(40, 56), (30, 30), (40, 56), (40, 56)]
    assert all(m.dtype == np.float32 and np.isfinite(m).all() for m in maps)
    # same result image by image (batching and grouping do not change outputs)
    one = estimator.disparity([images[1]])[0]
    scale = float(np.abs(maps[1]).max())
    assert scale > 0
    np.testing.assert_allclose(one, maps[1], rtol=1e-3, atol=1e-4 * scale)
    # deterministic for the same call
    np.testing.assert_array_equal(estimator.disparity(images[:1])[0], estimator.disparity(images[:1])[0])


def test_disparity_matches_the_processor_post_processing(estimator):
    image = np.random.default_rng(1).integers(0, 255, (33, 47, 3), dtype=np.uint8)
    inputs = estimator.processor(images=[image], return_tensors="pt")
    with torch.inference_mode():
        outputs = estimator.model(**inputs)
    ref = estimator.processor.post_process_depth_estimation(outputs, target_sizes=[(33, 47)])[0]["predicted_depth"]
    ref = ref.numpy()
    np.testing.assert_allclose(estimator.disparity([image])[0], ref, rtol=1e-5, atol=1e-6 * float(np.abs(ref).max()))


def test_resize_disparity_known_outputs():
    const = torch.full((2, 5, 7), 3.5)
    out = resize_disparity(const, (11, 13))
    assert out.shape == (2, 11, 13) and out.dtype == np.float32
    # a constant stays constant up to float32 roundoff: 4 x 4 bicubic taps weighted and summed in float32 (ATen's
    # scalar kernels, ATEN_CPU_CAPABILITY=default, give 3.4999962: 1.2e-6 relative; its AVX-512 ones 3.5)
    np.testing.assert_allclose(out, 3.5, rtol=1e-5)
    ramp = torch.arange(4, dtype=torch.float32).repeat(4, 1)[None]  # columns 0..3
    up = resize_disparity(ramp, (4, 8))[0]
    assert np.all(np.diff(up[:, 1:-1], axis=1) > 0)  # still increasing left to right
    np.testing.assert_allclose(resize_disparity(ramp, (4, 4))[0], ramp[0].numpy(), atol=1e-6)  # identity size


def test_empty_call(estimator):
    assert estimator.disparity([]) == []


@pytest.mark.parametrize(("dtype", "recorded"), [("bf16", "bfloat16"), ("fp16", "float16")])
def test_reduced_precision_is_recorded_and_returns_float32(estimator, dtype, recorded):
    """``dtype`` runs the model under autocast, records the precision in ``ModelInfo`` and still returns
    float32 maps close to the fp32 ones (random weights: the drift itself is reported by
    ``benchmarks/gpu_check.py``, not asserted tightly here)."""
    reduced = DepthAnythingEstimator(estimator.model, estimator.processor, estimator.info, dtype=dtype)
    assert estimator.info.dtype == "float32" and reduced.info.dtype == recorded
    image = np.random.default_rng(1).integers(0, 255, (40, 56, 3), dtype=np.uint8)
    ref, out = estimator.disparity([image])[0], reduced.disparity([image])[0]
    assert out.dtype == np.float32 and out.shape == ref.shape
    assert np.abs(out - ref).max() <= 0.1 * (np.abs(ref).max() + 1e-6)


def test_prepared_inputs_are_the_processor_batch(estimator):
    """``prepare`` (one image, off the model thread) gives exactly the tensors the image processor makes for
    the images together inside the previous call, and the disparities from them are the same bit for bit."""
    from negt2i.stages.torch_support import precision

    rng = np.random.default_rng(3)
    images = [rng.integers(0, 255, (30, 44, 3), dtype=np.uint8) for _ in range(3)] + [
        rng.integers(0, 255, (50, 20, 3), dtype=np.uint8)
    ]
    prepared = [estimator.prepare(im) for im in images]
    same = estimator.processor(images=images[:3], return_tensors="pt")["pixel_values"]
    assert torch.equal(torch.cat([p.inputs["pixel_values"] for p in prepared[:3]]), same)
    got = estimator.run_prepared(prepared)
    for idx in ([0, 1], [2], [3]):  # batch_size 2, grouped by size: the previous calls
        inputs = estimator.processor(images=[images[i] for i in idx], return_tensors="pt")
        with precision(estimator.device, estimator.dtype):
            predicted = estimator.model(**inputs).predicted_depth
        for i, want in zip(idx, resize_disparity(predicted, images[idx[0]].shape[:2]), strict=True):
            np.testing.assert_array_equal(got[i], want)
    assert estimator.disparity(images)[3].shape == (50, 20)
    with pytest.raises(ValueError):
        estimator.prepare(np.zeros((4, 4), np.uint8))
