"""The stage services' micro-batcher (``services.common.MicroBatcher``) and the handler's batch step
(``StageHandler.run``), in process: merging, the batch size and wait bounds, overload refusal, a failing
item failing alone. The same behaviour through real service processes: ``test_stage_batching.py``."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from negt2i.stages.synthetic import SceneObject, SyntheticSegmenter, render_scene, shape_mask
from negt2i.wire import adapter
from negt2i.wire.stage_handlers import StageHandler, StageSettings
from services.common import MicroBatcher, ModelThreadDied, Overloaded


class Recorder:
    """A model that doubles its inputs, takes ``delay_s`` per call and records each call's batch."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.batches: list[list[int]] = []

    def __call__(self, inputs: list[int]) -> list[Any]:
        self.batches.append(list(inputs))
        time.sleep(self.delay_s)
        return [2 * x for x in inputs]


def _concurrently(batcher: MicroBatcher, values: list[int]) -> dict[int, Any]:
    out: dict[int, Any] = {}
    start = threading.Barrier(len(values))

    def one(v: int) -> None:
        start.wait()
        out[v] = batcher.submit([v])[0].result(timeout=10)

    threads = [threading.Thread(target=one, args=(v,)) for v in values]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_concurrent_items_are_merged_up_to_the_batch_size():
    model = Recorder(delay_s=0.05)
    batcher = MicroBatcher(model, max_batch_size=4, max_wait_ms=20, max_queue=64)
    out = _concurrently(batcher, list(range(16)))
    assert out == {v: 2 * v for v in range(16)}  # every caller gets its own answer
    sizes = [len(b) for b in model.batches]
    assert sum(sizes) == 16 and max(sizes) <= 4 and len(sizes) < 16  # merged, never above the batch size
    assert batcher.calls == len(sizes) and batcher.items == 16


def test_an_idle_model_waits_at_most_max_wait_for_company():
    model = Recorder()
    batcher = MicroBatcher(model, max_batch_size=2, max_wait_ms=5000, max_queue=8)
    first = batcher.submit([1])
    time.sleep(0.05)
    second = batcher.submit([2])  # arrives within the first item's wait (5 s, far above the 50 ms): same call
    assert [first[0].result(10), second[0].result(10)] == [2, 4]
    assert model.batches == [[1, 2]]
    model = Recorder()
    batcher = MicroBatcher(model, max_batch_size=8, max_wait_ms=300, max_queue=8)
    t0 = time.monotonic()
    assert batcher.submit([3])[0].result(10) == 6  # alone: runs once its wait is over, not never
    assert time.monotonic() - t0 >= 0.3 and model.batches == [[3]]  # after waiting it out (a lower bound)


class NoWaiting(threading.Condition):
    """A condition that fails whoever waits on it: admission must decide at once, never wait for room."""

    def wait(self, timeout: float | None = None) -> bool:
        raise AssertionError("admission waited on the batcher's condition")


def test_admission_is_bounded_and_refused_at_once():
    batcher = MicroBatcher(Recorder(), max_batch_size=4, max_wait_ms=0, max_queue=5)
    batcher._cond = NoWaiting()  # the idle model thread keeps waiting on the old one; this test never runs it
    batcher.admit(3)
    batcher.admit(2)
    with pytest.raises(Overloaded, match="limit of 5"):
        batcher.admit(1)  # refused without waiting for room (NoWaiting)
    assert batcher.refused == 1
    batcher.release(2)
    batcher.admit(2)  # room again once a request is done


def test_a_model_that_raises_answers_every_waiter():
    def broken(inputs: list[int]) -> list[int]:
        raise RuntimeError("bug")

    batcher = MicroBatcher(broken, max_batch_size=4, max_wait_ms=0, max_queue=8)
    outs = [f.result(timeout=5) for f in batcher.submit([1, 2])]
    assert all(isinstance(o, RuntimeError) for o in outs)
    assert batcher.submit([3])[0].result(timeout=5).args == ("bug",)  # the thread lives on


def test_a_cancelled_item_is_dropped_before_it_runs_and_the_thread_lives_on():
    """A request cancelled while its item waits (BentoML's timeout cancels the future through
    ``asyncio.wrap_future``) is never run, nothing is set on its future, and the next item is answered."""
    model = Recorder()
    batcher = MicroBatcher(model, max_batch_size=4, max_wait_ms=300, max_queue=8)
    (gone,) = batcher.submit([1])
    assert gone.cancel()  # still waiting for company: cancellable
    kept = batcher.submit([2])[0]
    assert kept.result(5) == 4
    assert model.batches == [[2]] and batcher.dropped == 1 and gone.cancelled()
    assert batcher.alive() and batcher.submit([3])[0].result(5) == 6


def test_an_item_being_run_can_no_longer_be_cancelled_and_gets_its_answer():
    started = threading.Event()

    def slow(inputs: list[int]) -> list[int]:
        started.set()
        time.sleep(0.3)
        return [2 * x for x in inputs]

    batcher = MicroBatcher(slow, max_batch_size=4, max_wait_ms=0, max_queue=8)
    (running,) = batcher.submit([5])
    assert started.wait(5)
    assert not running.cancel()  # set running when the model thread took it
    assert running.result(5) == 10 and batcher.alive()


async def _cancelled_by_a_timeout(batcher: MicroBatcher) -> None:
    import asyncio

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(batcher.process([1, 2]), 0.05)  # what BentoML's request timeout does


def test_items_of_a_request_cancelled_by_asyncio_timeouts_never_kill_the_model_thread():
    import asyncio

    model = Recorder(delay_s=0.1)
    batcher = MicroBatcher(model, max_batch_size=2, max_wait_ms=200, max_queue=8)
    for _ in range(3):
        asyncio.run(_cancelled_by_a_timeout(batcher))
    time.sleep(0.4)
    assert batcher.alive()
    assert asyncio.run(batcher.process([7, 8])) == [14, 16]


def test_a_model_thread_that_dies_fails_every_waiter_and_turns_not_alive():
    release = threading.Event()

    def fatal(inputs: list[int]) -> list[int]:
        release.wait(5)
        if 13 in inputs:
            raise SystemExit("injected")
        return [2 * x for x in inputs]

    batcher = MicroBatcher(fatal, max_batch_size=1, max_wait_ms=0, max_queue=8, name="model-test")
    (doomed,) = batcher.submit([13])
    (queued,) = batcher.submit([1])  # waits behind the fatal call
    assert batcher.alive()
    release.set()
    with pytest.raises(ModelThreadDied, match="SystemExit"):
        doomed.result(5)
    with pytest.raises(ModelThreadDied, match="must be restarted"):
        queued.result(5)
    assert not batcher.alive() and "model thread has died" in batcher.why_dead()
    with pytest.raises(ModelThreadDied):
        batcher.submit([2])


def test_a_model_call_that_hangs_turns_not_alive_until_it_returns():
    release = threading.Event()
    started = threading.Event()

    def stuck(inputs: list[int]) -> list[int]:
        started.set()
        release.wait(30)
        return inputs

    batcher = MicroBatcher(stuck, max_batch_size=1, max_wait_ms=0, max_queue=8, hung_after_s=1.0)
    t0 = time.monotonic()
    (fut,) = batcher.submit([1])
    assert started.wait(10)
    alive, why = batcher.alive(), batcher.why_dead()
    if time.monotonic() - t0 < 1.0:  # asked within the limit (always, but on a machine 10 times too slow)
        assert alive and why == ""
    time.sleep(1.1)  # the call has now run longer than the limit
    assert not batcher.alive() and "above the limit of 1 s" in batcher.why_dead()
    release.set()
    assert fut.result(5) == 1
    assert batcher.alive()
    with pytest.raises(ValueError, match="hung_after_s"):
        MicroBatcher(stuck, max_batch_size=1, max_wait_ms=0, max_queue=1, hung_after_s=0)


class CountingSegmenter(SyntheticSegmenter):
    """The synthetic segmenter with a batch method that counts calls and fails on a poisoned image."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_calls: list[int] = []

    def refine_batch(self, items: list[tuple[Any, Any, Any]]) -> list[Any]:
        self.batch_calls.append(len(items))
        if any(np.asarray(image)[0, 0, 0] == 255 for image, _, _ in items):
            raise RuntimeError("poisoned")
        return [self.refine(*item) for item in items]


def _segment_items(n: int, poison: int = -1) -> list[Any]:
    items = []
    for i in range(n):
        obj = SceneObject("cup", (4 + i, 6, 30 + i, 28))
        image = render_scene([obj], (40, 48))
        if i == poison:
            image[0, 0] = (255, 0, 255)
        mask = shape_mask(obj, (40, 48))
        items.append(adapter.segment_item(adapter.encode_png(image), np.array([obj.box], np.float32), mask[None]))
    return items


def test_the_segmenter_handler_runs_many_items_in_one_batch_call_and_a_failing_item_fails_alone():
    backend = CountingSegmenter()
    handler = StageHandler(StageSettings.from_env("segmenter", {}), backend=backend)
    items = _segment_items(6, poison=2)
    prepared = handler.prepare(items)
    results = handler.pack(prepared, handler.run([p.input for p in prepared]))
    assert backend.batch_calls == [6, 1, 1, 1, 1, 1, 1]  # one merged call; it raised, so each item alone
    assert [r.HasField("error") for r in results] == [False, False, True, False, False, False]
    assert results[2].error.status == 500 and "poisoned" in results[2].error.message
    alone = [handler.handle_messages([item])[0] for i, item in enumerate(items) if i != 2]
    assert [r for i, r in enumerate(results) if i != 2] == alone  # the same answers as unmerged calls


def test_binary_items_are_checked_for_unknown_fields_per_item():
    handler = StageHandler(StageSettings.from_env("segmenter", {}), backend=CountingSegmenter())
    good, bad = _segment_items(2)
    bad = type(bad).FromString(bad.SerializeToString() + b"\xa0\x06\x01")  # field 100 = 1
    results = handler.handle_messages([good, bad])
    assert not results[0].HasField("error")
    assert results[1].error.status == 400 and results[1].error.field == "items[1]"
    assert "unknown field number 100" in results[1].error.message
