"""The client's pieces that need no server: requests, shards, the rules record, per-item outcomes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import grpc
import pytest

from negt2i.cli.common import parse_shard as _shard
from negt2i.client import ClientError, make_request
from negt2i.core.config import CURRENT, PREVIOUS
from negt2i.core.failures import Failure, FailureKind
from negt2i.core.spec import parse_prompt
from negt2i.run.jobs import Job, select_shard
from negt2i.run.output import Served, response_line
from negt2i.run.remote import rules_from_info
from negt2i.run.stream import retryable, transient
from negt2i.stages.demo_data import prompt_records
from negt2i.wire import adapter
from negt2i.wire.v1 import evaluator_pb2

PROMPT = parse_prompt(prompt_records(1)[0])


def test_make_request_needs_exactly_one_prompt_source():
    req = make_request(b"png", prompt=PROMPT, request_id="a")
    assert req.WhichOneof("prompt_source") == "prompt" and adapter.prompt_from_proto(req.prompt) == PROMPT
    assert make_request(b"png", prompt_id="x").prompt_id == "x"
    with pytest.raises(ValueError, match="exactly one"):
        make_request(b"png")
    with pytest.raises(ValueError, match="exactly one"):
        make_request(b"png", prompt=PROMPT, prompt_id="x")


def test_shards_partition_the_jobs():
    jobs = [Job(f"{i}.png", Path(f"{i}.png"), i, PROMPT) for i in range(10)]
    shards = [select_shard(jobs, (i, 3)) for i in range(3)]
    assert sorted(j.filename for s in shards for j in s) == sorted(j.filename for j in jobs)
    assert [j.sample for j in shards[1]] == [1, 4, 7]
    assert _shard("2/4") == (2, 4)
    for bad in ("4/4", "x", "1/0"):
        with pytest.raises(argparse.ArgumentTypeError):
            _shard(bad)


def test_rules_travel_with_their_digest():
    info = evaluator_pb2.ServiceInfo(rules_json=json.dumps(PREVIOUS.record()), rules_digest=PREVIOUS.digest())
    assert rules_from_info(info) == PREVIOUS
    info.rules_digest = CURRENT.digest()
    with pytest.raises(ClientError, match="digest mismatch"):
        rules_from_info(info)


@pytest.mark.parametrize(
    ("code", "field", "line"),
    [
        (grpc.StatusCode.UNAVAILABLE, "", None),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "", None),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "", None),
        (grpc.StatusCode.INVALID_ARGUMENT, "image.data", "unreadable_image"),
        (grpc.StatusCode.INVALID_ARGUMENT, "prompt.objects[0].class", "invalid_metadata"),
        (grpc.StatusCode.INTERNAL, "", "stage_error"),
        # an oversized message is RESOURCE_EXHAUSTED too, but sending it again cannot help (ErrorInfo.reason)
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "image.data", "unreadable_image"),
    ],
)
def test_item_errors_become_lines_or_reruns(code, field, line):
    job = Job("00000/samples/0000.png", Path("x.png"), 0, PROMPT)
    err = evaluator_pb2.ItemError(code=code.value[0], message="why", field=field)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and field:
        failure = Failure(FailureKind.UNREADABLE_IMAGE, "why", field=field, code=code.name, reason="MESSAGE_TOO_LARGE")
        err = adapter.failure_to_proto(failure)
        err.message = "why"
    # retried within the run: only what the API marks retryable; left for a rerun: every transient code
    assert retryable(err) == (line is None and code.name in {"UNAVAILABLE", "RESOURCE_EXHAUSTED"})
    assert transient(err) == (line is None)
    resp = evaluator_pb2.EvaluateStreamResponse(request_id="0", error=err)
    made = response_line(resp, job, Served(CURRENT, {}, {}))
    if line is None:
        assert made is None
    else:
        assert made is not None and made.record["status"] == "error" and made.record["correct"] is False
        assert made.record["error"].startswith(f"{line}: {code.name}: why")


def test_which_failed_calls_are_retried() -> None:
    """RESOURCE_EXHAUSTED is retried only when the orchestrator said so (its rich error model: overloaded, not an
    oversized message); one without it comes from gRPC's transport (a message or metadata over its limits) and
    cannot succeed when sent again. CANCELLED that the client did not ask for (gRPC ending an old connection's
    calls) is retried (issue 31)."""
    from negt2i.client import ClientError
    from negt2i.core.failures import Failure, FailureKind

    overloaded = Failure(FailureKind.STAGE_ERROR, "busy", code="RESOURCE_EXHAUSTED", reason="SERVER_OVERLOADED")
    too_large = Failure(FailureKind.INVALID_METADATA, "big", code="RESOURCE_EXHAUSTED", reason="MESSAGE_TOO_LARGE")
    assert ClientError("RESOURCE_EXHAUSTED", "at capacity", overloaded).retryable
    assert not ClientError("RESOURCE_EXHAUSTED", "message too large", too_large).retryable
    assert not ClientError("RESOURCE_EXHAUSTED", "received initial metadata size exceeds limit").retryable
    assert ClientError("CANCELLED", "Cancelled").retryable
    assert ClientError("UNAVAILABLE", "down").retryable
    assert not ClientError("INVALID_ARGUMENT", "bad").retryable


def test_needed_health_follows_the_categories_of_the_jobs(tmp_path) -> None:
    from negt2i.core.config import load_config
    from negt2i.run.jobs import discover
    from negt2i.run.remote import needed_health, needed_stages
    from negt2i.stages.demo_data import demo_entries
    from negt2i.stages.synthetic import write_geneval_layout

    entries = list(demo_entries(12, 1, 3, 32))
    write_geneval_layout(tmp_path / "c", [e for e in entries if e[0]["category"] == "color"])
    write_geneval_layout(tmp_path / "d", [e for e in entries if e[0]["category"] in ("color", "depth")])
    color, mixed = discover(tmp_path / "c"), discover(tmp_path / "d")
    assert needed_health(color) == ["negt2i.v1.Evaluator/category/color"]
    assert needed_health(mixed) == ["negt2i.v1.Evaluator/category/color", "negt2i.v1.Evaluator/category/depth"]
    config = load_config("current")
    assert needed_stages(color, config) == {"detector", "attributes"}
    assert needed_stages(mixed, config) == {"detector", "attributes", "segmenter", "depth"}
