"""An outside detector service (stdlib HTTP, the synthetic detector behind it) that does not filter by class.

- ``old``: a service of the contract before ``DetectItem.classes``: its ``/info`` lists no features and
  its strict parser fails an item carrying any field but ``image`` (status 400, as the proto3 JSON
  mapping's parsers do with unknown fields);
- ``ignoring``: lists the ``detect.classes`` feature but ignores the fields, returning every class.

Every item's field names are appended to ``--log`` (one JSON list per line), so tests see what was sent.

``python -m tests.services.outside_detector {old,ignoring} PORT --log FILE``
"""

from __future__ import annotations

import argparse
import base64
import json
from http.server import ThreadingHTTPServer
from typing import Any

from negt2i.stages.synthetic import SyntheticDetector
from negt2i.wire import adapter
from tests.services.stub_http import StubHandler


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("old", "ignoring"))
    p.add_argument("port", type=int)
    p.add_argument("--log", required=True)
    a = p.parse_args()
    detector = SyntheticDetector()
    info = adapter.model_info_to_proto(detector.info)  # the same model: verdict lines record the same model info
    features = [adapter.FEATURE_DETECT_CLASSES] if a.mode == "ignoring" else []

    class Handler(StubHandler):
        def do_GET(self) -> None:
            if self.path in ("/livez", "/readyz"):
                self._send(200, "\n", "text/plain")
            elif self.path == "/info":
                body = {"contract": adapter.CONTRACT, "model": adapter.to_json(info), "ready": True}
                self._send(200, {**body, **({"features": features} if features else {})})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            items = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))["items"]
            with open(a.log, "a", encoding="utf-8") as fh:
                for item in items:
                    fh.write(json.dumps(sorted(item)) + "\n")
            out: list[dict[str, Any]] = []
            digest = detector.info.digest()
            for item in items:
                unknown = sorted(set(item) - {"image"})
                if a.mode == "old" and unknown:
                    out.append({"error": {"status": 400, "message": f"unknown field {unknown[0]!r}",
                                          "field": unknown[0]}})  # fmt: skip
                    continue
                image = adapter.decode_image(base64.b64decode(item["image"]["data"]))
                det = detector.detect([image])[0]  # every class, no cap
                out.append({**adapter.to_json(adapter.detections_to_proto(det)), "model_digest": digest})
            self._send(200, out)

    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
