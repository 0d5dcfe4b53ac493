"""The real loading code (``from_weights`` via the registry) on weights built and saved locally.

Each test writes a weights folder in the layout ``negt2i weights fetch`` produces (with
a lock recording the files' hashes), loads it through ``registry.create`` exactly as
``negt2i evaluate`` does, and runs the backend once.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from negt2i import weights
from negt2i.stages import registry

torch = pytest.importorskip("torch")


def _lock(folder: Path, name: str) -> str:
    """Write the lock as ``weights fetch`` would; returns the main file's SHA-256."""
    files = {
        p.name: {"sha256": weights.file_digest(p), "size": p.stat().st_size}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != weights.LOCK_NAME
    }
    (folder / weights.LOCK_NAME).write_text(json.dumps({"name": name, "revision": "local-test", "files": files}))
    return str(files[weights.WEIGHTS[name].main_file]["sha256"])


@pytest.fixture
def no_published_hashes(monkeypatch):
    table = {k: dataclasses.replace(v, md5="", sha256="") for k, v in weights.WEIGHTS.items()}
    monkeypatch.setattr(weights, "WEIGHTS", table)


def test_depth_anything_from_weights(tmp_path):
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config, DPTImageProcessor

    folder = tmp_path / "depth-anything-v2-small"
    backbone = Dinov2Config(
        image_size=28, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
        out_indices=[1, 2, 3, 4], reshape_hidden_states=False,
    )  # fmt: skip
    config = DepthAnythingConfig(
        backbone_config=backbone, reassemble_hidden_size=32, neck_hidden_sizes=[8, 8, 16, 16],
        fusion_hidden_size=16, head_hidden_size=8,
    )  # fmt: skip
    DepthAnythingForDepthEstimation(config).save_pretrained(folder)
    DPTImageProcessor(size={"height": 28, "width": 28}, keep_aspect_ratio=True, ensure_multiple_of=14).save_pretrained(
        folder
    )
    sha = _lock(folder, "depth-anything-v2-small")
    depth = registry.create("depth", "depth-anything-v2-small", device="cpu", weights_dir=tmp_path)
    assert (depth.info.sha256, depth.info.revision, depth.info.device) == (sha, "local-test", "cpu")
    assert depth.info.library.startswith("transformers ")
    maps = depth.disparity([np.zeros((20, 30, 3), np.uint8)])
    assert maps[0].shape == (20, 30)


def test_siglip_from_weights(tmp_path):
    import open_clip
    from safetensors.torch import save_file

    from tests.stages.test_siglip import TINY

    folder = tmp_path / "siglip2-so400m-378"
    folder.mkdir()
    name = "negt2i-tiny-load"
    cfg = tmp_path / f"{name}.json"
    cfg.write_text(json.dumps(TINY))
    open_clip.add_model_config(cfg)
    model = open_clip.create_model(name, pretrained=None)
    preprocess_cfg = {
        "mean": [0.5, 0.5, 0.5],
        "std": [0.5, 0.5, 0.5],
        "interpolation": "bicubic",
        "resize_mode": "squash",
    }
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY, "preprocess_cfg": preprocess_cfg}))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
    (folder / "tokenizer_config.json").write_text("{}")
    sha = _lock(folder, "siglip2-so400m-378")
    scorer = registry.create("attributes", "siglip2-so400m-378", device="cpu", weights_dir=tmp_path)
    assert scorer.info.sha256 == sha and scorer.info.library.startswith("open_clip_torch ")
    # the loaded weights are the saved ones
    for key, value in model.state_dict().items():
        torch.testing.assert_close(scorer.model.state_dict()[key], value)
    masks = np.zeros((1, 24, 24), bool)
    masks[0, 4:20, 4:20] = True
    assert scorer.score(np.zeros((24, 24, 3), np.uint8), masks, ["cup"], ("red", "gray")).shape == (1, 2)


@pytest.mark.slow
def test_sam2_from_weights(tmp_path, no_published_hashes):
    from negt2i.stages.sam2_backend import build_model

    folder = tmp_path / "sam2.1-hiera-small"
    folder.mkdir()
    torch.manual_seed(0)
    model = build_model(None, "cpu")
    torch.save({"model": model.state_dict()}, folder / "sam2.1_hiera_small.pt")  # the published checkpoint layout
    _lock(folder, "sam2.1-hiera-small")
    seg = registry.create("segmenter", "sam2.1-hiera-small", device="cpu", weights_dir=tmp_path)
    for key, value in list(model.state_dict().items())[:20]:
        torch.testing.assert_close(seg.predictor.model.state_dict()[key], value)
    ref = np.zeros((1, 32, 32), bool)
    ref[0, 8:24, 8:24] = True
    out = seg.refine(np.zeros((32, 32, 3), np.uint8), np.array([[8, 8, 24, 24]], np.float32), ref)
    assert out.shape == (1, 32, 32)


@pytest.mark.slow
def test_rfdetr_from_weights(tmp_path, no_published_hashes):
    from rfdetr import RFDETRSegXLarge

    folder = tmp_path / "rfdetr-seg-xl"
    folder.mkdir()
    torch.manual_seed(0)
    source = RFDETRSegXLarge(pretrain_weights=None, device="cpu")
    torch.save({"model": source.model.model.state_dict()}, folder / "rf-detr-seg-xlarge.pt")
    sha = _lock(folder, "rfdetr-seg-xl")
    # a small inference resolution keeps the test fast (the optimised graph is built for it)
    det = registry.create("detector", "rfdetr-seg-xl", device="cpu", weights_dir=tmp_path, shape=(96, 96))
    assert det.info.sha256 == sha and det.info.model == "RFDETRSegXLarge"
    assert det.optimized
    out = det.detect([np.zeros((40, 50, 3), np.uint8)])
    assert out[0].shape_hw == (40, 50)


def test_unknown_device_is_rejected(tmp_path):
    from negt2i.stages.torch_support import resolve_device

    assert str(resolve_device("cpu")) == "cpu"
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("tpu")
