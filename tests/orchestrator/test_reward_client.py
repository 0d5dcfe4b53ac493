"""RewardClient against a scripted ``EvaluateStream`` server: only what the API marks retryable is sent again
(the stream submitter's one policy), what stays unanswered or is refused is an explicit ``RewardFailure``, the
window holds, and a verdict that contradicts itself is a failure, not a reward."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from negt2i.core.failures import Failure, FailureKind
from negt2i.reward import RewardClient, RewardFailure, RewardJudge
from negt2i.run.stream import RetryPolicy
from negt2i.stages.demo_data import demo_entries
from negt2i.wire import adapter
from negt2i.wire.v1 import evaluator_pb2
from tests.services.live import free_port

FAST = RetryPolicy(attempts=3, item_timeout=5.0, base=0.01, cap=0.05)
SYNTH = dict.fromkeys(("detector", "segmenter", "attributes", "depth"), "synthetic")
ERRORS = {
    "overloaded": ("RESOURCE_EXHAUSTED", "SERVER_OVERLOADED"),
    "unavailable": ("UNAVAILABLE", "STAGE_UNAVAILABLE"),
    "too_large": ("RESOURCE_EXHAUSTED", "MESSAGE_TOO_LARGE"),
    "invalid": ("INVALID_ARGUMENT", ""),
}


class Scripted:
    """Answers item ``i`` (its image bytes are ``str(i)``) on its n-th send with ``script[i][n-1]`` (the last
    entry repeats): ``ok`` (a real verdict), ``bad`` (a verdict whose score contradicts it) or an ``ERRORS`` key."""

    def __init__(self, script: dict[int, list[str]], verdict: evaluator_pb2.Verdict) -> None:
        self.script, self.verdict, self.sends = script, verdict, Counter[int]()
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        handler = grpc.stream_stream_rpc_method_handler(
            self._stream, request_deserializer=evaluator_pb2.EvaluateRequest.FromString,
            response_serializer=evaluator_pb2.EvaluateStreamResponse.SerializeToString,
        )  # fmt: skip
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("negt2i.v1.Evaluator", {"EvaluateStream": handler}),)
        )
        self.target = f"127.0.0.1:{free_port()}"
        self.server.add_insecure_port(self.target)
        self.server.start()

    def _stream(self, requests: Iterator[evaluator_pb2.EvaluateRequest], _: Any) -> Iterator[Any]:
        for request in requests:
            item = int(request.image.data.decode())
            self.sends[item] += 1
            steps = self.script[item]
            action = steps[min(self.sends[item], len(steps)) - 1]
            resp = evaluator_pb2.EvaluateStreamResponse(request_id=request.request_id)
            if action in ("ok", "bad"):
                resp.result.verdict.CopyFrom(self.verdict)
                if action == "bad":
                    resp.result.verdict.score = 0.123
            else:
                code, reason = ERRORS[action]
                resp.error.CopyFrom(
                    adapter.failure_to_proto(Failure(FailureKind.STAGE_ERROR, action, code=code, reason=reason))
                )
            yield resp


@pytest.fixture(scope="module")
def verdict() -> tuple[dict[str, Any], evaluator_pb2.Verdict, float]:
    record, images = next(iter(demo_entries(prompts=1, samples=1, seed=2, size=64)))
    [d] = RewardJudge("cpu", backends=SYNTH).score(images, [record], details=True)
    return record, adapter.verdict_to_proto(d.verdict), d.score


def test_only_retryable_answers_are_sent_again(verdict) -> None:
    record, msg, score = verdict
    script = {
        0: ["ok"],
        1: ["overloaded", "unavailable", "ok"],  # retryable twice, then answered: a reward
        2: ["unavailable"],  # retryable, never answered: the policy's 3 sends, then an explicit failure
        3: ["too_large"],  # RESOURCE_EXHAUSTED but MESSAGE_TOO_LARGE: sending it again cannot succeed
        4: ["invalid"],  # not retryable
        5: ["bad"],  # a verdict whose score contradicts its elements
        6: ["ok"],
    }
    server = Scripted(script, msg)
    try:
        with RewardClient(server.target, policy=FAST, window=2) as reward:
            got = reward.score([str(i).encode() for i in script], [record] * len(script), on_error="return")
            assert 0 < reward.last_max_in_flight <= 2 and reward.last_stats.retried == 4
    finally:
        server.server.stop(0)
    assert got[0] == got[1] == got[6] == score
    assert dict(server.sends) == {0: 1, 1: 3, 2: 3, 3: 1, 4: 1, 5: 1, 6: 1}
    failures = {f.index: f for f in got if isinstance(f, RewardFailure)}
    assert sorted(failures) == [2, 3, 4, 5]
    assert [(failures[i].code, failures[i].retryable) for i in (2, 3, 4)] == [
        ("UNAVAILABLE", True), ("RESOURCE_EXHAUSTED", False), ("INVALID_ARGUMENT", False)
    ]  # fmt: skip
    assert failures[5].code == "DATA_LOSS" and "contradicts" in failures[5].message


def test_a_server_that_is_not_there_fails_every_image_retryably(verdict) -> None:
    record, _, _ = verdict
    with RewardClient(f"127.0.0.1:{free_port()}", policy=FAST, timeout=20) as reward:
        got = reward.score([b"0", b"1"], [record] * 2, on_error="return")
    assert all(isinstance(f, RewardFailure) and f.code == "UNAVAILABLE" and f.retryable for f in got)
