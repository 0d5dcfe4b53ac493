"""Embedded vs services: the same image set through ``negt2i evaluate``'s code path and through the stage
services + orchestrator (``negt2i submit``), in one run; prints the wall times, the services / embedded
ratio, the bytes a request costs on the wire (the detector's response bytes per image among them), and
checks that the results files agree.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_services.py [--prompts 48] [--samples 4] [--size 256]
        [--backend synthetic] [--k 300] [--stage-bodies auto,json]

The services run as real processes on 127.0.0.1 (``bentoml serve`` per stage, ``python -m orchestrator``),
started and warmed up before the clock starts. ``--backend`` picks the same backend for both paths
(``synthetic`` needs no weights; ``random`` is the paper's four architectures with random weights, see
``benchmarks/random_backends.py``; a real backend needs its weights under ``NEGT2I_WEIGHTS_DIR``).
``--k N`` replaces the detector by ``benchmarks/kstub_backends.py`` in both paths: the scene's detections
plus fillers up to N raw detections per image with full-size masks (RF-DETR returns up to 300).
``--stage-bodies`` runs one orchestrator per body type against the same stage services (``auto``: binary
protobuf, as the services list it; ``json``: the JSON mapping, as before binary bodies existed), so both
are measured in one run.

After a ``machine:`` line (CPU model, core count, load average), the figure line per body type reads::

    ratio services / embedded (auto): R x   (results: identical; depth on the wire: float16)

``--smoke``: 2 prompts x 1 image of 64 px, one run each, one wire sample, the four stages served from one light
process (``tests/services/light_stages.py``, where ``bentoml serve`` takes 20-30 s to start): seconds.
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

from benchmarks.machine import describe  # noqa: E402
from negt2i.client import EvaluatorClient, make_request  # noqa: E402
from negt2i.evaluate import evaluate  # noqa: E402
from negt2i.pipeline import Stages  # noqa: E402
from negt2i.run.jobs import discover  # noqa: E402
from negt2i.stages.demo_data import write_demo  # noqa: E402
from negt2i.submit import submit  # noqa: E402
from tests.services.light_stages import start_light_stages  # noqa: E402
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--prompts", type=int, default=48)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--size", type=int, default=256, help="image side in pixels")
    p.add_argument("--backend", default="synthetic")
    p.add_argument("--k", type=int, default=0, help="raw detections per image (kstub detector); 0: the backend's")
    p.add_argument("--stage-bodies", default="auto", help="comma-separated: auto (binary where listed), json")
    p.add_argument("--repeats", type=int, default=2, help="timed runs of each path (the median is reported)")
    p.add_argument("--wire-samples", type=int, default=48, help="unary calls whose message sizes are measured")
    p.add_argument("--depth-encoding", choices=("float16", "float32"), default="float16")
    p.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads per process (real backends)")
    p.add_argument("--stage-concurrency", type=int, default=8, help="orchestrator calls in flight per stage")
    p.add_argument("--smoke", action="store_true", help="2 images of 64 px, one run, light stages: seconds")
    a = p.parse_args(argv)
    if a.smoke:
        a.prompts, a.samples, a.size, a.repeats, a.wire_samples, a.backend = 2, 1, 64, 1, 1, "synthetic"
    print(describe())
    bodies = [b.strip() for b in a.stage_bodies.split(",") if b.strip()]
    assert set(bodies) <= {"auto", "json"}, bodies

    tmp = Path(tempfile.mkdtemp(prefix="bench-services-"))
    root = tmp / "images"
    write_demo(root, prompts=a.prompts, samples=a.samples, seed=0, size=a.size)
    jobs = discover(root)
    print(f"{len(jobs)} images of {a.prompts} prompts, {a.size} x {a.size} px, backend {a.backend}"
          f"{f', detector kstub K={a.k}' if a.k else ''}; cpu count {os.cpu_count()}")  # fmt: skip

    stage_env = {"NEGT2I_DEVICE": "cpu", "OMP_NUM_THREADS": str(a.threads)}
    modules = []
    if a.backend == "random":  # random-weight real architectures (benchmarks/random_backends.py)
        import benchmarks.random_backends  # registers the "random" backends here too

        modules.append("benchmarks.random_backends")
        import torch

        torch.set_num_threads(a.threads)
    backends = dict.fromkeys(STAGES, a.backend)
    if a.k:
        import benchmarks.kstub_backends  # noqa: F401  (registers the "kstub" detector here too)

        modules.append("benchmarks.kstub_backends")
        os.environ["NEGT2I_BENCH_K"] = stage_env["NEGT2I_BENCH_K"] = str(a.k)
        backends["detector"] = "kstub"
    if modules:
        stage_env["NEGT2I_BACKEND_MODULES"] = ",".join(modules)
    if os.environ.get("NEGT2I_WEIGHTS_DIR"):
        stage_env["NEGT2I_WEIGHTS_DIR"] = os.environ["NEGT2I_WEIGHTS_DIR"]
    if a.smoke:
        procs = start_light_stages(
            tmp, {**stage_env, **{f"NEGT2I_{s.upper()}_BACKEND": b for s, b in backends.items()}}
        )
    else:
        procs = {s: start_stage(s, tmp, backend=backends[s], env=stage_env) for s in STAGES}
    orchs: dict[str, Any] = {}
    embedded_s: list[float] = []
    services_s: dict[str, list[float]] = {b: [] for b in bodies}
    identical: dict[str, bool] = {}
    sizes_req, sizes_resp = [], []
    try:
        for proc in procs.values():
            wait_ready(proc, timeout=600)
        for b in bodies:
            orchs[b] = start_orchestrator(
                {s: p.url for s, p in procs.items()},
                tmp,
                env={
                    "NEGT2I_DEPTH_ENCODING": a.depth_encoding,
                    "NEGT2I_STAGE_BODIES": b,
                    "NEGT2I_STAGE_CONCURRENCY": str(a.stage_concurrency),
                },
            )
        for orch in orchs.values():
            assert wait_health(orch.target, "SERVING", timeout=120) == "SERVING", orch.tail()

        stages = Stages.create(backends, device="cpu")
        for k in range(a.repeats):
            out_e = tmp / f"embedded-{k}.jsonl"
            t0 = time.perf_counter()
            evaluate(jobs, out_e, stages, progress=False)
            embedded_s.append(time.perf_counter() - t0)
            for b, orch in orchs.items():
                out_s = tmp / f"services-{b}-{k}.jsonl"
                t0 = time.perf_counter()
                outcome = submit(jobs, out_s, orch.target, progress=False)
                services_s[b].append(time.perf_counter() - t0)
                assert not outcome.retry, outcome.retry
                assert _verdicts(_rows(out_e)) == _verdicts(_rows(out_s)), (
                    f"services ({b}) and embedded verdicts differ"
                )
                identical[b] = _rows(out_e) == _rows(out_s)

        # what one request costs on the wire: the gRPC messages, and the stage calls behind them
        with EvaluatorClient(orchs[bodies[0]].target) as client:
            for job in jobs[: min(len(jobs), a.wire_samples)]:
                assert job.prompt is not None
                req = make_request(job.path.read_bytes(), prompt=job.prompt, request_id=job.filename)
                resp = client.stub.Evaluate(req, timeout=300)
                sizes_req.append(req.ByteSize())
                sizes_resp.append(resp.ByteSize())
    finally:
        for orch in orchs.values():
            orch.kill(signal.SIGTERM)
        for proc in procs.values():
            proc.kill()

    n = len(jobs)
    e = statistics.median(embedded_s)
    print(f"embedded: {e:.2f} s ({n / e:.1f} images/s, {1000 * e / n:.0f} ms per image)   runs "
          f"{[round(x, 2) for x in embedded_s]}")  # fmt: skip
    for b in bodies:
        s = statistics.median(services_s[b])
        kind = "binary protobuf where listed" if b == "auto" else "JSON"
        print(f"services ({b} stage bodies, {kind}): {s:.2f} s ({n / s:.1f} images/s, {1000 * s / n:.0f} ms per "
              f"image)   runs {[round(x, 2) for x in services_s[b]]}")  # fmt: skip
        same = "identical" if identical[b] else "same verdicts; measured numbers differ (float16 depth)"
        print(f"ratio services / embedded ({b}): {s / e:.2f}x   (results: {same}; depth on the wire: "
              f"{a.depth_encoding})")  # fmt: skip
    print(f"gRPC per request: {statistics.mean(sizes_req) / 1024:.1f} KiB sent, "
          f"{statistics.mean(sizes_resp) / 1024:.1f} KiB received (mean over {len(sizes_req)})")  # fmt: skip
    for b, orch in orchs.items():
        m = re.search(r"wire: calls (\{.*?\}), sent (\{.*?\}), received (\{.*?\}) bytes", orch.log.read_text())
        if not m:
            continue
        wire = {k: ast.literal_eval(v) for k, v in zip(("calls", "sent", "received"), m.groups(), strict=True)}
        requests = a.repeats * n + (len(sizes_req) if b == bodies[0] else 0)
        print(f"stage calls ({b} bodies):")
        for stage in STAGES:
            calls = wire["calls"].get(stage, 0)
            if calls:
                print(f"  {stage:<10} {calls:5d} calls, per call {wire['sent'][stage] / calls / 1024:7.1f} KiB sent, "
                      f"{wire['received'][stage] / calls / 1024:7.1f} KiB received")  # fmt: skip
        det_calls = wire["calls"].get("detector", 0)
        if det_calls:
            print(f"  detector response per image: {wire['received']['detector'] / det_calls / 1024:.1f} KiB")
        total = sum(wire["sent"].values()) + sum(wire["received"].values())
        print(f"  stage traffic per request: {total / requests / 1024:.1f} KiB (HTTP bodies, both directions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
