"""GPUs needed to score a sweep in a given time, per deployment variant: ESTIMATES.

Prints the sizing table of docs/deployment.md ("Sizing"). Nothing here is measured on a
GPU or a cluster; the inputs are one measurement and stated assumptions:

- MEASURED (the paper, Table 8 / Appendix B.4): the whole pipeline in one process on one
  H200 takes 0.78 s per image (no batching).
- ASSUMED: each stage's share of that GPU time equals its share of the per-image CPU time
  measured by benchmarks/bench_pipeline.py (docs/performance.md: detector 6.0 s on every
  image, segmenter 9.5 s on the 4 relation categories of 6, attributes 4.1 s per crop with
  2.25 crops on the 2 attribute categories of 6, depth 0.9 s on 1 category of 6).
- ASSUMED: a 1g MIG slice (1/7 of the SMs) runs a stage 7x slower than the whole GPU
  (pessimistic: these models do not fill an H200 at batch 1).
- ASSUMED: time-slicing keeps 90 % of the GPU's in-process throughput (context switches).
- No adaptive-batching speed-up is counted (it can only lower the figures).

Replace the assumptions with `benchmarks/bench_pipeline.py --device cuda` figures when a GPU
is available. Usage:

    python benchmarks/k8s_sizing.py [--images 211200] [--hours 12 24 48]

It measures nothing, so it needs no machine line; ``--smoke`` (for the test that runs every script) prints
the same table. Its first line::

    estimated GPU seconds per image: detector N, segmenter N, attributes N, depth N
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import yaml

PIPELINE_S_PER_IMAGE = 0.78
"""Measured: the paper, one H200, all four models in one process."""
CPU_S_PER_IMAGE = {
    "detector": 6.0 * 1,
    "segmenter": 9.5 * 4 / 6,
    "attributes": 4.1 * 2.25 * 2 / 6,
    "depth": 0.9 * 1 / 6,
}
"""Per-stage CPU seconds per image, weighted by how often the stage is called (docs/performance.md)."""
MIG_SLOWDOWN = 7.0
MIG_SLICES_PER_GPU = 7
TIME_SLICING_EFFICIENCY = 0.9
PLATFORM = Path(__file__).resolve().parents[1] / "k8s" / "negt2i.yaml"


def stage_gpu_seconds() -> dict[str, float]:
    """Estimated GPU seconds per image of each stage: its CPU share of the measured 0.78 s."""
    total = sum(CPU_S_PER_IMAGE.values())
    return {stage: PIPELINE_S_PER_IMAGE * s / total for stage, s in CPU_S_PER_IMAGE.items()}


def max_replicas() -> dict[str, int]:
    objs = [o for o in yaml.safe_load_all(PLATFORM.read_text()) if o]
    return {o["metadata"]["name"]: o["spec"]["maxReplicas"] for o in objs if o["kind"] == "HorizontalPodAutoscaler"}


def plan(images: int, hours: float) -> dict[str, tuple[int, str]]:
    """GPUs per variant for ``images`` in ``hours``, with a note when the HPAs' maxReplicas are too low."""
    rate = images / (hours * 3600)  # images per second needed
    per_stage = stage_gpu_seconds()
    limits = max_replicas()

    def note(pods: dict[str, int]) -> str:
        over = [f"{s} {n} > {limits[s]}" for s, n in pods.items() if n > limits[s]]
        return f" (raise maxReplicas: {', '.join(over)})" if over else ""

    in_process = math.ceil(images * PIPELINE_S_PER_IMAGE / (hours * 3600))
    whole = {s: max(1, math.ceil(rate * t)) for s, t in per_stage.items()}
    mig = {s: max(1, math.ceil(rate * t * MIG_SLOWDOWN)) for s, t in per_stage.items()}
    shared = max(1, math.ceil(images * PIPELINE_S_PER_IMAGE / (hours * 3600 * TIME_SLICING_EFFICIENCY)))
    return {
        "in-process": (in_process, ""),
        "gpu": (sum(whole.values()), note(whole)),
        "gpu-mig": (math.ceil(sum(mig.values()) / MIG_SLICES_PER_GPU), f" ({sum(mig.values())} slices){note(mig)}"),
        "gpu-time-slicing": (shared, ""),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=211_200, help="images to score (default: the paper's 11 models)")
    parser.add_argument("--hours", type=float, nargs="+", default=[12, 24, 48])
    parser.add_argument("--smoke", action="store_true", help="the same table (it measures nothing)")
    args = parser.parse_args()
    per_stage = stage_gpu_seconds()
    print("estimated GPU seconds per image:", ", ".join(f"{s} {t:.3f}" for s, t in per_stage.items()))
    print(f"total GPU work: {args.images * PIPELINE_S_PER_IMAGE / 3600:.1f} GPU-hours (in-process rate)")
    print()
    print("| variant | " + " | ".join(f"{h:g} h" for h in args.hours) + " |")
    print("|---|" + "---|" * len(args.hours))
    plans = [plan(args.images, h) for h in args.hours]
    for variant in plans[0]:
        cells = [f"{p[variant][0]} GPU{'s' if p[variant][0] != 1 else ''}{p[variant][1]}" for p in plans]
        print(f"| {variant} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
