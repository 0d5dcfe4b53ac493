"""A detector service written from the contract alone (stdlib HTTP), correct unless told to break one rule.

It "finds" one ``dog`` per image: the central half of the image, score 0.9, its box and its mask. With
``--fault NAME`` it breaks exactly one rule of ``docs/stage-contract.md`` (``FAULTS``), so the tests can
prove that ``negt2i conformance`` catches each violation and passes the correct service.

It speaks only the JSON body type (as the contract requires of every stage). With ``--lists-binary`` its
``/info`` also lists ``application/x-protobuf`` in ``content_types`` although a binary body gets 415 (a
mis-stated type: the orchestrator must fall back to JSON).

``python -m tests.services.faulty_detector PORT [--fault NAME] [--lists-binary]``
"""

from __future__ import annotations

import argparse
import base64
import io
import json
from http.server import ThreadingHTTPServer
from typing import Any, Final

import numpy as np

from tests.services.stub_http import StubHandler

FAULTS: Final[dict[str, str]] = {
    "mask-size": "masks one row short of the image",
    "unicorn": "a class name outside the benchmark vocabulary",
    "capitalised": "'Person' instead of 'person'",
    "below-floor": "score 0.001, below its own floor 0.005",
    "normalised-boxes": "boxes in 0-1 instead of pixels",
    "box-off-image": "a box reaching past the image's right edge",
    "no-411": "accepts a body without Content-Length",
    "no-413": "accepts a body over max_request_bytes",
    "unknown-fields": "accepts items with unknown fields",
    "ready-early": "/readyz 200 while the model is still loading",
    "info-contract": "/info names contract 'v1'",
    "info-stage": "/info names stage 'segmenter'",
    "no-operating-point": "/info states no operating point",
    "wrong-digest": "results carry a model digest other than /info's model",
}
"""Each fault breaks one rule (name -> what the service then does)."""

MAX_BYTES: Final = 4 << 20


def _info(fault: str) -> dict[str, Any]:
    from negt2i.stages.base import ModelInfo, OperatingPoint

    model = ModelInfo(stage="detector", backend="fake-yolo", model="fake-yolo-seg", library="stdlib",
                      operating_point=OperatingPoint(prediction_floor=0.005, suppression="none", input_size=640),
                      rules={"detection.prediction_floor": 0.005})  # fmt: skip
    out: dict[str, Any] = {
        "contract": "v1" if fault == "info-contract" else "negt2i.v1",
        "model": model.model_dump(mode="json"),
        "limits": {"max_request_bytes": MAX_BYTES, "max_batch_size": 4, "max_pixels": 4096 * 4096},
        "ready": fault != "ready-early",
    }
    if fault == "info-stage":
        out["model"]["stage"] = "segmenter"
    if fault == "no-operating-point":
        del out["model"]["operating_point"]
    out["digest"] = model.digest()
    return out


def _detect(item: dict[str, Any], fault: str, digest: str) -> dict[str, Any]:
    from PIL import Image

    from negt2i.core import rle

    allowed = {"image"}
    if set(item) - allowed and fault != "unknown-fields":
        field = sorted(set(item) - allowed)[0]
        return {"error": {"status": 400, "message": f"unknown field {field!r}", "field": field}}
    try:
        data = base64.b64decode(item["image"]["data"])
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
    except Exception as exc:
        return {"error": {"status": 400, "message": f"undecodable image ({exc})", "field": "image"}}
    x0, y0, x1, y1 = w // 4, h // 4, max(3 * w // 4, w // 4 + 1), max(3 * h // 4, h // 4 + 1)
    mask = np.zeros((h - 1 if fault == "mask-size" else h, w), dtype=bool)
    mask[y0:y1, x0:x1] = True
    box = [float(x0), float(y0), float(x1), float(y1)]
    if fault == "normalised-boxes":
        box = [x0 / w, y0 / h, x1 / w, y1 / h]
    if fault == "box-off-image":
        box[2] = float(w + 20)
    name = {"unicorn": "unicorn", "capitalised": "Person"}.get(fault, "dog")
    r = rle.encode(mask)
    det = {
        "class_name": name,
        "score": 0.001 if fault == "below-floor" else 0.9,
        "box": dict(zip(("x0", "y0", "x1", "y1"), box, strict=True)),
        "mask": {"height": r["size"][0], "width": r["size"][1], "counts": r["counts"]},
    }
    digest = "0" * 16 if fault == "wrong-digest" else digest
    return {"height": h, "width": w, "detections": [det], "model_digest": digest}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("--fault", choices=sorted(FAULTS), default="")
    p.add_argument("--lists-binary", action="store_true", help="/info lists application/x-protobuf (answered 415)")
    a = p.parse_args()
    info = _info(a.fault)
    digest = info.pop("digest")
    if a.lists_binary:
        info["content_types"] = ["application/x-protobuf"]

    class Handler(StubHandler):
        def do_GET(self) -> None:
            if self.path in ("/livez", "/readyz"):
                self._send(200, "\n", "text/plain")
            elif self.path == "/info":
                self._send(200, info)
            elif self.path == "/metrics":
                self._send(200, "# HELP fake_requests 1\n# TYPE fake_requests counter\nfake_requests 1\n", "text/plain")
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            if self.path != "/detect":
                self._send(404, {"error": "not found"})
                return
            ctype = (self.headers.get("content-type") or "application/json").split(";")[0].strip()
            if ctype != "application/json":
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self._send(415, {"error": f"content type {ctype!r} is not accepted: JSON only"})
                return
            length = self.headers.get("content-length")
            if length is None:
                if a.fault == "no-411":
                    raw = self._read_chunked()
                else:
                    self._send(411, {"error": "a Content-Length header is required"})
                    return
            elif int(length) > MAX_BYTES and a.fault != "no-413":
                self._send(413, {"error": "too large"})
                return
            else:
                raw = self.rfile.read(int(length))
            if a.fault == "ready-early":
                self._send(503, {"error": "the model is loading"})
                return
            try:
                items = json.loads(raw)["items"]
                if not isinstance(items, list):
                    raise TypeError("items must be a list")
            except Exception as exc:
                self._send(400, {"error": f"malformed body ({exc})"})
                return
            self._send(200, [_detect(item, a.fault, digest) for item in items])

        def _read_chunked(self) -> bytes:
            out = b""
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()

    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
