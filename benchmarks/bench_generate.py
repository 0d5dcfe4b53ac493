"""Generation throughput of `negt2i generate` and the GPU-hours it implies for one model's 19,200 images.

Times ``DiffusersGenerator`` (the runner's generator) on a preset or a local diffusers
folder, after one warm-up batch, and prints seconds per image, seconds per denoising
step, images/s and the projected GPU-hours for 4,800 prompts x 4 seeds. Replaces the
estimates in docs/deployment.md ("A generation run") when run on the GPU the sweep uses.
Figures are printed, never asserted. Usage::

    .venv/bin/python benchmarks/bench_generate.py --model sd1.5 --device cuda [--batch-size 4] [--images 16]
    .venv/bin/python benchmarks/bench_generate.py --tiny        # offline: the tests' tiny random pipeline, CPU

``--model`` needs the weights in the Hugging Face cache (``hf download <repo>``). After a ``machine:`` line (CPU
model, core count, load average), the figure line::

    S s/image, R images/s, T s per image-step

``--smoke``: ``--tiny --images 1 --batch-size 1`` (seconds; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's negt2i, wherever it is run from

from benchmarks.machine import describe

IMAGES_PER_MODEL = 4_800 * 4


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--model", default=None, help="preset or local diffusers folder")
    p.add_argument("--tiny", action="store_true", help="the tests' tiny random-weight pipeline (offline, CPU)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None, help="default: the preset's on a GPU, float32 on CPU")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--images", type=int, default=8, help="timed images (after one warm-up batch)")
    p.add_argument("--steps", type=int, default=None, help="override the preset's steps (not the protocol)")
    p.add_argument("--smoke", action="store_true", help="--tiny --images 1 --batch-size 1: seconds")
    a = p.parse_args(argv)
    if a.smoke:
        a.tiny, a.images, a.batch_size = True, 1, 1
    print(describe())

    import torch

    from negt2i.generate import ModelSpec, preset
    from negt2i.generate.diffusers_backend import DiffusersGenerator

    if a.tiny:
        from tests.generate.tiny import build_pipeline

        folder = build_pipeline(Path(tempfile.mkdtemp(prefix="bench-generate-")) / "pipe")
        spec = ModelSpec("custom", "tiny SD (random weights)", str(folder), steps=2, guidance=7.5, width=32, height=32)
    elif a.model:
        spec = preset(a.model) if not Path(a.model).exists() else ModelSpec("custom", a.model, a.model, steps=a.steps)
    else:
        p.error("give --model or --tiny")
    dtype = a.dtype or ("float32" if a.device == "cpu" else spec.dtype)
    spec = spec.with_overrides(dtype=dtype, steps=a.steps)
    start = time.perf_counter()
    gen = DiffusersGenerator(spec, device=a.device, dtype=dtype)
    load_s = time.perf_counter() - start
    prompts = ["a photo of a red tie", "a photo of a non-wooden bench", "a photo of a cat and a dog, where the cat "
               "is not left of the dog", "a photo of a glass cup"]  # fmt: skip

    def batch(k: int) -> None:
        n = a.batch_size
        gen.generate([prompts[(k + i) % len(prompts)] for i in range(n)], [42 + k + i for i in range(n)])
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()

    batch(0)  # warm-up
    if a.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    batches = max(1, -(-a.images // a.batch_size))
    start = time.perf_counter()
    for k in range(batches):
        batch(k + 1)
    elapsed = time.perf_counter() - start
    n = batches * a.batch_size
    per_image = elapsed / n
    where = f"device {a.device}, torch {torch.__version__}, {platform.processor() or 'cpu'}"
    print(f"model: {spec.label} ({spec.model}), {spec.steps} steps, {spec.width}x{spec.height}, {dtype}, "
          f"batch {a.batch_size}, {where}")  # fmt: skip
    print(f"load: {load_s:.1f} s; timed: {n} images in {elapsed:.2f} s")
    print(f"{per_image:.3f} s/image, {n / elapsed:.2f} images/s", end="")
    print(f", {per_image / spec.steps:.4f} s per image-step" if spec.steps else "")
    if a.device.startswith("cuda"):
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    unit = "GPU-h" if a.device.startswith("cuda") else "device-h"
    print(f"projected for one model ({IMAGES_PER_MODEL:,} images): {IMAGES_PER_MODEL * per_image / 3600:.1f} {unit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
