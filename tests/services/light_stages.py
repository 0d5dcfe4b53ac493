"""The four stage services in one light process (the standard library's HTTP server), for the benchmarks'
smoke modes: the same ``StageHandler`` each BentoML service runs (``negt2i.wire.stage_handlers``: the contract,
both body types, the backend from ``NEGT2I_<STAGE>_BACKEND`` and ``NEGT2I_BACKEND_MODULES``), without BentoML's
server, its micro-batcher, metrics or request limits. It starts in about a second where four ``bentoml serve``
processes take 20-30 s on two cores; the services themselves are tested with BentoML (``tests/services``).

``python -m tests.services.light_stages`` prints the four ports (detector, segmenter, attributes, depth) once
every backend is loaded; ``start_light_stages`` starts it and reads them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from http.server import ThreadingHTTPServer
from pathlib import Path

from tests.services.live import REPO, Proc, base_env
from tests.services.stub_http import StubHandler

STAGES = ("detector", "segmenter", "attributes", "depth")


READY = "light stages listening on"
"""The log line that names the four ports, once every backend is loaded."""


def handler_class(stage: str) -> type[StubHandler]:
    """The request handler of ``stage``: the contract through a ``StageHandler`` (the backend loaded and warmed up
    here, before the server answers)."""
    from negt2i.wire import adapter
    from negt2i.wire.stage_handlers import StageHandler, StageSettings

    handler = StageHandler(StageSettings.from_env(stage))
    handler.warm_up()
    route = f"/{handler.route}"
    lock = threading.Lock()  # one model call at a time, as a service's model thread

    class Handler(StubHandler):
        def do_GET(self) -> None:
            if self.path in ("/livez", "/readyz"):
                self._send(200, "\n", "text/plain")
            elif self.path == "/info":
                info = handler.info()
                info.content_types.append(adapter.PROTOBUF_TYPE)
                self._send(200, adapter.to_json(info))
            else:
                self._send(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            if self.path != route:
                self._send(404, {"error": f"no route {self.path}"})
                return
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            try:
                if self.headers.get("content-type", "").split(";")[0].strip() == adapter.PROTOBUF_TYPE:
                    request = adapter.from_binary(body, handler.spec.request)
                    with lock:
                        results = handler.handle_messages(list(request.items))  # type: ignore[attr-defined]
                    payload = handler.spec.response(results=results).SerializeToString()
                    self._send_bytes(payload, adapter.PROTOBUF_TYPE)
                    return
                items = json.loads(body)["items"]
                with lock:
                    answers = handler.handle(items)
            except Exception as exc:
                self._send(400, {"error": str(exc)})
                return
            self._send(200, answers)

        def _send_bytes(self, payload: bytes, ctype: str) -> None:
            self.send_response(200)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler


def start_light_stages(tmp: Path, env: Mapping[str, str] | None = None, timeout: float = 120.0) -> dict[str, Proc]:
    """The four stages in one process (synthetic backends unless ``env`` names others), ready; one ``Proc`` per
    stage, all four the same process (killing one kills them all). The process binds ports the kernel picks
    and names them in its log, so no other process can take one between a check and the bind."""
    log = tmp / f"light-stages-{time.monotonic_ns()}.log"
    e = base_env(tmp, {f"NEGT2I_{s.upper()}_BACKEND": "synthetic" for s in STAGES})
    e.update(env or {})
    with log.open("ab") as fh:
        popen = subprocess.Popen([sys.executable, "-m", "tests.services.light_stages"], cwd=REPO, env=e, stdout=fh,
                                 stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    end = time.monotonic() + timeout
    while True:
        text = log.read_text(errors="replace")
        found = re.search(rf"^{READY} (\d+) (\d+) (\d+) (\d+)$", text, re.M)
        if found:
            ports = [int(p) for p in found.groups()]
            return {s: Proc(s, popen, port, log) for s, port in zip(STAGES, ports, strict=True)}
        if popen.poll() is not None or time.monotonic() > end:
            Proc("light stages", popen, 0, log).kill()
            raise RuntimeError(f"light stages did not start (exit {popen.returncode}):\n{text[-3000:]}")
        time.sleep(0.05)


def main() -> None:
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), handler_class(stage)) for stage in STAGES]
    for server in servers[1:]:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print(READY, *(s.server_address[1] for s in servers), flush=True)
    servers[0].serve_forever()


if __name__ == "__main__":
    main()
