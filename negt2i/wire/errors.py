"""The gRPC rich error model of ``negt2i.v1``: every error the orchestrator returns as ``google.rpc.Status``.

A failed unary call carries the status in its ``grpc-status-details-bin`` trailer (read it with any gRPC
library's status helper: Python ``grpc_status.rpc_status.from_call``, Go ``status.FromError``, Java
``StatusProto.fromThrowable``, Node ``@grpc/grpc-js``' ``metadata.get('grpc-status-details-bin')``); a
failed stream item carries the same message in ``ItemError.status``. The status holds:

- ``code``: the gRPC code (``INVALID_ARGUMENT`` 3, ``DEADLINE_EXCEEDED`` 4, ``NOT_FOUND`` 5,
  ``RESOURCE_EXHAUSTED`` 8, ``INTERNAL`` 13, ``UNAVAILABLE`` 14);
- ``message``: the details text ``[<stage>: ][[<rule>] ][<field>: ]<message>`` (what older clients parse);
- ``details[0]``: a ``google.rpc.ErrorInfo``: ``domain`` ``negt2i.v1``, ``reason`` one of ``Reason``,
  ``metadata``: ``stage`` (always; see ``step``), ``kind`` (the ``FailureKind``), and ``field`` /
  ``rule`` when there is one;
- ``details[1]``, for ``INVALID_ARGUMENT`` only: a ``google.rpc.BadRequest`` with one field violation,
  ``field`` the request field path in proto names (``prompt.statements[0].relation.predicate``, AIP-193),
  ``description`` the message in plain words, ``reason`` the same reason.

Messages are plain words: ``plain`` removes Python object reprs (``<_io.BytesIO object at 0x...>``) and
exception class names that can reach a message from a library; pydantic's texts are mapped where they
arise (``negt2i.core.spec.plain_message``).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import TYPE_CHECKING, Final

from negt2i.core.failures import Code, ContractRule, Failure, FailureKind

if TYPE_CHECKING:
    from google.protobuf.message import Message
    from google.rpc import status_pb2

DOMAIN: Final = "negt2i.v1"
"""``ErrorInfo.domain`` of every error."""
DETAILS_KEY: Final = "grpc-status-details-bin"
"""The trailer that carries the serialized ``google.rpc.Status`` of a failed call."""


class Reason(StrEnum):
    """``ErrorInfo.reason``: why a call or item failed, stable and machine-readable (UPPER_SNAKE_CASE)."""

    MALFORMED_REQUEST = "MALFORMED_REQUEST"
    """INVALID_ARGUMENT: the bytes are not a valid ``EvaluateRequest``."""
    INVALID_REQUEST_ID = "INVALID_REQUEST_ID"
    """INVALID_ARGUMENT: ``request_id`` is empty (streams need one) or too long."""
    DUPLICATE_REQUEST_ID = "DUPLICATE_REQUEST_ID"
    """INVALID_ARGUMENT: another item of the stream with this ``request_id`` is still unanswered; this send is
    refused, the earlier one is judged and answered as usual."""
    INVALID_PROMPT = "INVALID_PROMPT"
    """INVALID_ARGUMENT: the inline prompt metadata is invalid (the field says where)."""
    UNKNOWN_PROMPT_ID = "UNKNOWN_PROMPT_ID"
    """NOT_FOUND: no corpus prompt has this ``prompt_id``."""
    UNREADABLE_IMAGE = "UNREADABLE_IMAGE"
    """INVALID_ARGUMENT: the image is empty, too large, or not a decodable PNG / JPEG / WebP."""
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
    """RESOURCE_EXHAUSTED: the request message is over ``ServerLimits.max_message_bytes`` (not transient:
    do not resend it unchanged)."""
    SERVER_OVERLOADED = "SERVER_OVERLOADED"
    """RESOURCE_EXHAUSTED: the orchestrator is at capacity (admission); retry with backoff."""
    STAGE_OVERLOADED = "STAGE_OVERLOADED"
    """RESOURCE_EXHAUSTED: a stage's queue is full; retry with backoff."""
    STAGE_UNAVAILABLE = "STAGE_UNAVAILABLE"
    """UNAVAILABLE: a stage service the item needs is down or refused by the orchestrator; retry later."""
    STAGE_REJECTED_INPUT = "STAGE_REJECTED_INPUT"
    """INVALID_ARGUMENT: a stage refused what it was sent for this item (e.g. over its own size limits)."""
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    """DEADLINE_EXCEEDED: no verdict before the item's deadline (the call's, or the stream's, less a margin)."""
    STAGE_CONTRACT_VIOLATION = "STAGE_CONTRACT_VIOLATION"
    """INTERNAL: a stage answered outside the stage contract (``metadata.rule`` names the rule)."""
    JUDGE_FAILED = "JUDGE_FAILED"
    """INTERNAL: the judge could not use the perception."""
    INTERNAL_ERROR = "INTERNAL_ERROR"
    """INTERNAL: a bug in the orchestrator (logged on the server)."""


STEPS: Final = ("request", "admission", "detector", "segmenter", "attributes", "depth", "judge", "orchestrator")
"""``ErrorInfo.metadata["stage"]``: where the item failed: ``request`` (validating the request, before any
work), ``admission`` (waiting for capacity), a stage, ``judge``, or ``orchestrator`` (anything else)."""


def reason_of(failure: Failure) -> Reason:
    """The failure's ``reason`` when it names one, else the reason that follows from its kind, code, stage
    and field."""
    if failure.reason in Reason.__members__:
        return Reason(failure.reason)
    code, stage = failure.code, failure.stage
    if failure.kind is FailureKind.UNREADABLE_IMAGE:
        return Reason.UNREADABLE_IMAGE
    if failure.kind is FailureKind.MISSING_METADATA:
        return Reason.UNKNOWN_PROMPT_ID
    if failure.kind is FailureKind.INVALID_METADATA:
        if failure.field == "request_id":
            return Reason.INVALID_REQUEST_ID
        if failure.field == "request":
            return Reason.MALFORMED_REQUEST
        return Reason.INVALID_PROMPT
    if code is Code.RESOURCE_EXHAUSTED:
        return Reason.STAGE_OVERLOADED if stage else Reason.SERVER_OVERLOADED
    if code is Code.UNAVAILABLE:
        return Reason.STAGE_UNAVAILABLE
    if code is Code.DEADLINE_EXCEEDED:
        return Reason.DEADLINE_EXCEEDED
    if code is Code.INVALID_ARGUMENT:
        return Reason.STAGE_REJECTED_INPUT
    if stage == "judge":
        return Reason.JUDGE_FAILED
    if failure.rule or stage:
        return Reason.STAGE_CONTRACT_VIOLATION
    return Reason.INTERNAL_ERROR


def step_of(failure: Failure) -> str:
    """``ErrorInfo.metadata["stage"]`` (see ``STEPS``)."""
    if failure.stage:
        return failure.stage
    if failure.code in {Code.INVALID_ARGUMENT, Code.NOT_FOUND} or failure.kind is not FailureKind.STAGE_ERROR:
        return "request"
    if reason_of(failure) is Reason.SERVER_OVERLOADED:
        return "admission"
    return "orchestrator"


_REPR = re.compile(r"<(?:[\w.]+ )?(?:object|instance) at 0x[0-9a-fA-F]+>")
_PAREN_NAME = re.compile(r"\s*\((?:[a-z_]\w*\.)*([A-Z][A-Za-z]*(?:Error|Exception|Timeout))\)")
_LEAD_NAME = re.compile(r"^(?:[a-z_]\w*\.)*[A-Z][A-Za-z]*(?:Error|Exception): ")
_WORDS: Final[dict[str, str]] = {
    "ConnectError": "connection refused",
    "ConnectTimeout": "connection timed out",
    "ReadTimeout": "read timed out",
    "WriteTimeout": "write timed out",
    "PoolTimeout": "no free connection",
    "ReadError": "connection lost while reading",
    "WriteError": "connection lost while writing",
    "RemoteProtocolError": "the connection was closed mid-answer",
    "TimeoutError": "timed out",
    "MemoryError": "out of memory",
}


def plain(text: str) -> str:
    """``text`` without Python object reprs (``<_io.BytesIO object at 0x...>`` -> ``the data``) and
    exception class names: a leading ``SomeError: `` is dropped, a parenthesised ``(ConnectError)`` becomes
    words (``(connection refused)``) or is dropped."""
    text = _REPR.sub("the data", text)
    text = _PAREN_NAME.sub(lambda m: f" ({_WORDS[m.group(1)]})" if m.group(1) in _WORDS else "", text)
    return _LEAD_NAME.sub("", text)


_ATTRIBUTE_KEYS: Final = ("object", "value")
_RELATION_KEYS: Final = ("subject", "target", "predicate")


def proto_path(field: str) -> str:
    """A request field path in the proto's names (AIP-193): ``prompt.objects[0].class`` ->
    ``prompt.objects[0].class_name``, ``prompt.statements[1].predicate`` ->
    ``prompt.statements[1].relation.predicate``, ``.value`` -> ``.attribute.value``."""
    out = re.sub(r"(\bobjects\[\d+\])\.class\b", r"\1.class_name", field)
    keys = "|".join(_ATTRIBUTE_KEYS)
    out = re.sub(rf"(\b(?:statements|probes)\[\d+\])\.({keys})$", r"\1.attribute.\2", out)
    keys = "|".join(_RELATION_KEYS)
    return re.sub(rf"(\b(?:statements|probes)\[\d+\])\.({keys})$", r"\1.relation.\2", out)


def to_status(failure: Failure, message: str | None = None) -> status_pb2.Status:
    """The ``google.rpc.Status`` of a failure (see the module docstring); ``message`` overrides the text
    (the bounded details the call is answered with)."""
    from google.protobuf import any_pb2
    from google.rpc import error_details_pb2, status_pb2

    reason = reason_of(failure)
    metadata = {"stage": step_of(failure), "kind": failure.kind.value}
    if failure.field:
        metadata["field"] = failure.field
    if failure.rule:
        metadata["rule"] = failure.rule.value
    info = error_details_pb2.ErrorInfo(reason=reason.value, domain=DOMAIN, metadata=metadata)
    details: list[Message] = [info]
    code = failure.code.number
    if failure.code is Code.INVALID_ARGUMENT:
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=failure.field or "request", description=plain(failure.message), reason=reason.value
        )
        details.append(error_details_pb2.BadRequest(field_violations=[violation]))
    packed = []
    for detail in details:
        any_msg = any_pb2.Any()
        any_msg.Pack(detail)
        packed.append(any_msg)
    return status_pb2.Status(code=code, message=plain(failure.details()) if message is None else message,
                             details=packed)  # fmt: skip


def failure_from_status(status: status_pb2.Status, *, kind: FailureKind | None = None) -> Failure:
    """The ``Failure`` a status describes: ``field``, ``stage``, ``rule`` and ``reason`` from its
    ``ErrorInfo`` / ``BadRequest`` (``stage`` only when a stage or the judge failed)."""
    from google.rpc import error_details_pb2

    code = Code.of(int(status.code))
    info = error_details_pb2.ErrorInfo()
    bad = error_details_pb2.BadRequest()
    for detail in status.details:
        if detail.Is(info.DESCRIPTOR):
            detail.Unpack(info)
        elif detail.Is(bad.DESCRIPTOR):
            detail.Unpack(bad)
    meta = dict(info.metadata)
    if info.domain == DOMAIN:  # ours: the field is in the metadata whenever there is one
        field = meta.get("field", "")
    else:
        field = bad.field_violations[0].field if bad.field_violations else ""
    step = meta.get("stage", "")
    stage = step if step not in {"request", "admission", "orchestrator"} else ""
    if kind is None:
        try:
            kind = FailureKind(meta.get("kind", ""))
        except ValueError:
            kind = FailureKind.STAGE_ERROR
    message = bad.field_violations[0].description if bad.field_violations else status.message
    return Failure(kind, message, stage=stage, rule=ContractRule.parse(meta.get("rule", "")), field=field, code=code,
                   text=f"{code}: {status.message}", reason=info.reason)  # fmt: skip
