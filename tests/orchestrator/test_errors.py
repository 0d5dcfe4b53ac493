"""The rich error model (``negt2i.wire.errors``), plain-word messages and the health table, without servers
(``tests/services/test_api_contract.py`` checks them on real processes)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from google.rpc import error_details_pb2, status_pb2

from negt2i.core.config import CURRENT
from negt2i.core.failures import Failure, FailureKind, StageError
from negt2i.core.plan import category_stages
from negt2i.core.spec import SpecError, parse_prompt
from negt2i.core.vocab import Category
from negt2i.wire import adapter, errors
from negt2i.wire.v1 import evaluator_pb2
from orchestrator import discovery

DEPTH: dict[str, Any] = {
    "id": "depth-x",
    "category": "depth",
    "prompt": "a photo of a dog not behind a horse",
    "include": [{"class": "dog"}, {"class": "horse"}],
    "statements": [{"kind": "relation", "subject": 0, "target": 1, "predicate": "behind", "polarity": "negated"}],
}


def unpack(status: status_pb2.Status) -> tuple[error_details_pb2.ErrorInfo, error_details_pb2.BadRequest | None]:
    info, bad = error_details_pb2.ErrorInfo(), None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            detail.Unpack(info)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
    return info, bad


CASES = [
    # failure, code number, reason, metadata stage, BadRequest field (None: no BadRequest)
    (Failure(FailureKind.INVALID_METADATA, "unknown class 'unicorn'", field="prompt.objects[0].class_name",
             code="INVALID_ARGUMENT"), 3, "INVALID_PROMPT", "request", "prompt.objects[0].class_name"),
    (Failure(FailureKind.UNREADABLE_IMAGE, "not a PNG, JPEG or WebP image", field="image.data",
             code="INVALID_ARGUMENT"), 3, "UNREADABLE_IMAGE", "request", "image.data"),
    (Failure(FailureKind.INVALID_METADATA, "not valid", field="request", code="INVALID_ARGUMENT"),
     3, "MALFORMED_REQUEST", "request", "request"),
    (Failure(FailureKind.MISSING_METADATA, "no prompt 'x'", field="prompt_id", code="NOT_FOUND"),
     5, "UNKNOWN_PROMPT_ID", "request", None),
    (StageError("depth", "unreachable (connection refused)", code="UNAVAILABLE"),
     14, "STAGE_UNAVAILABLE", "depth", None),
    (StageError("detector", "queue full", code="RESOURCE_EXHAUSTED"), 8, "STAGE_OVERLOADED", "detector", None),
    (Failure(FailureKind.STAGE_ERROR, "at capacity", code="RESOURCE_EXHAUSTED"), 8, "SERVER_OVERLOADED",
     "admission", None),
    (StageError("segmenter", "no answer within 2.0 s", code="DEADLINE_EXCEEDED"), 4, "DEADLINE_EXCEEDED",
     "segmenter", None),
    (StageError("detector", "class names ['unicorn']", rule="class-vocabulary"), 13, "STAGE_CONTRACT_VIOLATION",
     "detector", None),
    (StageError("judge", "bad perception"), 13, "JUDGE_FAILED", "judge", None),
    (StageError("attributes", "too large", code="INVALID_ARGUMENT"), 3, "STAGE_REJECTED_INPUT", "attributes",
     "request"),
    (Failure(FailureKind.STAGE_ERROR, "internal error", code="INTERNAL"), 13, "INTERNAL_ERROR", "orchestrator",
     None),
]  # fmt: skip


@pytest.mark.parametrize(("failure", "code", "reason", "stage", "field"), CASES, ids=[c[2] for c in CASES])
def test_every_failure_becomes_a_status_with_error_info(failure: Failure, code: int, reason: str, stage: str,
                                                        field: str | None) -> None:  # fmt: skip
    status = status_pb2.Status.FromString(errors.to_status(failure).SerializeToString())
    info, bad = unpack(status)
    assert status.code == code and status.message == failure.details()
    assert (info.domain, info.reason, info.metadata["stage"]) == ("negt2i.v1", reason, stage)
    assert info.metadata["kind"] == failure.kind.value
    assert info.metadata.get("rule", "") == (failure.rule or "")
    if field is None:
        assert bad is None
    else:
        assert bad is not None and [(v.field, v.reason) for v in bad.field_violations] == [(field, reason)]
        assert bad.field_violations[0].description == failure.message
    back = errors.failure_from_status(status)
    assert (back.code, back.reason, back.kind, back.rule) == (failure.code, reason, failure.kind, failure.rule)
    assert back.stage == failure.stage and back.field == failure.field


def test_item_errors_carry_the_same_status_and_keep_their_fields() -> None:
    failure = StageError("detector", "class names ['unicorn'] are not in the vocabulary", rule="class-vocabulary")
    err = evaluator_pb2.ItemError.FromString(adapter.failure_to_proto(failure).SerializeToString())
    assert (err.code, err.stage, err.rule, err.kind) == (13, "detector", "class-vocabulary",
                                                         evaluator_pb2.FAILURE_KIND_STAGE_ERROR)  # fmt: skip
    assert err.message == err.status.message == failure.details()
    info, _ = unpack(err.status)
    assert info.reason == "STAGE_CONTRACT_VIOLATION" and info.metadata["rule"] == "class-vocabulary"
    back = adapter.failure_from_proto(err)
    assert back.reason == "STAGE_CONTRACT_VIOLATION" and back.stage == "detector"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("cannot identify image file <_io.BytesIO object at 0x7f3a2c1d9e50>", "cannot identify image file the data"),
        ("detector: unreachable at http://h:1 (ConnectError) after 3 attempts",
         "detector: unreachable at http://h:1 (connection refused) after 3 attempts"),
        ("KeyError: 'x' while judging", "'x' while judging"),
        ("a fine message (3 bytes)", "a fine message (3 bytes)"),
        ("unknown class 'MyError'", "unknown class 'MyError'"),
    ],
)  # fmt: skip
def test_plain_removes_python_internals(text: str, want: str) -> None:
    assert errors.plain(text) == want


@pytest.mark.parametrize(
    ("field", "path"),
    [
        ("prompt.objects[0].class", "prompt.objects[0].class_name"),
        ("prompt.objects[2].count", "prompt.objects[2].count"),
        ("prompt.statements[0].value", "prompt.statements[0].attribute.value"),
        ("prompt.statements[3].object", "prompt.statements[3].attribute.object"),
        ("prompt.statements[1].predicate", "prompt.statements[1].relation.predicate"),
        ("prompt.probes[0].target", "prompt.probes[0].relation.target"),
        ("prompt.statements[0].polarity", "prompt.statements[0].polarity"),
        ("image.data", "image.data"),
    ],
)
def test_field_paths_use_the_proto_names(field: str, path: str) -> None:
    assert errors.proto_path(field) == path


PYDANTIC_PHRASES = ("should", "Input", "String", "Field required", "Extra inputs", "validation error", "pydantic")


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"prompt": ""}, "prompt", "must not be empty"),
        ({"id": ""}, "id", "must not be empty"),
        ({"prompt": 5}, "prompt", "must be a string, got 5"),
        ({"statements": [{"kind": "relation", "subject": -1, "target": 1, "predicate": "behind"}]},
         "statements[0].subject", "must be at least 0, got -1"),
        ({"statements": [{"kind": "relation", "subject": "a", "target": 1, "predicate": "behind"}]},
         "statements[0].subject", "must be an integer, got 'a'"),
        ({"statements": [{"kind": "relation", "subject": 0, "target": 1, "predicate": "behind", "polarity": "no"}]},
         "statements[0].polarity", "must be one of 'positive' or 'negated', got 'no'"),
        ({"statements": [{"kind": "shape", "object": 0}]}, "statements[0]", "unknown kind 'shape'"),
        ({"statements": [{"object": 0}]}, "statements[0]", "needs a 'kind'"),
        ({"statements": [{"kind": "attribute", "object": 0}]}, "statements[0].value", "missing required key"),
        ({"statements": [{"kind": "attribute", "object": 0, "value": "red", "x": 1}]}, "statements[0].x",
         "unknown key"),
        ({"statements": [7]}, "statements[0]", "must be an object"),
        ({"tag": 5}, "tag", "must be a string, got 5"),
    ],
)  # fmt: skip
def test_prompt_errors_are_in_plain_words(change: dict[str, Any], field: str, words: str) -> None:
    record = {**copy.deepcopy(DEPTH), **change}
    with pytest.raises(SpecError) as err:
        parse_prompt(record)
    assert err.value.field == field and words in err.value.message, err.value
    assert not any(p in err.value.message for p in PYDANTIC_PHRASES), err.value.message


def test_the_inline_prompt_errors_reach_the_wire_in_plain_words() -> None:
    msg = adapter.prompt_to_proto(parse_prompt(DEPTH))
    msg.prompt = ""
    with pytest.raises(adapter.WireError) as err:
        adapter.prompt_from_proto(msg)
    assert (err.value.field, err.value.message) == ("prompt.prompt", "must not be empty")


def test_category_stages_cover_what_the_plan_asks_for() -> None:
    assert category_stages(None) == ("detector",)
    assert category_stages(Category.COLOR) == category_stages(Category.MATERIAL) == ("detector", "attributes")
    for c in (Category.DIRECTIONAL, Category.PROXIMITY, Category.COMPARATIVE):
        assert category_stages(c) == ("detector", "segmenter")
    assert category_stages(Category.DEPTH) == ("detector", "segmenter", "depth")
    no_refine = CURRENT.model_copy(update={"masks": CURRENT.masks.model_copy(update={"refine": False})})
    assert category_stages(Category.DEPTH, no_refine) == ("detector", "depth")


def test_health_per_stage_and_category() -> None:
    serving, down = discovery.SERVING, discovery.NOT_SERVING
    every = dict.fromkeys(("detector", "segmenter", "attributes", "depth"), True)
    assert set(discovery.health_statuses(every, CURRENT).values()) == {serving}
    names = discovery.health_statuses({**every, "depth": False}, CURRENT)
    assert len(names) == 2 + 4 + 6
    assert names[""] == names["negt2i.v1.Evaluator"] == down
    assert names["negt2i.v1.Evaluator/stage/depth"] == down
    assert names["negt2i.v1.Evaluator/category/depth"] == down
    for c in ("color", "material", "directional", "proximity", "comparative"):
        assert names[f"negt2i.v1.Evaluator/category/{c}"] == serving
    names = discovery.health_statuses({**every, "segmenter": False}, CURRENT)
    assert [c for c in Category if names[discovery.category_name(c)] == serving] == [
        Category.COLOR, Category.MATERIAL
    ]  # fmt: skip
    names = discovery.health_statuses({**every, "detector": False}, CURRENT)
    assert all(names[discovery.category_name(c)] == down for c in Category)


@pytest.mark.parametrize(
    ("code", "stage", "want"),
    [("DEADLINE_EXCEEDED", "", "orchestrator"), ("RESOURCE_EXHAUSTED", "", "orchestrator"),
     ("INTERNAL", "", "orchestrator"), ("UNAVAILABLE", "depth", "depth"), ("INVALID_ARGUMENT", "", ""),
     ("NOT_FOUND", "", "")],
)  # fmt: skip
def test_item_error_stage_is_set_wherever_its_comment_says(code: str, stage: str, want: str) -> None:
    """ItemError.stage: the stage for the four stage codes, "orchestrator" when no stage failed (its deadline,
    admission or message limits, a bug), empty for the request's own errors."""
    failure = Failure(FailureKind.STAGE_ERROR, "x", stage=stage, code=code)
    assert adapter.failure_to_proto(failure).stage == want
