"""Embedded vs services: the same image set through ``negt2i evaluate``'s code path and through the stage
services + orchestrator (``negt2i submit``), in one run; prints both wall times, their ratio, the bytes a
request costs on the wire, and checks that the results files agree.

    .venv/bin/python benchmarks/bench_services.py [--prompts 48] [--samples 4] [--size 256] [--backend synthetic]

The services run as real processes on 127.0.0.1 (``bentoml serve`` per stage, ``python -m orchestrator``),
started and warmed up before the clock starts. ``--backend`` picks the same backend for both paths
(``synthetic`` needs no weights; ``random`` is the paper's four architectures with random weights, see
``benchmarks/random_backends.py``; a real backend needs its weights under ``NEGT2I_WEIGHTS_DIR``).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from negt2i.client import EvaluatorClient, make_request, submit  # noqa: E402
from negt2i.evaluate import discover, evaluate  # noqa: E402
from negt2i.pipeline import Stages  # noqa: E402
from negt2i.stages.demo_data import write_demo  # noqa: E402
from tests.services.live import start_orchestrator, start_stage, wait_health, wait_ready  # noqa: E402

STAGES = ("detector", "segmenter", "attributes", "depth")


def _rows(path: Path) -> dict[str, dict[str, object]]:
    out = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        r.pop("services", None)
        out[r["filename"]] = r
    return out


def _verdicts(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What a verdict decides (everything but the measured numbers)."""
    keep = ("status", "correct", "reason", "failure_class", "error")
    return {
        name: (
            tuple(r.get(k) for k in keep),
            [(s["fired"], s["passed"], s["cause"], s["dead_zone"]) for s in r.get("statements", [])],
        )
        for name, r in rows.items()
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--prompts", type=int, default=48)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--size", type=int, default=256, help="image side in pixels")
    p.add_argument("--backend", default="synthetic")
    p.add_argument("--repeats", type=int, default=2, help="timed runs of each path (the median is reported)")
    p.add_argument("--wire-samples", type=int, default=48, help="unary calls whose message sizes are measured")
    p.add_argument("--depth-encoding", choices=("float16", "float32"), default="float16")
    p.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads per process (real backends)")
    a = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-services-"))
    root = tmp / "images"
    write_demo(root, prompts=a.prompts, samples=a.samples, seed=0, size=a.size)
    jobs = discover(root)
    print(f"{len(jobs)} images of {a.prompts} prompts, {a.size} x {a.size} px, backend {a.backend}; cpu count "
          f"{os.cpu_count()}")  # fmt: skip

    stage_env = {"NEGT2I_DEVICE": "cpu", "OMP_NUM_THREADS": str(a.threads)}
    if a.backend == "random":  # random-weight real architectures (benchmarks/random_backends.py)
        import benchmarks.random_backends  # noqa: F401  (registers the "random" backends here too)

        stage_env["NEGT2I_BACKEND_MODULES"] = "benchmarks.random_backends"
        import torch

        torch.set_num_threads(a.threads)
    if os.environ.get("NEGT2I_WEIGHTS_DIR"):
        stage_env["NEGT2I_WEIGHTS_DIR"] = os.environ["NEGT2I_WEIGHTS_DIR"]
    procs = {s: start_stage(s, tmp, backend=a.backend, env=stage_env) for s in STAGES}
    orch = None
    try:
        for proc in procs.values():
            wait_ready(proc, timeout=600)
        orch = start_orchestrator(
            {s: p.url for s, p in procs.items()}, tmp, env={"NEGT2I_DEPTH_ENCODING": a.depth_encoding}
        )
        assert wait_health(orch.target, "SERVING", timeout=120) == "SERVING", orch.tail()

        stages = Stages.create(dict.fromkeys(STAGES, a.backend), device="cpu")
        embedded_s, services_s = [], []
        for k in range(a.repeats):
            out_e, out_s = tmp / f"embedded-{k}.jsonl", tmp / f"services-{k}.jsonl"
            t0 = time.perf_counter()
            evaluate(jobs, out_e, stages, progress=False)
            embedded_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            outcome = submit(jobs, out_s, orch.target, progress=False)
            services_s.append(time.perf_counter() - t0)
            assert not outcome.retry, outcome.retry
            assert _verdicts(_rows(out_e)) == _verdicts(_rows(out_s)), "services and embedded verdicts differ"
            identical = _rows(out_e) == _rows(out_s)

        # what one request costs on the wire: the gRPC messages, and the stage calls behind them
        with EvaluatorClient(orch.target) as client:
            sizes_req, sizes_resp = [], []
            for job in jobs[: min(len(jobs), a.wire_samples)]:
                assert job.prompt is not None
                req = make_request(job.path.read_bytes(), prompt=job.prompt, request_id=job.filename)
                resp = client.stub.Evaluate(req, timeout=60)
                sizes_req.append(req.ByteSize())
                sizes_resp.append(resp.ByteSize())
    finally:
        if orch is not None:
            orch.kill(signal.SIGTERM)
        for proc in procs.values():
            proc.kill()

    wire = {}
    if orch is not None:
        m = re.search(r"wire: calls (\{.*?\}), sent (\{.*?\}), received (\{.*?\}) bytes", orch.log.read_text())
        if m:
            wire = {k: ast.literal_eval(v) for k, v in zip(("calls", "sent", "received"), m.groups(), strict=True)}

    e, s = statistics.median(embedded_s), statistics.median(services_s)
    n = len(jobs)
    print(f"embedded: {e:.2f} s ({n / e:.1f} images/s)   runs {[round(x, 2) for x in embedded_s]}")
    print(f"services: {s:.2f} s ({n / s:.1f} images/s)   runs {[round(x, 2) for x in services_s]}")
    same = "identical" if identical else "same verdicts; measured numbers differ (float16 depth)"
    print(f"ratio services / embedded: {s / e:.2f}x   (results: {same}; depth on the wire: {a.depth_encoding})")
    print(f"gRPC per request: {statistics.mean(sizes_req) / 1024:.1f} KiB sent, "
          f"{statistics.mean(sizes_resp) / 1024:.1f} KiB received (mean over {len(sizes_req)})")  # fmt: skip
    if wire:
        requests = a.repeats * n + len(sizes_req)
        for stage in STAGES:
            calls = wire["calls"].get(stage, 0)
            if calls:
                print(f"  {stage:<10} {calls:5d} calls, per call {wire['sent'][stage] / calls / 1024:7.1f} KiB sent, "
                      f"{wire['received'][stage] / calls / 1024:7.1f} KiB received")  # fmt: skip
        total = sum(wire["sent"].values()) + sum(wire["received"].values())
        print(f"  stage traffic per request: {total / requests / 1024:.1f} KiB (HTTP bodies, both directions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
