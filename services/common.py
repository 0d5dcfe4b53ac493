"""What the four stage services share: settings, the handler, service options and an ASGI middleware.

Each ``services/<stage>/service.py`` is a thin ``@bentoml.service`` over a
``negt2i.wire.stage_handlers.StageHandler``: ``__init__`` starts loading (and warming up)
the model (``StageRuntime``), ``__is_ready__`` keeps BentoML's ``/readyz`` at 503 until then,
the one API is batchable with adaptive batching, and BentoML serves
``/livez``, ``/readyz`` and Prometheus ``/metrics``. ``StageHttpMiddleware`` adds
``GET /info`` and the request size limit (HTTP 413) of the stage contract.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from typing import Any, Final

from negt2i.wire import adapter
from negt2i.wire.stage_handlers import StageHandler, StageSettings

log = logging.getLogger("negt2i.services")

HANDLERS: dict[str, StageHandler] = {}
"""The loaded handler of each stage served by this worker process (read by the middleware)."""

MAX_LATENCY_MS: Final = int(os.environ.get("NEGT2I_MAX_LATENCY_MS", "60000"))
"""BentoML's adaptive-batching latency budget; requests predicted to exceed it get HTTP 503."""


def service_options(settings: StageSettings) -> dict[str, Any]:
    """``@bentoml.service`` options: a GPU per service unless ``NEGT2I_GPUS=0``, one worker (one model copy),
    a request timeout and a concurrency cap above what the orchestrator sends."""
    gpus = float(os.environ.get("NEGT2I_GPUS", "1"))
    resources: dict[str, Any] = {"cpu": os.environ.get("NEGT2I_CPUS", "1")}
    if gpus > 0:
        resources["gpu"] = int(gpus) if gpus.is_integer() else gpus
    return {
        "name": settings.stage,
        "resources": resources,
        "workers": 1,
        "traffic": {
            "timeout": int(os.environ.get("NEGT2I_STAGE_TIMEOUT_S", "120")),
            "max_concurrency": int(os.environ.get("NEGT2I_STAGE_MAX_CONCURRENCY", "256")),
        },
    }


def load_handler(settings: StageSettings) -> StageHandler:
    """Build the stage backend, run one warm-up item through it and register it for the middleware."""
    handler = StageHandler(settings)
    handler.warm_up()
    HANDLERS[settings.stage] = handler
    return handler


class StageRuntime:
    """The model of one service, loaded (and warmed up) on a thread started by the service's ``__init__``.

    The HTTP server answers from the start: ``/livez`` 200, ``/readyz`` and ``/info`` 503 until the model
    is loaded, the stage API 503 ("loading") too. A load that fails turns ``/livez`` to 503, so that the
    platform restarts the service.
    """

    def __init__(self, settings: StageSettings) -> None:
        self.settings = settings
        self.handler: StageHandler | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._load, name=f"load-{settings.stage}", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        try:
            self.handler = load_handler(self.settings)
            log.info("%s: %s loaded", self.settings.stage, self.handler.model_info.model)
        except BaseException as exc:
            self.error = exc
            log.exception("%s: loading backend %r failed", self.settings.stage, self.settings.backend)

    def ready(self) -> bool:
        """Loaded and warmed up."""
        return self.handler is not None and self.handler.ready

    def alive(self) -> bool:
        """False once loading failed."""
        return self.error is None

    def handle(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The stage API; HTTP 503 while the model is loading (or failed to load)."""
        if self.handler is None or not self.handler.ready:
            from bentoml.exceptions import ServiceUnavailable

            state = f"failed to load: {self.error}" if self.error else "is loading"
            raise ServiceUnavailable(f"the {self.settings.stage} model {state}")
        return self.handler.handle(items)


class StageHttpMiddleware:
    """ASGI middleware: ``GET /info`` (503 until the model is loaded), the request body limit (413/411) and
    the body read timeout (408): a POST body is read in full within ``body_timeout_s`` before the app sees
    the request, so a slow or stalled client is dropped instead of holding a worker."""

    def __init__(self, app: Any, *, stage: str, max_request_bytes: int, body_timeout_s: float = 30.0) -> None:
        self.app = app
        self.stage = stage
        self.max_request_bytes = max_request_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope.get("method", "GET"), scope.get("path", "/")
        if path == "/info" and method == "GET":
            handler = HANDLERS.get(self.stage)
            if handler is None:
                await _send_json(send, 503, {"error": f"the {self.stage} model is not loaded yet"})
            else:
                await _send_json(send, 200, adapter.to_json(handler.info()))
            return
        if method == "POST":
            headers = dict(scope.get("headers") or [])
            length = headers.get(b"content-length")
            if length is None:
                await _send_json(send, 411, {"error": "a Content-Length header is required"})
                return
            try:
                declared = int(length)
            except ValueError:
                await _send_json(send, 400, {"error": "Content-Length must be an integer"})
                return
            if declared > self.max_request_bytes:
                await _send_json(
                    send,
                    413,
                    {"error": f"request body of {declared} bytes exceeds the limit of {self.max_request_bytes}"},
                )
                return
            # the whole body within body_timeout_s, before the app (and its worker) sees the request
            try:
                body = await asyncio.wait_for(_read_body(receive, declared), self.body_timeout_s)
            except TimeoutError:
                await _send_json(
                    send, 408, {"error": f"the request body did not arrive within {self.body_timeout_s:g} s"}
                )
                return
            except _Disconnected:
                return
            await self.app(scope, _replay(body, receive), send)
            return
        await self.app(scope, receive, send)


class _Disconnected(Exception):
    """The client went away before its body was complete."""


async def _read_body(receive: Any, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:  # more than Content-Length said: refuse to buffer it
            raise _Disconnected
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    """The body already read, then the connection's own messages (a disconnect, when the client leaves)."""
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send_json(send: Any, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
