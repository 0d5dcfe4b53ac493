"""Reward latency (docs/reward.md): batches of images scored through the services stack by ``RewardClient`` and
in-process by ``RewardJudge``, against the bare ``EvaluateStream`` of the same run.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_reward.py [--batches 16,64] [--size 512] [--repeats 5]
        [--backend synthetic] [--dtype fp32] [--device cpu]

For each batch size B, ``--repeats`` timed batches (after one warm-up) of each path, interleaved so that
machine noise hits every path alike:

- ``bare``: the batch's requests (PNG bytes and inline prompts, built before the clock starts) on one raw
  ``EvaluateStream`` call, every response read: the floor for a streaming client;
- ``client(bytes)``: ``RewardClient.score`` on the same PNG bytes and prompts (request building, the stream
  submitter's window and ordering, verdict decoding, the scores);
- ``client(arrays)``: the same from numpy arrays (the client PNG-encodes them: what a trainer pays when
  it hands over its decoded samples);
- ``in-process``: ``RewardJudge`` on the arrays, no network (``--device`` / ``--dtype``).

Printed per path: per-batch p50 / p99 latency (ms), images/s (B / mean latency), and each as a ratio to
``bare`` of the same run (the goal: ``client(bytes)`` at most 1.10 x bare), plus the in-process judge's
peak memory (``ru_maxrss`` growth while it was built and ran; ``torch.cuda.max_memory_allocated`` on
CUDA). The services are real processes on 127.0.0.1 (``bentoml serve`` per stage, ``python -m
orchestrator``), started and warmed up before the clock starts; ``--backend synthetic`` needs no weights,
``random`` runs the paper's four architectures with random weights (``benchmarks/random_backends.py``).

After a ``machine:`` line (CPU model, core count, load average), per batch size, one line per path::

      client(bytes)   p50 N ms  p99 N ms  R images/s   x bare: p50 X  p99 X  images/s X

``--smoke``: one batch of 2 images of 64 px, one timed batch per path, the four stages served from one light
process (``tests/services/light_stages.py``, where ``bentoml serve`` takes 20-30 s to start): seconds.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import describe  # noqa: E402
from negt2i.client import EvaluatorClient, make_request  # noqa: E402
from negt2i.core.spec import parse_prompt  # noqa: E402
from negt2i.reward import RewardClient, RewardJudge  # noqa: E402
from negt2i.stages.demo_data import demo_entries  # noqa: E402
from negt2i.wire import adapter  # noqa: E402
from tests.services.light_stages import start_light_stages  # noqa: E402
from tests.services.live import start_orchestrator, start_stage, wait_health, wait_ready  # noqa: E402

STAGES = ("detector", "segmenter", "attributes", "depth")


def _batch(n: int, size: int, seed: int) -> tuple[list[Any], list[np.ndarray[Any, Any]], list[bytes]]:
    prompts, arrays = [], []
    for record, images in demo_entries(prompts=max(1, n // 4), samples=4, seed=seed, size=size):
        for image in images:
            prompts.append(parse_prompt(record))
            arrays.append(image)
    prompts, arrays = prompts[:n], arrays[:n]
    return prompts, arrays, [adapter.encode_png(a) for a in arrays]


def _figures(name: str, times: list[float], n: int, bare: list[float] | None) -> str:
    p50, p99 = (float(np.percentile(times, q)) * 1000 for q in (50, 99))
    rate = n / float(np.mean(times))
    line = f"  {name:<15} p50 {p50:8.1f} ms  p99 {p99:8.1f} ms  {rate:7.1f} images/s"
    if bare is not None:
        b50, b99 = (float(np.percentile(bare, q)) * 1000 for q in (50, 99))
        brate = n / float(np.mean(bare))
        line += f"   x bare: p50 {p50 / b50:5.2f}  p99 {p99 / b99:5.2f}  images/s {rate / brate:5.2f}"
    return line


def _measure(
    n: int, size: int, repeats: int, raw: EvaluatorClient, reward: RewardClient, judge: RewardJudge
) -> dict[str, list[float]]:
    """Per-batch seconds of each path for batches of ``n`` (interleaved; the first round warms up)."""
    prompts, arrays, pngs = _batch(n, size, seed=n)

    requests = [make_request(png, prompt=pr) for png, pr in zip(pngs, prompts, strict=True)]

    def bare() -> None:
        got = sum(1 for r in raw.stream(requests) if r.HasField("result"))
        assert got == n, f"{got} of {n} answered"

    runs = {
        "bare": bare,
        "client(bytes)": lambda: reward.score(pngs, prompts),
        "client(arrays)": lambda: reward.score(arrays, prompts),
        "in-process": lambda: judge.score(arrays, prompts),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for k in range(repeats + 1):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            if k:
                times[name].append(time.perf_counter() - t0)
    assert reward.score(pngs, prompts) == judge.score(arrays, prompts)  # the same scores both ways
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--batches", default="16,64", help="comma-separated batch sizes")
    p.add_argument("--size", type=int, default=512, help="image side in pixels")
    p.add_argument("--repeats", type=int, default=5, help="timed batches per path and size (after one warm-up)")
    p.add_argument("--backend", default="synthetic")
    p.add_argument("--device", default="cpu", help="the in-process judge's device")
    p.add_argument("--dtype", default="fp32", help="the in-process judge's precision (fp32, bf16, fp16)")
    p.add_argument("--window", type=int, default=64, help="RewardClient window (images in flight)")
    p.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads per stage process")
    p.add_argument("--smoke", action="store_true", help="1 batch of 2 images at 64 px, light stages: seconds")
    a = p.parse_args(argv)
    if a.smoke:
        a.batches, a.size, a.repeats, a.backend = "2", 64, 1, "synthetic"
    print(describe())
    sizes = [int(x) for x in a.batches.split(",") if x.strip()]
    if not sizes or min(sizes) < 1 or a.repeats < 1:
        p.error("--batches needs positive sizes and --repeats >= 1")

    tmp = Path(tempfile.mkdtemp(prefix="bench-reward-"))
    stage_env = {"NEGT2I_DEVICE": "cpu", "OMP_NUM_THREADS": str(a.threads)}
    if a.backend == "random":
        import benchmarks.random_backends  # noqa: F401  (registers the "random" backends here too)

        stage_env["NEGT2I_BACKEND_MODULES"] = "benchmarks.random_backends"
    if os.environ.get("NEGT2I_WEIGHTS_DIR"):
        stage_env["NEGT2I_WEIGHTS_DIR"] = os.environ["NEGT2I_WEIGHTS_DIR"]
    backends = dict.fromkeys(STAGES, a.backend)
    print(f"batches {sizes} at {a.size} x {a.size} px, backend {a.backend}, {a.repeats} timed batches per path; "
          f"cpu count {os.cpu_count()}")  # fmt: skip
    if a.smoke:
        procs = start_light_stages(tmp, stage_env)
    else:
        procs = {s: start_stage(s, tmp, backend=backends[s], env=stage_env) for s in STAGES}
    orch = None
    try:
        for proc in procs.values():
            wait_ready(proc, timeout=600)
        orch = start_orchestrator({s: pr.url for s, pr in procs.items()}, tmp)
        assert wait_health(orch.target, "SERVING", timeout=120) == "SERVING", orch.tail()

        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        judge = RewardJudge(a.device, dtype=a.dtype, backends=backends, batch_size=max(sizes))
        with EvaluatorClient(orch.target, timeout=None) as raw, RewardClient(raw, window=a.window) as reward:
            for n in sizes:
                times = _measure(n, a.size, a.repeats, raw, reward, judge)
                print(f"batch {n}:")
                for name, t in times.items():
                    print(_figures(name, t, n, None if name == "bare" else times["bare"]))
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(f"in-process judge ({a.device}, {a.dtype}): peak RSS growth {(rss - rss0) / 1024:.0f} MiB", end="")
        if a.device.startswith("cuda"):
            import torch

            print(f", peak CUDA memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB", end="")
        print()
    finally:
        if orch is not None:
            orch.kill(signal.SIGTERM)
        for proc in procs.values():
            proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
