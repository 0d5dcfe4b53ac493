"""The generators' API contract on real processes (docs/api.md): the rich error model on every status code
and per stream item, the stream contract (request_id rules, oversized messages, deadlines, the window), and
discovery (reflection v1 and v1alpha). Health per stage and category: ``test_orchestrator_live.py``'s
``test_unavailable_stage_and_health``."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from google.rpc import error_details_pb2, status_pb2
from grpc_reflection.v1alpha import reflection_pb2
from grpc_status import rpc_status

from negt2i.client import ClientError, EvaluatorClient, make_request
from negt2i.core.spec import parse_prompt
from negt2i.stages.synthetic import SceneObject, render_scene
from negt2i.wire import adapter
from negt2i.wire.v1 import evaluator_pb2
from tests.services.live import REPO, Proc, free_port, start_orchestrator, wait_health
from tests.services.test_api_doc_live import _python_blocks, _run

pytestmark = pytest.mark.xdist_group("services")

DEPTH = {
    "id": "depth-x",
    "category": "depth",
    "prompt": "a photo of a dog not behind a horse",
    "include": [{"class": "dog"}, {"class": "horse"}],
    "statements": [{"kind": "relation", "subject": 0, "target": 1, "predicate": "behind", "polarity": "negated"}],
}
DOG_HORSE = adapter.encode_png(
    render_scene([SceneObject("horse", (2, 10, 28, 40)), SceneObject("dog", (36, 44, 60, 60), "ellipse")], (64, 64))
)
LEAKS = ("object at 0x", "<_io.", "Traceback", "should have", "Input should", "Error:", "Exception")


def rich(status: status_pb2.Status) -> tuple[error_details_pb2.ErrorInfo, error_details_pb2.BadRequest | None]:
    """The ErrorInfo (required) and BadRequest (if any) of a status."""
    info, bad = None, None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
    assert info is not None, status
    assert info.domain == "negt2i.v1"
    assert not any(leak in status.message for leak in LEAKS), status.message
    return info, bad


def call_status(err: grpc.RpcError) -> status_pb2.Status:
    """The google.rpc.Status a failed call carries (grpcio-status checks it agrees with code and details)."""
    status = rpc_status.from_call(err)
    assert status is not None, f"no rich error details on {err.code()}: {err.details()}"
    return status


def _unknown_class(req: evaluator_pb2.EvaluateRequest) -> None:
    req.prompt.objects[0].class_name = "unicorn"


def _empty_text(req: evaluator_pb2.EvaluateRequest) -> None:
    req.prompt.prompt = ""


def _negative_index(req: evaluator_pb2.EvaluateRequest) -> None:
    req.prompt.statements[0].relation.subject = -1


def _unknown_prompt_id(req: evaluator_pb2.EvaluateRequest) -> None:
    req.prompt_id = "no-such-prompt"


def _too_large(req: evaluator_pb2.EvaluateRequest) -> None:
    req.image.data = b"\0" * (5 << 20)  # over the 4 MiB message limit, under the 8 MiB transport limit


def _not_an_image(req: evaluator_pb2.EvaluateRequest) -> None:
    req.image.data = b"GIF89a" + b"\0" * 32


UNARY = [
    # mutate, code, reason, ErrorInfo stage, BadRequest field (None: none), words in the description
    (_unknown_class, "INVALID_ARGUMENT", "INVALID_PROMPT", "request", "prompt.objects[0].class_name",
     "unknown class 'unicorn'"),
    (_empty_text, "INVALID_ARGUMENT", "INVALID_PROMPT", "request", "prompt.prompt", "must not be empty"),
    (_negative_index, "INVALID_ARGUMENT", "INVALID_PROMPT", "request", "prompt.statements[0].relation.subject",
     "must be at least 0"),
    (_not_an_image, "INVALID_ARGUMENT", "UNREADABLE_IMAGE", "request", "image.data", "not a PNG, JPEG or WebP image"),
    (_unknown_prompt_id, "NOT_FOUND", "UNKNOWN_PROMPT_ID", "request", None, "no prompt 'no-such-prompt'"),
    (_too_large, "RESOURCE_EXHAUSTED", "MESSAGE_TOO_LARGE", "request", None, "over the limit of 4194304 bytes"),
]  # fmt: skip


@pytest.mark.parametrize(("mutate", "code", "reason", "stage", "field", "words"), UNARY,
                         ids=[c[2] + "-" + c[0].__name__ for c in UNARY])  # fmt: skip
def test_unary_errors_carry_the_rich_error_model(orchestrator: Proc, mutate: Any, code: str, reason: str,
                                                 stage: str, field: str | None, words: str) -> None:  # fmt: skip
    req = make_request(DOG_HORSE, prompt=parse_prompt(DEPTH), request_id="r")
    mutate(req)
    with EvaluatorClient(orchestrator.target, max_message_bytes=64 << 20, attempts=1) as client:
        with pytest.raises(grpc.RpcError) as err:
            client.stub.Evaluate(req, timeout=30)
        assert err.value.code().name == code
        status = call_status(err.value)
        info, bad = rich(status)
        assert (info.reason, info.metadata["stage"]) == (reason, stage)
        assert words in status.message
        if field is None:
            assert bad is None
        else:
            assert bad is not None and [v.field for v in bad.field_violations] == [field]
            assert words in bad.field_violations[0].description and bad.field_violations[0].reason == reason
        # negt2i.client reads the same: ClientError carries field, stage and reason (a client builds only valid
        # prompts, so the cases that need an invalid one are sent raw above only)
        if mutate in (_not_an_image, _too_large, _unknown_prompt_id):
            with pytest.raises(ClientError) as cerr:
                if mutate is _unknown_prompt_id:
                    client.evaluate(req.image.data, prompt_id=req.prompt_id)
                else:
                    client.evaluate(req.image.data, prompt=parse_prompt(DEPTH))
            assert (cerr.value.code, cerr.value.reason, cerr.value.field) == (code, reason, field or (
                "prompt_id" if mutate is _unknown_prompt_id else "image.data"))  # fmt: skip
            assert cerr.value.failure is not None and cerr.value.failure.line().startswith(
                "missing_metadata" if mutate is _unknown_prompt_id else "unreadable_image"
            )
            assert not cerr.value.retryable  # none of these succeeds when sent again


def test_stream_items_carry_the_rich_error_model_and_an_oversized_item_fails_alone(orchestrator: Proc) -> None:
    """Per item: ItemError keeps code / message / field / stage / kind and adds status (same content as a
    unary call's trailer); a message over max_message_bytes fails only its own item; an empty request_id
    is refused; the grant is in the initial metadata and ServiceInfo."""
    prompt = parse_prompt(DEPTH)
    reqs = [make_request(DOG_HORSE, prompt=prompt, request_id="ok0")]
    bad = make_request(DOG_HORSE, prompt=prompt, request_id="badclass")
    bad.prompt.objects[0].class_name = "unicorn"
    big = make_request(DOG_HORSE, prompt=prompt, request_id="big")
    big.image.data = b"\0" * (5 << 20)
    anonymous = make_request(DOG_HORSE, prompt=prompt, request_id="x")
    anonymous.request_id = ""
    reqs += [bad, big, anonymous, make_request(DOG_HORSE, prompt=prompt, request_id="ok1")]
    with EvaluatorClient(orchestrator.target, max_message_bytes=64 << 20) as client:
        call = client.stream_call(reqs, timeout=60)
        answers = list(call)
        grant = dict(call.initial_metadata())["negt2i-max-in-flight"]
        assert call.code() == grpc.StatusCode.OK
        assert grant == str(client.info().limits.max_in_flight_per_stream) == "32"
    assert sorted(a.request_id for a in answers) == ["", "badclass", "big", "ok0", "ok1"]
    by_id = {a.request_id: a for a in answers}
    assert by_id["ok0"].HasField("result") and by_id["ok1"].HasField("result")
    expect = {
        "badclass": (3, "INVALID_PROMPT", "prompt.objects[0].class_name"),
        "big": (8, "MESSAGE_TOO_LARGE", "image.data"),
        "": (3, "INVALID_REQUEST_ID", "request_id"),
    }
    for rid, (code, reason, field) in expect.items():
        err = by_id[rid].error
        assert (err.code, err.status.code, err.field) == (code, code, field)
        assert err.status.message == err.message and err.kind != evaluator_pb2.FAILURE_KIND_UNSPECIFIED
        info, bad_request = rich(err.status)
        assert info.reason == reason and info.metadata["stage"] == "request" and info.metadata["field"] == field
        if code == 3:
            assert bad_request is not None and bad_request.field_violations[0].field == field
        failure = adapter.failure_from_proto(err)
        assert (failure.reason, failure.field) == (reason, field)


@pytest.fixture
def slow_detector(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.services.fake_stage", "slow", str(port), "--delay", "4"],
                            cwd=REPO, start_new_session=True)  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_stream_deadline_answers_every_item_read_and_refuses_duplicate_ids(
    stage_urls: dict[str, str], slow_detector: str, live_tmp: Path
) -> None:
    """A detector slower than the stream's deadline, a window of 2, and a client that keeps the stream open:
    every item is answered (a DEADLINE_EXCEEDED item error with its reason) before gRPC ends the stream
    with DEADLINE_EXCEEDED; a request_id sent again while its first send is in flight is refused
    (DUPLICATE_REQUEST_ID) and the first send is still answered."""
    proc = start_orchestrator({**stage_urls, "detector": slow_detector}, live_tmp, env={"NEGT2I_STREAM_WINDOW": "2"})
    try:
        assert wait_health(proc.target, "SERVING", timeout=30) == "SERVING"
        prompt = parse_prompt(DEPTH)
        ids = ["a", "a", "b", "c", "d", "e"]
        done = threading.Event()

        def requests() -> Iterator[evaluator_pb2.EvaluateRequest]:
            for rid in ids:
                yield make_request(DOG_HORSE, prompt=prompt, request_id=rid)
            done.wait(30)  # keep the stream open: its deadline, not the client, ends it

        answers: list[evaluator_pb2.EvaluateStreamResponse] = []
        start = time.monotonic()
        with EvaluatorClient(proc.target) as client:
            call = client.stream_call(requests(), timeout=3.0)
            with pytest.raises(grpc.RpcError) as err:
                for answer in call:
                    answers.append(answer)
            done.set()
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - start < 10
        assert sorted(a.request_id for a in answers) == sorted(ids), "every item read is answered"
        reasons = sorted((a.request_id, rich(a.error.status)[0].reason) for a in answers)
        late = [(rid, "DEADLINE_EXCEEDED") for rid in "abcde"]
        assert reasons == sorted([*late, ("a", "DUPLICATE_REQUEST_ID")])
        dup = next(a.error for a in answers if rich(a.error.status)[0].reason == "DUPLICATE_REQUEST_ID")
        assert (dup.code, dup.field) == (3, "request_id") and "already in flight" in dup.message
        for a in answers:
            if a.error.code == 4:
                assert a.error.status.code == 4 and a.error.kind == evaluator_pb2.FAILURE_KIND_STAGE_ERROR
        # the unary call: the item's own deadline answer, with its details, before the call's deadline
        with EvaluatorClient(proc.target, attempts=1) as client, pytest.raises(grpc.RpcError) as uerr:
            client.stub.Evaluate(make_request(DOG_HORSE, prompt=prompt, request_id="u"), timeout=2.0)
        assert uerr.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert rich(call_status(uerr.value))[0].reason == "DEADLINE_EXCEEDED"
    finally:
        proc.kill()


def test_a_stage_out_of_contract_is_internal_with_the_rule(stage_urls: dict[str, str], live_tmp: Path) -> None:
    """INTERNAL carries the rich error model too: a detector that answers a class outside the vocabulary
    fails the item with reason STAGE_CONTRACT_VIOLATION, stage detector and the contract rule, unary and
    per stream item."""
    port = free_port()
    fake = subprocess.Popen([sys.executable, "-m", "tests.services.faulty_detector", str(port), "--fault", "unicorn"],
                            cwd=REPO, start_new_session=True)  # fmt: skip
    proc = start_orchestrator({**stage_urls, "detector": f"http://127.0.0.1:{port}"}, live_tmp)
    try:
        assert wait_health(proc.target, "SERVING", timeout=30) == "SERVING"
        request = make_request(DOG_HORSE, prompt=parse_prompt(DEPTH), request_id="u")
        with EvaluatorClient(proc.target, attempts=1) as client:
            with pytest.raises(grpc.RpcError) as err:
                client.stub.Evaluate(request, timeout=30)
            (answer,) = list(client.stream_call([request], timeout=30))
        assert err.value.code() == grpc.StatusCode.INTERNAL
        for status in (call_status(err.value), answer.error.status):
            info, bad = rich(status)
            assert status.code == 13 and bad is None
            assert (info.reason, info.metadata["stage"], info.metadata["rule"]) == (
                "STAGE_CONTRACT_VIOLATION", "detector", "class-vocabulary"
            )  # fmt: skip
            assert "unicorn" in status.message
        assert (answer.error.stage, answer.error.rule) == ("detector", "class-vocabulary")
    finally:
        proc.kill()
        fake.kill()
        fake.wait(timeout=10)


def test_a_message_over_the_transport_limit_ends_the_stream(orchestrator: Proc) -> None:
    """Over guard.TRANSPORT_FACTOR x max_message_bytes gRPC itself ends the stream (RESOURCE_EXHAUSTED); what
    was answered before stays answered, nothing is answered twice (docs/api.md says: resend what has no
    answer)."""
    prompt = parse_prompt(DEPTH)
    first = make_request(b"not an image", prompt=prompt, request_id="first")
    huge = make_request(DOG_HORSE, prompt=prompt, request_id="huge")
    huge.image.data = b"\0" * (9 << 20)
    answered = threading.Event()

    def requests() -> Iterator[evaluator_pb2.EvaluateRequest]:
        yield first
        answered.wait(30)
        yield huge
        yield make_request(DOG_HORSE, prompt=prompt, request_id="after")

    answers = []
    with EvaluatorClient(orchestrator.target, max_message_bytes=64 << 20) as client:
        with pytest.raises(grpc.RpcError) as err:
            for a in client.stream_call(requests(), timeout=60):
                answers.append(a.request_id)
                answered.set()
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert answers == ["first"]


def _reflect(channel: grpc.Channel, version: str, request: reflection_pb2.ServerReflectionRequest) -> Any:
    """One reflection exchange over ``grpc.reflection.<version>.ServerReflection`` (the v1 and v1alpha
    messages are the same on the wire)."""
    call = channel.stream_stream(
        f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    (answer,) = list(call(iter([request]), timeout=30))
    return answer


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_reflection_v1_and_v1alpha(orchestrator: Proc, version: str) -> None:
    with grpc.insecure_channel(orchestrator.target) as channel:
        listed = _reflect(channel, version, reflection_pb2.ServerReflectionRequest(list_services=""))
        names = {s.name for s in listed.list_services_response.service}
        assert {"negt2i.v1.Evaluator", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection"} <= names  # fmt: skip
        files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
        for symbol in ("negt2i.v1.Evaluator", "grpc.health.v1.Health", f"grpc.reflection.{version}.ServerReflection"):
            found = _reflect(channel, version, reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol))
            for raw in found.file_descriptor_response.file_descriptor_proto:
                fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
                files[fd.name] = fd
        # the answers carry each file with its dependencies: they build a pool on their own
        pool = descriptor_pool.DescriptorPool()
        added: set[str] = set()
        while len(added) < len(files):
            ready = [f for n, f in files.items() if n not in added and set(f.dependency) <= added]
            assert ready, f"missing dependencies of {sorted(set(files) - added)}"
            for fd in ready:
                pool.Add(fd)
                added.add(fd.name)
        service = pool.FindServiceByName("negt2i.v1.Evaluator")
        assert {"Evaluate", "EvaluateStream", "GetServiceInfo"} <= {m.name for m in service.methods}
        item_error = pool.FindMessageTypeByName("negt2i.v1.ItemError")
        assert item_error.fields_by_name["status"].message_type.full_name == "google.rpc.Status"
        assert pool.FindServiceByName(f"grpc.reflection.{version}.ServerReflection").methods[0].name == (
            "ServerReflectionInfo"
        )


def test_the_guides_error_and_health_examples_run(orchestrator: Proc, tmp_path: Path) -> None:
    """docs/api.md's Python examples of "Errors and status codes" and "Health and discovery", run as written
    (target and image swapped in, as for the guide's other examples)."""
    image = tmp_path / "dog.png"
    image.write_bytes(DOG_HORSE)
    (errors_block,) = _python_blocks("## Errors and status codes")
    assert _run(errors_block, orchestrator.target, image).splitlines() == [
        "INVALID_ARGUMENT 3",
        "INVALID_PROMPT request",
        "prompt.objects[0].class_name",
        "img-1 3 prompt.objects[0].class_name",
    ]
    (health_block,) = _python_blocks("## Health and discovery")
    assert _run(health_block, orchestrator.target, image).splitlines() == ["SERVING", "SERVING"]
