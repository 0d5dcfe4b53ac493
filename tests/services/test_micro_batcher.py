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
from services.common import MicroBatcher, Overloaded


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
    batcher = MicroBatcher(model, max_batch_size=8, max_wait_ms=300, max_queue=8)
    first = batcher.submit([1])
    time.sleep(0.05)
    second = batcher.submit([2])  # arrives within the first item's wait: same call
    assert [first[0].result(5), second[0].result(5)] == [2, 4]
    assert model.batches == [[1, 2]]
    t0 = time.monotonic()
    assert batcher.submit([3])[0].result(5) == 6  # alone: runs once its wait is over
    assert 0.25 <= time.monotonic() - t0 < 3 and model.batches[-1] == [3]


def test_admission_is_bounded_and_refused_at_once():
    batcher = MicroBatcher(Recorder(), max_batch_size=4, max_wait_ms=0, max_queue=5)
    batcher.admit(3)
    batcher.admit(2)
    with pytest.raises(Overloaded, match="limit of 5"):
        batcher.admit(1)
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
