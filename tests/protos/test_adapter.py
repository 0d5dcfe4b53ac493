"""The protobuf <-> core adapter: exact round trips, and errors that name the field."""

from __future__ import annotations

import numpy as np
import pytest

from negt2i.core.spec import parse_prompt
from negt2i.pipeline import Pipeline, Stages
from negt2i.stages.demo_data import demo_entries, prompt_records
from negt2i.stages.synthetic import SceneObject, SyntheticDetector, render_scene
from negt2i.wire import adapter
from negt2i.wire.stage_handlers import StageHandler, StageSettings
from negt2i.wire.v1 import common_pb2, evaluator_pb2, stages_pb2

SYNTH = dict.fromkeys(("detector", "segmenter", "attributes", "depth"), "synthetic")


def _wire(msg):
    """Through bytes and through the proto3 JSON mapping: both must give the same message."""
    again = type(msg).FromString(msg.SerializeToString())
    assert adapter.from_json(adapter.to_json(msg), type(msg)) == again
    return again


def test_masks_round_trip_exactly():
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (7, 13), (64, 48)]:
        for density in (0.0, 0.3, 1.0):
            mask = rng.random(shape) < density
            msg = _wire(adapter.mask_to_proto(mask))
            assert (msg.height, msg.width) == shape
            assert (adapter.mask_from_proto(msg, shape) == mask).all()


def test_mask_errors_name_the_field():
    msg = adapter.mask_to_proto(np.ones((4, 4), bool))
    with pytest.raises(adapter.WireError, match=r"^m: mask is 4 x 4, expected 5 x 4"):
        adapter.mask_from_proto(msg, (5, 4), field="m")
    msg.counts = "garbage!"
    with pytest.raises(adapter.WireError, match="bad RLE"):
        adapter.mask_from_proto(msg)


def test_detections_round_trip_exactly():
    image = render_scene(
        [SceneObject("cup", (3, 4, 20, 30)), SceneObject("dog", (25, 10, 60, 50), "ellipse")], (64, 72)
    )
    det = SyntheticDetector(score=0.8765).detect([image])[0]
    back = adapter.detections_from_proto(_wire(adapter.detections_to_proto(det)))
    assert back.class_names == det.class_names and back.shape_hw == det.shape_hw
    assert (back.scores == det.scores).all() and (back.xyxy == det.xyxy).all() and (back.masks == det.masks).all()
    empty = SyntheticDetector().detect([np.full((8, 9, 3), 250, np.uint8)])[0]
    assert len(adapter.detections_from_proto(_wire(adapter.detections_to_proto(empty)))) == 0


def test_depth_packing():
    rng = np.random.default_rng(1)
    disp = rng.random((37, 29)).astype(np.float32)
    exact = adapter.depth_to_proto(disp, common_pb2.DEPTH_ENCODING_FLOAT32)
    assert len(exact.data) == 37 * 29 * 4 and (adapter.depth_from_proto(_wire(exact)) == disp).all()
    half = _wire(adapter.depth_to_proto(disp))  # float16 by default: half the bytes
    assert half.encoding == common_pb2.DEPTH_ENCODING_FLOAT16 and len(half.data) == 37 * 29 * 2
    assert np.abs(adapter.depth_from_proto(half) - disp).max() < 1e-3
    steps = (np.arange(128, dtype=np.float32)[:, None] + 1) / 128 * np.ones((1, 5), np.float32)
    assert (adapter.depth_from_proto(adapter.depth_to_proto(steps)) == steps).all()  # k/128 is exact in float16
    half.data = half.data[:-2]
    with pytest.raises(adapter.WireError, match=r"disparity\.data"):
        adapter.depth_from_proto(half)


def test_attribute_scores_round_trip_exactly():
    scores = np.random.default_rng(2).normal(50, 20, (3, 11)).astype(np.float32)
    msg = _wire(adapter.scores_to_attributes_result(scores))
    assert (adapter.attributes_result_scores(msg, 3, 11) == scores).all()
    with pytest.raises(adapter.WireError, match="expected 3 rows of 4 scores"):
        adapter.attributes_result_scores(msg, 3, 4)


GENEVAL_STYLE = {"tag": "position", "prompt": "a photo of a dog right of a cat",
                 "include": [{"class": "dog"}, {"class": "cat", "position": ["left of", 0]}]}  # fmt: skip


@pytest.mark.parametrize(
    "record",
    [
        *prompt_records(12, seed=5),
        {**GENEVAL_STYLE, "id": "00007"},
        {"id": "single", "tag": "single_object", "prompt": "a photo of a bench", "include": [{"class": "bench"}]},
        {"id": "two-skis", "tag": "counting", "prompt": "two skis", "include": [{"class": "skis", "count": 2}],
         "source": {"seed": 3, "ratio": 0.5}, "note": "kept"},
    ],
)  # fmt: skip
def test_prompts_round_trip_exactly(record):
    prompt = parse_prompt(record)
    assert adapter.prompt_from_proto(_wire(adapter.prompt_to_proto(prompt))) == prompt


def test_prompt_errors_name_the_field():
    msg = adapter.prompt_to_proto(parse_prompt(prompt_records(3)[2]))
    msg.statements[0].relation.subject = 9
    # field paths in the proto's names (AIP-193), as BadRequest field violations carry them
    with pytest.raises(adapter.WireError, match=r"prompt\.statements\[0\]\.relation\.subject: points at object 9"):
        adapter.prompt_from_proto(msg)
    msg = adapter.prompt_to_proto(parse_prompt(prompt_records(1)[0]))
    msg.statements[0].polarity = evaluator_pb2.POLARITY_UNSPECIFIED
    with pytest.raises(adapter.WireError, match=r"statements\[0\]\.polarity"):
        adapter.prompt_from_proto(msg)
    msg = adapter.prompt_to_proto(parse_prompt(prompt_records(1)[0]))
    msg.statements[0].attribute.value = "teal"
    with pytest.raises(adapter.WireError, match="'teal' is not a color value") as err:
        adapter.prompt_from_proto(msg)
    assert err.value.field == "prompt.statements[0].attribute.value"
    msg.statements[0].attribute.value = "red"
    msg.objects[0].class_name = "unicorn"
    with pytest.raises(adapter.WireError, match="unknown class 'unicorn'") as err:
        adapter.prompt_from_proto(msg)
    assert err.value.field == "prompt.objects[0].class_name"


def test_verdicts_round_trip_exactly():
    pipeline = Pipeline(Stages.create(SYNTH))
    seen = set()
    for record, images in demo_entries(prompts=18, samples=3, seed=4):
        prompt = parse_prompt(record)
        for result in pipeline.run([prompt] * len(images), images):
            assert result.verdict is not None
            v = result.verdict
            seen.add((v.category, v.correct, v.failure_class))
            msg = _wire(adapter.verdict_to_proto(v))
            assert msg.HasField("score") and msg.score == v.score
            back = adapter.verdict_from_proto(msg)
            assert back.to_json() == v.to_json() and back.dumps() == v.dumps()
    assert len({c for c, _, _ in seen}) == 6 and {True, False} <= {ok for _, ok, _ in seen}


def test_verdict_score_from_an_older_evaluator_and_a_wrong_one():
    record, images = next(iter(demo_entries(prompts=6, samples=1, seed=4)))
    v = Pipeline(Stages.create(SYNTH)).run_one(parse_prompt(record), images[0]).verdict
    assert v is not None
    msg = adapter.verdict_to_proto(v)
    msg.ClearField("score")  # what an evaluator older than the field sends: the reader computes it
    assert adapter.verdict_from_proto(msg).score == v.score
    msg.score = 0.5 if v.score != 0.5 else 0.25
    with pytest.raises(ValueError, match="contradicts objects / statements"):
        adapter.verdict_from_proto(msg)


def test_model_info_and_json_transport():
    info = Stages.create(SYNTH).detector.info
    assert adapter.model_info_from_proto(_wire(adapter.model_info_to_proto(info))) == info
    with pytest.raises(adapter.WireError, match="no_such_field"):
        adapter.from_json({"image": {}, "no_such_field": 1}, stages_pb2.DetectItem)
    with pytest.raises(adapter.WireError, match="expected a JSON object"):
        adapter.from_json([1], stages_pb2.DetectItem)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"", "empty file"),
        (b"GIF89a....", r"not a PNG, JPEG or WebP image \(the file is GIF\)"),
        (b"\x89PNG\r\n\x1a\n\0\0", "not a PNG, JPEG or WebP image"),
    ],
)
def test_decode_image_rejects_bad_bytes(data, needle):
    with pytest.raises(adapter.WireError, match=needle):
        adapter.decode_image(data)


def test_decode_image_pixel_limit():
    png = adapter.encode_png(np.zeros((40, 50, 3), np.uint8))
    assert adapter.decode_image(png).shape == (40, 50, 3)
    with pytest.raises(adapter.WireError, match="above the limit of 1999"):
        adapter.decode_image(png, max_pixels=1999)


@pytest.mark.parametrize("stage", ["detector", "segmenter", "attributes", "depth"])
def test_stage_handler_fails_bad_items_alone(stage):
    handler = StageHandler(StageSettings.from_env(stage, {f"NEGT2I_{stage.upper()}_BACKEND": "synthetic"}))
    assert not handler.ready and not handler.info().ready
    handler.warm_up()
    assert handler.ready and handler.info().model.backend == "synthetic"
    from negt2i.conformance import _item, _scene

    png, masks, boxes = _scene((40, 48))
    good = _item(stage, png, masks, boxes)
    bad = _item(stage, b"nope", masks, boxes)
    out = handler.handle([good, bad, {"unknown": 1}, good])
    assert "error" not in out[0] and out[0] == out[3]
    assert out[1]["error"]["status"] == 400 and out[1]["error"]["field"] == "image"
    assert out[2]["error"]["status"] == 400 and "unknown" in out[2]["error"]["message"]


def test_perception_round_trips_with_the_disparity():
    pipeline = Pipeline(Stages.create(SYNTH))
    kinds = set()
    for record, images in demo_entries(prompts=12, samples=2, seed=9):
        for result in pipeline.run([parse_prompt(record)] * len(images), images):
            p = result.perception
            assert p is not None
            back = adapter.perception_from_proto(_wire(adapter.perception_to_proto(p)))
            assert back.detections.class_names == p.detections.class_names
            assert (back.detections.masks == p.detections.masks).all()
            assert (back.refined is None) == (p.refined is None)
            if p.refined is not None:
                kinds.add("refined")
                assert set(back.refined.masks) == set(p.refined.masks)
                assert all((back.refined[k] == p.refined[k]).all() for k in p.refined.masks)
            if p.attributes is not None:
                kinds.add("attributes")
                assert {k: dict(v) for k, v in back.attributes.scores.items()} == {
                    k: dict(v) for k, v in p.attributes.scores.items()
                }
            assert (back.disparity is None) == (p.disparity is None)
            if p.disparity is not None:  # packed float16 (the orchestrator's default); the synthetic map is exact in it
                kinds.add("disparity")
                assert (back.disparity.values == p.disparity.values).all()
                exact = adapter.perception_from_proto(
                    _wire(adapter.perception_to_proto(p, common_pb2.DEPTH_ENCODING_FLOAT32))
                )
                assert exact.disparity is not None and (exact.disparity.values == p.disparity.values).all()
            assert adapter.perception_to_proto(p).used_depth == (p.disparity is not None)
    assert kinds == {"refined", "attributes", "disparity"}


def test_enum_tables_cover_both_sides_exactly():
    """Core enums <-> proto enums by explicit tables: every value of each side maps, one to one."""
    from negt2i.core.failures import ContractRule, Failure, FailureKind
    from negt2i.core.verdict import FailureCause, RowFailure
    from negt2i.wire.v1 import evaluator_pb2

    for table, core, proto in [
        (adapter._CAUSE_TO, FailureCause, evaluator_pb2.FailureCause),
        (adapter._ROW_TO, RowFailure, evaluator_pb2.RowFailure),
    ]:
        assert set(table) == {None, *core} and sorted(table.values()) == sorted(proto.values())
    assert set(adapter._KIND_TO) == set(FailureKind)
    assert sorted(adapter._KIND_TO.values()) == sorted(v for v in evaluator_pb2.FailureKind.values() if v)
    for kind in FailureKind:
        sent = Failure(kind, "why", stage="s", rule=ContractRule.MASK_SIZE)
        back = adapter.failure_from_proto(adapter.failure_to_proto(sent))
        assert (back.kind, back.stage, back.rule, back.code) == (kind, "s", ContractRule.MASK_SIZE, "INTERNAL")


def test_model_info_rules_come_back_in_one_order_whatever_the_map_order():
    """The protobuf map's iteration order differs from process to process; the core record (and so a results
    line's model record) orders the rules as ``STAGE_RULES`` does, then any other path sorted."""
    from negt2i.core.config import STAGE_RULES
    from negt2i.core.stage_types import ModelInfo

    paths = list(STAGE_RULES["segmenter"])
    for order in (paths, paths[::-1], [paths[1], paths[2], paths[0]]):
        rules = {p: float(i) for i, p in enumerate(order)} | {"z.extra": 1.0, "a.extra": 2.0}
        msg = adapter.model_info_to_proto(ModelInfo(stage="segmenter", backend="b", model="m", rules=rules))
        back = adapter.model_info_from_proto(msg)
        assert list(back.rules) == [*paths, "a.extra", "z.extra"] and back.rules == rules
