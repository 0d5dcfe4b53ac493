"""What the server does with malformed input before the servicer sees it, and how long its messages get.

- Requests that are not valid protobuf (corrupt bytes, invalid UTF-8 in a string field) would fail inside
  grpc's deserializer and reach the client as UNKNOWN. The Evaluator's methods are registered here with
  deserializers that never raise: a bad message becomes a ``BadMessage`` that the servicer answers with
  INVALID_ARGUMENT (field ``request``); on a stream it fails that one item and the stream goes on.
- Every status message and item error is cut to ``MAX_MESSAGE_CHARS``, and identifiers echoed in them to
  ``MAX_ID_CHARS`` (``short``), so that no client input is reflected back in full.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import grpc

from negt2i.wire.v1 import evaluator_pb2

MAX_MESSAGE_CHARS: Final = 1024
"""Longest status message / item error message."""
MAX_ID_CHARS: Final = 64
"""Longest identifier quoted in a message."""
MAX_REQUEST_ID_CHARS: Final = 256
"""Longest ``request_id`` accepted (it is echoed in every response)."""


class BadMessage:
    """A request that could not be parsed; ``reason`` says why."""

    request_id = ""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def short(text: str, limit: int = MAX_ID_CHARS) -> str:
    """``text`` cut to ``limit`` characters (with the total length when cut)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def bounded(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """A message cut to ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _tolerant(cls: type[Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except Exception as exc:  # DecodeError, invalid UTF-8, recursion limit, ...
            return BadMessage(f"not a valid {cls.DESCRIPTOR.full_name} message ({bounded(str(exc), 200)})")

    return parse


def add_evaluator(servicer: Any, server: grpc.aio.Server) -> None:
    """Register the ``negt2i.v1.Evaluator`` servicer with tolerant deserializers (same routes as the
    generated ``add_EvaluatorServicer_to_server``)."""
    handlers = {
        "Evaluate": grpc.unary_unary_rpc_method_handler(
            servicer.Evaluate,
            request_deserializer=_tolerant(evaluator_pb2.EvaluateRequest),
            response_serializer=evaluator_pb2.EvaluateResponse.SerializeToString,
        ),
        "EvaluateStream": grpc.stream_stream_rpc_method_handler(
            servicer.EvaluateStream,
            request_deserializer=_tolerant(evaluator_pb2.EvaluateRequest),
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
