"""The one stream submitter (``negt2i.run.stream``) against a scripted in-process ``EvaluateStream`` server:
answers in job order, the window, ``prepare``'s refusals, the retry policy (only what the API marks
retryable), a stream the server ends with items unanswered, idle streams (closed by the client, or ended by
the server), and an iterator that fails."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from negt2i.client import EvaluatorClient
from negt2i.core.failures import Code, Failure, FailureKind
from negt2i.run.stream import INTERRUPTED, RetryPolicy, StreamSubmitter
from negt2i.wire import adapter
from negt2i.wire.errors import Reason
from negt2i.wire.v1 import common_pb2, evaluator_pb2
from tests.services.live import free_port

FAST = RetryPolicy(attempts=3, item_timeout=5.0, base=0.01, cap=0.05)

Script = Callable[[int, int], tuple[str, float]]
"""(item, its send number) -> (what the server does, after how many seconds): ``ok``, ``overloaded``,
``unavailable``, ``deadline``, ``too_large``, ``drop`` (never answered) or ``close`` (end the stream now)."""


def _error(code: Code, reason: Reason) -> evaluator_pb2.ItemError:
    return adapter.failure_to_proto(Failure(FailureKind.STAGE_ERROR, "scripted", code=code, reason=reason))


_ERRORS = {
    "overloaded": (Code.RESOURCE_EXHAUSTED, Reason.SERVER_OVERLOADED),
    "unavailable": (Code.UNAVAILABLE, Reason.STAGE_UNAVAILABLE),
    "deadline": (Code.DEADLINE_EXCEEDED, Reason.DEADLINE_EXCEEDED),
    "too_large": (Code.RESOURCE_EXHAUSTED, Reason.MESSAGE_TOO_LARGE),
}


class _Server:
    """``idle_end_s``: a stream with nothing unanswered for that long is ended RESOURCE_EXHAUSTED
    (SERVER_OVERLOADED, the rich error model), as the orchestrator ends an idle stream others wait behind."""

    def __init__(self, script: Script, idle_end_s: float | None = None) -> None:
        self.script = script
        self.idle_end_s = idle_end_s
        self.idle_ended = 0
        self.sends: Counter[int] = Counter()
        self.unanswered = 0
        self.most_unanswered = 0
        self.streams = 0
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(8))
        handlers = {
            "EvaluateStream": grpc.stream_stream_rpc_method_handler(
                self._stream, request_deserializer=evaluator_pb2.EvaluateRequest.FromString,
                response_serializer=evaluator_pb2.EvaluateStreamResponse.SerializeToString),
        }  # fmt: skip
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("negt2i.v1.Evaluator", handlers),))
        self.port = free_port()
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        self.server.start()

    def _stream(self, requests: Iterator[evaluator_pb2.EvaluateRequest], context: Any) -> Iterator[Any]:
        import queue

        out: queue.Queue[Any] = queue.Queue()
        timers: list[threading.Timer] = []
        with self._lock:
            self.streams += 1

        def answer(resp: Any) -> None:
            with self._lock:
                self.unanswered -= 1
            out.put(resp)

        def read() -> None:
            try:
                for request in requests:
                    item = int(request.image.data.decode())
                    with self._lock:
                        self.sends[item] += 1
                        send = self.sends[item]
                        self.unanswered += 1
                        self.most_unanswered = max(self.most_unanswered, self.unanswered)
                    action, delay = self.script(item, send)
                    if action == "close":
                        with self._lock:
                            self.unanswered -= 1
                        out.put(None)
                        return
                    if action == "drop":
                        continue
                    rid = request.request_id
                    if action == "ok":
                        resp = evaluator_pb2.EvaluateStreamResponse(
                            request_id=rid, result=evaluator_pb2.EvaluateResponse()
                        )
                    else:
                        resp = evaluator_pb2.EvaluateStreamResponse(request_id=rid, error=_error(*_ERRORS[action]))
                    timer = threading.Timer(delay, answer, args=(resp,))
                    timers.append(timer)
                    timer.start()
            except grpc.RpcError:  # the client cancelled (a stop): end the answers too
                out.put(None)
                return
            for timer in timers:
                timer.join()
            out.put(None)

        threading.Thread(target=read, daemon=True).start()
        idle_since = time.monotonic()
        while True:
            try:
                resp = out.get(timeout=0.05)
            except queue.Empty:
                if not context.is_active():  # the client left, or the server stopped: so does this thread
                    return  # (else it waits forever and the executor's exit hook hangs the interpreter's exit)
                if self.idle_end_s is None or time.monotonic() - idle_since < self.idle_end_s:
                    continue
                with self._lock:
                    if self.unanswered:
                        idle_since = time.monotonic()
                        continue
                    self.idle_ended += 1
                context.abort_with_status(_overloaded("the stream was idle while others waited"))
            idle_since = time.monotonic()
            if resp is None:
                return
            yield resp

    def stop(self) -> None:
        self.server.stop(0)


def _overloaded(message: str) -> Any:
    from grpc_status import rpc_status

    from negt2i.wire import errors

    failure = Failure(FailureKind.STAGE_ERROR, message, code=Code.RESOURCE_EXHAUSTED, reason=Reason.SERVER_OVERLOADED)
    return rpc_status.to_status(errors.to_status(failure, message))


def _request(item: int) -> evaluator_pb2.EvaluateRequest:
    return evaluator_pb2.EvaluateRequest(image=common_pb2.Image(data=str(item).encode()))


def _run(script: Script, items: Any, *, window: int = 4, policy: RetryPolicy = FAST,
         prepare: Callable[[int], Any] = _request, idle_end_s: float | None = None,
         idle_close: float = 60.0) -> tuple[list[Any], StreamSubmitter[int], _Server]:  # fmt: skip
    server = _Server(script, idle_end_s)
    try:
        with EvaluatorClient(f"127.0.0.1:{server.port}", timeout=None) as client:
            submitter = StreamSubmitter(client, prepare, window=window, policy=policy, warn=lambda _: None,
                                        idle_close=idle_close)  # fmt: skip
            answers = list(submitter.run(items))
    finally:
        server.stop()
    return answers, submitter, server


def test_answers_come_in_job_order_and_the_window_bounds_the_flight() -> None:
    # later items are answered first: the answers still come out in job order
    answers, submitter, server = _run(lambda item, _: ("ok", (20 - item) * 0.005), range(20), window=4)
    assert [a.index for a in answers] == list(range(20)) == [a.item for a in answers]
    assert all(a.response is not None and a.response.HasField("result") and not a.left for a in answers)
    assert server.most_unanswered <= 4 and submitter.stats.max_in_flight <= 4
    assert submitter.stats.answers == 20 and submitter.stats.retried == 0 and submitter.stats.streams == 1


def test_jobs_prepare_refuses_are_answered_in_order_and_never_sent() -> None:
    def prepare(item: int) -> Any:
        return Failure(FailureKind.UNREADABLE_IMAGE, "odd") if item % 2 else _request(item)

    answers, _, server = _run(lambda item, _: ("ok", 0.0), range(9), prepare=prepare)
    assert [a.index for a in answers] == list(range(9))
    assert [a.failure is not None for a in answers] == [bool(i % 2) for i in range(9)]
    assert set(server.sends) == {0, 2, 4, 6, 8}


def test_only_what_the_api_marks_retryable_is_sent_again() -> None:
    plan = {0: ["overloaded", "overloaded"], 1: ["deadline"], 2: ["too_large"], 3: ["unavailable"] * 5}

    def script(item: int, send: int) -> tuple[str, float]:
        steps = plan.get(item, [])
        return (steps[send - 1] if send <= len(steps) else "ok"), 0.0

    answers, submitter, server = _run(script, range(5))
    assert dict(server.sends) == {0: 3, 1: 1, 2: 1, 3: 3, 4: 1}  # attempts=3
    ok, late, too_large, down, fine = answers
    assert ok.response is not None and ok.response.HasField("result") and not ok.left
    assert late.left.startswith("DEADLINE_EXCEEDED") and late.response is not None  # transient: left, not retried
    assert not too_large.left and too_large.response is not None and too_large.response.HasField("error")  # final
    assert down.left.startswith("UNAVAILABLE")  # out of attempts: left for a rerun
    assert fine.response is not None and fine.response.HasField("result")
    assert submitter.stats.retried == 4 and submitter.stats.codes.count("RESOURCE_EXHAUSTED") == 2


def test_the_item_timeout_bounds_the_retries_of_one_item() -> None:
    policy = RetryPolicy(attempts=100, item_timeout=0.3, base=0.05, cap=0.05)
    answers, _, server = _run(lambda item, _: ("overloaded", 0.0), range(1), policy=policy)
    # backoffs of 0.025-0.05 s (jittered) within 0.3 s from the first send: at most 13 sends, never the 100 attempts
    assert answers[0].left.startswith("RESOURCE_EXHAUSTED") and 2 <= server.sends[0] <= 13


def test_a_stream_ended_with_items_unanswered_is_reopened_and_they_are_sent_again() -> None:
    def script(item: int, send: int) -> tuple[str, float]:
        if item == 3 and send == 1:
            return "close", 0.0
        return "ok", 0.0

    answers, submitter, server = _run(script, range(6), window=2)
    assert [a.index for a in answers] == list(range(6))
    assert all(a.response is not None and not a.left for a in answers)
    assert server.streams == 2 and submitter.stats.streams == 2 and server.sends[3] == 2


def test_the_stall_watchdog_stops_the_run_and_leaves_the_rest() -> None:
    policy = RetryPolicy(attempts=3, item_timeout=0.5, base=0.01, cap=0.05)
    start = time.monotonic()
    answers, submitter, _ = _run(lambda item, _: ("drop" if item == 1 else "ok", 0.0), range(8), window=2,
                                 policy=policy)  # fmt: skip
    # stopped by the watchdog (the stream_error below) once item 1 went unanswered for 0.5 s; 30 s only guards
    # against a watchdog on another clock than the item timeout (the figure is not the test's)
    assert time.monotonic() - start < 30
    assert [a.index for a in answers] == list(range(8))
    # the stuck item holds one of the two places; the others pass through the other; then nothing is answered
    assert [bool(a.left) for a in answers] == [i == 1 for i in range(8)]
    assert answers[1].response is None and "stopped answering" in answers[1].left
    assert submitter.stats.stream_error is not None and "stopped answering" in submitter.stats.stream_error


def test_stop_from_another_thread_ends_the_run_at_once_and_leaves_the_rest() -> None:
    """The one stop every driver uses on Ctrl-C (``negt2i generate --score`` calls it from the generating thread):
    nothing is answered here, so without it the run would wait for the stall watchdog (``item_timeout``, 5 s)."""
    server = _Server(lambda item, _: ("ok", 0.0) if item == 0 else ("drop", 0.0))
    try:
        with EvaluatorClient(f"127.0.0.1:{server.port}", timeout=None) as client:
            submitter = StreamSubmitter(client, _request, window=3, policy=FAST, warn=lambda _: None)
            threading.Timer(0.5, submitter.stop).start()
            start = time.monotonic()
            answers = list(submitter.run(range(6)))
            assert time.monotonic() - start < 3
    finally:
        server.stop()
    assert [a.index for a in answers] == list(range(6))
    assert answers[0].response is not None and not answers[0].left  # answered before the stop: kept
    assert all(a.left == INTERRUPTED and a.response is None for a in answers[1:])  # in flight or never sent
    assert set(server.sends) <= {0, 1, 2, 3} and submitter.stats.stream_error == INTERRUPTED
    submitter.stop("again")  # idempotent: the first reason stays
    assert submitter.stats.stream_error == INTERRUPTED


def test_an_iterator_that_fails_ends_the_run_with_its_error() -> None:
    def items() -> Iterator[int]:
        yield 0
        raise OSError("the queue is gone")

    with pytest.raises(OSError, match="the queue is gone"):
        _run(lambda item, _: ("ok", 0.0), items())


def paused_jobs(pauses: dict[int, float], count: int) -> Iterator[int]:
    """Jobs 0..count-1, sleeping ``pauses[i]`` seconds before job i (a generator between images)."""
    for i in range(count):
        time.sleep(pauses.get(i, 0.0))
        yield i


def test_a_paused_client_closes_its_stream_and_reopens_it_for_the_next_job() -> None:
    """Nothing to send and nothing unanswered for ``idle_close``: the stream is half-closed (it holds no
    reception place on the server); the next job opens a new one, and nothing counts as a failure."""
    answers, submitter, server = _run(lambda item, _: ("ok", 0.0), paused_jobs({2: 1.0}, 4), idle_close=0.2)
    assert [a.index for a in answers] == list(range(4))
    assert all(a.response is not None and a.response.HasField("result") and not a.left for a in answers)
    assert server.streams == 2 and submitter.stats.streams == 2 and submitter.stats.idle_ends == 1
    assert submitter.stats.retried == 0 and submitter.stats.stream_error is None


def test_a_stream_the_server_ends_while_idle_is_reopened_for_the_next_job_and_is_no_failure() -> None:
    """The server ends every stream idle for 0.1 s (RESOURCE_EXHAUSTED, retryable); the client pauses 0.5 s
    before each job, so every stream it opens ends so, more times in a row than ``attempts`` (3) allows failures
    without an answer: the run still judges every job, each on a stream opened when the job was ready (before:
    reopened at once, idle, ended again, and the run stopped after 3)."""
    answers, submitter, server = _run(lambda item, _: ("ok", 0.0), paused_jobs(dict.fromkeys(range(5), 0.5), 5),
                                      idle_end_s=0.1)  # fmt: skip
    assert [a.index for a in answers] == list(range(5))
    assert all(a.response is not None and a.response.HasField("result") and not a.left for a in answers), answers
    assert submitter.stats.stream_error is None and submitter.stats.retried == 0
    assert server.idle_ended >= 4 and submitter.stats.idle_ends >= 4
    assert submitter.stats.streams <= 6  # one per job (and the first, opened before job 0 was ready)
