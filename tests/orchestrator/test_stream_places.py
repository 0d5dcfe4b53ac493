"""``orchestrator.guard.StreamPlaces`` / ``StreamGate``: stream messages are read a few at a time, a stream
waiting for a place ends an idle holder, a holder with items in flight is never ended, a stream that gets no
place in time stops reading cleanly (issue 31, item 6: memory before a message is read)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.guard import StreamGate, StreamPlaces


class _Client:
    """A stream's request side: messages put here arrive at the server's pending read; ``reading`` counts the
    server's reads pending at once (what gRPC would be receiving)."""

    pending = 0
    most = 0

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    def __aiter__(self) -> _Client:
        return self

    async def __anext__(self) -> Any:
        _Client.pending += 1
        _Client.most = max(_Client.most, _Client.pending)
        try:
            message = await self.queue.get()
        finally:
            _Client.pending -= 1
        if message is None:
            raise StopAsyncIteration
        return message


class _Context:
    def __init__(self, left: float | None = None) -> None:
        self.left = left

    def time_remaining(self) -> float | None:
        return self.left


def _gate(places: StreamPlaces, left: float | None = None) -> tuple[_Client, StreamGate]:
    client = _Client()
    return client, StreamGate(client, places, _Context(left))


def _run(coro: Any) -> Any:
    _Client.pending = _Client.most = 0
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_messages_are_read_one_place_at_a_time_first_come_first_served() -> None:
    async def main() -> None:
        places = StreamPlaces(1, idle_s=60, max_wait_s=60)
        (ca, a), (cb, b), (cc, c) = (_gate(places) for _ in range(3))
        ra = asyncio.ensure_future(a.__anext__())
        await asyncio.sleep(0.01)
        rb = asyncio.ensure_future(b.__anext__())
        await asyncio.sleep(0.01)
        rc = asyncio.ensure_future(c.__anext__())
        await asyncio.sleep(0.05)
        assert _Client.most == 1 and places.waiting() == 2  # b and c wait without reading
        for client in (cc, cb):  # c's message is there first, but b asked first
            client.queue.put_nowait(f"m-{id(client)}")
        ca.queue.put_nowait("a1")
        assert await ra == "a1"
        assert await rb == f"m-{id(cb)}"
        assert await rc == f"m-{id(cc)}"
        assert _Client.most == 1 and places.peak == 1 and not places.holders

    _run(main())


def test_a_waiting_stream_ends_the_idle_holder() -> None:
    """a has answered everything and its client is silent: b, waiting, ends it after idle_s; a's iterator stops
    (as if its client had half-closed) with the reason, and b reads."""

    async def main() -> None:
        places = StreamPlaces(1, idle_s=0.2, max_wait_s=30, check_s=0.02)
        t0 = asyncio.get_running_loop().time()  # before a is idle: what follows is a lower bound on any machine
        (_, a), (cb, b) = _gate(places), _gate(places)
        ra = asyncio.ensure_future(a.__anext__())
        await asyncio.sleep(0.01)
        cb.queue.put_nowait("b1")
        assert await b.__anext__() == "b1"
        assert asyncio.get_running_loop().time() - t0 >= 0.2  # a was ended once idle for idle_s, not before
        with pytest.raises(StopAsyncIteration):
            await ra
        assert "idle" in a.refusal and not b.refusal and places.evicted == 1
        with pytest.raises(StopAsyncIteration):  # it stays ended
            await a.__anext__()

    _run(main())


def test_a_holder_with_an_item_in_flight_is_never_ended_and_the_waiter_stops_reading() -> None:
    """a read one message and has not answered it: it is not idle, so b gets no place; after max_wait_s b stops
    reading (its items read so far are still answered) with the reason."""

    async def main() -> None:
        places = StreamPlaces(1, idle_s=0.05, max_wait_s=0.4, check_s=0.02)
        (ca, a), (cb, b) = _gate(places), _gate(places)
        ca.queue.put_nowait("a1")
        assert await a.__anext__() == "a1"  # read, not answered
        ra = asyncio.ensure_future(a.__anext__())  # a asks for its next message and holds the place
        await asyncio.sleep(0.01)
        cb.queue.put_nowait("b1")
        with pytest.raises(StopAsyncIteration):
            await b.__anext__()
        assert "at capacity" in b.refusal and places.refused == 1 and places.evicted == 0
        assert not ra.done() and not a.refusal
        a.answered()  # now a is idle, but nobody waits: it keeps its place
        await asyncio.sleep(0.2)
        assert not ra.done()
        ca.queue.put_nowait("a2")
        assert await ra == "a2"

    _run(main())


def test_the_idle_clock_starts_at_the_last_answer() -> None:
    async def main() -> None:
        places = StreamPlaces(1, idle_s=0.3, max_wait_s=30, check_s=0.02)
        (ca, a), (cb, b) = _gate(places), _gate(places)
        ca.queue.put_nowait("a1")
        assert await a.__anext__() == "a1"
        ra = asyncio.ensure_future(a.__anext__())
        await asyncio.sleep(0.4)  # a waits with one item unanswered: not idle, however long
        t0 = asyncio.get_running_loop().time()  # before the answer: a lower bound on any machine
        a.answered()
        cb.queue.put_nowait("b1")
        assert await b.__anext__() == "b1"
        assert asyncio.get_running_loop().time() - t0 >= 0.3  # idle from the answer, not from the ask
        with pytest.raises(StopAsyncIteration):
            await ra

    _run(main())


def test_a_deadline_shorter_than_the_wait_cuts_it() -> None:
    async def main() -> None:
        places = StreamPlaces(1, idle_s=60, max_wait_s=60)
        (_, a) = _gate(places)
        ra = asyncio.ensure_future(a.__anext__())
        await asyncio.sleep(0.01)
        _, b = _gate(places, left=0.2)
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(StopAsyncIteration):
            await b.__anext__()
        assert "within 0.2 s" in b.refusal  # cut by its deadline, not by max_wait_s (60 s)
        assert asyncio.get_running_loop().time() - t0 < 30  # (a guard only: the message says which)
        ra.cancel()

    _run(main())


def test_cancelled_readers_and_waiters_give_their_places_back() -> None:
    async def main() -> None:
        places = StreamPlaces(1, idle_s=60, max_wait_s=60)
        (_, a), (_, b), (cc, c) = _gate(places), _gate(places), _gate(places)
        ra = asyncio.ensure_future(a.__anext__())
        await asyncio.sleep(0.01)
        rb = asyncio.ensure_future(b.__anext__())
        await asyncio.sleep(0.01)
        rb.cancel()  # a waiter leaves the queue
        ra.cancel()  # the holder's call ends: its read is cancelled, its place freed
        await asyncio.gather(ra, rb, return_exceptions=True)
        await asyncio.sleep(0.01)
        assert not places.holders and places.waiting() == 0
        cc.queue.put_nowait("c1")
        assert await c.__anext__() == "c1"

    _run(main())


@settings(max_examples=15, deadline=None)
@given(
    count=st.integers(1, 3),
    streams=st.lists(st.lists(st.integers(0, 20), min_size=1, max_size=4), min_size=1, max_size=6),
)
def test_never_more_reads_pending_than_places_and_every_message_arrives(count: int, streams: list[list[int]]) -> None:
    """Streams whose clients send messages after the given delays (ms) and answer each at once: at no time are
    more reads pending than places, and every message is read exactly once, in its stream's order."""

    async def one(places: StreamPlaces, delays: list[int], k: int) -> list[str]:
        client, gate = _gate(places)

        async def send() -> None:
            for i, ms in enumerate(delays):
                await asyncio.sleep(ms / 1000)
                client.queue.put_nowait(f"{k}-{i}")
            client.queue.put_nowait(None)

        sender = asyncio.ensure_future(send())
        got = []
        async for message in gate:
            got.append(message)
            gate.answered()
        await sender
        return got

    async def main() -> list[list[str]]:
        places = StreamPlaces(count, idle_s=60, max_wait_s=60)
        return list(await asyncio.gather(*(one(places, d, k) for k, d in enumerate(streams))))

    got = _run(main())
    assert got == [[f"{k}-{i}" for i in range(len(d))] for k, d in enumerate(streams)]
    assert _Client.most <= count
