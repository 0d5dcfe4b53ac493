"""The HTTP plumbing shared by the test-only stage stand-ins (``fake_stage``, ``faulty_detector``,
``outside_detector``): a quiet request handler that answers JSON or plain text with a content length."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


class StubHandler(BaseHTTPRequestHandler):
    """``BaseHTTPRequestHandler`` without request logging, with ``_send(status, payload, ctype)``."""

    def log_message(self, *_: object) -> None:
        pass

    def _send(self, status: int, payload: object, ctype: str = "application/json") -> None:
        """``payload`` as JSON (``ctype`` JSON) or as its ``str`` (any other ``ctype``)."""
        body = json.dumps(payload).encode() if ctype == "application/json" else str(payload).encode()
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
