"""Does a running stage service honour the stage contract? (``negt2i conformance <stage> URL``)

Each check is one row: a name, pass / fail and what was seen. The checks
follow ``docs/stage-contract.md``: the health endpoints, ``GET /info``, a valid
item (results that parse, have the right sizes and values), a batch of two
items answered in order, a bad item failing alone (status 400 inside a 200
answer), a malformed body (HTTP 400), an oversized body (HTTP 413),
determinism (the same item twice gives the same result) and ``GET /metrics``.
The probe images are synthetic scenes (``negt2i.stages.synthetic.render_scene``),
so any detector should answer them, though not necessarily find anything.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from negt2i.stages.registry import STAGES

SEVERITY: Final = ("required", "recommended")


@dataclass(frozen=True)
class Check:
    """One conformance check's outcome."""

    name: str
    passed: bool
    detail: str = ""


class _Fail(Exception):
    pass


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise _Fail(message)


def _scene(hw: tuple[int, int], shift: int = 0) -> tuple[bytes, Any, Any]:
    """(PNG bytes, masks (2, H, W), boxes (2, 4)) of a two-object synthetic scene."""
    from negt2i.perception import mask_to_xyxy
    from negt2i.stages.synthetic import SceneObject, render_scene, shape_mask
    from negt2i.wire import adapter

    h, w = hw
    objs = [
        SceneObject("cup", (4 + shift, 6, w // 2, h // 2), value="red"),
        SceneObject("dog", (w // 2 + 2, h // 2 + 2, w - 3, h - 2), shape="ellipse"),
    ]
    image = render_scene(objs, hw)
    masks = np.stack([shape_mask(o, hw) for o in objs])
    boxes = np.array([mask_to_xyxy(m) for m in masks], dtype=np.float32)
    return adapter.encode_png(image), masks, boxes


def _item(stage: str, png: bytes, masks: Any, boxes: Any, encoding: int = 0) -> dict[str, Any]:
    from negt2i.wire import adapter
    from negt2i.wire.v1 import stages_pb2

    msg: Any
    if stage == "detector":
        msg = stages_pb2.DetectItem(image=adapter.image_to_proto(png))
    elif stage == "segmenter":
        msg = adapter.segment_item(png, boxes, masks)
    elif stage == "attributes":
        msg = adapter.attributes_item(png, masks, ["cup", "dog"], ["red", "blue", "gray"])
    else:
        msg = stages_pb2.DepthItem(image=adapter.image_to_proto(png), encoding=encoding)  # type: ignore[arg-type]
    return adapter.to_json(msg)


def _validate(stage: str, result: Any, hw: tuple[int, int], *, encoding: int = 0) -> str:
    """Raise ``_Fail`` unless ``result`` is a correct result for the probe item; returns a summary."""
    from negt2i.wire import adapter
    from negt2i.wire.v1 import common_pb2, stages_pb2

    cls = {
        "detector": stages_pb2.DetectResult,
        "segmenter": stages_pb2.SegmentResult,
        "attributes": stages_pb2.AttributesResult,
        "depth": stages_pb2.DepthResult,
    }[stage]
    try:
        msg: Any = adapter.from_json(result, cls)
        if msg.HasField("error"):
            raise _Fail(f"the valid item failed: {msg.error.status} {msg.error.message}")
        if stage == "detector":
            det = adapter.detections_from_proto(msg)
            _expect(det.shape_hw == hw, f"detections are for {det.shape_hw}, the image is {hw}")
            return f"{len(det)} detections ({', '.join(sorted(set(det.class_names))) or 'none'})"
        if stage == "segmenter":
            masks = adapter.segment_result_masks(msg, 2, hw)
            return f"2 masks of {hw}, areas {[int(m.sum()) for m in masks]}"
        if stage == "attributes":
            scores = adapter.attributes_result_scores(msg, 2, 3)
            _expect(bool(np.isfinite(scores).all()), "scores must be finite")
            return f"scores {np.round(scores, 2).tolist()}"
        disp = adapter.depth_result_map(msg, hw)
        want = encoding or common_pb2.DEPTH_ENCODING_FLOAT16
        _expect(msg.disparity.encoding == want, f"encoding {msg.disparity.encoding}, asked for {want}")
        _expect(bool(np.isfinite(disp).all()), "disparity must be finite")
        return f"{hw[0]} x {hw[1]} map, {len(msg.disparity.data)} bytes"
    except adapter.WireError as exc:
        raise _Fail(f"the result does not follow the contract: {exc}") from None


def run_checks(stage: str, url: str, *, timeout: float = 30.0) -> list[Check]:
    """Every check against the service at ``url``, in order."""
    import httpx

    from negt2i.wire import adapter
    from negt2i.wire.stage_handlers import ROUTES
    from negt2i.wire.v1 import common_pb2, stages_pb2

    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    base = url.rstrip("/")
    route = f"{base}/{ROUTES[stage]}"
    checks: list[Check] = []
    hw = (64, 80)
    png, masks, boxes = _scene(hw)
    png2, masks2, boxes2 = _scene((48, 56), shift=3)
    limits: dict[str, Any] = {}

    with httpx.Client(timeout=timeout, trust_env=False) as client:

        def post(payload: Any) -> httpx.Response:
            return client.post(route, json=payload)

        def results_of(r: httpx.Response, n: int) -> list[Any]:
            _expect(r.status_code == 200, f"HTTP {r.status_code}: {r.text[:200]}")
            data = r.json()
            _expect(isinstance(data, list), f"the body must be a JSON array, got {type(data).__name__}")
            _expect(len(data) == n, f"{len(data)} results for {n} items")
            return list(data)

        def run(name: str, fn: Callable[[], str]) -> None:
            try:
                detail = fn()
                checks.append(Check(name, True, detail))
            except _Fail as exc:
                checks.append(Check(name, False, str(exc)))
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                checks.append(Check(name, False, f"{type(exc).__name__}: {exc}"))

        def livez() -> str:
            r = client.get(f"{base}/livez")
            _expect(r.status_code == 200, f"GET /livez: HTTP {r.status_code}")
            return "200"

        def readyz() -> str:
            r = client.get(f"{base}/readyz")
            _expect(r.status_code == 200, f"GET /readyz: HTTP {r.status_code} (a loaded service answers 200)")
            return "200"

        def info() -> str:
            r = client.get(f"{base}/info")
            _expect(r.status_code == 200, f"GET /info: HTTP {r.status_code}")
            msg = adapter.from_json(r.json(), stages_pb2.StageInfo)
            _expect(msg.contract == adapter.CONTRACT, f"contract {msg.contract!r}, expected {adapter.CONTRACT!r}")
            _expect(msg.model.stage == stage, f"model.stage is {msg.model.stage!r}, expected {stage!r}")
            _expect(bool(msg.model.model), "model.model (the model's name) is empty")
            _expect(msg.limits.max_request_bytes > 0, "limits.max_request_bytes must be set")
            limits["max_request_bytes"] = int(msg.limits.max_request_bytes)
            return f"{msg.model.backend} / {msg.model.model} on {msg.model.device or '?'}"

        def valid() -> str:
            return _validate(stage, results_of(post({"items": [_item(stage, png, masks, boxes)]}), 1)[0], hw)

        def batch() -> str:
            items = [_item(stage, png, masks, boxes), _item(stage, png2, masks2, boxes2)]
            got = results_of(post({"items": items}), 2)
            first = _validate(stage, got[0], hw)
            _validate(stage, got[1], (48, 56))
            return f"2 results in order; first: {first}"

        def bad_item() -> str:
            bad = _item(stage, b"not an image", masks, boxes)
            got = results_of(post({"items": [bad, _item(stage, png, masks, boxes)]}), 2)
            err = got[0].get("error") if isinstance(got[0], dict) else None
            if not isinstance(err, dict):
                raise _Fail("the undecodable item must carry an error")
            _expect(err.get("status") == 400, f"its error status must be 400, got {err.get('status')}")
            _validate(stage, got[1], hw)
            return f"error 400 ({str(err.get('message', ''))[:60]}); the other item answered"

        def malformed() -> str:
            r = client.post(route, content=b"{not json", headers={"content-type": "application/json"})
            _expect(400 <= r.status_code < 500, f"a malformed body must get HTTP 4xx, got {r.status_code}")
            r2 = post({"items": "nope"})
            _expect(400 <= r2.status_code < 500, f"a body of the wrong shape must get HTTP 4xx, got {r2.status_code}")
            return f"HTTP {r.status_code} / {r2.status_code}"

        def oversized() -> str:
            limit = limits.get("max_request_bytes")
            if limit is None:
                raise _Fail("needs limits.max_request_bytes from GET /info")
            if limit > 256 * 1024 * 1024:
                raise _Fail(f"max_request_bytes {limit} is too large to probe")
            body = b'{"items": []}' + b" " * (int(limit) + 1 - 13)
            r = client.post(route, content=body, headers={"content-type": "application/json"})
            _expect(r.status_code == 413, f"a body over max_request_bytes must get HTTP 413, got {r.status_code}")
            return f"413 above {limit} bytes"

        def deterministic() -> str:
            item = _item(stage, png, masks, boxes)
            a = results_of(post({"items": [item]}), 1)[0]
            b = results_of(post({"items": [item]}), 1)[0]
            _expect(json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True), "the same item gave two results")
            return "identical"

        def metrics() -> str:
            r = client.get(f"{base}/metrics")
            _expect(r.status_code == 200, f"GET /metrics: HTTP {r.status_code}")
            _expect("# TYPE" in r.text or "# HELP" in r.text, "not Prometheus text exposition")
            return f"{r.text.count(chr(10))} lines"

        run("GET /livez", livez)
        run("GET /readyz", readyz)
        run("GET /info", info)
        run(f"POST /{ROUTES[stage]}: one valid item", valid)
        run(f"POST /{ROUTES[stage]}: two items answered in order", batch)
        run(f"POST /{ROUTES[stage]}: a bad item fails alone (400)", bad_item)
        run(f"POST /{ROUTES[stage]}: malformed body (4xx)", malformed)
        run(f"POST /{ROUTES[stage]}: oversized body (413)", oversized)
        run(f"POST /{ROUTES[stage]}: deterministic", deterministic)
        if stage == "depth":

            def float32() -> str:
                item = _item(stage, png, masks, boxes, encoding=common_pb2.DEPTH_ENCODING_FLOAT32)
                got = results_of(post({"items": [item]}), 1)[0]
                return _validate(stage, got, hw, encoding=common_pb2.DEPTH_ENCODING_FLOAT32)

            run("POST /depth: float32 on request", float32)
        run("GET /metrics", metrics)
    return checks


def format_report(stage: str, url: str, checks: list[Check]) -> str:
    """A table of the checks and a verdict line."""
    lines = [f"conformance of {stage} at {url} (contract negt2i.v1)"]
    for c in checks:
        lines.append(f"  [{'PASS' if c.passed else 'FAIL'}] {c.name}" + (f": {c.detail}" if c.detail else ""))
    failed = sum(not c.passed for c in checks)
    lines.append(f"{len(checks) - failed}/{len(checks)} checks passed" + ("" if failed else "; the service conforms"))
    return "\n".join(lines)
