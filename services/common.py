"""What the four stage services share: settings, the handler, the micro-batcher, service options and an
ASGI middleware.

Each ``services/<stage>/service.py`` is a thin ``@bentoml.service`` over a
``negt2i.wire.stage_handlers.StageHandler``: ``__init__`` starts loading (and warming up)
the model (``StageRuntime``), ``__is_ready__`` keeps BentoML's ``/readyz`` at 503 until then,
and BentoML serves ``/livez``, ``/readyz`` and Prometheus ``/metrics``. The one API (JSON bodies)
and the binary body type (``application/x-protobuf``, answered by ``StageHttpMiddleware``) both hand
their items to the runtime's ``MicroBatcher``, which merges the items of concurrent requests into one
model call (at most ``max_batch_size`` items; an idle model waits at most ``max_wait_ms`` for more) and
admits at most ``max_queue`` items at once: a request beyond that is refused with HTTP 503 at once,
before anything of it is decoded, so an overload never piles up in memory. ``StageHttpMiddleware`` also
adds ``GET /info`` and the request size limit (HTTP 413) of the stage contract.

Health means "can answer": an item whose request was cancelled (BentoML's request timeout,
``NEGT2I_STAGE_TIMEOUT_S``, or a client gone) is dropped before it runs; a model thread that dies, or a model
call that runs longer than ``NEGT2I_MODEL_HUNG_S`` (default 900 s), turns ``/livez`` and ``/readyz`` to 503
(the kubelet restarts the pod) and every waiting request gets 503 instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.message import Message

from negt2i.wire import adapter
from negt2i.wire.stage_handlers import StageHandler, StageSettings
from services import http_guard

log = logging.getLogger("negt2i.services")

http_guard.install()  # header read timeout, connections per peer, /info past BentoML's request cap

RUNTIMES: dict[str, StageRuntime] = {}
"""The one registry: the ``StageRuntime`` of each stage served by this worker process, and through it the
loaded handler (``runtime.handler``; None while loading), which ``StageHttpMiddleware`` reads for ``/info``
and the binary route.

Why a module global and not an attribute of the middleware: BentoML builds the middleware itself, from
``add_asgi_middleware(StageHttpMiddleware, **kwargs)`` at import time, and creates the service instance
(whose ``__init__`` starts the runtime) later, in the worker; neither is ever handed to the other, so the
middleware can find the runtime only by its stage name. One worker per service (``service_options``), so
one runtime per stage per process."""


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


def model_hung_s() -> float | None:
    """``NEGT2I_MODEL_HUNG_S`` (default 900): seconds one model call may run before liveness fails; 0: never."""
    raw = os.environ.get("NEGT2I_MODEL_HUNG_S", "900")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"NEGT2I_MODEL_HUNG_S must be a number of seconds (0: no limit), got {raw!r}") from None
    if value < 0:
        raise ValueError(f"NEGT2I_MODEL_HUNG_S must be at least 0 (0: no limit), got {raw!r}")
    return value or None


def load_handler(settings: StageSettings) -> StageHandler:
    """Build the stage backend and run one warm-up item through it."""
    handler = StageHandler(settings)
    handler.warm_up()
    return handler


class Overloaded(Exception):
    """The micro-batcher holds ``max_queue`` items already: the request is refused (HTTP 503)."""


class TooManyItems(Exception):
    """A request of more items than ``max_queue``: it could never be admitted (HTTP 413, not worth a retry)."""


class ModelThreadDied(RuntimeError):
    """The micro-batcher's model thread has ended: nothing will be answered again (HTTP 503; ``/livez`` 503)."""


def _settle(fut: concurrent.futures.Future[Any], out: Any) -> None:
    """Resolve a future taken by the model thread; one cancelled meanwhile (which a future already set running
    cannot be) is left alone instead of raising ``InvalidStateError`` in the model thread."""
    try:
        if isinstance(out, ModelThreadDied):
            fut.set_exception(out)
        else:
            fut.set_result(out)
    except concurrent.futures.InvalidStateError:
        pass


class MicroBatcher:
    """Merges the items of concurrent requests into one model call, on one thread that owns the model.

    ``run(inputs)`` is called with at most ``max_batch_size`` inputs, from any number of requests, and
    returns one output per input (``StageHandler.run``: an exception object for an input that failed).
    When the model is idle the first waiting item waits at most ``max_wait_ms`` for others to join it;
    while the model runs, items queue and the next call takes them at once. ``admit(n)`` reserves room
    for a request's ``n`` items before anything of the request is decoded; with ``max_queue`` items
    admitted, it raises ``Overloaded`` (the request is refused, nothing waits on it).

    An item whose future was cancelled while it waited (the request timed out or went away) is dropped when
    the model thread takes it (``Future.set_running_or_notify_cancel``): it never runs, and a taken item can
    no longer be cancelled. An exception from ``run`` is every waiter's answer and the thread lives on; a
    ``BaseException`` that is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``) or a bug in the
    loop itself ends the thread: ``alive()`` turns False, every waiter and every later ``submit`` gets
    ``ModelThreadDied``. ``alive()`` is False too while one model call has run longer than ``hung_after_s``.
    """

    def __init__(
        self,
        run: Callable[[list[Any]], list[Any]],
        *,
        max_batch_size: int,
        max_wait_ms: float,
        max_queue: int,
        name: str = "batcher",
        on_batch: Callable[[int], None] | None = None,
        hung_after_s: float | None = None,
    ) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError("max_batch_size and max_queue must be at least 1, max_wait_ms at least 0")
        if hung_after_s is not None and hung_after_s <= 0:
            raise ValueError("hung_after_s must be above 0 (or None: never)")
        self.run = run
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.on_batch = on_batch
        self.calls = 0
        """Model calls so far."""
        self.items = 0
        """Items through the model so far."""
        self.refused = 0
        """Requests refused as overload so far."""
        self.dropped = 0
        """Items dropped before running because their request had been cancelled."""
        self.error: BaseException | None = None
        """Why the model thread ended (None while it runs)."""
        self.hung_after_s = hung_after_s
        self._busy_since: float | None = None
        self._admitted = 0
        self._pending: collections.deque[tuple[float, Any, concurrent.futures.Future[Any]]] = collections.deque()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def admit(self, n: int) -> None:
        """Reserve room for ``n`` items (release it with ``release``); ``Overloaded`` when there is none."""
        if n > self.max_queue:
            raise TooManyItems(
                f"a request of {n} items can never be admitted: the stage holds at most {self.max_queue} items at "
                f"once (NEGT2I_MAX_QUEUE); send at most {self.max_queue} items per request"
            )
        with self._cond:
            if self._admitted + n > self.max_queue:
                self.refused += 1
                raise Overloaded(
                    f"overloaded: {self._admitted} items in progress, {n} more would pass the limit of "
                    f"{self.max_queue}; retry with backoff"
                )
            self._admitted += n

    def release(self, n: int) -> None:
        """Give back the room of ``n`` admitted items."""
        with self._cond:
            self._admitted -= n

    def submit(self, inputs: Sequence[Any]) -> list[concurrent.futures.Future[Any]]:
        """Queue admitted inputs; one future per input, resolved with its output."""
        futures: list[concurrent.futures.Future[Any]] = [concurrent.futures.Future() for _ in inputs]
        now = time.monotonic()
        with self._cond:
            if self.error is not None:
                raise ModelThreadDied(self.why_dead())
            self._pending.extend((now, x, f) for x, f in zip(inputs, futures, strict=True))
            self._cond.notify()
        return futures

    async def process(self, inputs: Sequence[Any]) -> list[Any]:
        """``submit`` and wait for the outputs without blocking the event loop."""
        if not inputs:
            return []
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in self.submit(inputs))))

    def alive(self) -> bool:
        """The model thread runs, and its current call (if any) has not run longer than ``hung_after_s``."""
        if self.error is not None or not self._thread.is_alive():
            return False
        since = self._busy_since
        return self.hung_after_s is None or since is None or time.monotonic() - since <= self.hung_after_s

    def why_dead(self) -> str:
        """Why ``alive()`` is False (empty while it is True)."""
        if self.error is not None or not self._thread.is_alive():
            return f"the model thread has died ({self.error!r}); the service must be restarted"
        since = self._busy_since
        if self.hung_after_s is not None and since is not None and time.monotonic() - since > self.hung_after_s:
            return (f"one model call has run for {time.monotonic() - since:.0f} s, above the limit of "
                    f"{self.hung_after_s:g} s (NEGT2I_MODEL_HUNG_S); the service must be restarted")  # fmt: skip
        return ""

    def _take(self) -> list[tuple[float, Any, concurrent.futures.Future[Any]]]:
        """The next batch: at most ``max_batch_size`` items whose futures could be set running; cancelled ones
        are dropped here, so that they never run and nothing is set on them later."""
        with self._cond:
            while True:
                while not self._pending:
                    self._cond.wait()
                deadline = self._pending[0][0] + self.max_wait_s
                while len(self._pending) < self.max_batch_size:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch: list[tuple[float, Any, concurrent.futures.Future[Any]]] = []
                while self._pending and len(batch) < self.max_batch_size:
                    item = self._pending.popleft()
                    if item[2].set_running_or_notify_cancel():
                        batch.append(item)
                    else:
                        self.dropped += 1
                if batch:
                    return batch

    def _loop(self) -> None:
        try:
            while True:
                batch = self._take()
                self._busy_since = time.monotonic()
                try:
                    outs = self.run([x for _, x, _ in batch])
                    if len(outs) != len(batch):
                        raise RuntimeError(f"{len(outs)} outputs for {len(batch)} inputs")
                except Exception as exc:  # run() answers per item; this is a bug, reported to every waiter
                    log.exception("model batch failed")
                    outs = [exc] * len(batch)
                except BaseException as exc:  # SystemExit and the like: this thread ends, its waiters are told
                    died = ModelThreadDied(f"the model thread has died ({exc!r}); the service must be restarted")
                    for _, _, fut in batch:
                        _settle(fut, died)
                    raise
                finally:
                    self._busy_since = None
                self.calls += 1
                self.items += len(batch)
                if self.on_batch is not None:
                    try:
                        self.on_batch(len(batch))
                    except Exception:
                        log.exception("batch metrics failed")
                for (_, _, fut), out in zip(batch, outs, strict=True):
                    _settle(fut, out)
        except BaseException as exc:
            self._die(exc)

    def _die(self, exc: BaseException) -> None:
        """The model thread ends: ``alive()`` turns False and every waiting item gets ``ModelThreadDied``."""
        log.critical("model thread %s died: %r; /livez answers 503 from now on", self._thread.name, exc,
                     exc_info=exc)  # fmt: skip
        with self._cond:
            self.error = exc
            waiting = [fut for _, _, fut in self._pending]
            self._pending.clear()
        died = ModelThreadDied(self.why_dead())
        for fut in waiting:
            if fut.set_running_or_notify_cancel():
                _settle(fut, died)


class _Metrics:
    """Prometheus metrics of the micro-batcher, on BentoML's ``/metrics``."""

    def __init__(self, stage: str) -> None:
        from prometheus_client import Counter

        self.stage = stage
        self.calls = Counter("negt2i_stage_model_calls", "Model calls of the stage (merged batches)", ["stage"])
        self.items = Counter("negt2i_stage_model_items", "Items through the stage's model", ["stage"])
        self.refused = Counter("negt2i_stage_refused_requests", "Requests refused as overload (503)", ["stage"])

    def batch(self, n: int) -> None:
        self.calls.labels(self.stage).inc()
        self.items.labels(self.stage).inc(n)

    def refuse(self) -> None:
        self.refused.labels(self.stage).inc()


class StageRuntime:
    """The model of one service, loaded (and warmed up) on a thread started by the service's ``__init__``,
    and its ``MicroBatcher``.

    The HTTP server answers from the start: ``/livez`` 200, ``/readyz`` and ``/info`` 503 until the model
    is loaded, the stage API 503 ("loading") too. A load that fails, a model thread that dies and a model
    call that hangs (longer than ``NEGT2I_MODEL_HUNG_S``, default 900 s) turn ``/livez`` and ``/readyz`` to
    503 and the stage API to 503, so that the platform restarts the service.
    """

    def __init__(self, settings: StageSettings) -> None:
        self.settings = settings
        self.handler: StageHandler | None = None
        self.batcher: MicroBatcher | None = None
        self.error: BaseException | None = None
        self._metrics: _Metrics | None = None
        try:
            self._metrics = _Metrics(settings.stage)
        except Exception:  # metrics are optional (e.g. registered twice in one process)
            log.warning("%s: batch metrics unavailable", settings.stage, exc_info=True)
        RUNTIMES[settings.stage] = self
        self._thread = threading.Thread(target=self._load, name=f"load-{settings.stage}", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        try:
            handler = load_handler(self.settings)
            self.batcher = MicroBatcher(
                handler.run,
                max_batch_size=self.settings.max_batch_size,
                max_wait_ms=self.settings.max_wait_ms,
                max_queue=self.settings.max_queue,
                name=f"model-{self.settings.stage}",
                on_batch=self._metrics.batch if self._metrics else None,
                hung_after_s=model_hung_s(),
            )
            self.handler = handler
            log.info("%s: %s loaded", self.settings.stage, handler.model_info.model)
        except BaseException as exc:
            self.error = exc
            log.exception("%s: loading backend %r failed", self.settings.stage, self.settings.backend)

    def ready(self) -> bool:
        """Loaded and warmed up, and the model thread can answer."""
        return self.handler is not None and self.handler.ready and self.batcher is not None and self.batcher.alive()

    def alive(self) -> bool:
        """False once loading failed, the model thread died or a model call hangs."""
        return self.error is None and (self.batcher is None or self.batcher.alive())

    def unavailable(self) -> str:
        """Why the stage cannot answer now (empty when it can)."""
        if self.handler is None or self.batcher is None or not self.handler.ready:
            return f"the {self.settings.stage} model " + (
                f"failed to load: {self.error}" if self.error else "is loading"
            )
        return self.batcher.why_dead()

    async def serve(self, items: Sequence[Any]) -> list[Message]:
        """One result message per item (JSON mapping or item message): admitted (or ``Overloaded``), decoded
        on a worker thread, run through the model merged with other requests' items, packed on a worker
        thread. Raises ``RuntimeError`` while the model is not loaded."""
        why = self.unavailable()
        if why:
            raise RuntimeError(why)
        handler, batcher = self.handler, self.batcher
        assert handler is not None and batcher is not None
        n = len(items)
        try:
            batcher.admit(n)
        except Overloaded:
            if self._metrics is not None:
                self._metrics.refuse()
            raise
        try:
            prepared = await asyncio.to_thread(handler.prepare, items)
            outputs = await batcher.process([p.input for p in prepared if p.failure is None])
            return await asyncio.to_thread(handler.pack, prepared, outputs)
        finally:
            batcher.release(n)

    async def handle(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The stage API (JSON bodies): HTTP 503 while the model is loading (or failed to load) and when the
        service is overloaded."""
        from http import HTTPStatus

        from bentoml.exceptions import BentoMLException, ServiceUnavailable

        try:
            results = await self.serve(items)
        except (RuntimeError, Overloaded) as exc:
            raise ServiceUnavailable(str(exc)) from None
        except TooManyItems as exc:
            raise BentoMLException(str(exc), error_code=HTTPStatus.REQUEST_ENTITY_TOO_LARGE) from None
        return await asyncio.to_thread(lambda: [adapter.to_json(m) for m in results])


class StageHttpMiddleware:
    """ASGI middleware: ``GET /info`` (503 until the model is loaded), the request body limit (413/411), the
    body read timeout (408: a POST body is read in full within ``body_timeout_s`` before the app sees the
    request, so a slow or stalled client is dropped instead of holding a worker) and the binary body type
    of the stage route (``application/x-protobuf``: a ``<Stage>Request`` answered with a
    ``<Stage>Response``, through the same ``StageRuntime`` as JSON bodies); other body types get 415."""

    def __init__(self, app: Any, *, stage: str, max_request_bytes: int, body_timeout_s: float = 30.0) -> None:
        from negt2i.wire.stage_table import spec

        self.app = app
        self.stage = stage
        self.spec = spec(stage)
        self.route = f"/{self.spec.route}"
        self.max_request_bytes = max_request_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope.get("method", "GET"), scope.get("path", "/")
        if path == "/info" and method == "GET":
            runtime = RUNTIMES.get(self.stage)
            handler = runtime.handler if runtime is not None else None
            if handler is None:
                await _send_json(send, 503, {"error": f"the {self.stage} model is not loaded yet"})
            else:
                info = handler.info()
                info.content_types.append(adapter.PROTOBUF_TYPE)
                await _send_json(send, 200, adapter.to_json(info))
            return
        if method == "POST":
            headers = dict(scope.get("headers") or [])
            ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower().decode("latin-1")
            binary = path == self.route and ctype == adapter.PROTOBUF_TYPE
            if path == self.route and ctype and ctype not in (adapter.JSON_TYPE, adapter.PROTOBUF_TYPE):
                await _send_json(send, 415, {"error": f"content type {ctype!r} is not accepted: send "
                                                      f"{adapter.JSON_TYPE} or {adapter.PROTOBUF_TYPE}"})  # fmt: skip
                return
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
            if binary:
                await self._binary(body, send)
                return
            await self.app(scope, _replay(body, receive), send)
            return
        await self.app(scope, receive, send)

    async def _binary(self, body: bytes, send: Any) -> None:
        """A binary request: parsed on a worker thread (400 when it is not a ``<Stage>Request``), served by the
        runtime (503 while loading or overloaded), answered with the binary ``<Stage>Response``."""
        runtime = RUNTIMES.get(self.stage)
        why = runtime.unavailable() if runtime is not None else f"the {self.stage} model is loading"
        if runtime is None or why:
            await _send_json(send, 503, {"error": why})
            return
        try:
            request = await asyncio.to_thread(adapter.from_binary, body, self.spec.request)
        except adapter.WireError as exc:
            await _send_json(send, 400, {"error": str(exc)})
            return
        try:
            results = await runtime.serve(list(request.items))  # type: ignore[attr-defined]
        except (RuntimeError, Overloaded) as exc:
            await _send_json(send, 503, {"error": str(exc)})
            return
        except TooManyItems as exc:
            await _send_json(send, 413, {"error": str(exc)})
            return
        response = self.spec.response
        payload = await asyncio.to_thread(lambda: response(results=results).SerializeToString())
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", adapter.PROTOBUF_TYPE.encode()),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


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
