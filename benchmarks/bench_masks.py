"""Mask post-processing and RLE at 1024 px: today's implementations against their references.

- ``postprocess_mask`` (OpenCV) vs the SciPy implementation it replaced (kept in
  ``tests/core/test_mask_postprocess.py`` as the bit-exact reference);
- ``negt2i.core.rle`` encode / decode (vectorised numpy) vs pycocotools' C implementation.

Masks are SAM-like blobs (discs of radius 20-300 px with 5% holes). Prints median milliseconds per mask, after a
``machine:`` line (CPU model, core count, load average); each figure line reads::

    postprocess  opencv            N

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_masks.py [--masks 30]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_masks.py --smoke    # 2 masks (seconds)
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

from benchmarks.machine import describe  # noqa: E402


def per_mask_ms(fn: Callable[[Any], Any], items: Sequence[Any], repeats: int = 3) -> float:
    fn(items[0])
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for item in items:
            fn(item)
        runs.append((time.perf_counter() - start) / len(items) * 1000)
    return statistics.median(runs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--masks", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="2 masks: seconds")
    args = parser.parse_args(argv)
    if args.smoke:
        args.masks = 2
    print(describe())
    import pycocotools.mask as coco

    from negt2i.core import rle
    from negt2i.core.rules import postprocess_mask
    from tests.core.test_mask_postprocess import scipy_postprocess

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:1024, :1024]
    masks = []
    for _ in range(args.masks):
        cy, cx, r = rng.integers(0, 1024), rng.integers(0, 1024), rng.integers(20, 300)
        masks.append(((yy - cy) ** 2 + (xx - cx) ** 2 < r**2) & (rng.random((1024, 1024)) > 0.05))
    closed = [postprocess_mask(m) for m in masks]
    print(f"{args.masks} masks of 1024 x 1024 px, median ms per mask")
    print(f"postprocess  scipy (reference) {per_mask_ms(lambda m: scipy_postprocess(m, 5, 0.05), masks):8.2f}")
    print(f"postprocess  opencv            {per_mask_ms(postprocess_mask, masks):8.2f}")
    ours = [rle.encode(m) for m in closed]
    theirs = [coco.encode(np.asfortranarray(m.astype(np.uint8))) for m in closed]
    print(f"rle encode   negt2i.core.rle        {per_mask_ms(rle.encode, closed):8.2f}")
    print(f"rle encode   pycocotools       "
          f"{per_mask_ms(lambda m: coco.encode(np.asfortranarray(m.astype(np.uint8))), closed):8.2f}")  # fmt: skip
    print(f"rle decode   negt2i.core.rle        {per_mask_ms(rle.decode, ours):8.2f}")
    print(f"rle decode   pycocotools       {per_mask_ms(coco.decode, theirs):8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
