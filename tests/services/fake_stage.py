"""A stand-in detector service (stdlib HTTP server) for the tests: ``broken`` or ``slow``.

- ``broken`` breaks the contract: ``/info`` names another contract, ``/detect`` answers a JSON
  object instead of an array, a bad item fails the whole request with HTTP 500, no ``/metrics``.
- ``slow`` honours the contract (no detections) but answers ``/detect`` after ``--delay`` seconds.

``python -m tests.services.fake_stage {broken,slow} PORT [--delay S]``
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import time
from http.server import ThreadingHTTPServer

from tests.services.stub_http import StubHandler


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("broken", "slow"))
    p.add_argument("port", type=int)
    p.add_argument("--delay", type=float, default=2.0)
    p.add_argument("--signal", default="", help="a file created when the first POST arrives (tests wait on it)")
    a = p.parse_args()

    class Handler(StubHandler):
        def do_GET(self) -> None:
            if self.path in ("/livez", "/readyz"):
                self._send(200, "\n", "text/plain")
            elif self.path == "/info":
                contract = "v0" if a.mode == "broken" else "negt2i.v1"
                model = {
                    "stage": "detector",
                    "backend": f"fake-{a.mode}",
                    "model": f"fake-{a.mode}",
                    "rules": {"detection.prediction_floor": 0.005},
                }
                self._send(200, {"contract": contract, "model": model, "limits": {"max_request_bytes": 1 << 20},
                                 "ready": True})  # fmt: skip
            elif self.path == "/metrics" and a.mode == "slow":
                self._send(200, "# HELP fake 1\n# TYPE fake counter\nfake 1\n", "text/plain")
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            if length > 1 << 20:
                self._send(413, {"error": "too large"})
                return
            raw = self.rfile.read(length)
            try:
                items = json.loads(raw)["items"]
                sizes = []
                from PIL import Image

                for item in items:
                    data = base64.b64decode(item["image"]["data"])
                    with Image.open(io.BytesIO(data)) as im:
                        sizes.append((im.height, im.width))
            except Exception as exc:
                self._send(500 if a.mode == "broken" else 400, {"error": str(exc)})
                return
            if a.mode == "broken":
                self._send(200, {"detections": []})
                return
            if a.signal:
                with open(a.signal, "a"):
                    pass
            time.sleep(a.delay)
            self._send(200, [{"height": h, "width": w} for h, w in sizes])

    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
