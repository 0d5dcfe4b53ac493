"""One GPU check of the judge, in at most about 8 minutes on one GPU: prints, for the paper's four models with
random weights (nothing is downloaded),

- per stage, images/s at batch 1 / 8 / 32 in fp32 / bf16 / fp16, and the peak device memory;
- per stage, the output drift of bf16 / fp16 against fp32 on the same inputs (detector: sorted scores and
  the mask IoU of its top detections; segmenter: refined-mask IoU; attributes: scores in 100 x cosine
  units; depth: disparity relative to its range), so that a real-weight parity run can decide the default;
- the full in-process pipeline's images/s (fp32, every stage batched as ``negt2i evaluate`` batches them);
- the distribution of K, the detector's raw detections above the 0.005 floor per image (with random
  weights this is the query count; with the published weights it depends on the image).

Usage (on the GPU machine, from the repository root)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/gpu_check.py                 # cuda if available
    PYTHONPATH=$PWD .venv/bin/python benchmarks/gpu_check.py --smoke         # tiny models on CPU, seconds

``--smoke`` builds tiny versions of the same architectures at small inputs (a test runs it so that the
script keeps working); its figures mean nothing. Figures are printed, never asserted, after a ``machine:``
line (the host's CPU model, core count, load average); the last figure line::

    full pipeline, fp32, N images: R images/s
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from benchmarks.machine import describe  # noqa: E402

STAGES = ("detector", "segmenter", "attributes", "depth")
DTYPES = ("fp32", "bf16", "fp16")


# --------------------------------------------------------------------------- models


def build_stage(stage: str, device: str, dtype: str, smoke: bool) -> Any:
    """The stage backend with random weights (the paper's architecture, or a tiny one with ``smoke``)."""
    import torch

    torch.manual_seed(0)
    if stage == "detector":
        from rfdetr import RFDETRSegNano, RFDETRSegXLarge

        from negt2i.stages.base import ModelInfo
        from negt2i.stages.rfdetr_backend import RFDETRDetector

        model = (RFDETRSegNano if smoke else RFDETRSegXLarge)(pretrain_weights=None, device=device)
        info = ModelInfo(stage="detector", backend="rfdetr-seg-xl", model="RFDETRSegXLarge", device=device)
        return RFDETRDetector(model, info, shape=(96, 96) if smoke else None, dtype=dtype)
    if stage == "segmenter":
        from negt2i.stages.base import ModelInfo
        from negt2i.stages.sam2_backend import SAM2Segmenter, build_model, make_predictor

        model = build_model(None, device, image_size=128 if smoke else None)
        info = ModelInfo(stage="segmenter", backend="sam2.1-hiera-small", model="facebook/sam2.1-hiera-small")
        return SAM2Segmenter(make_predictor(model), info, dtype=dtype, image_batch_size=32)
    if stage == "attributes":
        return _attributes(device, dtype, smoke)
    return _depth(device, dtype, smoke)


def _attributes(device: str, dtype: str, smoke: bool) -> Any:
    import json
    import tempfile

    import open_clip
    import torch

    from negt2i.stages.base import ModelInfo
    from negt2i.stages.siglip_backend import SigLIPScorer

    name = "ViT-SO400M-14-SigLIP2-378"
    if smoke:
        name = "negt2i-gpu-check-tiny"
        tiny = {
            "embed_dim": 32,
            "init_logit_bias": -10,
            "custom_text": True,
            "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
            "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2,
                         "no_causal_mask": True, "proj_bias": True, "pool_type": "last"},
        }  # fmt: skip
        path = Path(tempfile.mkdtemp()) / f"{name}.json"
        path.write_text(json.dumps(tiny))
        open_clip.add_model_config(path)
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=None, device=device)
    context = 16 if smoke else 64

    def tokenizer(texts: Sequence[str]) -> Any:  # the Gemma tokenizer comes with the weights; ids do not matter
        return torch.ones((len(texts), context), dtype=torch.long)

    info = ModelInfo(stage="attributes", backend="siglip2-so400m-378", model="ViT-SO400M-14-SigLIP2-378/webli")
    return SigLIPScorer(model, preprocess, tokenizer, info, batch_size=32, dtype=dtype)


def _depth(device: str, dtype: str, smoke: bool) -> Any:
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config, DPTImageProcessor

    from negt2i.stages.base import ModelInfo
    from negt2i.stages.depth_anything_backend import DepthAnythingEstimator

    if smoke:
        backbone = Dinov2Config(image_size=28, patch_size=14, hidden_size=32, num_hidden_layers=4,
                                num_attention_heads=2, intermediate_size=64, out_indices=[1, 2, 3, 4],
                                reshape_hidden_states=False)  # fmt: skip
        config = DepthAnythingConfig(
            backbone_config=backbone,
            patch_size=14,
            reassemble_hidden_size=32,
            neck_hidden_sizes=[8, 8, 16, 16],
            fusion_hidden_size=16,
            head_hidden_size=8,
        )
    else:
        config = DepthAnythingConfig()  # the Small configuration
    model = DepthAnythingForDepthEstimation(config).to(device)
    side = 42 if smoke else 518
    processor = DPTImageProcessor(
        size={"height": side, "width": side},
        keep_aspect_ratio=True,
        ensure_multiple_of=14,
        resample=3,
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    )
    info = ModelInfo(
        stage="depth", backend="depth-anything-v2-small", model="depth-anything/Depth-Anything-V2-Small-hf"
    )
    return DepthAnythingEstimator(model, processor, info, batch_size=32, dtype=dtype)


# --------------------------------------------------------------------------- inputs and calls


def scenes(n: int, size: int) -> tuple[list[Any], list[Any]]:
    """Synthetic scenes (a cup and a dog) and their synthetic detections (two instances per image)."""
    from negt2i.stages.synthetic import SceneObject, SyntheticDetector, render_scene

    s = size
    images = [
        render_scene(
            [SceneObject("cup", (s // 10, s // 3, s // 3, 2 * s // 3), value="blue"),
             SceneObject("dog", (s // 2 + k % (s // 8), s // 4, 9 * s // 10, 3 * s // 4), shape="ellipse")],
            (s, s),
        )
        for k in range(n)
    ]  # fmt: skip
    return images, SyntheticDetector().detect(images)


def call(stage: str, backend: Any, images: list[Any], dets: list[Any]) -> list[Any]:
    """One batched call of the stage over ``images``; its outputs as numpy arrays."""
    from negt2i.core.vocab import COLOR_ANSWERS

    if stage == "detector":
        return backend.detect(images)  # type: ignore[no-any-return]
    if stage == "segmenter":
        return backend.refine_batch([(im, d.xyxy, d.masks) for im, d in zip(images, dets, strict=True)])  # type: ignore[no-any-return]
    if stage == "attributes":
        return backend.score_batch(  # type: ignore[no-any-return]
            [(im, d.masks, list(d.class_names), COLOR_ANSWERS) for im, d in zip(images, dets, strict=True)]
        )
    return backend.disparity(images)  # type: ignore[no-any-return]


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str, repeats: int) -> float:
    """Median seconds of ``repeats`` calls after one warm-up call."""
    fn()
    _sync(device)
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - start)
    return statistics.median(out)


def _iou(a: Any, b: Any) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def drift(stage: str, ref: list[Any], out: list[Any]) -> str:
    """How far ``out`` is from the fp32 ``ref`` (see the module docstring)."""
    if stage == "detector":
        score, ious = [], []
        for r, o in zip(ref, out, strict=True):
            n = min(len(r), len(o))
            if n:
                score.append(float(np.abs(np.sort(r.scores)[::-1][:n] - np.sort(o.scores)[::-1][:n]).max()))
            for i in np.argsort(-r.scores)[:10]:
                same = [j for j in range(len(o)) if o.class_names[j] == r.class_names[i]]
                ious.append(max((_iou(r.masks[i], o.masks[j]) for j in same), default=0.0))
        return (f"sorted scores max |diff| {max(score, default=0.0):.4f}, "
                f"top-10 mask IoU mean {np.mean(ious) if ious else 1.0:.4f}")  # fmt: skip
    if stage == "segmenter":
        ious = [_iou(a, b) for r, o in zip(ref, out, strict=True) for a, b in zip(r, o, strict=True)]
        return f"refined mask IoU min {min(ious, default=1.0):.4f} mean {np.mean(ious) if ious else 1.0:.4f}"
    if stage == "attributes":
        d = max((float(np.abs(r - o).max()) for r, o in zip(ref, out, strict=True) if r.size), default=0.0)
        return f"scores max |diff| {d:.4f} (100 x cosine units)"
    rel = max(float(np.abs(r - o).max() / max(float(np.ptp(r)), 1e-12)) for r, o in zip(ref, out, strict=True))
    return f"disparity max |diff| / range {rel:.4f}"


def peak_memory(device: str) -> str:
    import resource

    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB (process RSS, CPU)"


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N")
    parser.add_argument("--smoke", action="store_true", help="tiny models, small inputs, batch 1, fp32 + bf16")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset of the four stages")
    parser.add_argument("--batches", default=None, help="batch sizes (default 1,8,32; --smoke 1)")
    parser.add_argument("--dtypes", default=None, help="precisions (default fp32,bf16,fp16; --smoke fp32,bf16)")
    parser.add_argument("--size", type=int, default=None, help="image side in px (default 1024; --smoke 64)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per figure (default 3; --smoke 1)")
    parser.add_argument("--pipeline-images", type=int, default=None, help="images for the pipeline (default 64)")
    args = parser.parse_args(argv)
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    smoke = args.smoke
    batches = [int(b) for b in (args.batches or ("1" if smoke else "1,8,32")).split(",")]
    dtypes = [d.strip() for d in (args.dtypes or ("fp32,bf16" if smoke else ",".join(DTYPES))).split(",")]
    size = args.size or (64 if smoke else 1024)
    repeats = args.repeats or (1 if smoke else 3)
    n_pipeline = args.pipeline_images or (2 if smoke else 64)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    started = time.perf_counter()
    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"
    print(describe())
    print(f"gpu_check: device {device} ({name}), torch {torch.__version__}, {size} px images, "
          f"{'SMOKE (tiny models: figures mean nothing)' if smoke else 'random weights'}")  # fmt: skip
    images, dets = scenes(max(batches), size)
    print("\nstage       dtype  " + "  ".join(f"b={b:<3} img/s" for b in batches) + "  peak memory")
    drifts: list[str] = []
    built: dict[str, Any] = {}
    for stage in stages:
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        built[stage] = build_stage(stage, device, "fp32", smoke)
        reference: list[Any] | None = None
        for dtype in dtypes:
            backend = with_dtype(built[stage], dtype)
            rates = []
            for b in batches:
                seconds = timed(lambda b=b, s=stage, be=backend: call(s, be, images[:b], dets[:b]), device, repeats)
                rates.append(b / seconds)
            outs = call(stage, backend, images, dets)
            if dtype == "fp32":
                reference = outs
            elif reference is not None:
                drifts.append(f"{stage:<11} {dtype}  {drift(stage, reference, outs)}")
            print(f"{stage:<11} {dtype:<5}  " + "  ".join(f"{r:11.2f}" for r in rates) + f"  {peak_memory(device)}")
            if stage == "detector" and dtype == "fp32":
                k = [len(d) for d in outs]
                print(f"  K (raw detections >= 0.005 per image): min {min(k)} median {statistics.median(k):g} "
                      f"max {max(k)} over {len(k)} images")  # fmt: skip
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    if drifts:
        print("\ndrift against fp32 (random weights)")
        for line in drifts:
            print(f"  {line}")
    if set(STAGES) <= set(stages):
        print(f"\nfull pipeline, fp32, {n_pipeline} images:", end=" ", flush=True)
        print(f"{pipeline_rate(built, device, n_pipeline, size, repeats):.2f} images/s")
    print(f"\ngpu_check: done in {time.perf_counter() - started:.0f} s")
    return 0


def with_dtype(backend: Any, dtype: str) -> Any:
    """The same backend (same model object) running in ``dtype``: a shallow copy with its precision set."""
    import copy

    from negt2i.stages.torch_support import DTYPES, check_dtype

    out = copy.copy(backend)
    out.dtype = check_dtype(dtype)
    out.info = backend.info.model_copy(update={"dtype": DTYPES[out.dtype]})
    return out


def pipeline_rate(built: dict[str, Any], device: str, n: int, size: int, repeats: int) -> float:
    """Images/s of ``Pipeline.run`` over color / directional / depth prompts; the real detector runs, the
    synthetic scene's detections drive the downstream stages (as in ``benchmarks/bench_pipeline.py``)."""
    import bench_pipeline

    from negt2i.pipeline import Pipeline, Stages
    from negt2i.stages.synthetic import SyntheticDetector

    class FixedDetections:
        info = built["detector"].info

        def detect(self, imgs: Sequence[Any]) -> list[Any]:
            built["detector"].detect(imgs)
            return SyntheticDetector().detect(imgs)

    pipeline = Pipeline(Stages(FixedDetections(), built["segmenter"], built["attributes"], built["depth"]))  # type: ignore[arg-type]
    images, _ = scenes(n, size)
    ps = bench_pipeline.prompts()
    prompts = [ps[k % len(ps)] for k in range(n)]
    return n / timed(lambda: pipeline.run(prompts, images), device, repeats)


if __name__ == "__main__":
    raise SystemExit(main())
