"""CPU work per image around the models, in the in-process pipeline, with the models replaced by stubs.

The four real backend wrappers run (``RFDETRDetector``, ``SAM2Segmenter``, ``SigLIPScorer``,
``DepthAnythingEstimator``: their conversions, SAM's and Depth-Anything's image transforms, SigLIP's crop
preprocessing, mask selection and post-processing) and so does ``Pipeline.run`` (planning, rules, verdicts);
only the device work is stubbed, with precomputed outputs:

- RF-DETR is the library's own ``RFDETRSegXLarge`` object (configuration, 624 px resolution, normalisation,
  post-processing module) without its network; the detector's model call and post-processing
  (``RFDETRDetector._forward``) return K raw detections with full-size masks (an ellipse in a random box),
  scores uniform in [0.005, 1]; their classes are random COCO classes, except that each of the prompt's
  classes is given to two of them (so that every prompt has instances to refine and score, as a real image
  would). It honours the class filter the pipeline passes (``docs/stage-contract.md``), as RF-DETR's
  filtering post-processing does: only the kept rows (the prompt's classes, at most 16 per class) and their
  masks come back (``--no-filter``: every row, the path before the filter). RF-DETR's own transform
  (``RFDETRDetector.prepare``: resize to 624 px, normalisation) runs, but on a GPU it runs on the device, so
  its time is printed apart and not counted in the CPU path;
- SAM's own predictor (``SAM2ImagePredictor``: its transforms run) without a model; the image encoder
  (``SAM2Segmenter._encode``) does nothing and the box prompts (``candidates``) return three masks per box
  (the box's ellipse, grown and shrunk);
- SigLIP returns fixed unit embeddings; Depth-Anything a fixed 518 x 518 map.

A stand-in network that would run instead of the stubbed methods raises, so a backend change that bypasses
a stub fails the run (``tests/benchmarks/test_smoke.py`` runs ``--smoke``) instead of timing something else.

Images are 1024 x 1024; prompts are the benchmark's own (``data/negt2ibench.jsonl``, every category),
drawn at random. The stub outputs are computed in a warm-up pass, and a second one settles the memory
allocator; each timed pass runs the same images again, followed by one untimed and eight timed runs of the
reference workload (``benchmarks/machine.py``) on the same clock.
Prints, per K, exactly one line::

    cpu path per image (1024 px, K=300): median R x reference (goal <= 3.3); for information N ms, reference M ms,
        RF-DETR's transform (on the GPU in production) T ms more

(one line; R = the median of the CPU path per image over the median of the reference workload), between two
``machine:`` lines (CPU model, core count, load average). Usage::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_cpu_path.py [--images 12] [--repeats 5] [--k 20,300]
        [--clock cpu|wall] [--no-filter]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_cpu_path.py --smoke     # 2 images, 1 pass, K=300

``--no-filter`` holds K full-size masks per image (300 MB at 1024 px and K=300): mind the memory with many
``--images``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import REFERENCE_VERSION, Reference, describe, ratio  # noqa: E402

SIZE = 1024
GOAL_K = 300
GOAL_X_REFERENCE = 3.3
"""The goal: at K = 300, the CPU path per image at most this many times the reference workload (docs)."""
REFERENCE_UNITS = 8
"""Reference runs timed after each pass."""


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
    """One image's raw detections: RF-DETR's rows (class ids, scores, boxes) and their full-size masks, built on
    first use (a row the class filter drops never gets one)."""

    def __init__(self, class_id: np.ndarray, confidence: np.ndarray, xyxy: np.ndarray) -> None:
        self.class_id, self.confidence, self.xyxy = class_id, confidence, xyxy
        self._masks: dict[int, np.ndarray] = {}
        self._results: dict[tuple[Any, ...], dict[str, Any]] = {}

    def masks(self, rows: np.ndarray) -> np.ndarray:
        for r in rows.tolist():
            if r not in self._masks:
                self._masks[r] = ellipse((SIZE, SIZE), self.xyxy[r])
        return np.stack([self._masks[r] for r in rows.tolist()]) if len(rows) else np.zeros((0, SIZE, SIZE), bool)

    def result(self, rows: np.ndarray) -> dict[str, Any]:
        """What RF-DETR's post-processing returns for these rows (masks (n, 1, H, W)), built once per row set."""
        import torch

        key = tuple(rows.tolist())
        if key not in self._results:
            self._results[key] = {
                "scores": torch.from_numpy(self.confidence[rows]),
                "labels": torch.from_numpy(self.class_id[rows]),
                "boxes": torch.from_numpy(self.xyxy[rows]),
                "masks": torch.from_numpy(self.masks(rows)[:, None]),
            }
        return self._results[key]


def stub_rfdetr() -> Any:
    """An ``RFDETRSegXLarge`` whose network is never built: the library's own object (its model configuration,
    resolution 624, normalisation, post-processing module, flags), so that whatever the backend reads of it is
    there, with a stand-in network that refuses to run (``StubRFDETRDetector`` answers instead)."""
    import torch
    from rfdetr import RFDETRSegXLarge
    from rfdetr.inference import ModelContext
    from rfdetr.models.postprocess import PostProcess

    class NoNetwork(torch.nn.Module):
        def forward(self, *_: Any, **__: Any) -> Any:
            raise RuntimeError("bench_cpu_path: the stub RF-DETR network ran: RFDETRDetector._forward was not "
                               "replaced (the backend changed; update StubRFDETRDetector)")  # fmt: skip

    class WithoutNetwork(RFDETRSegXLarge):  # type: ignore[misc]
        def get_model(self, config: Any, **_: Any) -> Any:
            return ModelContext(NoNetwork().eval(), PostProcess(), torch.device("cpu"), config.resolution, None)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pretrain_weights=None")  # no weights: nothing runs
        return WithoutNetwork(pretrain_weights=None, device="cpu")


def stub_detector(honour_filter: bool = True) -> Any:
    """The real ``RFDETRDetector`` around ``stub_rfdetr()``, whose model call and post-processing (``_forward``:
    device work on a GPU) answer precomputed rows (``outputs``, by image); with a class filter requested, only
    the rows RF-DETR's filtering post-processing keeps, with their masks (``honour_filter`` False: every row)."""
    from negt2i.stages.base import ModelInfo
    from negt2i.stages.common import select_requested
    from negt2i.stages.rfdetr_backend import RFDETRDetector

    class StubRFDETRDetector(RFDETRDetector):
        outputs: dict[int, StubPrediction]

        def prepare(self, request: Any) -> Any:
            start = self.clock()
            prepared = super().prepare(request)
            self.transform_s += self.clock() - start  # on the model's device in production: not CPU path
            self._image_of[id(prepared.pixels)] = id(request)
            return prepared

        def run_prepared(self, prepared: Sequence[Any], classes: Any = None, *, max_per_class: int = 0) -> Any:
            self._batch = [self._image_of.pop(id(p.pixels)) for p in prepared]
            return super().run_prepared(prepared, classes, max_per_class=max_per_class)

        def _forward(self, batch: Any, sizes: list[tuple[int, int]]) -> list[dict[str, Any]]:
            post = self._post
            request = post.request if honour_filter else None
            out, counts = [], []
            for i, image in enumerate(self._batch):
                raw = self.outputs[image]
                if request is None:
                    rows, found = np.flatnonzero(raw.confidence > self.floor), {}
                else:
                    names = [self.names.get(int(c)) for c in raw.class_id]
                    above = raw.confidence > self.floor  # predict's threshold (scores lie in [0, 1])
                    keep, found = select_requested([n if ok else None for n, ok in zip(names, above, strict=True)],
                                                   raw.confidence, *request[i])  # fmt: skip
                    rows = np.asarray(keep, dtype=np.intp)
                counts.append(found)
                out.append(raw.result(rows))
            post.counts = counts if request is not None else []
            return out

    detector = StubRFDETRDetector(stub_rfdetr(), ModelInfo(stage="detector", backend="stub", model="stub"),
                                  optimize=False)  # fmt: skip
    detector.outputs, detector._image_of, detector._batch = {}, {}, []
    detector.clock, detector.transform_s = time.process_time, 0.0
    return detector


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
    return StubPrediction(ids.astype(np.int64), rng.uniform(0.005, 1.0, k).astype(np.float32), xyxy)


class NoSAM:
    """What ``SAM2ImagePredictor`` reads of its model when it is built (``image_size``, ``device``): the predictor
    is SAM's own (its transforms run); ``StubSAM2Segmenter`` answers for the image encoder and the prompts."""

    image_size = SIZE

    def __init__(self) -> None:
        import torch

        self.device = torch.device("cpu")

    def forward_image(self, *_: Any) -> Any:
        raise RuntimeError("bench_cpu_path: the stub SAM image encoder ran: SAM2Segmenter._encode was not "
                           "replaced (the backend changed; update StubSAM2Segmenter)")  # fmt: skip


def stub_segmenter() -> Any:
    """The real ``SAM2Segmenter`` with SAM's own predictor (transforms) around ``NoSAM``; the image encoder
    (``_encode``) and the box prompts (``candidates``: three masks per box, the box's ellipse, the ellipse
    grown and shrunk) are stubs, their masks precomputed in the warm-up pass."""
    from negt2i.stages.base import ModelInfo
    from negt2i.stages.sam2_backend import SAM2Segmenter, make_predictor

    class StubSAM2Segmenter(SAM2Segmenter):
        def _encode(self, prepared: Sequence[Any]) -> None:
            self.predictor.reset_predictor()
            self.predictor._orig_hw = [p.shape_hw for p in prepared]

        def candidates(self, boxes: np.ndarray, shape_hw: tuple[int, int], img_idx: int = -1) -> np.ndarray:
            key = boxes.tobytes() + str(shape_hw).encode()
            if key not in self._cache:
                self._cache[key] = np.stack(
                    [np.stack([ellipse(shape_hw, b), ellipse(shape_hw, b, 1.4), ellipse(shape_hw, b, 0.7)])
                     for b in boxes]
                )  # fmt: skip
            return self._cache[key]

    segmenter = StubSAM2Segmenter(make_predictor(NoSAM()), ModelInfo(stage="segmenter", backend="stub", model="stub"))
    segmenter._cache = {}
    return segmenter


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


def build_stages(honour_filter: bool = True) -> tuple[Any, Any]:
    import open_clip
    import torch
    from transformers import DPTImageProcessor

    from negt2i.pipeline import Stages
    from negt2i.stages.base import ModelInfo
    from negt2i.stages.depth_anything_backend import DepthAnythingEstimator
    from negt2i.stages.siglip_backend import SigLIPScorer

    def info(stage: str) -> ModelInfo:
        return ModelInfo(stage=stage, backend="stub", model="stub")

    detector = stub_detector(honour_filter)
    segmenter = stub_segmenter()
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
    return Stages(detector, segmenter, scorer, depth), detector


@dataclass
class Measured:
    """What ``measure`` found: per image, milliseconds of the CPU path (RF-DETR's transform excluded) and of
    RF-DETR's transform, per timed pass; the reference workload's milliseconds, timed between the passes."""

    path_ms: list[float]
    transform_ms: list[float]
    reference_ms: list[float]

    @property
    def x_reference(self) -> float:
        return ratio(self.path_ms, self.reference_ms)


def measure(
    k: int,
    n_images: int,
    repeats: int,
    seed: int = 0,
    clock: str = "cpu",
    honour_filter: bool = True,
    reference: Reference | None = None,
) -> Measured:
    """``repeats`` timed passes of ``n_images`` images (``clock``: ``cpu`` = the process's CPU time, robust on a
    shared machine; ``wall`` = ``time.perf_counter``), each followed by ``REFERENCE_UNITS`` runs of the
    reference workload on the same clock."""
    from negt2i.core.spec import read_prompts
    from negt2i.pipeline import Pipeline

    now = time.perf_counter if clock == "wall" else time.process_time
    reference = reference or Reference()
    rng = np.random.default_rng(seed)
    corpus = read_prompts(REPO / "data" / "negt2ibench.jsonl")
    picks = rng.choice(len(corpus), size=n_images, replace=False)
    prompts = [corpus[int(i)] for i in picks]
    stages, detector = build_stages(honour_filter)
    detector.clock = now
    images = [rng.integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8) for _ in prompts]
    for image, prompt in zip(images, prompts, strict=True):
        detector.outputs[id(image)] = raw_detections(rng, k, [o.class_name for o in prompt.objects])
    pipeline = Pipeline(stages)
    results = pipeline.run(prompts, images)  # warm-up: fills the stub caches
    failed = [r for r in results if not r.ok]
    if failed:
        raise SystemExit(f"bench_cpu_path: {len(failed)} images failed: {failed[0]}")
    pipeline.run(prompts, images)  # and once more: the first pass after it still paid for fresh memory (+150 %)
    reference.ms(now)
    out = Measured([], [], [])
    for _ in range(repeats):
        detector.transform_s = 0.0
        start = now()
        pipeline.run(prompts, images)
        elapsed = now() - start
        out.path_ms.append((elapsed - detector.transform_s) / n_images * 1000)
        out.transform_ms.append(detector.transform_s / n_images * 1000)
        reference.ms(now)  # after the pass, as before the first: one run untimed
        out.reference_ms.extend(reference.ms(now) for _ in range(REFERENCE_UNITS))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=12, help="images per pass (default 12)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes; the median is printed (default 5)")
    parser.add_argument("--k", default="20,300", help="raw detections per image, comma-separated (default 20,300)")
    parser.add_argument("--threads", type=int, default=1, help="torch and OpenCV threads (default 1)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="cpu", help="process CPU time (default) or wall")
    parser.add_argument(
        "--no-filter",
        action="store_true",
        help="the stub detector ignores the class filter (every raw row comes back: the path before it)",
    )
    parser.add_argument("--smoke", action="store_true", help="2 images, 1 pass, K=300: the script works (seconds)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.images, args.repeats, args.k = 2, 1, "300"
    import cv2
    import torch

    torch.set_num_threads(args.threads)
    cv2.setNumThreads(args.threads)
    print(describe())
    print(f"{args.images} images of {SIZE} px per pass, {args.repeats} passes, {args.clock} clock, "
          f"{args.threads} thread(s); x reference: over the reference workload (benchmarks/machine.py, "
          f"v{REFERENCE_VERSION})")  # fmt: skip
    reference = Reference()
    for k in (int(v) for v in args.k.split(",")):
        m = measure(k, args.images, args.repeats, clock=args.clock, honour_filter=not args.no_filter,
                    reference=reference)  # fmt: skip
        note = " (no class filter)" if args.no_filter else ""
        goal = f" (goal <= {GOAL_X_REFERENCE:g})" if k == GOAL_K else ""
        print(f"cpu path per image ({SIZE} px, K={k}): median {m.x_reference:.2f} x reference{goal}{note}; for "
              f"information {statistics.median(m.path_ms):.1f} ms, reference {statistics.median(m.reference_ms):.2f} "
              f"ms, RF-DETR's transform (on the GPU in production) {statistics.median(m.transform_ms):.1f} ms more",
              flush=True)  # fmt: skip
    print(describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
