"""The bad-input catalogue (``catalogue.py``) against real processes: every entry gets its documented
status (never INTERNAL / UNKNOWN / HTTP 500 for a client's mistake), unary and on one stream; afterwards
every service still answers SERVING / ready and its memory stayed bounded."""

from __future__ import annotations

import base64
import io
import json
import random
import socket
import struct
import time
import zlib
from functools import cache
from typing import Any

import grpc
import httpx
import numpy as np
import psutil
import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from negt2i.stages.synthetic import SceneObject, render_scene
from negt2i.wire import adapter
from negt2i.wire.stage_table import STAGE_TABLE
from negt2i.wire.v1 import evaluator_pb2
from tests.reliability.catalogue import CATALOGUE, GOOD_PROMPT, GRPC, HTTP
from tests.services.live import Proc

pytestmark = pytest.mark.xdist_group("reliability")

METHOD = "/negt2i.v1.Evaluator/Evaluate"
STREAM = "/negt2i.v1.Evaluator/EvaluateStream"
ORCHESTRATOR_RSS_BOUND = 600 * 2**20
STAGE_RSS_BOUND = 1200 * 2**20


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


@cache
def images() -> dict[str, bytes]:
    from PIL import Image as PILImage

    png = adapter.encode_png(
        render_scene([SceneObject("horse", (2, 10, 28, 40)), SceneObject("dog", (36, 44, 60, 60), "ellipse")], (64, 64))
    )
    buf = io.BytesIO()
    PILImage.fromarray(np.full((64, 64, 3), 128, np.uint8)).save(buf, format="JPEG")
    rng = random.Random(0)
    bomb = b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0))
    bomb += _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + _png_chunk(b"IEND", b"")
    return {
        "$png": png,
        "$text": b"hello, this is not an image",
        "$garbage": rng.randbytes(4000),
        "$truncated": png[: len(png) // 2],
        "$png_signature": b"\x89PNG\r\n\x1a\n",
        "$jpeg_truncated": buf.getvalue()[:300],
        "$png_bomb": bomb,
        "$too_many_pixels": adapter.encode_png(np.zeros((1000, 1100, 3), np.uint8)),
        "$too_many_bytes": rng.randbytes(1_500_000),
        "$oversize_message": rng.randbytes(3_000_000),
        **{f"$odd_exif_{fmt.lower()}": _with_exif(png, fmt) for fmt in ("PNG", "JPEG", "WEBP")},
    }


def _with_exif(png: bytes, fmt: str) -> bytes:
    """``png``'s pixels as ``fmt`` with the EXIF block of issue 31 (``ImageOps.exif_transpose`` raised on it)."""
    from PIL import Image as PILImage

    from benchmarks.fuzz_decoder import ISSUE_31_EXIF

    buf = io.BytesIO()
    with PILImage.open(io.BytesIO(png)) as img:
        img.convert("RGB").save(buf, format=fmt, exif=b"Exif\x00\x00" + ISSUE_31_EXIF)
    return buf.getvalue()


def _mask(empty: bool = False) -> dict[str, Any]:
    m = np.zeros((64, 64), bool)
    if not empty:
        m[8:40, 8:40] = True
    return adapter.to_json(adapter.mask_to_proto(m))


def expand(value: Any) -> Any:
    """Replace the catalogue's placeholders (see ``catalogue.py``)."""
    if isinstance(value, str):
        if value in images():
            return base64.b64encode(images()[value]).decode()
        if value == "$mask":
            return _mask()
        if value == "$empty_mask":
            return _mask(empty=True)
        return value
    if isinstance(value, list):
        return [expand(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"$str"}:
            c, n = value["$str"]
            return c * n
        if set(value) == {"$list"}:
            x, n = value["$list"]
            return [expand(x)] * n
        if set(value) == {"$nest"}:
            n = value["$nest"]
            return '{"a":' + "[" * n + "]" * n + "}"
        if set(value) == {"$extra_bytes"}:
            return json.dumps({"note": "x" * value["$extra_bytes"]})
        return {k: expand(v) for k, v in value.items()}
    return value


def grpc_bytes(entry: dict[str, Any]) -> bytes:
    if "raw" in entry:
        return bytes(entry["raw"])
    msg = json_format.ParseDict(expand(entry["request"]), evaluator_pb2.EvaluateRequest())
    return msg.SerializeToString()


def _ids(entries: list[dict[str, Any]]) -> list[str]:
    return [f"{e.get('stage', 'grpc')}: {e['kind']}" for e in entries]


def test_catalogue_size() -> None:
    kinds = _ids(CATALOGUE)
    assert len(set(kinds)) == len(kinds) >= 80
    assert len(GRPC) >= 40 and len(HTTP) >= 40


@pytest.fixture(scope="module")
def channel(rel_orchestrator: Proc) -> Any:
    with grpc.insecure_channel(rel_orchestrator.target, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        yield ch


@pytest.mark.parametrize("entry", GRPC, ids=_ids(GRPC))
def test_grpc_unary(entry: dict[str, Any], channel: Any) -> None:
    call = channel.unary_unary(METHOD)
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        call(grpc_bytes(entry), timeout=30)
    assert time.monotonic() - start < 10, "a bad input must be refused quickly"
    err = info.value
    assert err.code().name == entry["expect"], err.details()
    details = err.details() or ""
    assert len(details) <= 1100, f"unbounded message ({len(details)} characters)"
    assert entry["field"] in details, details
    _check_rich(rpc_status.from_call(err), err.code().value[0], details)


LEAKS = ("object at 0x", "<_io.", "Traceback", "should have", "Input should", "String should", "Error: ")


def _check_rich(status: Any, code: int, details: str) -> None:
    """The rich error model (negt2i.wire.errors): code and text as the call's, an ErrorInfo with a reason and
    the stage, and for INVALID_ARGUMENT a BadRequest naming one field; plain words only."""
    assert status is not None, f"no google.rpc.Status for {details!r}"
    assert status.code == code and status.message == details
    info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
    kinds = [d.type_url.rsplit("/", 1)[-1] for d in status.details]
    assert kinds == (["google.rpc.ErrorInfo", "google.rpc.BadRequest"] if code == 3 else ["google.rpc.ErrorInfo"])
    status.details[0].Unpack(info)
    assert info.domain == "negt2i.v1" and info.reason.isupper() and info.metadata["stage"]
    if code == 3:
        status.details[1].Unpack(bad)
        (violation,) = bad.field_violations
        assert violation.field and violation.description and violation.reason == info.reason
    assert not any(leak in details for leak in LEAKS), details


def test_grpc_stream_fails_only_the_bad_items(channel: Any) -> None:
    """Every catalogue request on one stream, plus good items: each bad one gets its status as an item
    error, the good ones verdicts, and the stream itself ends OK."""
    entries = list(GRPC)  # a message over the size limit (below gRPC's transport limit) fails alone too
    good = evaluator_pb2.EvaluateRequest(request_id="good", image=adapter.image_to_proto(images()["$png"]))
    good.prompt.CopyFrom(json_format.ParseDict(expand(GRPC[6]["request"]["prompt"]), evaluator_pb2.PromptSpec()))
    first = good.SerializeToString()
    good.request_id = "good-again"  # request_ids are unique among a stream's unanswered items
    payloads = [first, *(grpc_bytes(e) for e in entries), good.SerializeToString()]
    call = channel.stream_stream(STREAM)
    answers = [evaluator_pb2.EvaluateStreamResponse.FromString(r) for r in call(iter(payloads), timeout=120)]
    assert len(answers) == len(payloads)
    codes = sorted(grpc.StatusCode.OK.name if a.HasField("result") else _name(a.error.code) for a in answers)
    want = sorted(["OK", "OK", *(e["expect"] for e in entries)])
    assert codes == want
    for a in answers:
        if a.HasField("error"):
            _check_rich(a.error.status, a.error.code, a.error.message)


def _name(code: int) -> str:
    return next(s.name for s in grpc.StatusCode if s.value[0] == code)


def _raw_http(port: int, head: bytes, body: bytes = b"", *, wait: float = 10.0) -> int:
    """Send ``head`` + ``body`` on a socket; the status code of the answer (0: none)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(head + body)
        data = b""
        end = time.monotonic() + wait
        while b"\r\n" not in data and time.monotonic() < end:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0


def _special_body(entry: dict[str, Any], proc: Proc) -> int:
    path = f"/{STAGE_TABLE[entry['stage']].route}".encode()
    head = b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    if entry["body"] == "$big_body":
        return _raw_http(proc.port, head + b"Content-Length: 9437184\r\n\r\n")
    if entry["body"] == "$bad_length":
        return _raw_http(proc.port, head + b"Content-Length: abc\r\n\r\n", b"{}")
    if entry["body"] == "$no_length":
        return _raw_http(proc.port, head + b"Transfer-Encoding: chunked\r\n\r\n", b"2\r\n{}\r\n0\r\n\r\n")
    if entry["body"] == "$slow_body":
        start = time.monotonic()
        status = _raw_http(proc.port, head + b"Content-Length: 100\r\n\r\n", b'{"items": [')
        assert time.monotonic() - start < 8, "a stalled body must be dropped after the read timeout"
        return status
    if entry["body"] in ("$stalled_head", "$silent"):  # closed by the server after its header timeout (1 s here)
        start = time.monotonic()
        partial = b"GET /info HTTP/1.1\r\nHost: 127." if entry["body"] == "$stalled_head" else b""
        with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as s:
            s.sendall(partial)
            closed = s.recv(64) == b""
        assert closed and time.monotonic() - start < 8, "a connection without a request head must be closed"
        return 0
    if entry["body"] in ("$queue_json", "$queue_binary"):  # NEGT2I_MAX_QUEUE is 64 (the default)
        spec = STAGE_TABLE[entry["stage"]]
        url = f"{proc.url}/{spec.route}"
        if entry["body"] == "$queue_json":
            items = [{"image": {"data": ""}, "masks": [], "class_names": [], "answers": ["red"]}] * 65
            r = httpx.post(url, json={"items": items}, timeout=30, trust_env=False)
        else:
            msg = spec.request(items=[spec.item(image=adapter.image_to_proto(images()["$png"]))] * 65)
            headers = {"content-type": adapter.PROTOBUF_TYPE}
            r = httpx.post(url, content=msg.SerializeToString(), headers=headers, timeout=30, trust_env=False)
        assert "NEGT2I_MAX_QUEUE" in r.text and "at most 64 items per request" in r.text, r.text
        return r.status_code
    raise AssertionError(entry["body"])


@pytest.mark.parametrize("entry", HTTP, ids=_ids(HTTP))
def test_stage_http(entry: dict[str, Any], rel_stages: dict[str, Proc]) -> None:
    proc = rel_stages[entry["stage"]]
    if isinstance(entry["body"], str):
        assert _special_body(entry, proc) == entry["http"]
        return
    url = f"{proc.url}/{STAGE_TABLE[entry['stage']].route}"
    body = entry["body"] if entry["body"] is not None else json.dumps({"items": [expand(entry["item"])]}).encode()
    r = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=60, trust_env=False)
    assert r.status_code == entry["http"], r.text[:500]
    if r.status_code != 200:
        return
    (result,) = r.json()
    if entry["item_status"] is None:
        assert "error" not in result, result
        return
    error = result.get("error", {})
    assert error.get("status") == entry["item_status"], result
    text = f"{error.get('field', '')} {error.get('message', '')}"
    assert entry["field"] in text, text
    assert len(error.get("message", "")) <= 2000


def test_after_the_catalogue_everything_serves(rel_orchestrator: Proc, rel_stages: dict[str, Proc]) -> None:
    from negt2i.client import EvaluatorClient

    with EvaluatorClient(rel_orchestrator.target) as client:
        assert client.health() == "SERVING"
        assert client.health(service="") == "SERVING"
        info = client.info()
        assert info.limits.max_statements > 0 and info.limits.max_inflight_bytes > 0
    for stage, proc in rel_stages.items():
        assert httpx.get(f"{proc.url}/readyz", timeout=5, trust_env=False).status_code == 200, stage
        limits = httpx.get(f"{proc.url}/info", timeout=5, trust_env=False).json()["limits"]
        assert int(limits["max_masks_per_item"]) == 8 and float(limits["body_timeout_s"]) == 1.0
    rss = psutil.Process(rel_orchestrator.popen.pid).memory_info().rss
    assert rss < ORCHESTRATOR_RSS_BOUND, f"orchestrator RSS {rss >> 20} MiB"
    for stage, proc in rel_stages.items():
        family = [psutil.Process(proc.popen.pid), *psutil.Process(proc.popen.pid).children(recursive=True)]
        biggest = max(p.memory_info().rss for p in family)
        assert biggest < STAGE_RSS_BOUND, f"{stage} RSS {biggest >> 20} MiB"


@pytest.mark.parametrize("fmt", ["png", "jpeg", "webp"])
def test_an_image_with_odd_exif_is_judged_not_internal(fmt: str, channel: Any) -> None:
    """Issue 31: the orchestrator answered INTERNAL (and the stages 500) for images whose EXIF block
    ``ImageOps.exif_transpose`` could not re-serialise; such an image is judged like any other."""
    image = adapter.image_to_proto(images()[f"$odd_exif_{fmt}"])
    request = evaluator_pb2.EvaluateRequest(request_id=f"exif-{fmt}", image=image)
    request.prompt.CopyFrom(json_format.ParseDict(GOOD_PROMPT, evaluator_pb2.PromptSpec()))
    answer = evaluator_pb2.EvaluateResponse.FromString(
        channel.unary_unary(METHOD)(request.SerializeToString(), timeout=60)
    )
    assert answer.request_id == f"exif-{fmt}" and answer.verdict.prompt_id == "depth-x"
