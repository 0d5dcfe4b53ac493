"""Stage transport: the proto3 JSON mapping (base64 bytes) against binary protobuf bodies, per image per side.

For each stage, one realistic request (one item) and its result at 1024 x 1024 px: the detector's result
with K = 20 and K = 300 detections (full-size RLE masks), the segmenter's and attribute scorer's items with
the instances a prompt sends (K = 20, and 64: the per-item limit), the depth map as float16. The image is a
1024 px PNG of a smooth random scene with sensor-like noise (about the size of a generated image's PNG).

Each side's transport work is timed, the RLE encoding of masks and the image decoding excluded (both
transports carry the same RLE strings and image bytes):

- **orchestrator**: build the request body from the item message, parse the response body into the result
  message (JSON: ``adapter.to_json`` + ``json.dumps``, ``json.loads`` + ``adapter.from_json``; protobuf:
  ``SerializeToString`` of the request message, ``FromString`` of the response message);
- **service**: parse the request body into item messages, build the response body (the same, the other way).

Prints, after a ``machine:`` line (CPU model, core count, load average), one line per stage and K: body bytes
and median milliseconds per side, for both transports, and the sum over the four stages::

    all four stages (K=20): orchestrator json N ms vs protobuf M ms per image; services json N ms vs protobuf M ms

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_stage_transport.py [--repeats 7] [--clock wall|cpu]
    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_stage_transport.py --smoke    # 256 px, 1 repeat (seconds)

``--clock cpu`` times process CPU time (steadier than the wall clock on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.machine import describe  # noqa: E402
from negt2i.core.vocab import COCO_CLASSES  # noqa: E402
from negt2i.wire import adapter  # noqa: E402
from negt2i.wire.stage_table import STAGE_TABLE  # noqa: E402
from negt2i.wire.v1 import common_pb2, stages_pb2  # noqa: E402

SIZE = 1024


def scene(rng: np.random.Generator, size: int = SIZE) -> np.ndarray:
    """A smooth random RGB scene (bilinear blow-up of a coarse grid) with Gaussian noise of sigma 6."""
    coarse = rng.uniform(0, 255, size=(9, 9, 3))
    idx = np.linspace(0, 8, size)
    i0 = np.minimum(idx.astype(int), 7)
    f = (idx - i0)[:, None]
    rows = coarse[i0] * (1 - f[..., None]) + coarse[i0 + 1] * f[..., None]  # (SIZE, 9, 3)
    g = (idx - i0)[None, :, None]
    img = rows[:, i0] * (1 - g) + rows[:, i0 + 1] * g
    img += rng.normal(0, 6, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def blob_masks(rng: np.random.Generator, k: int, size: int = SIZE) -> tuple[np.ndarray, np.ndarray]:
    """K ellipse masks in random boxes (K, H, W) and their boxes (K, 4)."""
    masks = np.zeros((k, size, size), dtype=bool)
    boxes = np.zeros((k, 4), dtype=np.float32)
    yy, xx = np.mgrid[0:size, 0:size]
    for i in range(k):
        w, h = rng.uniform(40, 500, size=2) * size / SIZE
        x0, y0 = rng.uniform(0, size - w), rng.uniform(0, size - h)
        cx, cy, rx, ry = x0 + w / 2, y0 + h / 2, w / 2, h / 2
        masks[i] = ((yy + 0.5 - cy) / ry) ** 2 + ((xx + 0.5 - cx) / rx) ** 2 <= 1.0
        boxes[i] = (x0, y0, x0 + w, y0 + h)
    return masks, boxes


CLOCK: list[Callable[[], float]] = [time.perf_counter]


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up
    clock = CLOCK[0]
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times) * 1e3


def json_body(items: list[Any]) -> bytes:
    return json.dumps({"items": [adapter.to_json(m) for m in items]}, separators=(",", ":")).encode()


def json_results(results: list[Any]) -> bytes:
    return json.dumps([adapter.to_json(m) for m in results], separators=(",", ":")).encode()


def measure(stage: str, item: Any, result: Any, repeats: int) -> dict[str, float]:
    """Bytes and milliseconds of both sides, both transports, for one item and its result."""
    spec = STAGE_TABLE[stage]
    req_t, resp_t = spec.request, spec.response
    j_req, j_resp = json_body([item]), json_results([result])
    p_req = req_t(items=[item]).SerializeToString()
    p_resp = resp_t(results=[result]).SerializeToString()

    def j_orch() -> None:
        json_body([item])
        [adapter.from_json(d, spec.result) for d in json.loads(j_resp)]

    def j_serv() -> None:
        [adapter.from_json(d, spec.item) for d in json.loads(j_req)["items"]]
        json_results([result])

    def p_orch() -> None:
        req_t(items=[item]).SerializeToString()
        list(resp_t.FromString(p_resp).results)

    def p_serv() -> None:
        list(req_t.FromString(p_req).items)
        resp_t(results=[result]).SerializeToString()

    return {
        "json_req": len(j_req),
        "json_resp": len(j_resp),
        "pb_req": len(p_req),
        "pb_resp": len(p_resp),
        "json_orch": median_ms(j_orch, repeats),
        "json_serv": median_ms(j_serv, repeats),
        "pb_orch": median_ms(p_orch, repeats),
        "pb_serv": median_ms(p_serv, repeats),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    p.add_argument("--size", type=int, default=SIZE, help=f"image side, px (default {SIZE})")
    p.add_argument("--smoke", action="store_true", help="256 px, 1 repeat: seconds")
    a = p.parse_args(argv)
    if a.smoke:
        a.size, a.repeats = 256, 1
    CLOCK[0] = time.process_time if a.clock == "cpu" else time.perf_counter
    print(describe())
    size = a.size
    rng = np.random.default_rng(0)
    png = adapter.encode_png(scene(rng, size))
    image = adapter.image_to_proto(png)
    masks, boxes = blob_masks(rng, 300, size)
    rles = [adapter.mask_to_proto(m) for m in masks]  # RLE once: both transports carry the same strings
    names = [COCO_CLASSES[i % len(COCO_CLASSES)] for i in range(300)]
    answers = ["red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white", "gray"]
    depth = rng.uniform(0, 10, size=(size, size)).astype(np.float32)
    print(f"{size} x {size} px, PNG {len(png) / 1024:.0f} KiB; per image per side, median of {a.repeats} "
          f"({a.clock} clock); body sizes in KiB (request / response)")  # fmt: skip

    cases: list[tuple[str, int, Any, Any]] = []
    for k in (20, 300):
        det = stages_pb2.DetectResult(height=size, width=size, model_digest="0123456789abcdef")
        for i in range(k):
            det.detections.append(
                stages_pb2.Detection(class_name=names[i], score=0.5, box=adapter.box_to_proto(boxes[i]), mask=rles[i])
            )
        cases.append(("detector", k, stages_pb2.DetectItem(image=image), det))
    for k in (20, 64):
        seg_item = stages_pb2.SegmentItem(
            image=image, boxes=[adapter.box_to_proto(b) for b in boxes[:k]], reference_masks=rles[:k]
        )
        seg_result = stages_pb2.SegmentResult(masks=rles[:k], model_digest="0123456789abcdef")
        cases.append(("segmenter", k, seg_item, seg_result))
        attr_item = stages_pb2.AttributesItem(image=image, masks=rles[:k], class_names=names[:k], answers=answers)
        attr_result = adapter.scores_to_attributes_result(rng.normal(10, 3, size=(k, len(answers))).astype(np.float32))
        attr_result.model_digest = "0123456789abcdef"
        cases.append(("attributes", k, attr_item, attr_result))
    depth_item = stages_pb2.DepthItem(image=image, encoding=common_pb2.DEPTH_ENCODING_FLOAT16)
    depth_result = stages_pb2.DepthResult(disparity=adapter.depth_to_proto(depth), model_digest="0123456789abcdef")
    cases.append(("depth", 0, depth_item, depth_result))

    total = {"json_orch": 0.0, "pb_orch": 0.0, "json_serv": 0.0, "pb_serv": 0.0}
    for stage, k, item, result in cases:
        m = measure(stage, item, result, a.repeats)
        label = f"{stage} K={k}" if k else stage
        print(
            f"{label:<15} json {m['json_req'] / 1024:7.0f} / {m['json_resp'] / 1024:6.0f} KiB: orchestrator "
            f"{m['json_orch']:6.2f} ms, service {m['json_serv']:6.2f} ms | protobuf {m['pb_req'] / 1024:7.0f} / "
            f"{m['pb_resp'] / 1024:6.0f} KiB: orchestrator {m['pb_orch']:5.2f} ms, service {m['pb_serv']:5.2f} ms"
        )
        if (stage, k) in {("detector", 20), ("segmenter", 20), ("attributes", 20), ("depth", 0)}:
            for key in total:
                total[key] += m[key]
    print(
        f"all four stages (K=20): orchestrator json {total['json_orch']:.1f} ms vs protobuf {total['pb_orch']:.1f} ms"
        f" per image; services json {total['json_serv']:.1f} ms vs protobuf {total['pb_serv']:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
