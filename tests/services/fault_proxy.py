"""A gRPC proxy in front of a real orchestrator that injects faults into ``EvaluateStream``, by image.

Every call is forwarded to the orchestrator at ``upstream`` (``GetServiceInfo``; each stream item over
one upstream ``EvaluateStream``), except the sends named in ``faults``: image SHA-256 -> a list of what
to do with its 1st, 2nd, ... send (``"overloaded"``: answer ``RESOURCE_EXHAUSTED`` / ``SERVER_OVERLOADED``
as the orchestrator's admission does; ``"deadline"``: answer ``DEADLINE_EXCEEDED``; ``"stall"``: never
answer; ``"pass"``: forward). Sends beyond the list are forwarded. ``sends`` counts the sends of each
image, so a test can assert how a client retried.
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from typing import Any

import grpc

from negt2i.core.failures import Code, Failure, FailureKind
from negt2i.wire import adapter
from negt2i.wire.errors import Reason
from negt2i.wire.v1 import evaluator_pb2, evaluator_pb2_grpc
from tests.services.live import free_port

_INJECTED = {
    "overloaded": (Code.RESOURCE_EXHAUSTED, Reason.SERVER_OVERLOADED, "injected: the server is at capacity"),
    "deadline": (Code.DEADLINE_EXCEEDED, Reason.DEADLINE_EXCEEDED, "injected: no verdict before the deadline"),
}


def serve_evaluator(
    service_info: Callable[[Any, Any], evaluator_pb2.ServiceInfo],
    stream: Callable[[Iterator[evaluator_pb2.EvaluateRequest], Any], Iterator[Any]],
    *,
    workers: int,
    options: Sequence[tuple[str, Any]] = (),
    serving: Sequence[str] = (),
) -> tuple[grpc.Server, int]:
    """A started ``grpc.server`` on 127.0.0.1 (a free port, returned with it) that answers the Evaluator's
    ``GetServiceInfo`` and ``EvaluateStream`` with these handlers and reports ``negt2i.v1.Evaluator`` (and the
    health names ``serving``, e.g. ``negt2i.v1.Evaluator/category/color``) SERVING on ``grpc.health.v1``: the
    stand-in orchestrators of the tests."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(workers), options=list(options))
    handlers = {
        "GetServiceInfo": grpc.unary_unary_rpc_method_handler(
            service_info, request_deserializer=evaluator_pb2.GetServiceInfoRequest.FromString,
            response_serializer=evaluator_pb2.ServiceInfo.SerializeToString),
        "EvaluateStream": grpc.stream_stream_rpc_method_handler(
            stream, request_deserializer=evaluator_pb2.EvaluateRequest.FromString,
            response_serializer=evaluator_pb2.EvaluateStreamResponse.SerializeToString),
    }  # fmt: skip
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("negt2i.v1.Evaluator", handlers),))
    servicer = health.HealthServicer()
    for name in ("negt2i.v1.Evaluator", *serving):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, port


class FaultProxy:
    """See the module docstring; ``target`` is the proxy's address. Use as a context manager."""

    def __init__(self, upstream: str, faults: Mapping[str, Sequence[str]]) -> None:
        self.faults = {k: list(v) for k, v in faults.items()}
        self.sends: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._channel = grpc.insecure_channel(upstream, options=[("grpc.max_receive_message_length", 64 << 20)])
        self._stub = evaluator_pb2_grpc.EvaluatorStub(self._channel)
        self.server, self.port = serve_evaluator(
            lambda req, ctx: self._stub.GetServiceInfo(req, timeout=30), self._stream, workers=8,
            options=[("grpc.max_receive_message_length", 64 << 20)],
        )  # fmt: skip

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.server.stop(0)
        self._channel.close()

    def _action(self, request: evaluator_pb2.EvaluateRequest) -> str:
        import hashlib

        key = hashlib.sha256(request.image.data).hexdigest()
        with self._lock:
            self.sends[key] += 1
            plan = self.faults.get(key, [])
            n = self.sends[key]
        return plan[n - 1] if n <= len(plan) else "pass"

    def _stream(self, requests: Iterator[evaluator_pb2.EvaluateRequest], context: Any) -> Iterator[Any]:
        out: queue.Queue[Any] = queue.Queue()
        upstream: queue.Queue[evaluator_pb2.EvaluateRequest | None] = queue.Queue()

        def upstream_requests() -> Iterator[evaluator_pb2.EvaluateRequest]:
            while (item := upstream.get()) is not None:
                yield item

        call = self._stub.EvaluateStream(upstream_requests())
        context.add_callback(call.cancel)

        def pump_answers() -> None:
            try:
                for resp in call:
                    out.put(resp)
            except grpc.RpcError:
                pass
            out.put(None)

        def pump_requests() -> None:
            try:
                for request in requests:
                    action = self._action(request)
                    if action == "stall":
                        continue
                    if action in _INJECTED:
                        code, reason, message = _INJECTED[action]
                        failure = Failure(FailureKind.STAGE_ERROR, message, code=code, reason=reason)
                        error = adapter.failure_to_proto(failure)
                        out.put(evaluator_pb2.EvaluateStreamResponse(request_id=request.request_id, error=error))
                        continue
                    upstream.put(request)
            except grpc.RpcError:  # the client went away
                pass
            upstream.put(None)

        threading.Thread(target=pump_answers, daemon=True).start()
        threading.Thread(target=pump_requests, daemon=True).start()
        while (resp := out.get()) is not None:
            yield resp
