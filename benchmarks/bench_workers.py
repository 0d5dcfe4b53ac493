"""Images/s of ``negt2i evaluate`` with ``--workers 0`` (serial), 1 and N, with stub models of fixed cost.

What overlaps in a pipelined run (``negt2i.evaluate.evaluate``): worker threads read, hash and
decode the images of the next batches and apply the rules (``flow.finish``, the judge, the results
line) to the previous batch, while the calling thread runs the models on the current batch. Here the
models are stubs whose cost is fixed: each stage call sleeps ``--stage-ms`` per image it is asked
about (a sleep releases the GIL as a GPU kernel does: it stands for the device's time) and returns
the synthetic backends' answers, computed once in a warm-up pass and looked up by a hash of the image.
Everything else is the real code: the one decoder, the flow and the rules, the one results writer
(a flushed and fsynced line per image). Images are the benchmark's own prompts (every category)
drawn as synthetic scenes (``negt2i.stages.demo_data``) at ``--size`` px, PNG.

The results files of all runs must be byte-identical (checked, printed). Figures are printed, never
asserted. Usage::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_workers.py [--images 192] [--size 512] [--batch-size 8]
        [--stage-ms 12,8,4,6] [--workers 0,1,4]

``--stage-ms`` is the stub time per image of the detector, segmenter, attribute scorer and depth
estimator (only the images a stage is asked about pay its time).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from negt2i.evaluate import evaluate
from negt2i.pipeline import Stages
from negt2i.run.jobs import discover
from negt2i.stages.demo_data import write_demo

SYNTH = dict.fromkeys(("detector", "segmenter", "attributes", "depth"), "synthetic")


def _key(image: np.ndarray) -> bytes:
    """The memo key of an image: a hash of every 4th row and column (the scenes' objects are larger), so
    that the lookup costs the main thread little next to the stub's time."""
    sample = np.ascontiguousarray(image[::4, ::4])
    return hashlib.blake2b(sample.data, digest_size=16).digest() + repr(image.shape).encode()


class _Stub:
    """A stage whose every call costs ``ms`` per image (sleep) and answers from a memo of the real synthetic
    backend's answers (filled on first sight of an image: the warm-up pass)."""

    def __init__(self, inner: Any, ms: float) -> None:
        self.inner, self.ms, self.info = inner, ms, inner.info
        self.memo: dict[bytes, Any] = {}
        self.asked = 0
        """Images asked about (each costs ``ms``)."""
        self.sleep = True

    def _answer(self, images: Sequence[np.ndarray], compute: Callable[[list[int]], list[Any]]) -> list[Any]:
        if self.sleep:
            self.asked += len(images)
            time.sleep(self.ms * len(images) / 1000)
        keys = [_key(im) for im in images]
        todo = [i for i, k in enumerate(keys) if k not in self.memo]
        for i, answer in zip(todo, compute(todo) if todo else [], strict=True):
            self.memo[keys[i]] = answer
        return [self.memo[k] for k in keys]


class StubDetector(_Stub):
    def detect(self, images: Sequence[np.ndarray]) -> list[Any]:
        return self._answer(images, lambda todo: self.inner.detect([images[i] for i in todo]))


class StubSegmenter(_Stub):
    def refine(self, image: np.ndarray, boxes: Any, refs: Any) -> Any:
        return self.refine_batch([(image, boxes, refs)])[0]

    def refine_batch(self, items: Sequence[Any]) -> list[Any]:
        return self._answer([it[0] for it in items], lambda todo: [self.inner.refine(*items[i]) for i in todo])


class StubScorer(_Stub):
    def score(self, image: np.ndarray, masks: Any, names: Any, answers: Any) -> Any:
        return self.score_batch([(image, masks, names, answers)])[0]

    def score_batch(self, items: Sequence[Any]) -> list[Any]:
        return self._answer([it[0] for it in items], lambda todo: [self.inner.score(*items[i]) for i in todo])


class StubDepth(_Stub):
    def disparity(self, images: Sequence[np.ndarray]) -> list[Any]:
        return self._answer(images, lambda todo: self.inner.disparity([images[i] for i in todo]))


def stub_stages(ms: Sequence[float]) -> Stages:
    real = Stages.create(SYNTH)
    return Stages(
        StubDetector(real.detector, ms[0]),
        StubSegmenter(real.segmenter, ms[1]),
        StubScorer(real.attributes, ms[2]),
        StubDepth(real.depth, ms[3]),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--images", type=int, default=192)
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--stage-ms", default="12,8,4,6", help="stub ms per image: detector,segmenter,attributes,depth")
    p.add_argument("--workers", default=f"0,1,{min(4, os.cpu_count() or 1)}", help="comma-separated worker counts")
    p.add_argument("--repeats", type=int, default=1, help="runs per worker count (the best is printed)")
    a = p.parse_args()
    ms = [float(v) for v in a.stage_ms.split(",")]
    counts = [int(v) for v in a.workers.split(",")]
    samples = 4
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_demo(root / "images", prompts=-(-a.images // samples), samples=samples, seed=0, size=a.size)
        jobs = discover(root / "images")[: a.images]
        stages = stub_stages(ms)
        objs = [stages.detector, stages.segmenter, stages.attributes, stages.depth]
        for s in objs:
            s.sleep = False
        evaluate(jobs, root / "warm.jsonl", stages, batch_size=a.batch_size, workers=0, progress=False)
        for s in objs:
            s.sleep = True
        print(
            f"{len(jobs)} images ({a.size} px PNG, {len(jobs) // samples} prompts of every category), batch "
            f"{a.batch_size}, stub model ms per image asked: detector {ms[0]:g}, segmenter {ms[1]:g}, "
            f"attributes {ms[2]:g}, depth {ms[3]:g}; {os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.1f}"
        )
        files: list[bytes] = []
        for workers in counts:
            best = float("inf")
            for r in range(a.repeats):
                for s in objs:
                    s.asked = 0
                out = root / f"w{workers}-{r}.jsonl"
                t = time.perf_counter()
                evaluate(jobs, out, stages, batch_size=a.batch_size, workers=workers, progress=False)
                best = min(best, time.perf_counter() - t)
                files.append(out.read_bytes())
            model_s = sum(s.asked * s.ms for s in objs) / 1000
            label = "workers 0 (serial)" if workers == 0 else f"workers {workers}"
            print(
                f"{label}: {len(jobs) / best:.1f} images/s ({best:.2f} s; stub model time {model_s:.2f} s, "
                f"the models' bound {len(jobs) / model_s:.1f} images/s)"
            )
        same = all(f == files[0] for f in files[1:])
        print(f"results files identical across runs: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
