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
asserted; after a ``machine:`` line (CPU model, core count, load average), one line per worker count::

    workers 1: R images/s (S s; stub model time M s, the models' bound B images/s)

Usage (``--smoke``: 8 images at 64 px, batch 4, workers 0 and 1, 1 ms per stage call: seconds)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_workers.py [--images 192] [--size 512] [--batch-size 8]
        [--stage-ms 12,8,4,6] [--workers 0,1,4]

``--stage-ms`` is the stub time per image of the detector, segmenter, attribute scorer and depth
estimator (only the images a stage is asked about pay its time).

``--backends random`` runs the paper's four architectures with random weights instead of the stubs
(``benchmarks/random_backends.py``: RF-DETR-Seg-XL at 624 px, which runs but answers the synthetic scene's
detections, SAM 2.1 hiera-small at 1024 px, SigLIP 2 SO400M/14-378, Depth-Anything V2 Small), and
``--variants`` measures where the models' own preprocessing runs (issue 30 item 7), interleaved in one run:

- ``prepared``: the backends prepare their inputs on the worker side (``PreparesInputs``: the detector's
  where the image is decoded, the other stages' in ``Pipeline.plan``); the models' thread runs the models;
- ``in-call``: the same backends seen without ``prepare`` / ``run_prepared`` (``InCall``), so their
  ordinary calls do the preprocessing inside the call, on the models' thread (the path before).

Bounded recipe for a 2-core CPU machine (most of it the random-weight models; 28 minutes at load average
7-15 on the shared development machine)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_workers.py --backends random --images 8 --size 512 \
        --batch-size 4 --workers 2 --variants in-call,prepared --repeats 2
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's negt2i, wherever it is run from

from benchmarks.machine import describe
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


class InCall:
    """A backend seen through its ordinary methods only (no ``prepare`` / ``run_prepared``): the pipeline calls
    them on the models' thread, and their own preprocessing runs inside the call (the ``in-call`` variant)."""

    METHODS = ("detect", "refine", "refine_batch", "score", "score_batch", "disparity")

    def __init__(self, inner: Any) -> None:
        self.inner, self.info = inner, inner.info
        for name in self.METHODS:
            if hasattr(inner, name):
                setattr(self, name, getattr(inner, name))


def random_stages() -> Stages:
    """The paper's four architectures with random weights (``benchmarks/random_backends.py``)."""
    import random_backends

    return Stages.create(dict.fromkeys(("detector", "segmenter", "attributes", "depth"), random_backends.NAME))


def in_call(stages: Stages) -> Stages:
    return Stages(*(None if s is None else InCall(s) for s in (stages.detector, stages.segmenter,
                                                                stages.attributes, stages.depth)))  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--images", type=int, default=192)
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--stage-ms", default="12,8,4,6", help="stub ms per image: detector,segmenter,attributes,depth")
    p.add_argument("--workers", default=f"0,1,{min(4, os.cpu_count() or 1)}", help="comma-separated worker counts")
    p.add_argument("--repeats", type=int, default=1, help="runs per worker count (the best is printed)")
    p.add_argument("--backends", choices=("stub", "random"), default="stub",
                   help="stub models of fixed cost, or the paper's architectures with random weights")  # fmt: skip
    p.add_argument("--variants", default="prepared",
                   help="comma-separated: prepared (preprocessing on the worker side), in-call (inside the "
                        "models' calls); run interleaved")  # fmt: skip
    p.add_argument("--smoke", action="store_true", help="8 images at 64 px, workers 0,1, 1 ms stages: seconds")
    a = p.parse_args(argv)
    if a.smoke:
        a.images, a.size, a.batch_size, a.workers, a.stage_ms = 8, 64, 4, "0,1", "1,1,1,1"
    print(describe())
    ms = [float(v) for v in a.stage_ms.split(",")]
    counts = [int(v) for v in a.workers.split(",")]
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - {"prepared", "in-call"})
    if unknown:
        p.error(f"unknown variants {unknown}; use prepared, in-call")
    samples = 4
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_demo(root / "images", prompts=-(-a.images // samples), samples=samples, seed=0, size=a.size)
        jobs = discover(root / "images")[: a.images]
        if a.backends == "stub":
            stages = stub_stages(ms)
            objs = [stages.detector, stages.segmenter, stages.attributes, stages.depth]
            for s in objs:
                s.sleep = False
            evaluate(jobs, root / "warm.jsonl", stages, batch_size=a.batch_size, workers=0, progress=False)
            for s in objs:
                s.sleep = True
            what = (f"stub model ms per image asked: detector {ms[0]:g}, segmenter {ms[1]:g}, attributes "
                    f"{ms[2]:g}, depth {ms[3]:g}")  # fmt: skip
        else:
            stages = random_stages()
            objs = []
            warm = jobs[: min(len(jobs), a.batch_size)]  # one batch: first calls allocate, load kernels
            evaluate(warm, root / "warm.jsonl", stages, batch_size=a.batch_size, workers=0, progress=False)
            what = "the paper's four architectures with random weights (benchmarks/random_backends.py)"
        print(
            f"{len(jobs)} images ({a.size} px PNG, {len(jobs) // samples} prompts of every category), batch "
            f"{a.batch_size}, {what}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
        )
        built = {"prepared": stages, "in-call": in_call(stages)}
        files: list[bytes] = []
        for workers in counts:
            best = dict.fromkeys(variants, float("inf"))
            for r in range(a.repeats):
                for variant in variants if r % 2 == 0 else variants[::-1]:  # interleaved, alternating order
                    for s in objs:
                        s.asked = 0
                    out = root / f"w{workers}-{variant}-{r}.jsonl"
                    t = time.perf_counter()
                    evaluate(jobs, out, built[variant], batch_size=a.batch_size, workers=workers, progress=False)
                    best[variant] = min(best[variant], time.perf_counter() - t)
                    files.append(out.read_bytes())
            label = "workers 0 (serial)" if workers == 0 else f"workers {workers}"
            for variant in variants:
                bound = ""
                if objs:
                    model_s = sum(s.asked * s.ms for s in objs) / 1000
                    bound = f"; stub model time {model_s:.2f} s, the models' bound {len(jobs) / model_s:.1f} images/s"
                tag = f", {variant}" if len(variants) > 1 else ""
                print(f"{label}{tag}: {len(jobs) / best[variant]:.2f} images/s ({best[variant]:.2f} s{bound})")
            if len(variants) > 1 and "prepared" in best and "in-call" in best:
                print(f"{label}: prepared / in-call images/s = {best['in-call'] / best['prepared']:.3f}")
        same = all(f == files[0] for f in files[1:])
        print(f"results files identical across runs: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
