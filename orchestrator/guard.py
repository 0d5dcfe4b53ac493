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
- Memory before a message is read (docs/services.md, "Memory"). gRPC core assembles a message only for a
  call whose message the server has asked for; before that a call holds at most its HTTP/2 stream window
  (``transport_options``: BDP probing off, the window fixed at ``NEGT2I_CALL_BUFFER_BYTES``, 64 KiB; gRPC's
  automatic window grows to several MiB per call on a busy connection). ``CallLimit`` asks for at most
  ``NEGT2I_MAX_RECEIVING`` unary messages at once (the others wait unread, up to ``NEGT2I_MAX_WAIT_S`` or
  their deadline, then RESOURCE_EXHAUSTED SERVER_OVERLOADED), a message that does not arrive within
  ``NEGT2I_RECEIVE_TIMEOUT_S`` ends its call (DEADLINE_EXCEEDED) and frees its place; streams read each
  message in one of ``NEGT2I_MAX_STREAM_RECEIVING`` places of their own (``StreamPlaces``: an idle holder is
  ended when another stream waits); a call refused for its token (``orchestrator.security``) is never read at
  all. A message read is dropped as soon as its call ends:
  the request iterator is closed and the frames of an aborted call's exception cleared (grpc.aio keeps the
  abort exception, whose traceback would otherwise hold the request in a reference cycle until the cyclic
  garbage collector runs). A message over ``max_message_bytes`` is never parsed (``scan_request`` reads its
  ``request_id`` from the wire format).
- Log injection: a ``request_id`` with a control character (CR, LF, NUL, ESC, ... : Unicode category Cc, and
  the line / paragraph separators U+2028 / U+2029) is refused (``control_char``), so an id echoed into a
  verdict, a results file or a log line can never start a new line or drive a terminal; any other client or
  stage text that reaches the server's log goes through ``loggable`` (non-printable characters escaped as
  ``\\xNN`` / ``\\uNNNN``, cut to ``MAX_ID_CHARS``).
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import traceback
import unicodedata
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any, Final

import grpc

from negt2i.core.failures import Code
from negt2i.wire import errors
from negt2i.wire.v1 import evaluator_pb2

if TYPE_CHECKING:
    from orchestrator.settings import Settings

MAX_MESSAGE_CHARS: Final = 1024
"""Longest status message / item error message."""
MAX_ID_CHARS: Final = 64
"""Longest identifier quoted in a message."""
MAX_REQUEST_ID_CHARS: Final = 256
"""Longest ``request_id`` accepted (it is echoed in every response)."""


TRANSPORT_FACTOR: Final = 2
"""gRPC's receive limit is this many times ``max_message_bytes`` (see the module docstring)."""
MAX_FRAME_BYTES: Final = 1 << 20
"""The largest HTTP/2 DATA frame clients may send (``transport_options``)."""


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


def _varint(data: bytes | memoryview, at: int) -> tuple[int, int]:
    """The varint at ``data[at:]`` and the offset after it (ValueError when truncated or over 64 bits)."""
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(data: bytes | memoryview) -> dict[int, tuple[int, int]]:
    """The length-delimited fields of one protobuf message: field number -> (offset, length) of the last
    occurrence; the other wire types are skipped. Reads the wire format only (nothing copied); ValueError when
    ``data`` is not a valid message."""
    found: dict[int, tuple[int, int]] = {}
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, kind = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if kind == 0:
            _, at = _varint(data, at)
        elif kind == 1:
            at += 8
        elif kind == 5:
            at += 4
        elif kind == 2:
            size, at = _varint(data, at)
            found[number] = (at, size)
            at += size
        else:  # groups (3, 4) are not used by negt2i.v1; 6 and 7 are invalid
            raise ValueError(f"wire type {kind}")
    if at != len(data):
        raise ValueError("truncated field")
    return found


def scan_request(data: bytes) -> tuple[str, int]:
    """The ``request_id`` (field 1, cut to ``MAX_REQUEST_ID_CHARS``) and the length of ``image.data`` (field 4,
    its field 1) of an encoded ``EvaluateRequest``, read from the wire format without parsing the message (a
    parse would copy its image); ValueError when it is not a valid message."""
    top = _fields(data)
    rid = ""
    if 1 in top:
        at, size = top[1]
        rid = bytes(data[at : at + min(size, 4 * MAX_REQUEST_ID_CHARS)]).decode("utf-8", "replace")
    image = 0
    if 4 in top:
        at, size = top[4]
        image = _fields(memoryview(data)[at : at + size]).get(1, (0, 0))[1]
    return rid[:MAX_REQUEST_ID_CHARS], image


def _tolerant(cls: type[Any], max_bytes: int | None = None) -> Callable[[bytes], Any]:
    def too_large(data: bytes) -> BadMessage:
        # never parsed: a parse would copy the (up to twice the limit) message once more
        try:
            rid, image_bytes = scan_request(data) if cls is evaluator_pb2.EvaluateRequest else ("", 0)
        except ValueError as exc:
            return BadMessage(f"not a valid {cls.DESCRIPTOR.full_name} message ({exc})")
        image = image_bytes > len(data) // 2
        return BadMessage(
            f"message of {len(data)} bytes is over the limit of {max_bytes} bytes",
            request_id=rid,
            too_large=True,
            field="image.data" if image else "request",
            image=image,
        )

    def parse(data: bytes) -> Any:
        if max_bytes is not None and len(data) > max_bytes:
            return too_large(data)
        try:
            return cls.FromString(data)
        except Exception as exc:  # DecodeError, invalid UTF-8, recursion limit, ...
            why = errors.plain(bounded(str(exc), 200)) or "malformed"
            return BadMessage(f"not a valid {cls.DESCRIPTOR.full_name} message ({why})")

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


PROCESS_BASELINE: Final = 256 << 20
"""The orchestrator's own resident memory before any call (251 MiB measured: Python, gRPC, numpy, SciPy)."""
_SLACK: Final = 16 << 20
"""The fixed term of each documented reception bound (docs/services.md, "Memory before a message is read")."""


def reception_reserve(settings: Settings) -> int:
    """What the orchestrator holds outside the admission budget, by the bounds docs/services.md documents:

        B + (6 T + 16 MiB) + ((3 R + 3) T + N b + 16 MiB) + (S + 1) T

    with B = ``PROCESS_BASELINE``, T = ``TRANSPORT_FACTOR`` x ``max_message_bytes`` (the transport limit),
    R = ``max_receiving``, S = ``max_stream_receiving``, N = ``max_calls`` and b = ``call_buffer_bytes`` of
    ``settings``: the process, health checks read one at a time, unary messages being received, and stream
    messages being received (one in gRPC's buffers per place, and one flat copy). The default admission budget
    is what is left of the memory limit after it (``orchestrator.admission.default_budget``), so the
    documented rows add up to the limit."""
    transport = TRANSPORT_FACTOR * settings.max_message_bytes
    health = 6 * transport + _SLACK
    unary = (3 * settings.max_receiving + 3) * transport + settings.max_calls * settings.call_buffer_bytes + _SLACK
    streams = (settings.max_stream_receiving + 1) * transport
    return PROCESS_BASELINE + health + unary + streams


def transport_options(max_message_bytes: int, call_buffer_bytes: int) -> list[tuple[str, int]]:
    """The gRPC server options that bound what gRPC itself receives (see the module docstring)."""
    options = [
        # gRPC ends a call whose message is over this; up to it, ``_tolerant`` answers an oversized item itself
        ("grpc.max_receive_message_length", TRANSPORT_FACTOR * max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]
    if call_buffer_bytes:
        # BDP probing grows every stream's window to several MiB on a busy connection, and gRPC fills that
        # window from the socket whether or not the server has asked for the message: 16 unread 60 MB calls on
        # one connection held 258 MiB, 3 MiB with the window fixed (docs/services.md, "Memory"). A message the
        # server reads is granted window ahead of it (up to 1 MiB at a time), whatever this is
        options += [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", call_buffer_bytes),
                    # BDP probing also raises the largest DATA frame a client may send from HTTP/2's 16 KiB; kept
                    # there, large images arrive 14 % slower. A frame never exceeds the window, so this costs
                    # no memory
                    ("grpc.http2.max_frame_size", MAX_FRAME_BYTES)]  # fmt: skip
    return options


COUNTED: Final = ("/negt2i.v1.Evaluator/", "/grpc.reflection.")
"""The methods ``CallLimit`` counts and whose messages it reads in places: the Evaluator's, and reflection's
(opt-in, a stream that needs no token when none is configured: its messages may be as large as any)."""
PROBE_RECEIVE_S: Final = 2.0
"""How long a health check's message may take to arrive, and to wait for its place (``CallLimit``)."""


class Places:
    """At most ``count`` request messages being received at once (see the module docstring)."""

    def __init__(self, count: int, receive_timeout_s: float, max_wait_s: float, what: str) -> None:
        self.count = count
        self.receive_timeout_s = receive_timeout_s
        self.max_wait_s = max_wait_s
        self.what = what
        self.receiving = 0
        self.peak = 0
        self.refused = 0
        self._free: asyncio.Semaphore | None = None

    async def receive(self, requests: Any, context: Any, open_calls: int, *, keep: bool = False) -> Any:
        """The one message of ``requests``, read in one of the places: RESOURCE_EXHAUSTED (SERVER_OVERLOADED)
        when none is free within ``max_wait_s`` (cut to the deadline), DEADLINE_EXCEEDED when the message has not
        arrived ``receive_timeout_s`` after it was asked for. ``keep``: the place stays taken after a message was
        received, until ``release``."""
        if self._free is None:
            self._free = asyncio.Semaphore(self.count)
        left = context.time_remaining()
        wait = max(0.0, self.max_wait_s if left is None else min(self.max_wait_s, left))
        try:
            await asyncio.wait_for(self._free.acquire(), wait)
        except TimeoutError:
            self.refused += 1
            await context.abort_with_status(_overloaded_status(
                f"the server is at capacity ({self.count} {self.what} being received, {open_calls} calls open; "
                f"none could start within {wait:.1f} s); retry with backoff"))  # fmt: skip
        self.receiving += 1
        self.peak = max(self.peak, self.receiving)
        iterator = requests.__aiter__()
        received = False
        try:
            message = await asyncio.wait_for(iterator.__anext__(), self.receive_timeout_s)
            received = True
            return message
        except StopAsyncIteration:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no request message")
        except TimeoutError:
            await context.abort_with_status(_status(
                Code.DEADLINE_EXCEEDED, errors.Reason.DEADLINE_EXCEEDED,
                f"the request message did not arrive within {self.receive_timeout_s:g} s of the server "
                "asking for it"))  # fmt: skip
        finally:
            if not (keep and received):
                self.release()
            await iterator.aclose()  # its frame would hold the message until the call's state is collected

    def release(self) -> None:
        """Free a place taken by ``receive``."""
        assert self._free is not None
        self.receiving -= 1
        self._free.release()


class StreamPlaces:
    """At most ``count`` stream messages being received at once (``StreamGate`` takes a place for each read).

    A stream asks for its next message as soon as its window and admission allow, and its client may then stay
    silent for minutes (``negt2i generate --score`` between images): such an idle stream holds a place. So a
    stream waiting for a place ends the longest-idle holder, one whose message has not arrived
    ``idle_s`` after it was asked for (or after the holder's last answer, when later) while it has no item
    unanswered (``StreamGate.evict``: the holder ends RESOURCE_EXHAUSTED SERVER_OVERLOADED, having nothing in
    flight, and its client reopens it when it has an image to send). A stream that gets no place within
    ``max_wait_s`` (cut to its deadline) stops reading (``take`` returns False). Places are given first come,
    first served."""

    def __init__(self, count: int, idle_s: float, max_wait_s: float, check_s: float = 0.25) -> None:
        if count < 1:
            raise ValueError("count must be at least 1")
        self.count = count
        self.idle_s = idle_s
        self.max_wait_s = max_wait_s
        self.check_s = check_s
        self.holders: dict[StreamGate, float] = {}
        """The streams holding a place, with the loop time they took it."""
        self.peak = 0
        self.refused = 0
        self.evicted = 0
        self._queue: deque[tuple[asyncio.Future[None], StreamGate]] = deque()

    def waiting(self) -> int:
        """Streams waiting for a place (an entry leaves the queue when given a place or when its wait ends)."""
        return len(self._queue)

    async def take(self, gate: StreamGate, wait_s: float) -> bool:
        """Take a place for ``gate``'s next read: True once taken, False when none was free within ``wait_s``."""
        loop = asyncio.get_running_loop()
        if len(self.holders) < self.count and not self._queue:
            self._grant(gate, loop.time())
            return True
        future: asyncio.Future[None] = loop.create_future()
        entry = (future, gate)
        self._queue.append(entry)
        end = loop.time() + wait_s
        try:
            while not future.done() and (now := loop.time()) < end:
                self._evict_idle(now)
                await asyncio.wait((future,), timeout=min(end - now, self.check_s))
        except BaseException:
            if future.done() and not future.cancelled():  # given a place while being cancelled: pass it on
                self.give(gate)
            future.cancel()
            raise
        finally:
            with suppress(ValueError):
                self._queue.remove(entry)
        if future.done() and not future.cancelled():
            return True
        future.cancel()
        self.refused += 1
        return False

    def give(self, gate: StreamGate) -> None:
        """Free ``gate``'s place (if it holds one) for the first stream waiting."""
        if self.holders.pop(gate, None) is None:
            return
        while self._queue:
            future, waiter = self._queue.popleft()
            if not future.done():
                self._grant(waiter, asyncio.get_running_loop().time())
                future.set_result(None)
                return

    def _grant(self, gate: StreamGate, now: float) -> None:
        self.holders[gate] = now
        self.peak = max(self.peak, len(self.holders))

    def _evict_idle(self, now: float) -> None:
        """End idle holders, the longest idle first, until as many are ending as streams wait."""
        ending = sum(1 for gate in self.holders if gate.evicting)
        idle = [
            (since, id(gate), gate)
            for gate, taken in self.holders.items()
            if not gate.evicting and (since := gate.idle_since(taken)) is not None and now - since >= self.idle_s
        ]
        for _, _, gate in sorted(idle, key=lambda row: row[:2]):
            if ending >= self.waiting():
                return
            gate.evict()
            ending += 1
            self.evicted += 1


class StreamGate:
    """A stream's request iterator that reads each message in one of ``places`` (``StreamPlaces``). It ends
    early (StopAsyncIteration, as if the client had half-closed, so every item already read is still judged and
    answered) when no place is free in time or when it is evicted as idle; ``refusal`` then says why, and the
    call ends RESOURCE_EXHAUSTED SERVER_OVERLOADED after the last answer (``CallLimit``). ``answered`` must be
    called for each answer written (a message read gets exactly one)."""

    def __init__(self, requests: Any, places: StreamPlaces, context: Any) -> None:
        self._inner = requests.__aiter__()
        self._places = places
        self._context = context
        self.read = 0
        self.answers = 0
        self.last_answer = 0.0
        self.refusal = ""
        self.evicting = False
        self._evict: asyncio.Future[None] | None = None

    def __aiter__(self) -> StreamGate:
        return self

    def answered(self) -> None:
        """An answer to one of the messages read was written."""
        self.answers += 1
        self.last_answer = asyncio.get_running_loop().time()

    def idle_since(self, taken: float) -> float | None:
        """Since when the stream has waited for its client with nothing unanswered (None: items unanswered)."""
        return None if self.read > self.answers else max(taken, self.last_answer)

    def evict(self) -> None:
        """End the stream at its pending read (``StreamPlaces``)."""
        self.evicting = True
        if self._evict is not None and not self._evict.done():
            self._evict.set_result(None)

    async def __anext__(self) -> Any:
        places = self._places
        if self.refusal:
            raise StopAsyncIteration
        left = self._context.time_remaining()
        wait = max(0.0, places.max_wait_s if left is None else min(places.max_wait_s, left))
        if not await places.take(self, wait):
            self.refusal = (f"the server is at capacity ({places.count} stream messages being received, "
                            f"{places.waiting() + 1} streams waiting; none could start within {wait:.1f} s): "
                            "every message read was answered; send the others again with backoff")  # fmt: skip
            raise StopAsyncIteration
        self._evict = asyncio.get_running_loop().create_future()
        read = asyncio.ensure_future(_next_message(self._inner))
        try:
            await asyncio.wait((read, self._evict), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the call was cancelled
            self._abandon(read)
            raise
        if not read.done():  # evicted while idle
            self._abandon(read)
            self.refusal = (f"the stream was idle (no message {places.idle_s:g} s after the server asked for one, "
                            "no item in flight) while other streams waited to send: reopen it when there is an "
                            "image to send")  # fmt: skip
            raise StopAsyncIteration
        self.evicting = False  # a message arrived as it was being evicted: it is no longer idle
        places.give(self)
        found, message = read.result()
        if not found:
            raise StopAsyncIteration
        self.read += 1
        return message

    def _abandon(self, read: asyncio.Future[Any]) -> None:
        """Cancel a pending read; the place is given back once it has ended (a message may still be arriving
        until then)."""

        def ended(done: asyncio.Future[Any]) -> None:
            self._places.give(self)
            if not done.cancelled():
                done.exception()  # retrieved: the call is ending anyway

        read.cancel()
        read.add_done_callback(ended)


async def _next_message(iterator: Any) -> tuple[bool, Any]:
    """(True, the next message) or (False, None) at the end of the stream (a task cannot raise
    StopAsyncIteration through its result)."""
    try:
        return True, await iterator.__anext__()
    except StopAsyncIteration:
        return False, None


class CallLimit(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """At most ``max_calls`` open calls of the Evaluator and reflection (``COUNTED``; health checks are not), and at
    most ``max_receiving`` of their unary messages being received (``Places``). A call is counted from the start
    of its handler to its end, and its message is read only after it was counted: a unary method is served
    through a request-streaming handler that checks the count, then reads the one message itself (a unary
    handler would get the message read before it runs), once one of the ``max_receiving`` places is free.
    Beyond the limit, or after ``max_wait_s`` (or the call's deadline) without a free place: RESOURCE_EXHAUSTED
    (SERVER_OVERLOADED, the rich error model: clients retry it) without reading anything; a message still not
    received ``receive_timeout_s`` after its place was taken: DEADLINE_EXCEEDED. Counting and uncounting happen
    in the same ``try`` of the handler, so a call cancelled at any moment never leaves a count behind.

    A stream's messages are read through a ``StreamGate``, each in one of ``max_stream_receiving`` places
    (``StreamPlaces``); a stream whose gate stopped reading (no place in time, or ended as idle) ends
    RESOURCE_EXHAUSTED SERVER_OVERLOADED once every message it read has been answered.

    Health checks need no token, so anyone who can connect may send one, of up to the transport limit: their
    messages are read the same way, one at a time in a place of their own (``PROBE_RECEIVE_S`` to arrive and
    to wait for it), never behind the Evaluator's uploads."""

    def __init__(self, max_calls: int, max_receiving: int | None = None, receive_timeout_s: float = 30.0,
                 max_wait_s: float = 60.0, max_free_heap: int = 128 << 20, *,
                 max_stream_receiving: int | None = None) -> None:  # fmt: skip
        if max_calls < 1 or any(n is not None and n < 1 for n in (max_receiving, max_stream_receiving)):
            raise ValueError("max_calls, max_receiving and max_stream_receiving must be at least 1")
        self.max_calls = max_calls
        self.open = 0
        self.refused = 0
        self.places = Places(max_receiving or max_calls, receive_timeout_s, max_wait_s, "messages")
        self.stream_places = StreamPlaces(max_stream_receiving or max_calls, receive_timeout_s, max_wait_s)
        self.probes = Places(1, PROBE_RECEIVE_S, PROBE_RECEIVE_S, "health checks")
        self.heap = HeapTrim(max_free=max_free_heap)

    async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = str(details.method)
        if method.startswith("/grpc.health.v1.Health/") and not handler.request_streaming:
            return self._probe(handler)
        if not method.startswith(COUNTED):
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

    def _probe(self, handler: Any) -> Any:
        """A health method (unary request) served through a request-streaming handler that reads its message in
        the probes' place."""
        kw = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}  # fmt: skip
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def check(requests: Any, context: Any) -> Any:
                try:
                    request = await self.probes.receive(requests, context, self.open, keep=True)
                    try:  # the place is held until the answer: one health message in memory at a time
                        return await inner(request, context)
                    finally:
                        del request
                        self.probes.release()
                except BaseException as exc:  # NOT_FOUND is an abort: its frames would keep the request
                    _forget(exc)
                    raise
                finally:
                    self.heap.poke()

            return grpc.stream_unary_rpc_method_handler(check, **kw)
        inner_stream = handler.unary_stream

        async def watch(requests: Any, context: Any) -> None:
            try:
                request = await self.probes.receive(requests, context, self.open)
            finally:
                self.heap.poke()
            try:
                result = inner_stream(request, context)
                if inspect.isasyncgen(result):
                    async for response in result:
                        await context.write(response)
                else:
                    await result
            except BaseException as exc:
                _forget(exc)
                raise

        return grpc.stream_stream_rpc_method_handler(watch, **kw)

    def _counted(self, handler: Any) -> Any:
        kw = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}  # fmt: skip
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(requests: Any, context: Any) -> Any:
                await self._admit(context)
                try:
                    request = await self.places.receive(requests, context, self.open)
                    try:
                        return await inner(request, context)
                    finally:
                        del request
                except BaseException as exc:
                    _forget(exc)
                    raise
                finally:
                    self.open -= 1
                    self.heap.poke()

            return grpc.stream_unary_rpc_method_handler(unary, **kw)
        inner_stream = handler.stream_stream

        async def streaming(requests: Any, context: Any) -> Any:
            await self._admit(context)
            try:
                gate = StreamGate(requests, self.stream_places, context)
                async for response in inner_stream(gate, context):
                    yield response
                    gate.answered()
                    self.heap.poke()  # an answered item's message is dropped
                if gate.refusal:  # it stopped reading: every message read has been answered
                    await context.abort_with_status(_overloaded_status(gate.refusal))
            except BaseException as exc:
                _forget(exc)
                raise
            finally:
                self.open -= 1
                self.heap.poke()

        return grpc.stream_stream_rpc_method_handler(streaming, **kw)


class HeapTrim:
    """Give the heap memory freed by finished calls back to the system (glibc's ``malloc_trim``, on a worker
    thread). gRPC core receives a message in many small buffers spread over glibc's per-thread arenas; once
    freed they stay in the process, and a later message received on another thread does not reuse them (16 x 60
    MB calls left +486 MiB resident; health checks read one at a time still grew it by 700 MiB). While calls
    end, the free heap (``mallinfo2``) is checked every ``interval_s`` / 5 and trimmed once it is over
    ``max_free`` bytes; ``interval_s`` after the last call it is trimmed whatever its size. Trimming sooner makes
    large messages fault their pages in afresh: with 64 MiB, 20 MiB images arrived at 0.66x the rate, with
    128 MiB at 1.0x (``benchmarks/bench_memory.py``). A no-op where the C library has no
    ``malloc_trim`` (musl, macOS); without ``mallinfo2`` (glibc < 2.33) every check trims."""

    def __init__(self, interval_s: float = 0.5, max_free: int = 128 << 20) -> None:
        self.interval_s = interval_s
        self.max_free = max_free
        self.trims = 0
        self._trim, self._free = _malloc_functions()
        self._pending: asyncio.Task[None] | None = None
        self._last = 0.0

    def poke(self) -> None:
        """A call that held a received message ended."""
        if self._trim is None:
            return
        loop = asyncio.get_running_loop()
        self._last = loop.time()
        if self._pending is None or self._pending.done():
            self._pending = loop.create_task(self._run())

    def _check(self) -> None:
        """Trim when the free heap is over ``max_free`` (a worker thread's job: both walk every arena)."""
        if self._trim is not None and (self._free is None or self._free() > self.max_free):
            self._trim(0)
            self.trims += 1

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while (quiet := loop.time() - self._last) < self.interval_s:
            await asyncio.sleep(min(self.interval_s - quiet, self.interval_s / 5))
            await asyncio.to_thread(self._check)
        if self._trim is not None:
            await asyncio.to_thread(self._trim, 0)
            self.trims += 1


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2``."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")
    ]  # fmt: skip


def _malloc_functions() -> tuple[Callable[[int], int] | None, Callable[[], int] | None]:
    """glibc's ``malloc_trim`` and the free heap bytes (``mallinfo2().fordblks``) through ctypes; None for what
    the C library lacks."""
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None, None
    try:
        info = libc.mallinfo2
    except AttributeError:
        return trim, None
    info.restype = _MallInfo2

    def free() -> int:
        return int(info().fordblks)

    return trim, free


def _forget(exc: BaseException) -> None:
    """Clear the local variables of the finished frames in ``exc``'s traceback. grpc.aio keeps an aborted call's
    exception with the call's state, and the traceback's frames hold the request and the context (which refers
    to that state): a reference cycle that would keep the request's bytes until the cyclic garbage collector
    happens to run."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:  # the exception and the ones it was raised from / during
        seen.add(id(link))
        traceback.clear_frames(link.__traceback__)
        link = link.__cause__ or link.__context__


def _status(code: Code, reason: str, message: str) -> Any:
    """A ``grpc.Status`` with the rich error model."""
    from grpc_status import rpc_status

    from negt2i.core.failures import Failure, FailureKind

    failure = Failure(FailureKind.STAGE_ERROR, message, code=code, reason=reason)
    return rpc_status.to_status(errors.to_status(failure, message))


def _overloaded_status(message: str) -> Any:
    """The ``grpc.Status`` of RESOURCE_EXHAUSTED (SERVER_OVERLOADED) with the rich error model."""
    return _status(Code.RESOURCE_EXHAUSTED, errors.Reason.SERVER_OVERLOADED, message)
