"""The orchestrator's stage client against an in-process HTTP transport: retries, backoff, deadlines,
queue limits and the mapping of stage answers to gRPC status codes."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest

from negt2i.core.failures import ContractRule, StageError
from negt2i.stages.synthetic import SceneObject, SyntheticDetector, render_scene
from negt2i.wire import adapter
from orchestrator.settings import DEFAULT_URLS, Settings
from orchestrator.stages import RemoteStages

IMAGE = render_scene([SceneObject("cup", (4, 4, 20, 20))], (32, 32))
PNG = adapter.encode_png(IMAGE)
RESULT = adapter.to_json(adapter.detections_to_proto(SyntheticDetector().detect([IMAGE])[0]))


def _stages(handler, **kw) -> RemoteStages:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return RemoteStages(DEFAULT_URLS, client=client, backoff_s=0.01, **kw)


def _detect(stages: RemoteStages, budget: float = 5.0):
    async def run():
        try:
            return (await stages.detect(PNG, (32, 32), time.monotonic() + budget))[0]
        finally:
            await stages.close()

    return asyncio.run(run())


def test_retries_after_503_then_succeeds():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(json.loads(request.content))
        return httpx.Response(503) if len(calls) < 3 else httpx.Response(200, json=[RESULT])

    stages = _stages(handler)
    det = _detect(stages)
    assert det.class_names == ("cup",) and len(calls) == 3
    assert calls[0]["items"][0]["image"]["data"]  # the PNG, base64
    assert stages.wire.calls["detector"] == 3 and stages.wire.received["detector"] > 0


@pytest.mark.parametrize(
    ("response", "code"),
    [
        (httpx.Response(503), "RESOURCE_EXHAUSTED"),
        (httpx.Response(502), "UNAVAILABLE"),
        (httpx.Response(413, text="too big"), "INVALID_ARGUMENT"),
        (httpx.Response(400, text="bad"), "INTERNAL"),
        (httpx.Response(200, json={"not": "a list"}), "INTERNAL"),
        (httpx.Response(200, json=[RESULT, RESULT]), "INTERNAL"),
        (httpx.Response(200, json=[{"error": {"status": 400, "message": "bad image", "field": "image"}}]),
         "INVALID_ARGUMENT"),
        (httpx.Response(200, json=[{"error": {"status": 500, "message": "model crashed"}}]), "INTERNAL"),
        (httpx.Response(200, json=[{**RESULT, "height": 31}]), "INTERNAL"),
    ],
)  # fmt: skip
def test_stage_answers_map_to_status_codes(response: httpx.Response, code: str):
    with pytest.raises(StageError) as err:
        _detect(_stages(lambda _r: response, retries=1))
    assert err.value.code == code and err.value.stage == "detector"


def test_connection_errors_are_unavailable_after_bounded_retries():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(StageError) as err:
        _detect(_stages(handler, retries=2))
    assert err.value.code == "UNAVAILABLE" and "unreachable" in err.value.message and len(calls) == 3


def test_deadline_cuts_the_call_and_maps_to_deadline_exceeded():
    answered: list[float] = []

    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        answered.append(time.monotonic())
        return httpx.Response(200, json=[RESULT])

    with pytest.raises(StageError) as err:
        _detect(_stages(slow), budget=0.3)
    assert err.value.code == "DEADLINE_EXCEEDED"
    assert answered == []  # cut at the deadline, not after the stage answered (5 s later)


def test_full_queue_is_resource_exhausted():
    """Event-driven: one call holds the only slot, one waits in the queue, the next two are refused at once."""

    async def run() -> list[str]:
        entered, release = asyncio.Event(), asyncio.Event()

        async def held(request: httpx.Request) -> httpx.Response:
            entered.set()
            await release.wait()
            return httpx.Response(200, json=[RESULT])

        stages = _stages(held, concurrency=1, queue=1)

        async def one() -> str:
            try:
                await stages.detect(PNG, (32, 32), time.monotonic() + 5)
                return "OK"
            except StageError as exc:
                return exc.code

        try:
            first = asyncio.ensure_future(one())
            await entered.wait()  # the first call is inside the stage, holding the slot
            second = asyncio.ensure_future(one())
            while stages.limiters["detector"].waiting < 1:  # the second call is queued
                await asyncio.sleep(0)
            refused = [await one(), await one()]  # the queue is full: refused without waiting
            release.set()
            return [await first, await second, *refused]
        finally:
            await stages.close()

    assert asyncio.run(run()) == ["OK", "OK", "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"]


def test_depth_encoding_is_requested_and_unpacked():
    disp = np.linspace(0, 1, 32 * 32, dtype=np.float32).reshape(32, 32)
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        item = json.loads(request.content)["items"][0]
        seen.append(item.get("encoding"))
        enc = 2 if item.get("encoding") == "DEPTH_ENCODING_FLOAT32" else 1
        return httpx.Response(200, json=[{"disparity": adapter.to_json(adapter.depth_to_proto(disp, enc))}])

    async def run(encoding: str) -> np.ndarray:
        stages = _stages(handler, depth_encoding=encoding)
        try:
            return (await stages.depth(PNG, (32, 32), time.monotonic() + 5))[0]
        finally:
            await stages.close()

    assert (asyncio.run(run("float32")) == disp).all()
    assert np.abs(asyncio.run(run("float16")) - disp).max() < 1e-3
    assert seen == ["DEPTH_ENCODING_FLOAT32", "DEPTH_ENCODING_FLOAT16"]


def test_settings_from_env_and_flags(monkeypatch):
    env = {"NEGT2I_DETECTOR_URL": "http://det:3000/", "NEGT2I_STAGE_QUEUE": "3", "NEGT2I_PORT": "6000"}
    s = Settings.from_env(env)
    assert s.urls["detector"] == "http://det:3000" and s.urls["depth"] == DEFAULT_URLS["depth"]
    assert s.stage_queue == 3 and s.port == 6000
    monkeypatch.setenv("NEGT2I_RULES", "previous")
    f = Settings.from_args(["--port", "7000", "--depth-url", "http://d:1", "--depth-encoding", "float32"])
    assert (f.port, f.urls["depth"], f.rules, f.depth_encoding) == (7000, "http://d:1", "previous", "float32")


def _info_json(model: str, *, contract: str = "negt2i.v1", stage: str = "detector", floor: float = 0.005) -> dict:
    from negt2i.stages.base import ModelInfo, OperatingPoint

    info = ModelInfo(stage=stage, backend="b", model=model, operating_point=OperatingPoint(prediction_floor=floor),
                     rules={"detection.prediction_floor": floor})  # fmt: skip
    return {"contract": contract, "model": info.model_dump(mode="json"), "ready": True}, info.digest()


def test_a_replaced_instance_is_noticed_at_once_and_named_in_the_answer():
    """Two instances behind one address: the answer's digest names the new model, /info is re-read at once."""
    from negt2i.core.config import CURRENT

    old, old_digest = _info_json("old-model")
    new, new_digest = _info_json("new-model")
    state = {"info": old, "digest": old_digest, "info_reads": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/info":
            state["info_reads"] += 1
            return httpx.Response(200, json=state["info"])
        if request.url.path == "/readyz":
            return httpx.Response(200)
        return httpx.Response(200, json=[{**RESULT, "model_digest": state["digest"]}])

    async def run() -> list[str]:
        stages = _stages(handler, config=CURRENT)
        try:
            assert await stages.ready("detector")
            names = [(await stages.detect(PNG, (32, 32), time.monotonic() + 5))[1].model.model]
            state["info"], state["digest"] = new, new_digest  # the swap; no health poll in between
            names.append((await stages.detect(PNG, (32, 32), time.monotonic() + 5))[1].model.model)
            return names
        finally:
            await stages.close()

    assert asyncio.run(run()) == ["old-model", "new-model"]
    assert state["info_reads"] == 2  # once by the health poll, once on the new digest


@pytest.mark.parametrize(
    ("info", "needle"),
    [
        (_info_json("m", contract="v1")[0], "contract 'v1'"),
        (_info_json("m", stage="segmenter")[0], "names stage 'segmenter'"),
        (_info_json("m", floor=0.25)[0], "rule constants"),
        ({"contract": "negt2i.v1", "model": {"stage": "detector", "model": "m"}, "surprise": 1}, "not a valid"),
    ],
)
def test_invalid_info_is_refused_with_unavailable(info, needle):
    from negt2i.core.config import CURRENT

    posts = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/info":
            return httpx.Response(200, json=info)
        if request.url.path == "/readyz":
            return httpx.Response(200)
        posts.append(request)
        return httpx.Response(200, json=[RESULT])

    async def run() -> None:
        stages = _stages(handler, config=CURRENT)
        try:
            assert not await stages.ready("detector")
            await stages.detect(PNG, (32, 32), time.monotonic() + 5)
        finally:
            await stages.close()

    with pytest.raises(StageError) as err:
        asyncio.run(run())
    assert err.value.code == "UNAVAILABLE" and err.value.rule == "stage-info" and needle in err.value.message
    assert not posts  # never called


# --------------------------------------------------------------------------- body types (JSON, binary protobuf)

RESULT_MSG = adapter.detections_to_proto(SyntheticDetector().detect([IMAGE])[0])


def _binary_stage(*, content_types: list[str], refuse_binary: bool = False, extra: bytes = b""):
    """A detector that lists ``content_types`` in /info and answers each body in its own type (415 for binary
    when ``refuse_binary``); ``extra`` is appended to the binary result (e.g. an unknown field)."""
    from negt2i.wire.v1 import stages_pb2

    info, digest = _info_json("m")
    info["content_types"] = content_types
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/info":
            return httpx.Response(200, json=info)
        if request.url.path == "/readyz":
            return httpx.Response(200)
        ctype = request.headers["content-type"]
        seen.append(ctype)
        result = stages_pb2.DetectResult()
        result.CopyFrom(RESULT_MSG)
        result.model_digest = digest
        if ctype == adapter.PROTOBUF_TYPE:
            if refuse_binary:
                return httpx.Response(415, json={"error": "JSON only"})
            items = stages_pb2.DetectRequest.FromString(request.content).items
            assert [i.image.data for i in items] == [PNG]  # raw bytes, no base64
            body = stages_pb2.DetectResponse(results=[result]).SerializeToString()
            if extra:  # an unknown field inside the result: re-frame results[0] with the extra bytes
                inner = result.SerializeToString() + extra
                body = b"\x0a" + _varint(len(inner)) + inner
            return httpx.Response(200, content=body, headers={"content-type": adapter.PROTOBUF_TYPE})
        assert ctype == adapter.JSON_TYPE
        assert json.loads(request.content)["items"][0]["image"]["data"]  # base64 text
        return httpx.Response(200, json=[adapter.to_json(result)])

    return handler, seen


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _detect_twice(handler, bodies: str = "auto") -> list:
    from negt2i.core.config import CURRENT

    async def run() -> list:
        stages = _stages(handler, config=CURRENT, bodies=bodies)
        try:
            assert await stages.ready("detector")
            return [(await stages.detect(PNG, (32, 32), time.monotonic() + 5))[0] for _ in range(2)]
        finally:
            await stages.close()

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("content_types", "refuse", "sent"),
    [
        ([adapter.PROTOBUF_TYPE], False, [adapter.PROTOBUF_TYPE] * 2),  # listed in /info: binary bodies
        ([], False, [adapter.JSON_TYPE] * 2),  # JSON-only (an outside service that implements only JSON)
        (["application/cbor"], False, [adapter.JSON_TYPE] * 2),  # a type we do not speak: JSON
        ([adapter.PROTOBUF_TYPE], True, [adapter.PROTOBUF_TYPE, adapter.JSON_TYPE, adapter.JSON_TYPE]),  # 415
    ],
)
def test_binary_bodies_only_where_the_stage_lists_them(content_types, refuse, sent):
    handler, seen = _binary_stage(content_types=content_types, refuse_binary=refuse)
    dets = _detect_twice(handler)
    assert seen == sent
    for det in dets:  # the same detections whichever body type carried them
        assert det.class_names == ("cup",) and det.masks.shape == (1, 32, 32)
        np.testing.assert_array_equal(det.masks, SyntheticDetector().detect([IMAGE])[0].masks)


def test_json_bodies_when_told_even_to_a_stage_that_lists_binary():
    handler, seen = _binary_stage(content_types=[adapter.PROTOBUF_TYPE])
    _detect_twice(handler, bodies="json")
    assert seen == [adapter.JSON_TYPE] * 2


def test_a_binary_result_with_an_unknown_field_breaks_the_contract():
    handler, _ = _binary_stage(content_types=[adapter.PROTOBUF_TYPE], extra=b"\x98\x06\x01")  # field 99, varint 1
    with pytest.raises(StageError) as err:
        _detect_twice(handler)
    assert err.value.code == "INTERNAL" and err.value.rule == "result-schema"
    assert "unknown field number 99" in err.value.message


def test_masks_are_encoded_and_decoded_off_the_event_loop(monkeypatch):
    """RLE decoding of stage answers and encoding of stage items never run on the orchestrator's event loop."""
    from negt2i.core import rle
    from negt2i.core.config import CURRENT
    from negt2i.stages.synthetic import SyntheticAttributeScorer, SyntheticSegmenter
    from negt2i.wire.v1 import stages_pb2

    on_loop: list[tuple[str, bool]] = []

    def watch(name, fn):
        def wrapped(*args, **kwargs):
            try:
                asyncio.get_running_loop()
                on_loop.append((name, True))
            except RuntimeError:
                on_loop.append((name, False))
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(rle, "decode", watch("decode", rle.decode))
    monkeypatch.setattr(rle, "encode", watch("encode", rle.encode))
    det = SyntheticDetector().detect([IMAGE])[0]
    refined = SyntheticSegmenter().refine(IMAGE, det.xyxy, det.masks)
    scores = SyntheticAttributeScorer().score(IMAGE, det.masks, list(det.class_names), ["red", "blue"])
    answers = {  # the stage results, encoded before the watch matters
        "detect": stages_pb2.DetectResponse(results=[RESULT_MSG]),
        "segment": stages_pb2.SegmentResponse(results=[adapter.masks_to_segment_result(refined)]),
        "attributes": stages_pb2.AttributesResponse(results=[adapter.scores_to_attributes_result(scores)]),
    }
    on_loop.clear()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/readyz":
            return httpx.Response(200)
        if request.url.path == "/info":
            info, _ = _info_json("m")
            stage = {"3001": "detector", "3002": "segmenter", "3003": "attributes"}.get(str(request.url.port), "")
            info["model"]["stage"] = stage
            if stage != "detector":
                info["model"]["rules"] = _rules(stage)
                info["model"].pop("operating_point", None)
            info["content_types"] = [adapter.PROTOBUF_TYPE]
            return httpx.Response(200, json=info)
        body = answers[request.url.path.strip("/")].SerializeToString()
        return httpx.Response(200, content=body, headers={"content-type": adapter.PROTOBUF_TYPE})

    async def run() -> None:
        stages = _stages(handler, config=CURRENT)
        try:
            deadline = time.monotonic() + 5
            got, _ = await stages.detect(PNG, (32, 32), deadline)
            masks, _ = await stages.segment(PNG, got.xyxy, got.masks, (32, 32), deadline)
            await stages.attributes(PNG, got.masks, list(got.class_names), ("red", "blue"), deadline)
            np.testing.assert_array_equal(masks, refined)
        finally:
            await stages.close()

    asyncio.run(run())
    assert {name for name, _ in on_loop} == {"encode", "decode"}
    assert not [call for call in on_loop if call[1]], on_loop


def _rules(stage: str) -> dict:
    from negt2i.core.config import CURRENT, stage_rules

    return stage_rules(CURRENT, stage)


def test_a_health_poll_that_raises_marks_the_stage_down_so_its_calls_fail_fast():
    """The health poller counts a stage whose poll raises as down; the calls must agree with it: the stage
    is recorded as down (nothing is sent to it, the item fails fast UNAVAILABLE naming why) until a poll
    finds it up again."""
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return httpx.Response(200, json=[RESULT])

    stages = _stages(handler)

    async def unexpected(stage: str, timeout_s: float = 2.0) -> bool | None:
        raise KeyError("an error the poll did not expect")

    stages.read_info = unexpected  # type: ignore[method-assign]

    async def poll() -> None:
        with pytest.raises(KeyError):
            await stages.ready("detector")

    asyncio.run(poll())
    assert "KeyError" in stages.down["detector"]
    sent.clear()
    with pytest.raises(StageError) as err:
        _detect(stages)
    assert err.value.code == "UNAVAILABLE" and "health poll failed" in str(err.value)
    assert not [p for p in sent if not p.endswith(("readyz", "info"))]  # nothing was sent to the stage


def test_a_detect_result_that_does_not_decode_to_detections_breaks_the_contract():
    """Rule ``detect-result``: a result that parses as its message but whose parts disagree (a score above 1)."""
    from negt2i.wire.v1 import stages_pb2

    info, digest = _info_json("m")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/info":
            return httpx.Response(200, json=info)
        if request.url.path == "/readyz":
            return httpx.Response(200)
        result = stages_pb2.DetectResult()
        result.CopyFrom(RESULT_MSG)
        result.model_digest = digest
        result.detections[0].score = 1.5
        return httpx.Response(200, json=[adapter.to_json(result)])

    with pytest.raises(StageError) as err:
        _detect_twice(handler)
    assert (err.value.stage, err.value.code, err.value.rule) == ("detector", "INTERNAL", ContractRule.DETECT_RESULT)
    assert "scores must be finite and in [0, 1]" in err.value.message


@pytest.mark.parametrize(
    ("failures", "up", "readyz_sent"),
    [
        ([httpx.ReadError("connection lost")], True, 2),  # the stopping instance; the new connection answers
        ([httpx.ConnectError("refused")], True, 2),
        ([httpx.ReadError("lost"), httpx.RemoteProtocolError("closed")], False, 2),  # twice: down
        ([httpx.ReadTimeout("slow")], False, 1),  # a hung stage is not polled twice
    ],
)
def test_a_poll_that_loses_its_connection_tries_one_new_one_before_the_stage_is_down(
    failures: list[Exception], up: bool, readyz_sent: int
) -> None:
    """A blue/green swap or rolling update: the poll's connection reaches the instance that is stopping while
    another one answers at the same address. One lost connection is tried again at once on a new one, so the
    stage's items do not all fail UNAVAILABLE until the next poll; a timeout is not retried."""
    from negt2i.core.config import CURRENT

    info, _ = _info_json("m")
    left = list(failures)
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        if request.url.path == "/readyz" and left:
            raise left.pop(0)
        if request.url.path == "/info":
            return httpx.Response(200, json=info)
        return httpx.Response(200)

    async def run() -> bool:
        stages = _stages(handler, config=CURRENT)
        try:
            return await stages.ready("detector")
        finally:
            await stages.close()

    stages_up = asyncio.run(run())
    assert stages_up is up
    assert sent.count("/readyz") == readyz_sent
