"""Health latency while clients stream the worst-case valid images the limits admit (issue 31, item 4).

    .venv/bin/python benchmarks/bench_health_latency.py [--image-bytes 25165000] [--streams 3] [--items 2]
        [--orchestrator HOST:PORT]

The worst case for an image's header: a valid 8 x 8 JPEG padded to ``--image-bytes`` (default: just under
the orchestrator's default ``NEGT2I_MAX_IMAGE_BYTES``, 24 MiB) with empty APP1 segments (4 bytes each:
millions of marker segments before the frame header). Pillow's JPEG parser walks every segment in Python
at about 1.5 s per MiB; ``negt2i.core.images`` stops after ``MAX_JPEG_SEGMENTS`` and the decoder refuses the file.
``--streams`` clients each stream ``--items`` such images
while the main thread checks health every 50 ms; printed: the time to read the header (our
``negt2i.core.images.header_size`` and Pillow's), and health latency (median, p90, max, checks). The goal: every
health check under 1 s (the readiness probe's timeout is 5 s).

Without ``--orchestrator`` the four stage services (synthetic backends) and an orchestrator with default
limits are started on 127.0.0.1 and stopped at the end. After a ``machine:`` line (CPU model, core count, load
average), the figure line::

    health latency: median N ms, p90 N ms, max N ms over N checks

``--smoke``: a 1 MiB image, one stream of one item, the four stages served from one light process
(``tests/services/light_stages.py``, where ``bentoml serve`` takes 20-30 s to start): seconds.
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import describe  # noqa: E402

STAGES = ("detector", "segmenter", "attributes", "depth")
PROMPT = {
    "id": "color-x",
    "category": "color",
    "prompt": "a photo of a non-red cup",
    "include": [{"class": "cup"}],
    "statements": [{"kind": "attribute", "object": 0, "value": "red", "polarity": "negated"}],
}


def worst_case_jpeg(size: int) -> bytes:
    """A valid 8 x 8 JPEG of about ``size`` bytes, padded after SOI with empty APP1 segments."""
    import numpy as np
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.fromarray(np.full((8, 8, 3), 200, np.uint8)).save(buf, format="JPEG")
    small = buf.getvalue()
    n = max(0, (size - len(small)) // 4)
    return small[:2] + b"\xff\xe1\x00\x02" * n + small[2:]


def health_under_load(target: str, image: bytes, *, streams: int, items: int, timeout: float = 600.0) -> list[float]:
    """Health latencies (seconds) measured every 50 ms while ``streams`` clients each stream ``items`` copies of
    ``image``; measuring starts with the first send and ends when every stream has been answered."""
    from negt2i.client import EvaluatorClient, make_request
    from negt2i.core.spec import parse_prompt

    prompt = parse_prompt(PROMPT)
    started = threading.Event()
    finished = threading.Event()
    errors: list[BaseException] = []

    def stream(k: int) -> None:
        try:
            with EvaluatorClient(target, max_message_bytes=len(image) + (1 << 20)) as client:
                reqs = [make_request(image, prompt=prompt, request_id=f"{k}-{i}") for i in range(items)]
                started.set()
                for _ in client.stream(reqs, timeout=timeout):
                    pass
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=stream, args=(k,), daemon=True) for k in range(streams)]
    for t in threads:
        t.start()

    def join() -> None:
        for t in threads:
            t.join(timeout)
        finished.set()

    threading.Thread(target=join, daemon=True).start()
    latencies: list[float] = []
    with EvaluatorClient(target) as client:
        started.wait(60)
        while not finished.is_set():
            start = time.perf_counter()
            client.health(timeout=30)
            latencies.append(time.perf_counter() - start)
            time.sleep(0.05)
    if errors:
        raise errors[0]
    return latencies


def _summary(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p90 = ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]  # nearest rank
    return (
        f"health latency: median {statistics.median(ordered) * 1000:.0f} ms, p90 {p90 * 1000:.0f} ms, "
        f"max {ordered[-1] * 1000:.0f} ms over {len(ordered)} checks"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image-bytes", type=int, default=24 * 1024 * 1024 - 4096)
    p.add_argument("--streams", type=int, default=3)
    p.add_argument("--items", type=int, default=2)
    p.add_argument("--orchestrator", default="", help="an orchestrator already running (default: start one)")
    p.add_argument("--smoke", action="store_true", help="1 MiB, 1 stream x 1 item, light stage services: seconds")
    args = p.parse_args(argv)
    if args.smoke:
        args.image_bytes, args.streams, args.items = 1 << 20, 1, 1
    print(describe())

    from PIL import Image as PILImage

    from negt2i.core.images import header_size

    image = worst_case_jpeg(args.image_bytes)
    start = time.perf_counter()
    size = header_size(image)
    ours = time.perf_counter() - start
    start = time.perf_counter()
    with PILImage.open(io.BytesIO(image)) as img:
        pillow_size = img.size
    pillow = time.perf_counter() - start
    print(f"image: {len(image)} bytes, {size} (Pillow {pillow_size}); header read: header_size {ours:.2f} s, "
          f"Pillow {pillow:.2f} s")  # fmt: skip
    if args.orchestrator:
        print(_summary(health_under_load(args.orchestrator, image, streams=args.streams, items=args.items)))
        return 0
    from tests.services.light_stages import start_light_stages
    from tests.services.live import start_orchestrator, start_stage, wait_health, wait_ready

    with tempfile.TemporaryDirectory() as tmp:
        env = {"NEGT2I_MAX_REQUEST_BYTES": str(64 << 20)}
        if args.smoke:
            procs = list(start_light_stages(Path(tmp), env).values())
        else:
            procs = [start_stage(s, Path(tmp), env=env) for s in STAGES]
        orch = None
        try:
            for proc in procs:
                wait_ready(proc)
            orch = start_orchestrator({s: p.url for s, p in zip(STAGES, procs, strict=True)}, Path(tmp))
            assert wait_health(orch.target, "SERVING", timeout=60) == "SERVING", orch.tail()
            print(_summary(health_under_load(orch.target, image, streams=args.streams, items=args.items)))
        finally:
            for proc in [*procs, *([orch] if orch else [])]:
                proc.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
