"""CPU work per image around the models, in the in-process pipeline, with the models replaced by stubs.

The four real backend wrappers run (``RFDETRDetector``, ``SAM2Segmenter``, ``SigLIPScorer``,
``DepthAnythingEstimator``: their conversions, SAM's and Depth-Anything's image transforms, SigLIP's crop
preprocessing, mask selection and post-processing) and so does ``Pipeline.run`` (planning, rules, verdicts);
only the model forward passes are stubs that return precomputed outputs:

- the detector returns K raw detections with full-size masks (an ellipse in a random box), scores uniform
  in [0.005, 1]; their classes are random COCO classes, except that each of the prompt's classes is given
  to two of them (so that every prompt has instances to refine and score, as a real image would). It
  honours the class filter the pipeline passes (``docs/stage-contract.md``), as RF-DETR's filtering
  post-processing does: only the kept rows (the prompt's classes, at most 16 per class) and their masks
  come back (``--no-filter``: every row, the path before the filter);
- SAM returns three candidate masks per box (the box's ellipse, the box, the ellipse shrunk);
- SigLIP returns fixed unit embeddings; Depth-Anything a fixed 518 x 518 map.

Images are 1024 x 1024; prompts are the benchmark's own (``data/negt2ibench.jsonl``, every category),
cycled. The stub outputs are computed in a warm-up pass; each timed pass runs the same images again.
Prints, per K, exactly one line::

    cpu path per image (1024 px, K=300): median N ms

Usage::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_cpu_path.py [--images 12] [--repeats 3] [--k 20,300]
        [--clock wall|cpu] [--no-filter]

At K=300 the stub outputs alone hold K full-size masks per image (300 MB at 1024 px): mind the memory
with many ``--images``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SIZE = 1024


def ellipse(hw: tuple[int, int], box: Sequence[float], shrink: float = 1.0) -> np.ndarray:
    """A filled ellipse inscribed in ``box`` (scaled by ``shrink`` about its centre)."""
    h, w = hw
    x0, y0, x1, y1 = box
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    rx, ry = max((x1 - x0) / 2 * shrink, 1.0), max((y1 - y0) / 2 * shrink, 1.0)
    r0, r1 = max(int(cy - ry), 0), min(int(cy + ry) + 1, h)
    c0, c1 = max(int(cx - rx), 0), min(int(cx + rx) + 1, w)
    out = np.zeros(hw, dtype=bool)
    yy, xx = np.mgrid[r0:r1, c0:c1]
    out[r0:r1, c0:c1] = ((yy + 0.5 - cy) / ry) ** 2 + ((xx + 0.5 - cx) / rx) ** 2 <= 1.0
    return out


class StubPrediction:
    def __init__(self, class_id: np.ndarray, confidence: np.ndarray, xyxy: np.ndarray, mask: np.ndarray) -> None:
        self.class_id, self.confidence, self.xyxy, self.mask = class_id, confidence, xyxy, mask


class StubRFDETR:
    """``rfdetr.RFDETR.predict`` stand-in: precomputed raw outputs per image (looked up by identity); with a
    class filter requested (``RFDETRDetector`` sets it on its post-processing hook), only the rows RF-DETR's
    filtering post-processing keeps, with their masks."""

    def __init__(self, honour_filter: bool = True) -> None:
        from types import SimpleNamespace

        import torch

        self.model = SimpleNamespace(device=torch.device("cpu"), postprocess=None)
        self.outputs: dict[int, StubPrediction] = {}
        self.honour_filter = honour_filter

    def predict(self, images: list[np.ndarray], **_: Any) -> list[StubPrediction]:
        from negt2i.stages.common import select_requested

        raw = [self.outputs[id(im)] for im in images]
        post = self.model.postprocess  # the detector's _FilteredPostProcess
        request = getattr(post, "request", None)
        if request is None or not self.honour_filter:
            return raw
        out, post.counts = [], []
        for p, (classes, cap) in zip(raw, request, strict=True):
            names = [post.names.get(int(c)) for c in p.class_id]
            keep, counts = select_requested(names, p.confidence, classes, cap)
            post.counts.append(counts)
            out.append(StubPrediction(p.class_id[keep], p.confidence[keep], p.xyxy[keep], p.mask[keep]))
        return out


def raw_detections(rng: np.random.Generator, k: int, classes: Sequence[str]) -> StubPrediction:
    from negt2i.stages.rfdetr_backend import class_names_by_id

    ids_by_name = {v: i for i, v in class_names_by_id().items()}
    ids = rng.choice(sorted(ids_by_name.values()), size=k)
    for j, name in enumerate([c for c in classes for _ in range(2)][:k]):
        ids[j] = ids_by_name[name]
    x0 = rng.uniform(0, SIZE * 0.8, k)
    y0 = rng.uniform(0, SIZE * 0.8, k)
    x1 = np.minimum(x0 + rng.uniform(20, SIZE * 0.4, k), SIZE)
    y1 = np.minimum(y0 + rng.uniform(20, SIZE * 0.4, k), SIZE)
    xyxy = np.stack([x0, y0, x1, y1], axis=1).astype(np.float32)
    masks = np.stack([ellipse((SIZE, SIZE), b) for b in xyxy]) if k else np.zeros((0, SIZE, SIZE), bool)
    return StubPrediction(ids, rng.uniform(0.005, 1.0, k).astype(np.float32), xyxy, masks)


class StubSAMPredictor:
    """The parts of ``SAM2ImagePredictor`` that ``SAM2Segmenter`` calls; the image transform is SAM's own."""

    def __init__(self) -> None:
        import torch
        from sam2.utils.transforms import SAM2Transforms

        self.device = torch.device("cpu")
        self._transforms = SAM2Transforms(resolution=SIZE, mask_threshold=0.0)
        self._cache: dict[bytes, Any] = {}
        self._hw: list[tuple[int, int]] = []

    def set_image_batch(self, images: list[np.ndarray]) -> None:
        self._transforms.forward_batch(images)  # CPU preprocessing, as SAM does
        self._hw = [im.shape[:2] for im in images]

    def reset_predictor(self) -> None:
        self._hw = []

    def _prep_prompts(self, coords: Any, labels: Any, box: np.ndarray, mask: Any, normalize: bool, img_idx: int) -> Any:
        return None, None, None, box

    def _predict(self, coords: Any, labels: Any, box: np.ndarray, mask: Any, multi: bool, **kw: Any) -> Any:
        import torch

        key = box.tobytes() + str(self._hw[kw["img_idx"]]).encode()
        if key not in self._cache:
            hw = self._hw[kw["img_idx"]]
            self._cache[key] = torch.from_numpy(
                np.stack([np.stack([ellipse(hw, b), ellipse(hw, b, 1.4), ellipse(hw, b, 0.7)]) for b in box])
            )
        return self._cache[key], None, None


class StubSigLIP:
    """``open_clip`` model stand-in: fixed unit embeddings."""

    def __init__(self) -> None:
        import torch

        self.dim = 1152
        self._p = torch.nn.Parameter(torch.zeros(1))

    def eval(self) -> StubSigLIP:
        return self

    def parameters(self) -> Any:
        return iter([self._p])

    def encode_image(self, batch: Any) -> Any:
        import torch

        return torch.ones((batch.shape[0], self.dim))

    def encode_text(self, tokens: Any) -> Any:
        import torch

        return torch.ones((tokens.shape[0], self.dim))


class StubDepth:
    """``DepthAnythingForDepthEstimation`` stand-in: a fixed 518 x 518 disparity per image."""

    def __init__(self) -> None:
        import torch

        self._p = torch.nn.Parameter(torch.zeros(1))

    def eval(self) -> StubDepth:
        return self

    def parameters(self) -> Any:
        return iter([self._p])

    def __call__(self, pixel_values: Any, **_: Any) -> Any:
        import torch

        class Out:
            predicted_depth = torch.linspace(0, 1, 518 * 518).reshape(1, 518, 518).repeat(pixel_values.shape[0], 1, 1)

        return Out()


def build_stages(honour_filter: bool = True) -> tuple[Any, StubRFDETR]:
    import open_clip
    import torch
    from transformers import DPTImageProcessor

    from negt2i.pipeline import Stages
    from negt2i.stages.base import ModelInfo
    from negt2i.stages.depth_anything_backend import DepthAnythingEstimator
    from negt2i.stages.rfdetr_backend import RFDETRDetector
    from negt2i.stages.sam2_backend import SAM2Segmenter
    from negt2i.stages.siglip_backend import SigLIPScorer

    def info(stage: str) -> ModelInfo:
        return ModelInfo(stage=stage, backend="stub", model="stub")

    rf = StubRFDETR(honour_filter)
    detector = RFDETRDetector(rf, info("detector"), optimize=False)
    segmenter = SAM2Segmenter(StubSAMPredictor(), info("segmenter"))
    preprocess = open_clip.image_transform(
        378, is_train=False, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), interpolation="bicubic", resize_mode="squash"
    )
    scorer = SigLIPScorer(StubSigLIP(), preprocess, lambda texts: torch.ones((len(texts), 64)), info("attributes"))
    processor = DPTImageProcessor(
        size={"height": 518, "width": 518},
        keep_aspect_ratio=True,
        ensure_multiple_of=14,
        resample=3,
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    )
    depth = DepthAnythingEstimator(StubDepth(), processor, info("depth"))
    return Stages(detector, segmenter, scorer, depth), rf


def measure(
    k: int, n_images: int, repeats: int, seed: int = 0, clock: str = "wall", honour_filter: bool = True
) -> float:
    """Median milliseconds per image over ``repeats`` timed passes of ``n_images`` images (``clock``:
    ``wall`` = ``time.perf_counter``, ``cpu`` = the process's CPU time, robust on a shared machine)."""
    from negt2i.core.spec import read_prompts
    from negt2i.pipeline import Pipeline

    rng = np.random.default_rng(seed)
    corpus = read_prompts(REPO / "data" / "negt2ibench.jsonl")
    picks = rng.choice(len(corpus), size=n_images, replace=False)
    prompts = [corpus[int(i)] for i in picks]
    stages, rf = build_stages(honour_filter)
    images = [rng.integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8) for _ in prompts]
    for image, prompt in zip(images, prompts, strict=True):
        rf.outputs[id(image)] = raw_detections(rng, k, [o.class_name for o in prompt.objects])
    pipeline = Pipeline(stages)
    results = pipeline.run(prompts, images)  # warm-up: fills the stub caches
    failed = [r for r in results if not r.ok]
    if failed:
        raise SystemExit(f"bench_cpu_path: {len(failed)} images failed: {failed[0]}")
    now = time.perf_counter if clock == "wall" else time.process_time
    per_image = []
    for _ in range(repeats):
        start = now()
        pipeline.run(prompts, images)
        per_image.append((now() - start) / n_images * 1000)
    return statistics.median(per_image)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=12, help="images per pass (default 12)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes; the median is printed (default 3)")
    parser.add_argument("--k", default="20,300", help="raw detections per image, comma-separated (default 20,300)")
    parser.add_argument("--threads", type=int, default=1, help="torch and OpenCV threads (default 1)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall (default) or process CPU time")
    parser.add_argument(
        "--no-filter",
        action="store_true",
        help="the stub detector ignores the class filter (every raw row comes back: the path before it)",
    )
    args = parser.parse_args(argv)
    import cv2
    import torch

    torch.set_num_threads(args.threads)
    cv2.setNumThreads(args.threads)
    for k in (int(v) for v in args.k.split(",")):
        ms = measure(k, args.images, args.repeats, clock=args.clock, honour_filter=not args.no_filter)
        note = " (no class filter)" if args.no_filter else ""
        print(f"cpu path per image ({SIZE} px, K={k}): median {ms:.0f} ms{note}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
