"""NegT2IBench's own cost under the judges' protocol (Appendix B.4, Table 8), for `negt2i agreement --ours-cost`.

One process, no batching: the four stages are built once (timed apart: load seconds), then each image is
judged alone through the in-process pipeline (``Pipeline.run_one``), the wall time of each image measured
with CUDA synchronised. GPU memory is ``torch.cuda.max_memory_allocated`` over the run (the basis the judge
harness uses); CPU memory the peak resident set size. Parameters are counted over the stages' torch modules.
Prints the figures and writes them as JSON (``--out``), the file ``negt2i agreement --ours-cost FILE`` reads::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_cost.py --images IMAGES --limit 600 --device cuda \
        --out ours-cost.json                      # the paper's models (weights from `negt2i weights fetch`)
    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_cost.py --backend synthetic --out /tmp/cost.json  # offline

Without ``--images`` it judges demo images it draws (``negt2i.stages.demo_data``, ``--size`` px). Figures are
printed, never asserted; with ``--backend synthetic`` they mean nothing (the plumbing is real). After a
``machine:`` line (CPU model, core count, load average), the figure line::

    NegT2IBench on cpu: N images, S s/img (median M), load L s, GPU GiB G, RSS GiB R, params P

``--smoke``: ``--backend synthetic --limit 2 --size 64`` (seconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import describe  # noqa: E402


def count_params(stages: Any) -> int:
    """Parameters of every torch module reachable from the stage objects' attributes (one level deep, each
    module counted once)."""
    if "torch" not in sys.modules:  # nothing imported it (the synthetic stages): no torch module to count
        return 0
    import torch

    seen: set[int] = set()
    total = 0
    for stage in (stages.detector, stages.segmenter, stages.attributes, stages.depth):
        if stage is None:
            continue
        for value in vars(stage).values() if hasattr(stage, "__dict__") else ():
            for module in [value, *getattr(value, "__dict__", {}).values()]:
                if isinstance(module, torch.nn.Module):
                    for p in module.parameters():
                        if id(p) not in seen:
                            seen.add(id(p))
                            total += p.numel()
    return total


def main(argv: Sequence[str] | None = None) -> int:
    from negt2i.judges.base import params_label

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", default=None, help="GenEval-layout folder or manifest (default: demo images)")
    parser.add_argument("--limit", type=int, default=8, help="images to time (default 8)")
    parser.add_argument("--backend", default=None, help="one backend for all four stages (default: the paper's)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--weights-dir", default=None)
    parser.add_argument("--out", default=None, help="write the figures as JSON (for --ours-cost)")
    parser.add_argument("--size", type=int, default=512, help="side of the drawn demo images, px (default 512)")
    parser.add_argument("--smoke", action="store_true", help="--backend synthetic --limit 2 --size 64: seconds")
    args = parser.parse_args(argv)
    if args.smoke:
        args.backend, args.limit, args.size = "synthetic", 2, 64
    print(describe())

    from negt2i.pipeline import Pipeline, Stages
    from negt2i.run.jobs import discover, read_job
    from negt2i.stages.registry import STAGES

    images = args.images
    if images is None:
        from negt2i.stages.demo_data import main as demo

        images = str(Path(tempfile.mkdtemp(prefix="bench-cost-")) / "demo")
        demo([images, "--prompts", str(args.limit), "--samples", "1", "--size", str(args.size)])
    jobs = [j for j in discover(images) if j.prompt is not None][: args.limit]
    if not jobs:
        print(f"{images}: no images with a prompt", file=sys.stderr)
        return 1
    backends = dict.fromkeys(STAGES, args.backend) if args.backend else None
    cuda = False
    try:
        import torch

        cuda = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    except ImportError:
        torch = None  # type: ignore[assignment]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    stages = Stages.create(backends, device=args.device, weights_dir=args.weights_dir)
    sync()
    load = time.perf_counter() - t0
    pipeline = Pipeline(stages)
    times: list[float] = []
    for job in jobs:
        loaded = read_job(job)
        if loaded.pixels is None or job.prompt is None:
            continue
        sync()
        start = time.perf_counter()
        pipeline.run_one(job.prompt, loaded.pixels)
        sync()
        times.append(time.perf_counter() - start)
    if not times:
        print("no image could be judged", file=sys.stderr)
        return 1
    from negt2i.judges._torch import peak_rss_gib

    params = count_params(stages)
    out: dict[str, Any] = {
        "evaluator": "NegT2IBench",
        "params": params_label(params) if params else None,
        "params_count": params,
        "s_per_image": statistics.mean(times),
        "s_per_image_median": statistics.median(times),
        "load_seconds": load,
        "gpu_gib": float(torch.cuda.max_memory_allocated()) / 2**30 if cuda else None,
        "rss_gib": peak_rss_gib(),
        "images": len(times),
        "device": "cuda" if cuda else "cpu",
        "models": stages.models(),
        "protocol": "one process, batch 1, load excluded, CUDA synchronised per image (Appendix B.4)",
    }
    gib = "-" if out["gpu_gib"] is None else f"{out['gpu_gib']:.2f}"
    print(f"NegT2IBench on {out['device']}: {len(times)} images, {out['s_per_image']:.3f} s/img (median "
          f"{out['s_per_image_median']:.3f}), load {load:.1f} s, GPU GiB {gib}, RSS GiB {out['rss_gib']:.2f}, "
          f"params {out['params'] or '-'}")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.out} (negt2i agreement --ours-cost {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
