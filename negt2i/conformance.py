"""Does a running stage service honour the stage contract? (``negt2i conformance <stage> URL``)

Each check is one row: a name, pass / fail and what was seen. The checks
follow ``docs/stage-contract.md``: the health endpoints, ``GET /info``, a valid
item (results that parse, have the right sizes and values), a batch of two
items answered in order, a bad item failing alone (status 400 inside a 200
answer), a malformed body (HTTP 400), an oversized body (HTTP 413),
determinism (the same item twice gives the same result) and ``GET /metrics``;
probes of the HTTP rules: a body without ``Content-Length`` (HTTP 411), an item
with an unknown field (that item fails with 400), readiness (``/readyz`` 200 means
``/info`` says ``ready`` and items are answered), and the ``/info`` schema (no
unknown fields, the stage's rule constants, a detector's operating point); for a detector whose
``/info`` lists the ``detect.classes`` feature, that ``classes`` / ``max_per_class`` give exactly the
unfiltered answer reduced by the class filter (``negt2i.core.flow.filter_detections``).

Every returned answer is checked against the contract rules of ``negt2i.core.flow``
(class names in the benchmark vocabulary, scores in [floor, 1], finite boxes
inside the image, mask sizes). The built-in probe images are synthetic scenes in
which a real detector may find nothing, so those checks would see nothing:
``images`` (``--image FILE``, repeatable) adds photos in which the service should
find something (a check fails when it finds nothing), and ``expect``
(``--expect CLASS``) classes that must be found in at least one of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.stage_types import STAGES


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
    from negt2i.core.perception import mask_to_xyxy
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
    """The stage table's probe item for an image with K masks / boxes (class names cup, dog, cup, ...)."""
    from negt2i.wire import adapter
    from negt2i.wire.stage_table import spec

    msg: Any = spec(stage).probe(png, masks, boxes, [("cup", "dog")[i % 2] for i in range(len(masks))])
    if encoding:
        msg.encoding = encoding
    return adapter.to_json(msg)


def _floor_config(floor: float) -> RuleConfig:
    return CURRENT.model_copy(update={"detection": CURRENT.detection.model_copy(update={"prediction_floor": floor})})


def _validate(
    stage: str, result: Any, hw: tuple[int, int], *, encoding: int = 0, floor: float = 0.0, k: int = 2,
    digest: str = "",
) -> str:  # fmt: skip
    """Raise ``_Fail`` unless ``result`` is a correct result for the probe item; returns a summary."""
    from negt2i.core import flow
    from negt2i.core.failures import StageError
    from negt2i.wire import adapter
    from negt2i.wire.stage_table import spec
    from negt2i.wire.v1 import common_pb2

    cls = spec(stage).result
    try:
        msg: Any = adapter.from_json(result, cls)
        if msg.HasField("error"):
            raise _Fail(f"the valid item failed: {msg.error.status} {msg.error.message}")
        if digest and msg.model_digest and msg.model_digest != digest:
            raise _Fail(f"model_digest {msg.model_digest!r} is not the digest of /info's model {digest!r}")
        if stage == "detector":
            det = adapter.detections_from_proto(msg)
            try:
                flow.check_detections(det, hw, _floor_config(floor))
            except StageError as exc:
                raise _Fail(f"[{exc.rule}] {exc.message}") from None
            for i in range(len(det)):  # pixel boxes around their masks (0-1 boxes fail this)
                area = int(det.masks[i].sum())
                x0, y0, x1, y1 = (int(np.floor(v)) if k < 2 else int(np.ceil(v)) for k, v in enumerate(det.xyxy[i]))
                inside = int(det.masks[i][max(y0, 0) : y1 + 1, max(x0, 0) : x1 + 1].sum())
                why = f"[box-covers-mask] box {i} {det.xyxy[i].tolist()} holds {inside} of its mask's {area} pixels"
                _expect(area == 0 or 2 * inside >= area, f"{why}: boxes are xyxy pixel edges around the mask")
            return f"{len(det)} detections ({', '.join(sorted(set(det.class_names))) or 'none'})"
        if stage == "segmenter":
            masks = adapter.segment_result_masks(msg, k, hw)
            return f"{k} masks of {hw}, areas {[int(m.sum()) for m in masks]}"
        if stage == "attributes":
            scores = adapter.attributes_result_scores(msg, k, 3)
            _expect(bool(np.isfinite(scores).all()), "scores must be finite")
            return f"scores {np.round(scores, 2).tolist()}"
        disp = adapter.depth_result_map(msg, hw)
        want = encoding or common_pb2.DEPTH_ENCODING_FLOAT16
        _expect(msg.disparity.encoding == want, f"encoding {msg.disparity.encoding}, asked for {want}")
        _expect(bool(np.isfinite(disp).all()), "disparity must be finite")
        return f"{hw[0]} x {hw[1]} map, {len(msg.disparity.data)} bytes"
    except adapter.WireError as exc:
        raise _Fail(f"the result does not follow the contract: {exc}") from None


def _photo_item(stage: str, data: bytes, hw: tuple[int, int]) -> dict[str, Any]:
    """A probe item for a photo: the image, and for segmenter / attributes one box / mask (its central half)."""
    h, w = hw
    mask = np.zeros(hw, dtype=bool)
    mask[h // 4 : max(3 * h // 4, h // 4 + 1), w // 4 : max(3 * w // 4, w // 4 + 1)] = True
    from negt2i.core.perception import mask_to_xyxy

    box = np.array([mask_to_xyxy(mask)], dtype=np.float32)
    return _item(stage, data, mask[None], box)


def run_checks(
    stage: str,
    url: str,
    *,
    timeout: float = 30.0,
    images: Sequence[str | Path] = (),
    expect: Sequence[str] = (),
    config: RuleConfig | None = None,
    strict: bool | None = None,
) -> list[Check]:
    """Every check against the service at ``url``, in order (``images`` / ``expect``: see the module docstring).

    ``/info``'s model goes through the orchestrator's own stage check (``negt2i.core.stage_identity``) under
    ``config`` (default: ``NEGT2I_RULES``, else ``current``, as the orchestrator reads it) and ``strict``
    (default ``NEGT2I_STRICT_STAGES``): what the orchestrator would refuse fails, what it would accept with
    a warning passes with the warning in the check's detail. A check that needs what an earlier one failed to
    read says so instead of failing on its own (no cascading failures), and ``model_digest`` is checked once."""
    import os

    import httpx

    from negt2i.core.config import load_config
    from negt2i.core.stage_identity import check_model_info, strict_from_env
    from negt2i.wire import adapter
    from negt2i.wire.stage_table import STAGE_TABLE
    from negt2i.wire.v1 import common_pb2, stages_pb2

    if stage not in STAGE_TABLE:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    route_path = STAGE_TABLE[stage].route
    base = url.rstrip("/")
    route = f"{base}/{route_path}"
    rules = config if config is not None else load_config(os.environ.get("NEGT2I_RULES") or "current")
    strict_on = strict_from_env() if strict is None else strict
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
            model = adapter.model_info_from_proto(msg.model)
            # what later checks need, recorded before anything here can fail (no cascading failures)
            limits["digest"] = msg.model_digest or model.digest()
            limits["ready"] = bool(msg.ready)
            limits["content_types"] = list(msg.content_types)
            limits["features"] = list(msg.features)
            if msg.limits.max_request_bytes > 0:
                limits["max_request_bytes"] = int(msg.limits.max_request_bytes)
            op = model.operating_point
            stated_floor = model.rules.get("detection.prediction_floor")
            if op is not None or stated_floor is not None:
                limits["floor"] = float(op.prediction_floor if op is not None else stated_floor or 0.0)
            _expect(msg.contract == adapter.CONTRACT, f"contract {msg.contract!r}, expected {adapter.CONTRACT!r}")
            _expect(msg.limits.max_request_bytes > 0, "limits.max_request_bytes must be set")
            verdict = check_model_info(stage, model, rules, strict=strict_on)
            _expect(verdict.ok, f"the orchestrator (rules {rules.name}) would refuse it: {verdict.problem}")
            point = ""
            if op is not None:
                _expect(0.0 <= op.prediction_floor <= 1.0, f"prediction_floor {op.prediction_floor} not in [0, 1]")
                _expect(bool(op.suppression), "operating_point.suppression must be set ('none' or e.g. 'nms:0.5')")
                point = (
                    f", floor {op.prediction_floor:g}, suppression {op.suppression}, input {op.input_size or 'native'}"
                )
            warned = "".join(f"; WARNING: it {w}" for w in verdict.warnings)
            return f"{msg.model.backend} / {msg.model.model} on {msg.model.device or '?'}{point}{warned}"

        def check(result: Any, shape: tuple[int, int], **kw: Any) -> str:
            digest = "" if limits.get("digest_checked") else str(limits.get("digest", ""))
            if digest:
                limits["digest_checked"] = True  # model_digest is checked once, on the first answer
            return _validate(stage, result, shape, floor=float(limits.get("floor", 0.0)), digest=digest, **kw)

        def valid() -> str:
            return check(results_of(post({"items": [_item(stage, png, masks, boxes)]}), 1)[0], hw)

        def batch() -> str:
            items = [_item(stage, png, masks, boxes), _item(stage, png2, masks2, boxes2)]
            got = results_of(post({"items": items}), 2)
            first = check(got[0], hw)
            check(got[1], (48, 56))
            return f"2 results in order; first: {first}"

        def bad_item() -> str:
            bad = _item(stage, b"not an image", masks, boxes)
            got = results_of(post({"items": [bad, _item(stage, png, masks, boxes)]}), 2)
            err = got[0].get("error") if isinstance(got[0], dict) else None
            if not isinstance(err, dict):
                raise _Fail("the undecodable item must carry an error")
            _expect(err.get("status") == 400, f"its error status must be 400, got {err.get('status')}")
            check(got[1], hw)
            return f"error 400 ({str(err.get('message', ''))[:60]}); the other item answered"

        def unknown_field() -> str:
            bad = {**_item(stage, png, masks, boxes), "no_such_field": 1}
            got = results_of(post({"items": [bad, _item(stage, png, masks, boxes)]}), 2)
            err = got[0].get("error") if isinstance(got[0], dict) else None
            _expect(isinstance(err, dict) and err.get("status") == 400,
                    "an item with an unknown field must fail alone with status 400 (it was answered)")  # fmt: skip
            check(got[1], hw)
            return "the item failed with 400; the other item answered"

        def no_length() -> str:
            body = json.dumps({"items": [_item(stage, png, masks, boxes)]}).encode()

            def chunks() -> Iterator[bytes]:
                yield body

            r = client.post(route, content=chunks(), headers={"content-type": "application/json"})
            _expect(r.status_code == 411, f"a body without Content-Length must get HTTP 411, got {r.status_code}")
            return "411"

        def readiness() -> str:
            r = client.get(f"{base}/readyz")
            _expect(r.status_code == 200, f"GET /readyz: HTTP {r.status_code}")
            _expect("ready" in limits, "not checked: GET /info could not be read (above)")
            _expect(limits["ready"] is True, "/readyz answers 200 but GET /info says ready: false")
            item = post({"items": [_item(stage, png, masks, boxes)]})
            _expect(item.status_code == 200, f"/readyz answers 200 but an item got HTTP {item.status_code}")
            return "/readyz, /info and the API agree"

        def photo(path: Path) -> Callable[[], str]:
            def run_photo() -> str:
                data = path.read_bytes()
                image = adapter.decode_image(data)
                shape = (int(image.shape[0]), int(image.shape[1]))
                got = results_of(post({"items": [_photo_item(stage, data, shape)]}), 1)[0]
                summary = check(got, shape, k=1)
                if stage == "detector":
                    det = adapter.detections_from_proto(adapter.from_json(got, stages_pb2.DetectResult))
                    _expect(len(det) > 0, f"nothing found in {path.name}: pass a photo the detector should find "
                            "something in, or the checks of detections see nothing")  # fmt: skip
                    found.update(det.class_names)
                return summary

            return run_photo

        found: set[str] = set()

        def expected() -> str:
            missing = sorted(set(expect) - found)
            _expect(not missing, f"{', '.join(missing)} not found in any --image (found: {sorted(found) or 'nothing'})")
            return f"found {', '.join(sorted(expect))}"

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

        def binary() -> str:
            if adapter.PROTOBUF_TYPE not in limits.get("content_types", []):
                return "JSON only (/info lists no binary body type)"
            spec = STAGE_TABLE[stage]
            json_items = [_item(stage, png, masks, boxes), _item(stage, png2, masks2, boxes2)]
            items = [adapter.from_json(i, spec.item) for i in json_items]
            headers = {"content-type": adapter.PROTOBUF_TYPE}
            r = client.post(route, content=spec.request_of(items).SerializeToString(), headers=headers)
            _expect(r.status_code == 200, f"a binary body (listed in /info) got HTTP {r.status_code}: {r.text[:200]}")
            ctype = r.headers.get("content-type", "").split(";")[0].strip()
            _expect(ctype == adapter.PROTOBUF_TYPE, f"a binary body must be answered in binary, got {ctype!r}")
            got = list(adapter.from_binary(r.content, spec.response).results)  # type: ignore[attr-defined]
            _expect(len(got) == 2, f"{len(got)} results for 2 items")
            want = [adapter.from_json(d, spec.result) for d in results_of(post({"items": json_items}), 2)]
            _expect(got == want, "the binary answer differs from the JSON answer to the same items")
            bad = client.post(route, content=b"\x0a\x05oops", headers=headers)
            _expect(bad.status_code == 400, f"a malformed binary body must get HTTP 400, got {bad.status_code}")
            return "same results as JSON; malformed body 400"

        def metrics() -> str:
            r = client.get(f"{base}/metrics")
            _expect(r.status_code == 200, f"GET /metrics: HTTP {r.status_code}")
            _expect("# TYPE" in r.text or "# HELP" in r.text, "not Prometheus text exposition")
            return f"{r.text.count(chr(10))} lines"

        run("GET /livez", livez)
        run("GET /readyz", readyz)
        run("GET /info", info)
        run(f"POST /{route_path}: one valid item", valid)
        run(f"POST /{route_path}: two items answered in order", batch)
        run(f"POST /{route_path}: a bad item fails alone (400)", bad_item)
        run(f"POST /{route_path}: malformed body (4xx)", malformed)
        run(f"POST /{route_path}: oversized body (413)", oversized)
        run(f"POST /{route_path}: deterministic", deterministic)
        run(f"POST /{route_path}: an item with an unknown field fails alone (400)", unknown_field)
        run(f"POST /{route_path}: no Content-Length (411)", no_length)
        run("readiness: /readyz, /info.ready and the API agree", readiness)
        for path in map(Path, images):
            run(f"POST /{route_path}: photo {path.name}", photo(path))
        if expect:
            run(f"--expect {', '.join(expect)}", expected)
        if stage == "depth":

            def float32() -> str:
                item = _item(stage, png, masks, boxes, encoding=common_pb2.DEPTH_ENCODING_FLOAT32)
                got = results_of(post({"items": [item]}), 1)[0]
                return check(got, hw, encoding=common_pb2.DEPTH_ENCODING_FLOAT32)

            run("POST /depth: float32 on request", float32)
        run(f"POST /{route_path}: binary protobuf body (when /info lists it)", binary)
        if stage == "detector" and adapter.FEATURE_DETECT_CLASSES in limits.get("features", ()):

            def class_filter() -> str:
                from negt2i.core.flow import filter_detections

                seen = []
                for data in [png, *(Path(p).read_bytes() for p in images)]:
                    item = {"image": adapter.to_json(adapter.image_to_proto(data))}
                    full = adapter.detections_from_proto(adapter.from_json(results_of(post({"items": [item]}), 1)[0],
                                                                           stages_pb2.DetectResult))  # fmt: skip
                    classes = list(dict.fromkeys(full.class_names))[:1] or ["cup"]
                    asked = {**item, "classes": classes, "max_per_class": 1}
                    got = adapter.detections_from_proto(adapter.from_json(results_of(post({"items": [asked]}), 1)[0],
                                                                          stages_pb2.DetectResult))  # fmt: skip
                    want, _ = filter_detections(full, classes, 1)
                    same = got.class_names == want.class_names and np.array_equal(got.scores, want.scores)
                    _expect(same and np.array_equal(got.masks, want.masks),
                            f"classes={classes}, max_per_class=1 gave {list(got.class_names)}, expected "
                            f"{list(want.class_names)} (the unfiltered top detection)")  # fmt: skip
                    counts = dict(got.class_counts or {})
                    _expect(counts == dict(want.class_counts or {}),
                            f"class_counts {counts}, expected {dict(want.class_counts or {})}")  # fmt: skip
                    seen.append(f"{classes[0]}: {len(full.indices_of(classes[0]))} -> {len(got)}")
                return "; ".join(seen)

            run("POST /detect: the class filter (features lists detect.classes)", class_filter)
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
