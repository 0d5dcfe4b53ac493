"""Memory before a message is read (issue 31, item 6), against real orchestrator processes: calls without the
token cost one HTTP/2 stream window each, unary messages are received ``NEGT2I_MAX_RECEIVING`` at a time and
their memory goes back to the system, a silent call gives its place up after ``NEGT2I_RECEIVE_TIMEOUT_S``.
The bounds are docs/services.md's ("Memory"), computed by ``benchmarks.bench_memory.documented``; the same
helpers print the 16 x 60 MB figures (``benchmarks/bench_memory.py``)."""

from __future__ import annotations

import functools
import queue
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from benchmarks.bench_memory import METHOD, TOKEN, burst, documented, measure, request_bytes, start
from negt2i.core.failures import Code

pytestmark = [
    pytest.mark.xdist_group("reliability"),
    pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc (VmHWM)"),
]

MB = 1_000_000


def test_calls_without_the_token_cost_one_stream_window_each(tmp_path: Path) -> None:
    """16 concurrent 24 MB calls without the token on one connection (where gRPC's automatic window grows
    most): each is refused UNAUTHENTICATED without its message being read, and the server grows by no more than
    the documented 4 MiB + 64 KiB per call (before: 12-53 MiB, the window grown by BDP probing)."""
    calls, size = 16, 24 * MB
    with start({"NEGT2I_AUTH_TOKEN": TOKEN}, tmp_path) as server:
        time.sleep(0.5)
        peak, _after, codes = measure(server.pid, functools.partial(
            burst, server.target, request_bytes(size), calls, connections=1), settle_s=0.2)  # fmt: skip
        assert codes == {"UNAUTHENTICATED": calls}, server.tail()
        bound = documented(calls, size)["unauthenticated"]
        assert peak <= bound, f"grew {peak:.0f} MiB, the documented bound is {bound:.0f} MiB"


def test_unary_messages_are_received_a_few_at_a_time_and_their_memory_returns(tmp_path: Path) -> None:
    """16 concurrent 15 MB calls with the token, one connection each, over NEGT2I_MAX_MESSAGE_BYTES (8 MiB) but
    under the transport limit: all are read and answered RESOURCE_EXHAUSTED (MESSAGE_TOO_LARGE), one at a time
    (NEGT2I_MAX_RECEIVING=1), so the peak stays under the documented (3 x 1 + 1) x 15 MB + 145 MiB (before:
    198-262 MiB, every message received at once), and 1.5 s later the memory is back with the system (before:
    143-234 MiB kept)."""
    calls, size = 16, 15 * MB
    env = {"NEGT2I_AUTH_TOKEN": TOKEN, "NEGT2I_MAX_MESSAGE_BYTES": str(8 << 20), "NEGT2I_MAX_RECEIVING": "1"}
    with start(env, tmp_path) as server:
        time.sleep(0.5)
        peak, after, codes = measure(server.pid, functools.partial(
            burst, server.target, request_bytes(size), calls, token=TOKEN, connections=calls))  # fmt: skip
        assert codes == {"RESOURCE_EXHAUSTED": calls}, server.tail()
        bound = documented(calls, size, max_message_bytes=8 << 20, max_receiving=1)["authenticated"]
        assert peak <= bound, f"grew {peak:.0f} MiB at the peak, the documented bound is {bound:.0f} MiB"
        assert after <= 64, f"{after:.0f} MiB still held 1.5 s after the calls"


def test_health_checks_of_any_size_are_read_one_at_a_time(tmp_path: Path) -> None:
    """Health checks need no token, so anyone may send 16 concurrent 24 MB ones: they are read one at a time
    (the others wait 2 s for the place, then RESOURCE_EXHAUSTED), so the peak stays under the documented 4 x
    24 MB + 144 MiB (before: every one read at once, +1.3 GiB for 16 x 60 MB), and a real health check is
    answered afterwards."""
    from benchmarks.bench_memory import HEALTH
    from tests.services.live import wait_health

    calls, size = 16, 24 * MB
    with start({"NEGT2I_AUTH_TOKEN": TOKEN}, tmp_path) as server:
        time.sleep(0.5)
        peak, after, codes = measure(server.pid, functools.partial(
            burst, server.target, request_bytes(size), calls, connections=calls, method=HEALTH))  # fmt: skip
        assert set(codes) <= {"NOT_FOUND", "RESOURCE_EXHAUSTED"} and codes["NOT_FOUND"] >= 1, codes
        bound = documented(calls, size)["health"]
        assert peak <= bound, f"grew {peak:.0f} MiB at the peak, the documented bound is {bound:.0f} MiB"
        assert after <= 64, f"{after:.0f} MiB still held 1.5 s after the calls"
        assert wait_health(server.target, "NOT_SERVING", timeout=10) == "NOT_SERVING"  # stages point nowhere


def test_a_silent_call_gives_its_place_up_after_the_receive_timeout(tmp_path: Path) -> None:
    """NEGT2I_MAX_RECEIVING=1: a call that never sends its message holds the one place, so another call waits
    (unread) and is refused RESOURCE_EXHAUSTED after NEGT2I_MAX_WAIT_S, with the rich error model; after
    NEGT2I_RECEIVE_TIMEOUT_S the silent call ends DEADLINE_EXCEEDED and calls are read again."""
    from grpc_status import rpc_status

    env = {"NEGT2I_AUTH_TOKEN": TOKEN, "NEGT2I_MAX_RECEIVING": "1", "NEGT2I_RECEIVE_TIMEOUT_S": "2",
           "NEGT2I_MAX_WAIT_S": "0.5"}  # fmt: skip
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    with start(env, tmp_path) as server, grpc.insecure_channel(server.target) as channel:
        feed: queue.Queue[Any] = queue.Queue()
        t0 = time.monotonic()
        silent = channel.stream_unary(METHOD).future(iter(feed.get, None), timeout=30, metadata=metadata)
        try:
            time.sleep(0.5)  # the silent call has taken the place
            unary = channel.unary_unary(METHOD)
            with pytest.raises(grpc.RpcError) as waited:
                unary(request_bytes(1000), timeout=30, metadata=metadata)
            assert waited.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, waited.value.details()
            assert "being received" in (waited.value.details() or "")
            assert rpc_status.from_call(waited.value) is not None, "no rich error model: clients would not retry"
            with pytest.raises(grpc.RpcError) as ended:
                silent.result(timeout=30)
            assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, ended.value.details()
            assert "did not arrive within 2 s" in (ended.value.details() or "")
            assert 1.5 <= time.monotonic() - t0 <= 20
        finally:
            feed.put(None)
        with pytest.raises(grpc.RpcError) as served:  # read and judged: the prompt id is unknown
            unary(request_bytes(1000), timeout=30, metadata=metadata)
        assert served.value.code() == grpc.StatusCode.NOT_FOUND, served.value.details()


def test_stream_messages_are_received_a_few_at_a_time_and_their_memory_returns(tmp_path: Path) -> None:
    """16 concurrent streams with the token, one connection each, each sending one 60 MB message (over
    NEGT2I_MAX_MESSAGE_BYTES, under the transport limit): every item is read and answered RESOURCE_EXHAUSTED
    (MESSAGE_TOO_LARGE), one message at a time (NEGT2I_MAX_STREAM_RECEIVING=1), so the peak stays under the
    documented (1 + 2) x 60 MB + 145 MiB (before: +748 MiB, every stream's message received at once), and 1.5 s
    later the memory is back with the system."""
    from benchmarks.bench_memory import stream_burst

    calls, size = 16, 60 * MB
    with start({"NEGT2I_AUTH_TOKEN": TOKEN, "NEGT2I_MAX_STREAM_RECEIVING": "1"}, tmp_path) as server:
        time.sleep(0.5)
        peak, after, codes = measure(server.pid, functools.partial(
            stream_burst, server.target, request_bytes(size), calls, token=TOKEN, connections=calls))  # fmt: skip
        assert codes == {"RESOURCE_EXHAUSTED": calls}, (codes, server.tail())
        bound = documented(calls, size, max_stream_receiving=1)["streams"]
        assert peak <= bound, f"grew {peak:.0f} MiB at the peak, the documented bound is {bound:.0f} MiB"
        assert after <= 64, f"{after:.0f} MiB still held 1.5 s after the streams"


def _stream_status(call: Any) -> tuple[list[str], Any]:
    """The answers' request ids of a stream call and the error that ended it (None: OK)."""
    from negt2i.wire.v1 import evaluator_pb2

    ids = []
    try:
        for raw in call:
            ids.append(evaluator_pb2.EvaluateStreamResponse.FromString(raw).request_id)
    except grpc.RpcError as exc:
        return ids, exc
    return ids, None


@dataclass
class _Silent:
    """An orchestrator, a stream on it whose client sends nothing (``call``: it has asked for its first message,
    so it holds a reception place), ``open``: another stream sending the given messages, ``close``: the silent
    client half-closes."""

    server: Any
    call: Any
    open: Callable[..., Any]
    close: Callable[[], None]


@contextmanager
def _behind_a_silent_stream(env: dict[str, str], tmp: Path) -> Iterator[_Silent]:
    from benchmarks.bench_memory import STREAM

    metadata = (("authorization", f"Bearer {TOKEN}"),)
    with start({"NEGT2I_AUTH_TOKEN": TOKEN, **env}, tmp) as server, grpc.insecure_channel(server.target) as channel:
        feed: queue.Queue[Any] = queue.Queue()

        def open_stream(*messages: bytes) -> Any:
            return channel.stream_stream(STREAM)(iter(messages), timeout=60, metadata=metadata)

        silent = channel.stream_stream(STREAM)(iter(feed.get, None), timeout=60, metadata=metadata)
        try:
            time.sleep(0.5)  # the silent stream has asked for its first message: it holds the place
            yield _Silent(server, silent, open_stream, lambda: feed.put(None))
        finally:
            feed.put(None)


def test_an_idle_stream_gives_its_place_up_to_a_stream_waiting_to_send(tmp_path: Path) -> None:
    """NEGT2I_MAX_STREAM_RECEIVING=1: a stream whose client stays silent holds the one place; a second stream's
    message waits for it, and once the silent stream has been idle NEGT2I_RECEIVE_TIMEOUT_S (1 s) it is ended
    RESOURCE_EXHAUSTED (SERVER_OVERLOADED, the rich error model: clients reopen it) and the second stream's item
    is read and answered. Before: the silent stream held nothing and was never ended."""
    from grpc_status import rpc_status

    env = {"NEGT2I_MAX_STREAM_RECEIVING": "1", "NEGT2I_RECEIVE_TIMEOUT_S": "1"}
    with _behind_a_silent_stream(env, tmp_path) as silent:
        t0 = time.monotonic()
        ids, error = _stream_status(silent.open(request_bytes(1000, "b1")))
        waited = time.monotonic() - t0
        assert ids == ["b1"] and error is None, (ids, error, silent.server.tail())
        assert 0.4 <= waited <= 20, waited
        silent_ids, ended = _stream_status(silent.call)
        assert silent_ids == [] and ended is not None and ended.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "idle" in (ended.details() or ""), ended.details()
        assert rpc_status.from_call(ended) is not None, "no rich error model: clients would not reopen it"


def test_a_stream_that_gets_no_place_in_time_ends_resource_exhausted(tmp_path: Path) -> None:
    """The silent stream is not idle long enough to be ended (NEGT2I_RECEIVE_TIMEOUT_S 30 s): a second stream
    waits NEGT2I_MAX_WAIT_S (0.5 s) for the place without its message being read, then ends RESOURCE_EXHAUSTED
    (SERVER_OVERLOADED) with nothing answered, so its client sends the item again."""
    from grpc_status import rpc_status

    with _behind_a_silent_stream({"NEGT2I_MAX_STREAM_RECEIVING": "1", "NEGT2I_MAX_WAIT_S": "0.5"}, tmp_path) as silent:
        ids, error = _stream_status(silent.open(request_bytes(1000, "b1")))
        assert ids == [] and error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (ids, error)
        assert "at capacity" in (error.details() or ""), error.details()
        assert rpc_status.from_call(error) is not None
        silent.close()
        assert _stream_status(silent.call) == ([], None)  # the silent stream half-closed: it ends OK


def test_stream_submitters_share_one_place_and_a_paused_one_does_not_hold_it(tmp_path: Path) -> None:
    """NEGT2I_MAX_STREAM_RECEIVING=1, NEGT2I_RECEIVE_TIMEOUT_S=1, real ``StreamSubmitter`` runs: a paused one (a
    generator between images, keeping its stream open: ``idle_close`` 60 s) holds the place while it idles;
    four busy runs of 12 jobs each start behind it. The paused stream is ended as idle, the busy runs share the
    one place, and the paused run's next job goes out on a stream opened for it: every job of every run is
    answered (NOT_FOUND: the prompt id is unknown), none left, no run stopped."""
    import threading

    from negt2i.client import EvaluatorClient
    from negt2i.run.stream import RetryPolicy, StreamSubmitter
    from negt2i.wire.v1 import evaluator_pb2
    from tests.orchestrator.test_stream import paused_jobs

    def prepare(job: int) -> evaluator_pb2.EvaluateRequest:
        return evaluator_pb2.EvaluateRequest.FromString(request_bytes(2000))

    env = {"NEGT2I_AUTH_TOKEN": TOKEN, "NEGT2I_MAX_STREAM_RECEIVING": "1", "NEGT2I_RECEIVE_TIMEOUT_S": "1"}
    results: dict[str, tuple[list[Any], Any]] = {}

    def run(name: str, count: int, pause_before: dict[int, float], target: str) -> None:
        with EvaluatorClient(target, token=TOKEN, timeout=None) as client:
            submitter = StreamSubmitter(client, prepare, window=4, policy=RetryPolicy(item_timeout=60),
                                        warn=lambda _: None, idle_close=60.0)  # fmt: skip
            results[name] = (list(submitter.run(paused_jobs(pause_before, count))), submitter.stats)

    with start(env, tmp_path) as server:
        paused = threading.Thread(target=run, args=("paused", 2, {1: 4.0}, server.target))
        paused.start()
        time.sleep(1.0)  # its first job answered, it idles with its next read pending
        busy = [threading.Thread(target=run, args=(f"busy-{k}", 12, {}, server.target)) for k in range(4)]
        for t in busy:
            t.start()
        for t in (paused, *busy):
            t.join(timeout=120)
        assert set(results) == {"paused"} | {f"busy-{k}" for k in range(4)}, server.tail()
        for name, (answers, stats) in results.items():
            assert [a.index for a in answers] == list(range(len(answers))), name
            assert all(not a.left and a.response is not None for a in answers), (name, answers)
            assert {Code.of(a.response.error.code).name for a in answers} == {"NOT_FOUND"}, name
            assert stats.stream_error is None, (name, stats)
        assert results["paused"][1].idle_ends >= 1, results["paused"][1]


def test_reflection_streams_are_read_in_the_stream_places(tmp_path: Path) -> None:
    """Reflection (opt-in; it needs no token when none is configured, and its messages may be as large as any)
    is read in the stream places too: behind a silent stream holding the one place, a reflection call waits and
    ends RESOURCE_EXHAUSTED after NEGT2I_MAX_WAIT_S; once the place is free it lists the services (before:
    reflection was neither counted nor gated, and answered at once)."""
    from grpc_reflection.v1alpha import reflection_pb2

    env = {"NEGT2I_MAX_STREAM_RECEIVING": "1", "NEGT2I_MAX_WAIT_S": "0.5", "NEGT2I_REFLECTION": "1"}
    ask = reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    with _behind_a_silent_stream(env, tmp_path) as silent, grpc.insecure_channel(silent.server.target) as channel:
        reflect = channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
        with pytest.raises(grpc.RpcError) as waited:
            list(reflect(iter([ask]), timeout=30, metadata=metadata))
        assert waited.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, waited.value.details()
        silent.close()
        assert _stream_status(silent.call) == ([], None)
        (raw,) = list(reflect(iter([ask]), timeout=30, metadata=metadata))
        listed = reflection_pb2.ServerReflectionResponse.FromString(raw).list_services_response.service
        assert "negt2i.v1.Evaluator" in {service.name for service in listed}
