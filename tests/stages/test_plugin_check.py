"""One check for both paths (issue 28 item 3): an in-process plug-in is held to the rules a served stage is
held to (stated rules, operating point; strict opt-in), with the same messages, its warnings recorded in every
results line; and the class filter is asked of a detector only when it states the feature, so a plug-in that
caps without ``class_counts`` still gives the services path's ``candidates``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from negt2i.core.config import CURRENT
from negt2i.core.perception import Detections
from negt2i.core.stage_types import ModelInfo, OperatingPoint
from negt2i.pipeline import Pipeline, StageRefused, Stages
from negt2i.stages.registry import register
from negt2i.stages.synthetic import SyntheticDetector
from negt2i.wire import adapter
from negt2i.wire.v1 import stages_pb2
from orchestrator.stages import RemoteStages
from tests.stages.test_class_filter import DEPTH, PROMPTS, SCORER, SEGMENTER, scene


class Plugin:
    """A plug-in detector (the synthetic one inside) stating ``info`` as given."""

    def __init__(self, info: ModelInfo) -> None:
        self.info = info
        self.inner = SyntheticDetector()

    def detect(self, images: Sequence[np.ndarray]) -> list[Detections]:
        return self.inner.detect(images)


def _info(**update: Any) -> ModelInfo:
    return ModelInfo(stage="detector", backend="my-yolo", model="yolo-seg").model_copy(update=update)


def _served_problem(info: ModelInfo, strict: bool) -> tuple[str, tuple[str, ...]]:
    """What the orchestrator says of a served detector whose ``/info`` states ``info``."""
    remote = RemoteStages({"detector": "http://127.0.0.1:9"}, config=CURRENT, strict=strict)
    check = remote.check_info("detector", stages_pb2.StageInfo(contract="negt2i.v1",
                                                               model=adapter.model_info_to_proto(info)))  # fmt: skip
    return check.problem, check.warnings


@pytest.mark.parametrize(
    ("info", "strict", "refused"),
    [
        (_info(rules={"detection.prediction_floor": 0.25}), False, "applies rule constants"),
        (_info(rules={"detection.prediction_floor": 0.005}, operating_point=OperatingPoint(prediction_floor=0.25)),
         False, "operating point's prediction_floor 0.25"),
        (_info(), True, "states no rule constants"),
        (_info(rules={"detection.prediction_floor": 0.005}), True, "states no operating point"),
    ],
)  # fmt: skip
def test_a_plugin_is_refused_as_a_served_stage_is_with_the_same_message(info: ModelInfo, strict: bool, refused: str):
    problem, _ = _served_problem(info, strict)
    assert refused in problem
    with pytest.raises(StageRefused) as err:
        Stages(detector=Plugin(info), segmenter=SEGMENTER).check(CURRENT, strict=strict)  # type: ignore[arg-type]
    assert str(err.value) == f"the detector (my-yolo) is refused: {problem}"


def test_a_plugin_that_states_nothing_is_used_with_the_served_warnings_in_every_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    info = _info()  # floor applied (the synthetic detector's 0.005), nothing stated: a plug-in of before
    register("detector", "test-unstated-plugin", lambda **_: Plugin(info), replace=True)
    monkeypatch.delenv("NEGT2I_STRICT_STAGES", raising=False)
    names = {"detector": "test-unstated-plugin", "segmenter": "synthetic", "attributes": "synthetic",
             "depth": "synthetic"}  # fmt: skip
    stages = Stages.create(names, config=CURRENT)
    _, served = _served_problem(info, strict=False)
    assert stages.warnings["detector"] == served and len(served) == 2
    assert capsys.readouterr().err.count("warning: the detector (my-yolo) states no") == 2
    models = stages.models()
    assert models["detector"]["warnings"] == list(served) and models["detector"]["rules"] == {}
    assert "warnings" not in models["segmenter"]
    monkeypatch.setenv("NEGT2I_STRICT_STAGES", "1")
    with pytest.raises(StageRefused, match="strict stages are on"):
        Stages.create(names, config=CURRENT)


def test_a_plugin_that_caps_without_class_counts_is_filtered_by_the_caller():
    """It takes the keywords but does not state the feature: it is called with the images alone, so the counts
    before the cap (``candidates``) are the services path's; stating the feature gets it the keywords."""
    calls: list[bool] = []

    class Capping(SyntheticDetector):
        features: tuple[str, ...] = ()

        def detect(self, images, classes=None, *, max_per_class=0):  # type: ignore[no-untyped-def]
            calls.append(classes is not None)
            found = super().detect(images, classes, max_per_class=max_per_class)
            return [Detections(d.class_names, d.scores, d.xyxy, d.masks, d.shape_hw) for d in found]  # no counts

    rng = np.random.default_rng(7)
    prompts = PROMPTS[::2]
    images = [scene(p, rng) for p in prompts]
    want = Pipeline(Stages(SyntheticDetector(), SEGMENTER, SCORER, DEPTH)).run(prompts, images)
    got = Pipeline(Stages(Capping(), SEGMENTER, SCORER, DEPTH)).run(prompts, images)
    assert calls and not any(calls)  # never asked for the filter
    assert [r.verdict.to_json() for r in got if r.verdict] == [r.verdict.to_json() for r in want if r.verdict]
    assert any(o["measurements"]["candidates"] > o["measurements"]["per_class_cap"]
               for r in got if r.verdict for o in r.verdict.to_json()["objects"])  # the cap mattered  # fmt: skip
    calls.clear()
    Capping.features = ("detect.classes",)
    Pipeline(Stages(Capping(), SEGMENTER, SCORER, DEPTH)).run(prompts[:2], images[:2])
    assert calls == [True]
