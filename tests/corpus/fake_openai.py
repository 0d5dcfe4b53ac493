"""A small OpenAI chat-completions server for the LLM selector tests (real HTTP on 127.0.0.1).

It answers from the plausibility table, and adds the faults a real model makes:
out-of-list values and pairs in every answer, and scripted malformed answers
(not JSON, wrong shape, HTTP 500) for chosen requests. It records every request.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from negt2i.core.vocab import Category
from negt2i.corpus import plausibility

Reply = tuple[int, str]  # HTTP status, message content (or raw body for status != 200)


def table_answer(user: str) -> str:
    """The table's answer to a selector request, plus out-of-list items a model might add."""
    obj = re.search(r"^Object: (.+)$", user, re.M)
    if obj:
        category = Category.COLOR if "Allowed colors" in user else Category.MATERIAL
        values = list(plausibility.attribute_values(category, obj.group(1)))
        return json.dumps({"values": [*values, "gray", "Magenta"]})
    subject = re.search(r"^Subject: (.+)$", user, re.M)
    assert subject, user
    preds = re.findall(r'"([^"]+)"', re.search(r"^Allowed predicates: (.+)$", user, re.M).group(1))  # type: ignore[union-attr]
    targets = re.findall(r'"([^"]+)"', re.search(r"^Candidate targets: (.+)$", user, re.M).group(1))  # type: ignore[union-attr]
    pairs: list[dict[str, Any]] = [
        {"predicate": p, "target": t}
        for t in targets
        for p in preds
        if plausibility.relation_plausible(p, subject.group(1), t)
    ]
    pairs.append({"predicate": preds[0], "target": "person"})  # not a benchmark class
    pairs.append({"predicate": "on top of", "target": targets[0]})  # not an allowed predicate
    return json.dumps({"pairs": pairs})


@dataclass
class FakeOpenAI:
    """Server state: scripted replies by a key found in the user message, and a request log."""

    script: dict[str, list[Reply]] = field(default_factory=dict)
    """``needle -> replies``: the n-th request whose user message contains ``needle`` gets reply n
    (the last one repeats); other requests get ``table_answer``."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    seen: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def reply(self, body: dict[str, Any]) -> Reply:
        user = body["messages"][-1]["content"]
        with self.lock:
            for needle, replies in self.script.items():
                if needle in user:
                    n = self.seen[needle]
                    self.seen[needle] += 1
                    return replies[min(n, len(replies) - 1)]
        return 200, table_answer(user)


def _handler(state: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            body = json.loads(raw)
            with state.lock:
                state.requests.append(body)
                state.headers.append(dict(self.headers))
                state.paths.append(self.path)
            if self.path != "/v1/chat/completions":
                self._send(404, b'{"error": "not found"}')
                return
            status, content = state.reply(body)
            if status != 200:
                self._send(status, content.encode())
                return
            response = {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                ],
            }
            self._send(200, json.dumps(response).encode())

        def _send(self, status: int, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler


@contextmanager
def serve(script: dict[str, list[Reply]] | None = None) -> Iterator[FakeOpenAI]:
    """Run the fake on an ephemeral port of 127.0.0.1; ``state.url`` is its ``/v1`` root."""
    state = FakeOpenAI(script=dict(script or {}))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
