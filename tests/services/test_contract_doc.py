"""``docs/stage-contract.md`` followed literally: the ``model_digest`` recipe as written gives the digest the
orchestrator computes, for every kind of ``/info`` a service may send."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from negt2i.core.config import CURRENT
from negt2i.stages.base import ModelInfo
from negt2i.stages.registry import create
from negt2i.wire import adapter
from negt2i.wire.v1 import stages_pb2

DOC = Path(__file__).resolve().parents[2] / "docs" / "stage-contract.md"


def _py_float(value: float) -> str:
    """A number "as Python writes a float" (what the recipe says): repr of the float."""
    return repr(float(value))


def recipe(model: dict[str, Any]) -> str:
    """The digest of a ``ModelInfo`` as the doc's recipe says, from the proto3 JSON ``/info`` sends: all ten
    fields, defaults included, keys sorted, no spaces, rules as Python floats, operating_point null or its
    three fields. Written by hand (not ``json.dumps`` of the ``ModelInfo``), as another language would."""
    strings = {k: str(model.get(k, "")) for k in ("backend", "library", "model", "revision", "sha256", "stage")}
    strings["device"] = str(model.get("device") or "cpu")
    strings["dtype"] = str(model.get("dtype") or "float32")
    fields: dict[str, str] = {k: json.dumps(v) for k, v in strings.items()}
    rules = model.get("rules") or {}
    fields["rules"] = "{" + ",".join(f"{json.dumps(k)}:{_py_float(v)}" for k, v in sorted(rules.items())) + "}"
    op = model.get("operating_point")
    if op is None:
        fields["operating_point"] = "null"
    else:
        size, floor = int(op.get("input_size", 0)), _py_float(op.get("prediction_floor", 0))
        suppression = json.dumps(str(op.get("suppression", "")))
        fields["operating_point"] = f'{{"input_size":{size},"prediction_floor":{floor},"suppression":{suppression}}}'
    text = "{" + ",".join(f"{json.dumps(k)}:{fields[k]}" for k in sorted(fields)) + "}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _infos() -> list[ModelInfo]:
    out = [create(s, "synthetic", config=CURRENT).info for s in ("detector", "segmenter", "attributes", "depth")]
    out.append(ModelInfo(stage="detector", backend="yolo", model="YOLOv8x-seg", library="ultralytics 8.3"))  # v1 of old
    out.append(ModelInfo(stage="detector", backend="b", model="Modèle ✓", rules={"detection.prediction_floor": 1e-05}))
    return out


@pytest.mark.parametrize("info", _infos(), ids=lambda i: f"{i.stage}-{i.backend}")
def test_the_documented_digest_recipe_is_what_the_code_computes(info: ModelInfo):
    sent = adapter.to_json(stages_pb2.StageInfo(contract="negt2i.v1", model=adapter.model_info_to_proto(info)))
    assert recipe(sent["model"]) == info.digest()  # what /info sends, hashed as the doc says
    # and what the orchestrator computes from the same /info
    assert adapter.model_info_from_proto(adapter.from_json(sent, stages_pb2.StageInfo).model).digest() == info.digest()


def test_the_documented_example_matches_its_recipe():
    text = DOC.read_text(encoding="utf-8")
    found = re.search(r"For our synthetic detector:\n\n  ```\n  (\{.*\})\n  ```", text)
    assert found, "the digest example is gone from docs/stage-contract.md"
    example = json.loads(found.group(1))
    assert list(example) == sorted(example) and len(example) == 10  # all ten fields, sorted
    assert ModelInfo(**example).digest() == hashlib.sha256(found.group(1).encode()).hexdigest()[:16]
    shipped = create("detector", "synthetic", config=CURRENT).info.model_dump(mode="json")
    assert {k: v for k, v in example.items() if k != "library"} == {k: v for k, v in shipped.items() if k != "library"}


def test_model_digest_is_documented_as_optional_once():
    text = DOC.read_text(encoding="utf-8")
    assert "**`model_digest` is optional**" in text
    assert "Every result that is not an `error` carries `model_digest`" not in text  # it was stated both ways


def test_the_documented_details_of_a_stage_service(tmp_path: Path):
    """Presets' floors, partial rules files, DetectItem.classes with person and repeats, and the error.field
    of an unknown field (JSON and binary) are what the code does."""
    from negt2i.core.config import PRESETS, load_config
    from negt2i.wire.stage_handlers import StageHandler, StageSettings
    from negt2i.wire.v1 import common_pb2

    for config in PRESETS.values():
        assert (config.detection.prediction_floor, config.masks.closing_radius, config.masks.min_component_fraction,
                config.masks.box_chunk_size) == (0.005, 5, 0.05, 50)  # fmt: skip
    rules = tmp_path / "partial.json"
    rules.write_text('{"detection": {"prediction_floor": 0.01}}')
    partial = load_config(str(rules))
    assert partial.detection.prediction_floor == 0.01
    assert partial.detection.presence_threshold == CURRENT.detection.presence_threshold
    handler = StageHandler(StageSettings.from_env("detector", {"NEGT2I_DETECTOR_BACKEND": "synthetic"}))
    png = adapter.encode_png(np.zeros((8, 8, 3), dtype=np.uint8))
    image = adapter.to_json(adapter.image_to_proto(png))
    out = handler.handle([{"image": image, "classes": ["person", "person", "cup"]},
                          {"image": image, "no_such_field": 1},
                          {"image": image, "classes": ["unicorn"]}])  # fmt: skip
    assert "error" not in out[0]
    assert out[1]["error"]["status"] == 400 and out[1]["error"]["field"] == "items[1]"
    assert "no_such_field" in out[1]["error"]["message"]
    assert out[2]["error"]["field"] == "classes[0]"
    item = stages_pb2.DetectItem(image=common_pb2.Image(data=png))
    raw = item.SerializeToString() + b"\x98\x06\x01"  # field 99, varint 1: unknown to DetectItem
    msg = stages_pb2.DetectItem.FromString(raw)
    failed = handler.handle_messages([msg])[0]
    assert failed.error.status == 400 and failed.error.field == "items[0]"
    assert "unknown field number 99 in negt2i.v1.DetectItem" in failed.error.message
