"""A detector service written against ``negt2i.v1`` as the contract stood before it was made strict.

Written from ``docs/stage-contract.md`` of that time (git ``1066bcb^``), as an outside engineer would, with
the synthetic detector as its "model":

- ``GET /info``: ``contract``, ``model`` (stage, backend, model, revision, library, device, dtype: **no**
  ``rules``, **no** ``operating_point``), ``limits`` (the three fields of then), ``ready``; **no**
  ``features``, **no** ``content_types``;
- ``POST /detect``: JSON only (415 to any other body type); its strict parser fails an item carrying any
  field but ``image`` (status 400, as proto3 JSON parsers do with unknown fields), so it knows no class
  filter; results carry ``height``, ``width`` and ``detections`` only (**no** ``model_digest``, **no**
  ``class_counts``);
- images are decoded as stored: Pillow's ``Image.open(...).convert("RGB")``, **no** EXIF orientation.

Every item's field names and the image size it decoded are appended to ``--log`` (one JSON object per
line), so tests see what was sent.

``python -m tests.services.prestrict_detector PORT --log FILE``
"""

from __future__ import annotations

import argparse
import base64
import io
import json
from http.server import ThreadingHTTPServer
from typing import Any

import numpy as np
from PIL import Image as PILImage

from negt2i.core import rle
from negt2i.stages.synthetic import SyntheticDetector
from tests.services.stub_http import StubHandler

MAX_REQUEST_BYTES = 8 << 20
MODEL: dict[str, str] = {
    "stage": "detector",
    "backend": "prestrict-palette",
    "model": "palette-components-2026-11",
    "revision": "v1",
    "library": "pillow+numpy",
    "device": "cpu",
    "dtype": "float32",
}


def detect(data: bytes, detector: SyntheticDetector) -> dict[str, Any]:
    """One ``DetectResult`` (proto3 JSON) of encoded image bytes, decoded as stored (no EXIF orientation)."""
    image = np.asarray(PILImage.open(io.BytesIO(data)).convert("RGB"), dtype=np.uint8)
    det = detector.detect([image])[0]
    h, w = det.shape_hw
    rows = []
    for name, score, box, mask in zip(det.class_names, det.scores, det.xyxy, det.masks, strict=True):
        x0, y0, x1, y1 = (float(v) for v in box)
        counts = rle.encode(mask)["counts"]
        rows.append({"class_name": name, "score": float(score), "box": {"x0": x0, "y0": y0, "x1": x1, "y1": y1},
                     "mask": {"height": h, "width": w, "counts": counts}})  # fmt: skip
    return {"height": h, "width": w, "detections": rows}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("--log", required=True)
    a = p.parse_args()
    detector = SyntheticDetector()

    class Handler(StubHandler):
        def do_GET(self) -> None:
            if self.path in ("/livez", "/readyz"):
                self._send(200, "\n", "text/plain")
            elif self.path == "/metrics":
                self._send(200, "# TYPE detect_requests_total counter\ndetect_requests_total 0\n", "text/plain")
            elif self.path == "/info":
                limits = {"max_request_bytes": MAX_REQUEST_BYTES, "max_batch_size": 16, "max_pixels": 4096 * 4096}
                self._send(200, {"contract": "negt2i.v1", "model": MODEL, "limits": limits, "ready": True})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = self.headers.get("content-length")
            if length is None:
                self.close_connection = True
                self._send(411, {"error": "Content-Length required"})
                return
            if int(length) > MAX_REQUEST_BYTES:
                self.close_connection = True
                self._send(413, {"error": f"the body is over {MAX_REQUEST_BYTES} bytes"})
                return
            body = self.rfile.read(int(length))
            if self.path != "/detect":
                self._send(404, {"error": "not found"})
                return
            if self.headers.get("content-type", "").split(";")[0].strip() != "application/json":
                self._send(415, {"error": "application/json only"})
                return
            try:
                items = json.loads(body)["items"]
                if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                self._send(400, {"error": 'the body must be {"items": [...]}'})
                return
            out: list[dict[str, Any]] = []
            for item in items:
                unknown = sorted(set(item) - {"image"})
                seen: dict[str, Any] = {"fields": sorted(item)}
                if unknown:
                    out.append({"error": {"status": 400, "message": f"unknown field {unknown[0]!r}",
                                          "field": unknown[0]}})  # fmt: skip
                else:
                    try:
                        result = detect(base64.b64decode(item["image"]["data"]), detector)
                    except Exception as exc:  # not an image this service can read: the item fails alone
                        out.append({"error": {"status": 400, "message": f"cannot read the image ({exc})",
                                              "field": "image"}})  # fmt: skip
                        continue
                    seen["hw"] = [result["height"], result["width"]]
                    out.append(result)
                with open(a.log, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(seen) + "\n")
            self._send(200, out)

    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
