"""Stage services as real processes on 127.0.0.1: both body types (JSON and binary protobuf) give the same
results, 16 concurrent clients are merged into fewer model calls (all four stages; counted by the services'
own ``negt2i_stage_model_calls`` metric) with the same answers as unmerged calls, a failing item fails
alone, and an overload is refused at once (503: while the model is held, before any model call ends) without
hurting the requests already admitted. How long a refusal takes is a figure of
``benchmarks/bench_stage_refusal.py``, not of these tests."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from google.protobuf.message import Message

from negt2i.stages.synthetic import SceneObject, render_scene, shape_mask
from negt2i.wire import adapter
from negt2i.wire.stage_table import STAGE_TABLE
from tests.services.batch_backend import POISON
from tests.services.live import Proc, start_stage, wait_ready

pytestmark = pytest.mark.xdist_group("services")

CLIENTS = 16


def _items(stage: str, n: int, poison: int = -1) -> list[Message]:
    """``n`` different valid items for ``stage`` (a cup and a bowl at other places in each image)."""
    out = []
    for i in range(n):
        objs = [SceneObject("cup", (4 + 2 * i, 6, 40 + 2 * i, 34), value="red"), SceneObject("bowl", (50, 40, 90, 70))]
        image = render_scene(objs, (80, 96))
        if i == poison:
            image[0, 0] = POISON
        masks = np.stack([shape_mask(o, (80, 96)) for o in objs])
        boxes = np.array([o.box for o in objs], np.float32)
        out.append(STAGE_TABLE[stage].probe(adapter.encode_png(image), masks, boxes, [o.class_name for o in objs]))
    return out


def _post(client: httpx.Client, url: str, stage: str, item: Message, binary: bool) -> tuple[int, Message | None]:
    spec = STAGE_TABLE[stage]
    if binary:
        r = client.post(f"{url}/{spec.route}", content=spec.request(items=[item]).SerializeToString(),
                        headers={"content-type": adapter.PROTOBUF_TYPE})  # fmt: skip
        if r.status_code != 200:
            return r.status_code, None
        assert r.headers["content-type"] == adapter.PROTOBUF_TYPE
        (result,) = spec.response.FromString(r.content).results
        return 200, result
    r = client.post(f"{url}/{spec.route}", json={"items": [adapter.to_json(item)]})
    if r.status_code != 200:
        return r.status_code, None
    (data,) = r.json()
    return 200, adapter.from_json(data, spec.result)


def _start(
    url: str, stage: str, items: list[Message], done: queue.Queue[int]
) -> tuple[list[threading.Thread], list[Any]]:
    """Every item in its own request from its own client, all released at once; half JSON, half binary.

    The threads are started, not joined: ``out[i]`` becomes item i's ``(status, result)`` (or the exception
    its request raised) when it is answered, and then ``i`` is put on ``done``."""
    out: list[Any] = [None] * len(items)
    start = threading.Barrier(len(items))

    def one(i: int) -> None:
        try:
            with httpx.Client(trust_env=False, timeout=60) as client:
                start.wait()
                out[i] = _post(client, url, stage, items[i], binary=i % 2 == 0)
        except Exception as exc:  # reported by the test that reads ``out``
            out[i] = exc
        finally:
            done.put(i)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(items))]
    for t in threads:
        t.start()
    return threads, out


def _concurrently(url: str, stage: str, items: list[Message]) -> list[tuple[int, Message | None]]:
    """``_start``, and every answer once all are in."""
    threads, out = _start(url, stage, items, queue.Queue())
    for t in threads:
        t.join(120)
    assert all(isinstance(x, tuple) for x in out), out
    return out


def _metric(url: str, name: str, stage: str) -> float:
    """The value of counter ``name`` (its ``_total`` sample) of ``stage`` on the service's Prometheus metrics."""
    text = httpx.get(f"{url}/metrics", trust_env=False).text
    prefix = f'{name}_total{{stage="{stage}"}} '
    return next((float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)), 0.0)


def _model_counts(url: str, stage: str) -> tuple[float, float]:
    """(model calls, items through the model) from the service's Prometheus metrics."""
    return _metric(url, "negt2i_stage_model_calls", stage), _metric(url, "negt2i_stage_model_items", stage)


@pytest.mark.parametrize("stage", ["detector", "segmenter", "attributes", "depth"])
def test_both_body_types_give_the_same_results(stage_procs: dict[str, Proc], stage: str):
    url = stage_procs[stage].url
    info = httpx.get(f"{url}/info", trust_env=False).json()
    assert adapter.PROTOBUF_TYPE in info["content_types"]  # how the orchestrator knows it may send binary
    with httpx.Client(trust_env=False, timeout=30) as client:
        for item in _items(stage, 2):
            (s1, as_json), (s2, as_binary) = (
                _post(client, url, stage, item, False),
                _post(client, url, stage, item, True),
            )
            assert s1 == s2 == 200 and as_json is not None and not as_json.HasField("error")
            assert as_json == as_binary
        spec = STAGE_TABLE[stage]
        bad = client.post(
            f"{url}/{spec.route}", content=b"\x0a\x05oops", headers={"content-type": adapter.PROTOBUF_TYPE}
        )
        assert bad.status_code == 400 and "not a binary" in bad.json()["error"]
        other = client.post(f"{url}/{spec.route}", content=b"<items/>", headers={"content-type": "application/xml"})
        assert other.status_code == 415


@pytest.mark.parametrize("stage", ["detector", "segmenter", "attributes", "depth"])
def test_concurrent_requests_are_merged_with_the_answers_of_unmerged_calls(stage_procs: dict[str, Proc], stage: str):
    url = stage_procs[stage].url
    items = _items(stage, CLIENTS)
    calls0, items0 = _model_counts(url, stage)
    merged = _concurrently(url, stage, items)
    calls1, items1 = _model_counts(url, stage)
    assert [status for status, _ in merged] == [200] * CLIENTS
    assert items1 - items0 == CLIENTS
    assert calls1 - calls0 < CLIENTS  # concurrent requests shared model calls
    with httpx.Client(trust_env=False, timeout=30) as client:  # one at a time: each alone in its model call
        alone = [_post(client, url, stage, item, binary=False)[1] for item in items]
    calls2, items2 = _model_counts(url, stage)
    assert (calls2 - calls1, items2 - items1) == (CLIENTS, CLIENTS)
    for (_, result), single in zip(merged, alone, strict=True):
        assert result is not None and not result.HasField("error")
        assert result == single  # identical answers, merged or not


MAX_QUEUE = 8
"""Most items the slow segmenter admits at once (``NEGT2I_MAX_QUEUE``)."""


@pytest.fixture(scope="module")
def hold(live_tmp: Path) -> Path:
    """While this file exists, the slow segmenter's model calls do not end (``NEGT2I_TEST_HOLD_FILE``)."""
    return live_tmp / "slow-segmenter.hold"


@pytest.fixture(scope="module")
def slow_segmenter(live_tmp: Path, hold: Path):
    """A segmenter whose model takes 0.5 s per call (``tests/services/batch_backend.py``; held while ``hold``
    exists), batches of at most 4, at most ``MAX_QUEUE`` items admitted at once."""
    env = {"NEGT2I_BACKEND_MODULES": "tests.services.batch_backend", "NEGT2I_TEST_CALL_S": "0.5",
           "NEGT2I_MAX_BATCH_SIZE": "4", "NEGT2I_MAX_QUEUE": str(MAX_QUEUE), "NEGT2I_MAX_WAIT_MS": "50",
           "NEGT2I_TEST_HOLD_FILE": str(hold)}  # fmt: skip
    proc = start_stage("segmenter", live_tmp, backend="batch-test", env=env)
    try:
        wait_ready(proc)
        yield proc
    finally:
        proc.kill()


def test_a_failing_item_fails_alone_in_a_merged_call(slow_segmenter: Proc):
    url = slow_segmenter.url
    items = _items("segmenter", 8, poison=3)
    calls0, _ = _model_counts(url, "segmenter")
    merged = _concurrently(url, "segmenter", items)
    assert [status for status, _ in merged] == [200] * 8
    results = [r for _, r in merged]
    assert [r is not None and r.HasField("error") for r in results] == [i == 3 for i in range(8)]
    assert results[3] is not None and results[3].error.status == 500 and "poisoned" in results[3].error.message
    with httpx.Client(trust_env=False, timeout=30) as client:
        for i, item in enumerate(items):
            if i != 3:
                assert _post(client, url, "segmenter", item, binary=True)[1] == results[i]
    calls1, _ = _model_counts(url, "segmenter")
    assert calls1 - calls0 < 8 + 8 + 7  # the first calls were merged (a failed batch is rerun item by item)


def test_an_overload_is_refused_at_once_and_does_not_cascade(slow_segmenter: Proc, hold: Path):
    """16 concurrent one-item requests against room for 8, with the model held (no model call ends until the
    test lets it go): exactly 8 are admitted and wait for the model, and the other 8 are answered 503 while it
    is still held, before any model call has ended: a refusal does not wait for the model (nor for room:
    ``test_micro_batcher.py`` shows that admission never waits). Once the model is let go, the admitted
    requests get their own, correct answers, the refused items never reach the model, and the service serves
    on."""
    url = slow_segmenter.url
    items = _items("segmenter", CLIENTS)
    calls0, items0 = _model_counts(url, "segmenter")
    refused0 = _metric(url, "negt2i_stage_refused_requests", "segmenter")
    done: queue.Queue[int] = queue.Queue()
    hold.touch()
    try:
        threads, out = _start(url, "segmenter", items, done)
        first: list[int] = []
        try:
            while len(first) < CLIENTS - MAX_QUEUE:
                first.append(done.get(timeout=60))  # 60 s: a guard against a hang, not a figure
        except queue.Empty:
            pytest.fail(f"{len(first)} answers while the model was held: refusals wait for the model")
        assert [out[i] for i in first] == [(503, None)] * (CLIENTS - MAX_QUEUE), [out[i] for i in first]
        assert done.empty()  # the admitted requests are still waiting for the held model
        assert _model_counts(url, "segmenter") == (calls0, items0)  # no model call has ended yet
        refused = _metric(url, "negt2i_stage_refused_requests", "segmenter") - refused0
        assert refused == CLIENTS - MAX_QUEUE
    finally:
        hold.unlink(missing_ok=True)  # let the model go
    for t in threads:
        t.join(120)
    admitted = sorted(set(range(CLIENTS)) - set(first))
    assert [out[i][0] for i in admitted] == [200] * MAX_QUEUE, [out[i] for i in admitted]
    calls1, items1 = _model_counts(url, "segmenter")
    assert items1 - items0 == MAX_QUEUE  # the refused items never reached the model: no cascade
    assert 2 <= calls1 - calls0 <= MAX_QUEUE  # in batches of at most 4
    with httpx.Client(trust_env=False, timeout=30) as client:
        for i in admitted:  # the admitted requests got their own, correct answers
            assert out[i][1] == _post(client, url, "segmenter", items[i], binary=False)[1]
        assert _post(client, url, "segmenter", items[0], binary=True)[0] == 200  # and the service serves on
    assert httpx.get(f"{url}/readyz", trust_env=False).status_code == 200


RED_DOG = {
    "id": "red-dog",
    "category": "color",
    "prompt": "a photo of a red dog",
    "include": [{"class": "dog"}],
    "statements": [{"kind": "attribute", "object": 0, "value": "red", "polarity": "positive"}],
}


@pytest.mark.parametrize("flags", [[], ["--lists-binary"]], ids=["json-only", "lists-binary-answers-415"])
def test_an_outside_stage_that_speaks_only_json_still_serves(stage_procs: dict[str, Proc], live_tmp: Path, flags):
    """The orchestrator sends JSON to a detector written from the JSON contract alone
    (``tests/services/faulty_detector.py``: no ``content_types``, or listing the binary type but answering it
    with 415), and binary bodies to our stages, in the same request."""
    import subprocess
    import sys

    from negt2i.client import EvaluatorClient
    from negt2i.core.spec import parse_prompt
    from tests.services.live import REPO, free_port, start_orchestrator, wait_health

    port = free_port()
    fake = subprocess.Popen([sys.executable, "-m", "tests.services.faulty_detector", str(port), *flags], cwd=REPO,
                            start_new_session=True)  # fmt: skip
    urls = {stage: proc.url for stage, proc in stage_procs.items()}
    orch = start_orchestrator({**urls, "detector": f"http://127.0.0.1:{port}"}, live_tmp)
    try:
        assert wait_health(orch.target, "SERVING", timeout=60) == "SERVING", orch.tail()
        image = render_scene([SceneObject("dog", (20, 20, 44, 44), value="red")], (64, 64))
        with EvaluatorClient(orch.target) as client:
            for _ in range(2):
                result = client.evaluate(adapter.encode_png(image), prompt=parse_prompt(RED_DOG))
                assert result.verdict is not None
                assert {s.stage: s.model.model for s in result.stages} == {
                    "detector": "fake-yolo-seg",
                    "attributes": "synthetic-palette-v1",
                }
        assert ("answered 415 to a binary body" in orch.tail(200)) == bool(flags)
        calls = [line for line in stage_procs["attributes"].tail(20).splitlines() if "path=/attributes" in line]
        assert calls and "type=application/x-protobuf" in calls[-1]  # our stage got a binary body
    finally:
        orch.kill()
        fake.kill()
        fake.wait(timeout=10)
