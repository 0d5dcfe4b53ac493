"""How long a stage service takes to refuse a request it has no room for (HTTP 503), against its model call.

    .venv/bin/python benchmarks/bench_stage_refusal.py [--clients 16] [--max-queue 8] [--rounds 5]
        [--call-s 0.5] [--smoke]

``--smoke`` (tests/benchmarks/test_smoke.py): 4 clients, room for 2, one round of 0.2 s calls; the time is
mostly the BentoML service's start.

A segmenter service (``tests/services/batch_backend.py``: ``--call-s`` seconds per model call, batches of 4,
``--max-queue`` items admitted at once) as a real process on 127.0.0.1. Each round holds its model
(``NEGT2I_TEST_HOLD_FILE``), sends ``--clients`` concurrent one-item requests (half JSON, half binary), waits
for the ``--clients - --max-queue`` refusals, then lets the model go. Printed: the refusal latency (from the
common start of the requests to each 503; median, p90, max over all rounds) and the latency of the admitted
requests, which wait for the model. The goal: a refusal takes a small fraction of one model call; the tests
(``tests/services/test_stage_batching.py``) check the mechanism instead: every refusal is answered while the
model is held, before any model call ends.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from google.protobuf.message import Message

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import describe  # noqa: E402
from tests.services.live import start_stage, wait_ready  # noqa: E402


def _items(n: int) -> list[Message]:
    """``n`` different valid segmenter items (a cup and a bowl, the cup at another place in each image)."""
    import numpy as np

    from negt2i.stages.synthetic import SceneObject, render_scene, shape_mask
    from negt2i.wire import adapter
    from negt2i.wire.stage_table import STAGE_TABLE

    out = []
    for i in range(n):
        objs = [SceneObject("cup", (4 + 2 * i, 6, 40 + 2 * i, 34), value="red"), SceneObject("bowl", (50, 40, 90, 70))]
        image = render_scene(objs, (80, 96))
        masks = np.stack([shape_mask(o, (80, 96)) for o in objs])
        boxes = np.array([o.box for o in objs], np.float32)
        probe = STAGE_TABLE["segmenter"].probe
        out.append(probe(adapter.encode_png(image), masks, boxes, [o.class_name for o in objs]))
    return out


def _round(url: str, items: list[Message], hold: Path, refusals: int) -> tuple[list[float], list[float]]:
    """One burst with the model held until the refusals are in: (refusal latencies, admitted latencies)."""
    import httpx

    from negt2i.wire import adapter
    from negt2i.wire.stage_table import STAGE_TABLE

    spec = STAGE_TABLE["segmenter"]
    got: list[tuple[int, float]] = []
    lock = threading.Condition()
    start = threading.Barrier(len(items) + 1)
    t0 = [0.0]

    def one(i: int) -> None:
        with httpx.Client(trust_env=False, timeout=120) as client:
            start.wait()
            if i % 2 == 0:
                body = spec.request(items=[items[i]]).SerializeToString()
                r = client.post(f"{url}/{spec.route}", content=body, headers={"content-type": adapter.PROTOBUF_TYPE})
            else:
                r = client.post(f"{url}/{spec.route}", json={"items": [adapter.to_json(items[i])]})
            with lock:
                got.append((r.status_code, time.monotonic() - t0[0]))
                lock.notify_all()

    hold.touch()
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(items))]
    try:
        for t in threads:
            t.start()
        t0[0] = time.monotonic()
        start.wait()
        with lock:
            if not lock.wait_for(lambda: len(got) >= refusals, timeout=120):
                raise RuntimeError(f"only {len(got)} of {refusals} refusals within 120 s")
    finally:
        hold.unlink(missing_ok=True)
    for t in threads:
        t.join(300)
    refused = [s for code, s in got if code == 503]
    admitted = [s for code, s in got if code == 200]
    if len(refused) != refusals or len(admitted) != len(items) - refusals:
        raise RuntimeError(f"expected {refusals} refusals and the rest answered, got {sorted(c for c, _ in got)}")
    return refused, admitted


def _summary(name: str, values: list[float]) -> str:
    values = sorted(values)
    p90 = values[int(0.9 * (len(values) - 1))]
    median, top = statistics.median(values), values[-1]
    return f"{name}: median {median * 1000:.0f} ms, p90 {p90 * 1000:.0f} ms, max {top * 1000:.0f} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--max-queue", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--call-s", type=float, default=0.5)
    p.add_argument("--smoke", action="store_true", help="a few seconds' check that the script works (CI)")
    a = p.parse_args(argv)
    if a.smoke:
        a.clients, a.max_queue, a.rounds, a.call_s = 4, 2, 1, 0.2
    if not 0 < a.max_queue < a.clients:
        p.error("--max-queue must be above 0 and below --clients")
    tmp = Path(tempfile.mkdtemp(prefix="bench-refusal-"))
    hold = tmp / "hold"
    env = {"NEGT2I_BACKEND_MODULES": "tests.services.batch_backend", "NEGT2I_TEST_CALL_S": str(a.call_s),
           "NEGT2I_MAX_BATCH_SIZE": "4", "NEGT2I_MAX_QUEUE": str(a.max_queue), "NEGT2I_MAX_WAIT_MS": "50",
           "NEGT2I_TEST_HOLD_FILE": str(hold)}  # fmt: skip
    proc = start_stage("segmenter", tmp, backend="batch-test", env=env)
    try:
        wait_ready(proc)
        items = _items(a.clients)
        refused: list[float] = []
        admitted: list[float] = []
        for _ in range(a.rounds):
            r, ok = _round(proc.url, items, hold, a.clients - a.max_queue)
            refused += r
            admitted += ok
    finally:
        proc.kill()
    print(describe())
    print(f"{a.clients} clients, room for {a.max_queue}, model call {a.call_s:g} s, {a.rounds} rounds")
    print(_summary(f"refused ({len(refused)})", refused))
    print(_summary(f"admitted ({len(admitted)}, held until the refusals were in)", admitted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
