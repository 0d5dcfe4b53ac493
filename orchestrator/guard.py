"""What the server does with malformed input before the servicer sees it, and how long its messages get.

- Requests that are not valid protobuf (corrupt bytes, invalid UTF-8 in a string field) would fail inside
  grpc's deserializer and reach the client as UNKNOWN. The Evaluator's methods are registered here with
  deserializers that never raise: a bad message becomes a ``BadMessage`` that the servicer answers with
  INVALID_ARGUMENT (field ``request``); on a stream it fails that one item and the stream goes on.
- Message size: gRPC itself refuses a message over its receive limit by ending the call (on a stream:
  the whole stream, with RESOURCE_EXHAUSTED, and nothing in flight can be answered after that). The
  server's transport limit is therefore ``TRANSPORT_FACTOR`` x ``max_message_bytes`` and the deserializer
  enforces ``max_message_bytes`` itself: a message between the two is a ``BadMessage`` answered
  RESOURCE_EXHAUSTED (reason ``MESSAGE_TOO_LARGE``) for that item only, with its ``request_id``; only a
  message over the transport limit still ends the stream (docs/api.md, "Stream contract").
- Every status message and item error is cut to ``MAX_MESSAGE_CHARS``, and identifiers echoed in them to
  ``MAX_ID_CHARS`` (``short``), so that no client input is reflected back in full.
- Calls at once (``CallLimit``, ``NEGT2I_MAX_CALLS``): the number of open calls (unary and streams, health
  checks excepted) is bounded where a call is routed, before its message is read; a call beyond it is answered
  RESOURCE_EXHAUSTED (reason SERVER_OVERLOADED: retry with backoff) without its message being read.
- Log injection: a ``request_id`` with a control character (CR, LF, NUL, ESC, ... : Unicode category Cc, and
  the line / paragraph separators U+2028 / U+2029) is refused (``control_char``), so an id echoed into a
  verdict, a results file or a log line can never start a new line or drive a terminal; any other client or
  stage text that reaches the server's log goes through ``loggable`` (non-printable characters escaped as
  ``\\xNN`` / ``\\uNNNN``, cut to ``MAX_ID_CHARS``).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Any, Final

import grpc

from negt2i.core.failures import Code
from negt2i.wire import errors
from negt2i.wire.v1 import evaluator_pb2

MAX_MESSAGE_CHARS: Final = 1024
"""Longest status message / item error message."""
MAX_ID_CHARS: Final = 64
"""Longest identifier quoted in a message."""
MAX_REQUEST_ID_CHARS: Final = 256
"""Longest ``request_id`` accepted (it is echoed in every response)."""


TRANSPORT_FACTOR: Final = 2
"""gRPC's receive limit is this many times ``max_message_bytes`` (see the module docstring)."""


class BadMessage:
    """A request that could not be used whole: ``reason`` says why, ``code`` / ``field`` / ``kind`` what to
    answer; ``request_id`` when it could be read."""

    def __init__(self, reason: str, *, request_id: str = "", too_large: bool = False, field: str = "request",
                 image: bool = False) -> None:  # fmt: skip
        self.reason = reason
        self.request_id = request_id
        self.too_large = too_large
        self.field = field
        self.image = image


def short(text: str, limit: int = MAX_ID_CHARS) -> str:
    """``text`` cut to ``limit`` characters (with the total length when cut)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def control_char(text: str) -> int:
    """The index of the first control character of ``text`` (category Cc, U+2028, U+2029), -1 when none."""
    for i, c in enumerate(text):
        if c in "\u2028\u2029" or unicodedata.category(c) == "Cc":
            return i
    return -1


def loggable(text: str, limit: int = MAX_ID_CHARS) -> str:
    """Client text made safe for one log line: cut to ``limit`` (``short``), non-printable characters escaped."""
    cut = short(text, limit)
    if cut.isprintable():
        return cut
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in cut)


def bounded(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """A message cut to ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _tolerant(cls: type[Any], max_bytes: int | None = None) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            msg = cls.FromString(data)
        except Exception as exc:  # DecodeError, invalid UTF-8, recursion limit, ...
            why = errors.plain(bounded(str(exc), 200)) or "malformed"
            return BadMessage(f"not a valid {cls.DESCRIPTOR.full_name} message ({why})")
        if max_bytes is not None and len(data) > max_bytes:
            image = len(getattr(getattr(msg, "image", None), "data", b"")) > len(data) // 2
            return BadMessage(
                f"message of {len(data)} bytes is over the limit of {max_bytes} bytes",
                request_id=str(getattr(msg, "request_id", ""))[:MAX_REQUEST_ID_CHARS],
                too_large=True,
                field="image.data" if image else "request",
                image=image,
            )
        return msg

    return parse


def add_evaluator(servicer: Any, server: grpc.aio.Server, max_message_bytes: int | None = None) -> None:
    """Register the ``negt2i.v1.Evaluator`` servicer with tolerant deserializers (same routes as the
    generated ``add_EvaluatorServicer_to_server``) that refuse requests over ``max_message_bytes``."""
    handlers = {
        "Evaluate": grpc.unary_unary_rpc_method_handler(
            servicer.Evaluate,
            request_deserializer=_tolerant(evaluator_pb2.EvaluateRequest, max_message_bytes),
            response_serializer=evaluator_pb2.EvaluateResponse.SerializeToString,
        ),
        "EvaluateStream": grpc.stream_stream_rpc_method_handler(
            servicer.EvaluateStream,
            request_deserializer=_tolerant(evaluator_pb2.EvaluateRequest, max_message_bytes),
            response_serializer=evaluator_pb2.EvaluateStreamResponse.SerializeToString,
        ),
        "GetServiceInfo": grpc.unary_unary_rpc_method_handler(
            servicer.GetServiceInfo,
            request_deserializer=_tolerant(evaluator_pb2.GetServiceInfoRequest),
            response_serializer=evaluator_pb2.ServiceInfo.SerializeToString,
        ),
        "GetVocabulary": grpc.unary_unary_rpc_method_handler(
            servicer.GetVocabulary,
            request_deserializer=_tolerant(evaluator_pb2.GetVocabularyRequest),
            response_serializer=evaluator_pb2.Vocabulary.SerializeToString,
        ),
    }
    service = evaluator_pb2.DESCRIPTOR.services_by_name["Evaluator"]
    missing = sorted({m.name for m in service.methods} - set(handlers))
    if missing:  # a new rpc in evaluator.proto must be routed here too
        raise RuntimeError(f"no handler for {', '.join(missing)}")
    name = service.full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


class CallLimit(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """At most ``max_calls`` open calls of the Evaluator (health checks and reflection are not counted). A
    call is counted from the start of its handler to its end, and its message is read only after it was
    counted: a unary method is served through a request-streaming handler that checks the count, then reads
    the one message itself (a unary handler would get the message read before it runs). Beyond the limit:
    RESOURCE_EXHAUSTED (SERVER_OVERLOADED, the rich error model: clients retry it) without reading anything.
    Counting and uncounting happen in the same ``try`` of the handler, so a call cancelled at any moment
    never leaves a count behind."""

    def __init__(self, max_calls: int) -> None:
        if max_calls < 1:
            raise ValueError("max_calls must be at least 1")
        self.max_calls = max_calls
        self.open = 0
        self.refused = 0

    async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or not str(details.method).startswith("/negt2i.v1.Evaluator/"):
            return handler
        if handler.unary_unary is None and handler.stream_stream is None:
            return handler
        return self._counted(handler)

    async def _admit(self, context: Any) -> None:
        if self.open >= self.max_calls:
            self.refused += 1
            await context.abort_with_status(_overloaded_status(
                f"the server is at capacity ({self.open} calls open, the limit is {self.max_calls}); "
                "retry with backoff"))  # fmt: skip
        self.open += 1

    def _counted(self, handler: Any) -> Any:
        kw = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}  # fmt: skip
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(requests: Any, context: Any) -> Any:
                await self._admit(context)
                try:
                    async for request in requests:  # the one message, read only now
                        return await inner(request, context)
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no request message")
                finally:
                    self.open -= 1

            return grpc.stream_unary_rpc_method_handler(unary, **kw)
        inner_stream = handler.stream_stream

        async def streaming(requests: Any, context: Any) -> Any:
            await self._admit(context)
            try:
                async for response in inner_stream(requests, context):
                    yield response
            finally:
                self.open -= 1

        return grpc.stream_stream_rpc_method_handler(streaming, **kw)


def _overloaded_status(message: str) -> Any:
    """The ``grpc.Status`` of RESOURCE_EXHAUSTED (SERVER_OVERLOADED) with the rich error model."""
    from grpc_status import rpc_status

    from negt2i.core.failures import Failure, FailureKind

    failure = Failure(FailureKind.STAGE_ERROR, message, code=Code.RESOURCE_EXHAUSTED,
                      reason=errors.Reason.SERVER_OVERLOADED)  # fmt: skip
    return rpc_status.to_status(errors.to_status(failure, message))
