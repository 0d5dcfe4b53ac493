"""The one stream submitter: an ordered iterator of jobs in, their answers out in the same order.

``negt2i submit``, ``negt2i generate --score`` (and any other client that judges many images
through ``negt2i.v1.Evaluator/EvaluateStream``) drive a ``StreamSubmitter``::

    from negt2i.client import EvaluatorClient, make_request
    from negt2i.run.stream import StreamSubmitter

    with EvaluatorClient("127.0.0.1:50051") as client:
        submitter = StreamSubmitter(client, lambda job: make_request(job.data, prompt=job.prompt), window=32)
        for answer in submitter.run(jobs):           # any iterable; it may block (a queue being filled)
            if answer.left:                          # no final answer: sent again by a rerun
                ...
            elif answer.failure is not None:         # ``prepare`` refused it (never sent)
                ...
            else:                                    # answer.response: the item's verdict or its ItemError
                ...

``prepare`` turns a job into its ``EvaluateRequest`` (or a ``negt2i.core.failures.Failure``: the job is
answered at once with it and never sent); it runs once per job, on the submitter's intake thread,
and the request is kept until the job's final answer (its ``request_id`` is set to the job's index).

**Back-pressure.** At most ``window`` jobs are in flight: taken from the iterator and not yet
finally answered (sent and unanswered, or waiting for a retry). The iterator is read only while
there is room, so a producer that feeds it from a bounded queue waits exactly at the bound.
Answers are yielded in job order; at most ``4 x window`` jobs are held (answered, waiting for an
earlier one), and the iterator waits beyond that as well.

**The retry policy** (``RetryPolicy``; the same for every driver). Only what the API marks
retryable is sent again within the run (docs/api.md, "Errors": ``retryable``): an item answered
``RESOURCE_EXHAUSTED`` (``SERVER_OVERLOADED``, ``STAGE_OVERLOADED``; never ``MESSAGE_TOO_LARGE``) or
``UNAVAILABLE``, after a jittered exponential backoff (``negt2i.transport.backoff_delay``: 0.2 s
doubling to 10 s, jittered to ``[d/2, d]``), up to ``attempts`` sends, while its ``item_timeout``
(from its first send) and the run's ``timeout`` leave room. A stream that ends with a retryable
status (``ClientError.retryable``: the orchestrator restarting, a connection closed, CANCELLED by a
server ending an old connection), or that the server ends with items unanswered, is reopened after
the same backoff and its unanswered items are sent again, at most ``attempts`` times in a row
without an answer in between. A final answer that is still *transient* (``transient``: one of
``TRANSIENT``, e.g. ``DEADLINE_EXCEEDED`` or a retryable code after the last attempt) is yielded with
``left`` set: the drivers write no line for it, so a rerun judges it.

**Idle streams.** A stream with nothing to send and nothing unanswered for ``idle_close`` seconds
(default ``IDLE_CLOSE_S``) is half-closed, and the next job opens a new one: a client that pauses (a
generator between images) holds no reception place on the server, which ends a stream that idles while
others wait to send (``RESOURCE_EXHAUSTED``, docs/services.md, "Memory before a message is read"). A stream
that ends with nothing unanswered and nothing waiting to be sent, cleanly or with a retryable status, is
not a failure: it is reopened when the next job is ready.

**The stall watchdog.** When no answer arrives for ``item_timeout`` seconds while items are sent and
unanswered, the run stops (``StreamStats.stream_error`` says the orchestrator stopped answering).

**Stopping.** After a stop (stall, a stream error that is not retryable or out of attempts, the run's
``timeout``, the caller leaving the loop, or ``stop`` called from another thread) every job not finally
answered, and every job the iterator still gives, is yielded with ``left`` set to the reason, in order;
nothing more is sent and the open stream is cancelled. This is how every driver stops on an interrupt
(Ctrl-C): ``negt2i submit`` leaves the loop (the ``KeyboardInterrupt`` passes through it), ``negt2i generate
--score``, whose answers are read on a thread of their own, calls ``stop`` from the generating thread; either
way the run ends within seconds, every answered job keeps its line and the rest is left for the rerun.
"""

from __future__ import annotations

import heapq
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from negt2i.core.failures import Code, Failure
from negt2i.transport import DEFAULT_ATTEMPTS, RETRYABLE, backoff_delay

if TYPE_CHECKING:
    from negt2i.client import EvaluatorClient
    from negt2i.wire.v1 import evaluator_pb2

T = TypeVar("T")

TRANSIENT: Final[frozenset[Code]] = RETRYABLE | {Code.DEADLINE_EXCEEDED, Code.CANCELLED}
"""Status codes of a final answer that leave the item for a rerun (no results line) rather than an error line."""
DEFAULT_ITEM_TIMEOUT_S: Final = 600.0
"""An item unanswered this long (from its first send) is not retried; no answer for this long stops the run."""
HOLD: Final = 4
"""Answered jobs held for the order (waiting for an earlier one): at most ``HOLD x window``."""
IDLE_CLOSE_S: Final = 5.0
"""A stream with nothing to send and nothing unanswered this long is half-closed (reopened for the next job)."""
INTERRUPTED: Final = "the run was interrupted"
"""The reason of the jobs an interrupt leaves for a rerun (``StreamSubmitter.stop``)."""


def retryable(err: evaluator_pb2.ItemError) -> bool:
    """Whether an item answered with ``err`` may succeed when sent again unchanged: its code is in
    ``RETRYABLE`` and its ``ErrorInfo.reason`` is not ``MESSAGE_TOO_LARGE``."""
    from negt2i.wire import adapter

    return Code.of(err.code) in RETRYABLE and adapter.failure_from_proto(err).reason != "MESSAGE_TOO_LARGE"


def transient(err: evaluator_pb2.ItemError) -> bool:
    """Whether a final answer ``err`` leaves its item for a rerun (no line): its code is in ``TRANSIENT``, and
    it is not an oversized message (a retryable code that ``retryable`` refuses)."""
    code = Code.of(err.code)
    return code in TRANSIENT and (code not in RETRYABLE or retryable(err))


@dataclass(frozen=True)
class RetryPolicy:
    """How a ``StreamSubmitter`` retries (see the module docstring)."""

    attempts: int = DEFAULT_ATTEMPTS
    item_timeout: float = DEFAULT_ITEM_TIMEOUT_S
    base: float = 0.2
    """First backoff, seconds (doubled per attempt)."""
    cap: float = 10.0
    """Longest backoff, seconds."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.item_timeout <= 0:
            raise ValueError(f"item_timeout must be > 0, got {self.item_timeout}")

    def delay(self, attempt: int) -> float:
        """Seconds before retry ``attempt`` (0-based), jittered (``negt2i.transport.backoff_delay``)."""
        return backoff_delay(attempt, self.base, self.cap)


@dataclass(frozen=True)
class Answer(Generic[T]):
    """One job's outcome, yielded in job order."""

    index: int
    """The job's position in the iterator (0-based; its ``request_id``)."""
    item: T
    response: evaluator_pb2.EvaluateStreamResponse | None = None
    """The final answer: a verdict, or an ``ItemError`` (a transient one when ``left`` is set)."""
    failure: Failure | None = None
    """Why ``prepare`` refused the job (never sent)."""
    left: str = ""
    """Non-empty: the job has no final answer and is left for a rerun; why (a transient answer's
    ``CODE: message``, or why the run stopped)."""


@dataclass
class StreamStats:
    """What the streams did."""

    answers: int = 0
    """Responses received (retried ones included)."""
    retried: int = 0
    """Sends repeated after a retryable answer, or because a failed stream's items were sent again."""
    stream_error: str | None = None
    """Why the run stopped early, if it did."""
    streams: int = 0
    """Streams opened."""
    idle_ends: int = 0
    """Streams that ended with nothing unanswered and nothing to send (closed idle, or ended by the server)."""
    max_in_flight: int = 0
    """The most jobs in flight at once."""
    codes: list[str] = field(default_factory=list)
    """The code of every retried item answer, in arrival order (``RESOURCE_EXHAUSTED`` ...)."""


_RESP: Final = "resp"
_END: Final = "end"
_WAKE: Final = "wake"


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


class StreamSubmitter(Generic[T]):
    """Submit jobs over ``EvaluateStream`` with back-pressure, the one retry policy and the stall watchdog.

    ``client``: an ``EvaluatorClient`` or a target (``host:port``; a client is opened and closed by
    ``run``); ``prepare``: a job's request or the ``Failure`` that keeps it from being sent; ``window``:
    the most jobs in flight (take the orchestrator's ``ServiceInfo.limits.max_in_flight_per_stream`` as the
    upper bound); ``timeout``: seconds for the whole run (None: no limit). See the module docstring.
    """

    def __init__(
        self,
        client: EvaluatorClient | str,
        prepare: Callable[[T], evaluator_pb2.EvaluateRequest | Failure],
        *,
        window: int,
        policy: RetryPolicy | None = None,
        timeout: float | None = None,
        warn: Callable[[str], None] = _warn,
        idle_close: float = IDLE_CLOSE_S,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if idle_close <= 0:
            raise ValueError(f"idle_close must be > 0, got {idle_close}")
        self.client = client
        self.prepare = prepare
        self.window = window
        self.policy = policy or RetryPolicy()
        self.timeout = timeout
        self.warn = warn
        self.idle_close = idle_close
        self.stats = StreamStats()
        self._cond = threading.Condition()
        self._events: queue.Queue[tuple[str, int, Any]] = queue.Queue()
        self._items: dict[int, T] = {}
        self._requests: dict[int, evaluator_pb2.EvaluateRequest] = {}
        self._sends: dict[int, int] = {}
        self._first: dict[int, float] = {}
        self._ready: deque[int] = deque()
        self._retry: list[tuple[float, int]] = []
        self._outstanding: dict[int, float] = {}
        self._done: dict[int, Answer[T]] = {}
        self._pulled = 0
        self._next = 0
        self._source_done = False
        self._source_error: BaseException | None = None
        self._generation = 0
        self._stopped = ""
        self._call: Any = None
        """The open stream (cancelled by a stop)."""

    # ------------------------------------------------------------------ state (under self._cond)

    def in_flight(self) -> int:
        """Jobs taken from the iterator and not yet finally answered."""
        with self._cond:
            return self._pulled - self._next - len(self._done)

    def _room(self) -> bool:
        held = self._pulled - self._next
        return held - len(self._done) < self.window and held < HOLD * self.window

    def _stop(self, reason: str, call: Any = None) -> None:
        """Stop sending: every job not finally answered is left for a rerun with ``reason``."""
        with self._cond:
            if self._stopped:
                return
            self._stopped = reason
            self._generation += 1
            for i, item in self._items.items():  # taken and not yet yielded: sent, waiting, or being prepared
                if i not in self._done:
                    self._done[i] = Answer(i, item, left=reason)
            self._outstanding.clear()
            self._retry.clear()
            self._ready.clear()
            self._requests.clear()
            self._cond.notify_all()
        if call is not None:
            call.cancel()

    def stop(self, reason: str = INTERRUPTED) -> None:
        """Stop the run now, from any thread (see "Stopping" in the module docstring): nothing more is sent, the
        open stream is cancelled, and ``run`` yields every job not finally answered with ``left=reason`` and ends
        once its iterator does. Idempotent; the first reason wins."""
        self._stop(reason)
        call = self._call
        if call is not None:  # also a stream opened while the stop was under way
            call.cancel()
        self._events.put((_WAKE, -1, None))

    # ------------------------------------------------------------------ threads

    def _intake(self, source: Iterator[T]) -> None:
        """Take jobs while there is room, prepare them, queue them for sending (or answer them at once)."""
        try:
            while True:
                with self._cond:
                    while not self._stopped and not self._room():
                        self._cond.wait(1.0)
                try:
                    item = next(source)
                except StopIteration:
                    return
                with self._cond:
                    index = self._pulled
                    self._pulled += 1
                    self._items[index] = item
                    in_flight = self._pulled - self._next - len(self._done)
                    self.stats.max_in_flight = max(self.stats.max_in_flight, in_flight)
                    stopped = self._stopped
                if stopped:
                    self._answer(Answer(index, item, left=stopped))
                    continue
                prepared = self.prepare(item)
                if isinstance(prepared, Failure):
                    self._answer(Answer(index, item, failure=prepared))
                    continue
                prepared.request_id = str(index)
                with self._cond:
                    if not self._stopped:  # else it was left by the stop
                        self._requests[index] = prepared
                        self._ready.append(index)
                    self._cond.notify_all()
                self._events.put((_WAKE, -1, None))
        except BaseException as exc:  # the iterator or prepare failed: the run stops and run() raises it
            with self._cond:
                self._source_error = exc
            self._stop(f"{type(exc).__name__}: {exc}")
        finally:
            with self._cond:
                self._source_done = True
                self._cond.notify_all()
            self._events.put((_WAKE, -1, None))

    def _answer(self, answer: Answer[T]) -> None:
        with self._cond:
            if answer.index in self._done or answer.index < self._next:  # left already by a stop
                return
            self._done[answer.index] = answer
            self._cond.notify_all()
        self._events.put((_WAKE, -1, None))

    def _request_iterator(self, generation: int) -> Iterator[evaluator_pb2.EvaluateRequest]:
        """One stream's requests: new jobs and due retries; it ends (half-close) when every job is answered, or
        after ``idle_close`` seconds with nothing to send and nothing unanswered."""
        idle_from: float | None = None
        while True:
            with self._cond:
                while True:
                    if self._generation != generation:
                        return
                    now = time.monotonic()
                    index: int | None = None
                    if self._retry and self._retry[0][0] <= now:
                        index = heapq.heappop(self._retry)[1]
                    elif self._ready:
                        index = self._ready.popleft()
                    if index is not None:
                        self._outstanding[index] = now
                        self._sends[index] = self._sends.get(index, 0) + 1
                        self._first.setdefault(index, now)
                        request = self._requests[index]
                        break
                    if self._source_done and not (self._retry or self._outstanding):
                        return
                    if self._retry or self._outstanding:
                        idle_from = None
                    elif idle_from is None:
                        idle_from = now
                    elif now - idle_from >= self.idle_close:
                        return
                    wait = self._retry[0][0] - now if self._retry else 1.0
                    if idle_from is not None:
                        wait = min(wait, idle_from + self.idle_close - now)
                    self._cond.wait(min(max(wait, 0.01), 1.0))
            idle_from = None  # the idle clock restarts after a send, even if its answer comes before the next look
            yield request

    def _read(self, call: Any, generation: int) -> None:
        try:
            for resp in call:
                self._events.put((_RESP, generation, resp))
            self._events.put((_END, generation, None))
        except Exception as exc:  # grpc.RpcError: the stream failed
            self._events.put((_END, generation, exc))

    # ------------------------------------------------------------------ the run

    def _handle(self, resp: evaluator_pb2.EvaluateStreamResponse, run_end: float | None) -> None:
        self.stats.answers += 1
        try:
            index = int(resp.request_id)
        except ValueError:
            index = -1
        with self._cond:
            if index not in self._items:
                self.warn(f"ignoring an answer for unknown request {resp.request_id[:64]!r}")
                return
            if index not in self._outstanding:  # a late answer to an item already answered or abandoned
                return
            if resp.HasField("error") and retryable(resp.error):
                sends = self._sends[index]
                delay = self.policy.delay(sends - 1)
                now = time.monotonic()
                room = now + delay - self._first[index] < self.policy.item_timeout
                room = room and (run_end is None or now + delay < run_end)
                if sends < self.policy.attempts and room:
                    del self._outstanding[index]
                    heapq.heappush(self._retry, (now + delay, index))
                    self.stats.retried += 1
                    self.stats.codes.append(Code.of(resp.error.code).name)
                    self._cond.notify_all()
                    return
            del self._outstanding[index]
            self._requests.pop(index, None)
            left = ""
            if resp.HasField("error") and transient(resp.error):
                left = f"{Code.of(resp.error.code).name}: {resp.error.message}"
            self._done[index] = Answer(index, self._items[index], response=resp, left=left)
            self._cond.notify_all()

    def _abandon(self, delay: float) -> int:
        """End the current stream's request iterator; its unanswered items are sent again after ``delay``."""
        with self._cond:
            self._generation += 1
            lost = list(self._outstanding)
            due = time.monotonic() + delay
            for index in lost:
                heapq.heappush(self._retry, (due, index))
            self._outstanding.clear()
            self._cond.notify_all()
            return len(lost)

    def _in_order(self) -> list[Answer[T]]:
        out: list[Answer[T]] = []
        with self._cond:
            while self._next in self._done:
                answer = self._done.pop(self._next)
                self._items.pop(self._next, None)
                out.append(answer)
                self._next += 1
            if out:
                self._cond.notify_all()
        return out

    def _has_work(self) -> bool:
        """Jobs ready to send or waiting for a retry."""
        with self._cond:
            return bool(self._ready or self._retry)

    def _finished(self) -> bool:
        with self._cond:
            return self._source_done and self._next == self._pulled

    def run(self, items: Iterable[T]) -> Iterator[Answer[T]]:
        """Send ``items`` and yield one ``Answer`` per item, in their order (see the module docstring)."""
        from negt2i.client import EvaluatorClient, client_error

        own = isinstance(self.client, str)
        client = EvaluatorClient(self.client, timeout=None) if isinstance(self.client, str) else self.client
        run_end = None if self.timeout is None else time.monotonic() + self.timeout
        intake = threading.Thread(target=self._intake, args=(iter(items),), name="negt2i-stream-intake", daemon=True)
        intake.start()
        call: Any = None
        reader: threading.Thread | None = None
        reopen_at = time.monotonic()
        lazy = False  # the last stream ended idle: open the next one when there is something to send
        failures = 0  # streams in a row that failed without an answer in between
        last_answer = time.monotonic()
        try:
            while True:
                yield from self._in_order()
                if self._finished():
                    break
                now = time.monotonic()
                if run_end is not None and now >= run_end and not self._stopped:
                    self._stop(f"DEADLINE_EXCEEDED: the run's timeout of {self.timeout:.0f} s passed", call)
                if call is None and not self._stopped and now >= reopen_at and (not lazy or self._has_work()):
                    lazy = False
                    with self._cond:
                        generation = self._generation
                    left = None if run_end is None else run_end - now
                    call = self._call = client.stream_call(self._request_iterator(generation), timeout=left)
                    self.stats.streams += 1
                    last_answer = now
                    reader = threading.Thread(target=self._read, args=(call, generation), name="negt2i-stream-reader",
                                              daemon=True)  # fmt: skip
                    reader.start()
                wait = 0.5 if call is not None or self._stopped or lazy else min(0.5, max(reopen_at - now, 0.0))
                try:
                    kind, generation, payload = self._events.get(timeout=wait)
                except queue.Empty:
                    kind, generation, payload = _WAKE, -1, None
                with self._cond:
                    current = generation == self._generation
                if kind == _RESP and current:
                    failures = 0
                    last_answer = time.monotonic()
                    self._handle(payload, run_end)
                elif kind == _END and current and not self._stopped:
                    call = self._call = None
                    with self._cond:
                        unanswered = len(self._outstanding) + len(self._retry) + len(self._ready)
                        done = self._source_done and not unanswered
                    if payload is None and done:
                        continue
                    if not unanswered and (payload is None or client_error(payload).retryable):
                        # closed idle by us, or ended by the server while idle (docs/api.md): not a failure
                        self._abandon(0.0)
                        self.stats.idle_ends += 1
                        lazy = True
                        continue
                    if payload is None:  # the server ended the stream with items unanswered
                        from negt2i.client import ClientError

                        err = ClientError(Code.UNAVAILABLE.name, f"the orchestrator closed the stream with "
                                          f"{unanswered} images unanswered")  # fmt: skip
                    else:
                        err = client_error(payload)
                    delay = self.policy.delay(failures)
                    failures += 1
                    if (
                        err.retryable
                        and failures < self.policy.attempts
                        and (run_end is None or time.monotonic() + delay < run_end)
                    ):
                        lost = self._abandon(delay)
                        self.stats.retried += lost
                        self.warn(f"the stream ended ({err.code}: {err.details[:200]}); reconnecting in "
                                  f"{delay:.1f} s and resending {lost} images")  # fmt: skip
                        reopen_at = time.monotonic() + delay
                        continue
                    self._stop(str(err))
                # the stall watchdog
                with self._cond:
                    oldest = min(self._outstanding.values()) if self._outstanding else None
                    count = len(self._outstanding)
                stalled = oldest is not None and time.monotonic() - max(oldest, last_answer) > self.policy.item_timeout
                if call is not None and stalled and not self._stopped:
                    target = getattr(client, "target", "?")
                    self._stop(f"the orchestrator at {target} stopped answering: no answer for "
                               f"{self.policy.item_timeout:.0f} s with {count} images in flight", call)  # fmt: skip
                if self._stopped and self.stats.stream_error is None:
                    self.stats.stream_error = self._stopped
            with self._cond:
                error = self._source_error
            if error is not None:
                raise error
        finally:
            self.stop()  # the caller left the loop (Ctrl-C, an error) or the run ended: nothing more is sent
            if reader is not None:
                reader.join(timeout=5)
            if own:
                client.close()
