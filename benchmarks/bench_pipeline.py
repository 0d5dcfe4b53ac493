"""Throughput of each perception stage and of the whole embedded pipeline, on CPU (or --device cuda).

The real architectures with random weights (nothing is downloaded): RF-DETR-Seg-XL at
its 624 px resolution, SAM 2.1 hiera-small at 1024 px, SigLIP 2 SO400M/14 at 378 px,
Depth-Anything V2 Small at 518 px. Random weights cost the same arithmetic as the
published ones, except that the detector's output (how many boxes pass the 0.005
floor) and therefore the downstream work depend on the weights; the pipeline figure
therefore fixes the downstream work with a synthetic scene (two objects per image,
every relation / attribute prompt evaluable) and times the real models on it.

Figures are printed, never asserted; after a ``machine:`` line (CPU model, core count, load average), a
table whose last row is the whole pipeline::

    pipeline        R        S  color / directional / depth prompts in turn

Usage::

    .venv/bin/python benchmarks/bench_pipeline.py [--images 4] [--size 512] [--threads 2]
        [--stages detector,segmenter,attributes,depth,pipeline]
    .venv/bin/python benchmarks/bench_pipeline.py --smoke   # tiny models (gpu_check's), 2 images of 64 px: seconds

The SigLIP 2 text tower needs the Gemma tokenizer, which is part of the downloaded
weights; here a stand-in tokenizer returns fixed token ids (text embeddings are
computed once per class and cached, so this does not change per-image cost).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's negt2i, wherever it is run from

from benchmarks.machine import describe

STAGES = ("detector", "segmenter", "attributes", "depth", "pipeline")


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _params(model: Any) -> float:
    return sum(p.numel() for p in model.parameters()) / 1e6


def build_detector(device: str) -> Any:
    from rfdetr import RFDETRSegXLarge

    from negt2i.stages.base import ModelInfo
    from negt2i.stages.rfdetr_backend import RFDETRDetector

    model = RFDETRSegXLarge(pretrain_weights=None, device=device)
    print(f"  RF-DETR-Seg-XL: {_params(model.model.model):.1f}M parameters, resolution {model.model_config.resolution}")
    return RFDETRDetector(model, ModelInfo(stage="detector", backend="rfdetr-seg-xl", model="RFDETRSegXLarge"))


def build_segmenter(device: str) -> Any:
    from negt2i.stages.base import ModelInfo
    from negt2i.stages.sam2_backend import SAM2Segmenter, build_model, make_predictor

    model = build_model(None, device)
    print(f"  SAM 2.1 hiera-small: {_params(model):.1f}M parameters, input {model.image_size}")
    info = ModelInfo(stage="segmenter", backend="sam2.1-hiera-small", model="facebook/sam2.1-hiera-small")
    return SAM2Segmenter(make_predictor(model), info)


def build_attributes(device: str) -> Any:
    import open_clip
    import torch

    from negt2i.stages.base import ModelInfo
    from negt2i.stages.siglip_backend import SigLIPScorer

    model, _, preprocess = open_clip.create_model_and_transforms(
        "ViT-SO400M-14-SigLIP2-378", pretrained=None, device=device
    )
    print(f"  SigLIP 2 SO400M/14-378: {_params(model):.1f}M parameters")

    def tokenizer(texts: Sequence[str]) -> Any:
        return torch.ones((len(texts), 64), dtype=torch.long, device=device)

    info = ModelInfo(stage="attributes", backend="siglip2-so400m-378", model="ViT-SO400M-14-SigLIP2-378/webli")
    return SigLIPScorer(model, preprocess, tokenizer, info)


def build_depth(device: str) -> Any:
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, DPTImageProcessor

    from negt2i.stages.base import ModelInfo
    from negt2i.stages.depth_anything_backend import DepthAnythingEstimator

    model = DepthAnythingForDepthEstimation(DepthAnythingConfig())  # the Small configuration
    model.to(device)
    print(f"  Depth-Anything V2 Small: {_params(model):.1f}M parameters")
    processor = DPTImageProcessor(
        size={"height": 518, "width": 518},
        keep_aspect_ratio=True,
        ensure_multiple_of=14,
        resample=3,
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    )
    info = ModelInfo(
        stage="depth", backend="depth-anything-v2-small", model="depth-anything/Depth-Anything-V2-Small-hf"
    )
    return DepthAnythingEstimator(model, processor, info)


def scenes(n: int, size: int) -> list[Any]:
    """Synthetic scenes with a cup and a dog; both objects are evaluable for every prompt below."""
    from negt2i.stages.synthetic import SceneObject, render_scene

    s = size
    return [
        render_scene(
            [
                SceneObject("cup", (s // 10, s // 3, s // 3, 2 * s // 3), value="blue"),
                SceneObject("dog", (s // 2 + k, s // 4, 9 * s // 10, 3 * s // 4), shape="ellipse"),
            ],
            (s, s),
        )
        for k in range(n)
    ]


def prompts() -> list[Any]:
    from negt2i.core.spec import parse_prompt

    rel = {"kind": "relation", "subject": 0, "target": 1, "polarity": "negated"}
    both = [{"class": "cup"}, {"class": "dog"}]
    return [
        parse_prompt({"id": "c", "category": "color", "prompt": "a non-red cup", "include": [{"class": "cup"}],
                      "statements": [{"kind": "attribute", "object": 0, "value": "red", "polarity": "negated"}]}),
        parse_prompt({"id": "d", "category": "directional", "prompt": "p", "include": both,
                      "statements": [rel | {"predicate": "above"}]}),
        parse_prompt({"id": "z", "category": "depth", "prompt": "p", "include": both,
                      "statements": [rel | {"predicate": "behind"}]}),
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4, help="images per stage (default 4)")
    parser.add_argument("--size", type=int, default=512, help="image side in pixels (default 512)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    parser.add_argument("--smoke", action="store_true", help="tiny models, 2 images of 64 px, 1 thread: seconds")
    args = parser.parse_args(argv)
    if args.smoke:
        args.images, args.size, args.threads = 2, 64, 1
    import torch

    from negt2i.core.vocab import COLOR_ANSWERS
    from negt2i.pipeline import Pipeline, Stages
    from negt2i.stages.synthetic import SyntheticDetector

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    wanted = [s.strip() for s in args.stages.split(",") if s.strip()]
    print(describe())
    print(f"CPU: {platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} threads")
    if args.device != "cpu":
        print(f"device: {args.device} ({torch.cuda.get_device_name(torch.device(args.device))})")
    weights = "SMOKE: tiny models (figures mean nothing)" if args.smoke else "random weights"
    print(f"{args.images} images of {args.size}x{args.size} px, {weights}, float32, batch = all images\n")
    images = scenes(args.images, args.size)
    built: dict[str, Any] = {}
    builders: dict[str, Callable[[str], Any]] = {"detector": build_detector, "segmenter": build_segmenter,
                                                 "attributes": build_attributes, "depth": build_depth}  # fmt: skip
    if args.smoke:
        import gpu_check  # its tiny versions of the same architectures

        builders = {s: (lambda device, s=s: gpu_check.build_stage(s, device, "fp32", smoke=True)) for s in builders}
    for stage, build in builders.items():
        if stage in wanted or "pipeline" in wanted:
            seconds, built[stage] = _timed(lambda build=build: build(args.device))
            print(f"  built {stage} in {seconds:.1f} s")
    synthetic = SyntheticDetector().detect(images)
    rows: list[tuple[str, float, str]] = []

    def run(stage: str, fn: Callable[[], Any], note: str) -> None:
        if stage != "pipeline":
            fn()  # warm-up pass, untimed (the pipeline reuses the warmed-up stages)
        seconds, _ = _timed(fn)
        rows.append((stage, seconds, note))
        print(f"  {stage}: {args.images / seconds:.2f} images/s ({seconds / args.images:.2f} s/image)")

    print()
    if "detector" in wanted:
        run("detector", lambda: built["detector"].detect(images), "one batched call")
    if "segmenter" in wanted:
        seg = built["segmenter"]
        run("segmenter", lambda: [seg.refine(im, d.xyxy, d.masks) for im, d in zip(images, synthetic, strict=True)],
            "2 boxes per image")  # fmt: skip
    if "attributes" in wanted:
        att = built["attributes"]
        pairs = list(zip(images, synthetic, strict=True))
        run("attributes", lambda: [att.score(im, d.masks[:1], ["cup"], COLOR_ANSWERS) for im, d in pairs],
            "1 instance x 11 colors")  # fmt: skip
    if "depth" in wanted:
        run("depth", lambda: built["depth"].disparity(images), "one batched call")
    if "pipeline" in wanted:
        stages = Stages(built["detector"], built["segmenter"], built["attributes"], built["depth"])
        pipeline = Pipeline(stages)
        ps = prompts()
        batch_prompts = [ps[k % len(ps)] for k in range(args.images)]

        class FixedDetections:
            """The real detector runs (and is timed) but the synthetic scene's detections drive the plan."""

            info = stages.detector.info

            def detect(self, imgs: Sequence[Any]) -> list[Any]:
                stages.detector.detect(imgs)
                return SyntheticDetector().detect(imgs)

        pipeline.stages = Stages(FixedDetections(), stages.segmenter, stages.attributes, stages.depth)  # type: ignore[arg-type]
        run("pipeline", lambda: pipeline.run(batch_prompts, images), "color / directional / depth prompts in turn")
    print("\nstage       images/s  s/image  note")
    for stage, seconds, note in rows:
        print(f"{stage:<10} {args.images / seconds:9.2f} {seconds / args.images:8.2f}  {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
