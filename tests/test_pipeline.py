"""The shared per-image flow over stage objects (synthetic backends and failing fakes)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from negt2i.config import CURRENT
from negt2i.perception import Detections
from negt2i.pipeline import Pipeline, Stages
from negt2i.spec import parse_prompt
from negt2i.stages.synthetic import (
    SceneObject,
    SyntheticAttributeScorer,
    SyntheticDepthEstimator,
    SyntheticDetector,
    SyntheticSegmenter,
    render_scene,
)


def _prompt(pid, category, include, statements):
    return parse_prompt(
        {
            "id": pid,
            "category": category,
            "prompt": pid,
            "include": [{"class": c} for c in include],
            "statements": statements,
        }
    )


def _rel(predicate, polarity="positive"):
    return [{"kind": "relation", "subject": 0, "target": 1, "predicate": predicate, "polarity": polarity}]


def _attr(value, polarity="positive"):
    return [{"kind": "attribute", "object": 0, "value": value, "polarity": polarity}]


class Counting:
    """Wraps a backend and counts the calls of its stage method."""

    def __init__(self, inner, method):
        self.inner, self.method, self.calls = inner, method, 0
        self.info = inner.info
        setattr(self, method, self._call)

    def _call(self, *args, **kwargs):
        self.calls += 1
        return getattr(self.inner, self.method)(*args, **kwargs)


def _stages():
    return Stages(
        Counting(SyntheticDetector(), "detect"),
        Counting(SyntheticSegmenter(), "refine"),
        Counting(SyntheticAttributeScorer(), "score"),
        Counting(SyntheticDepthEstimator(), "disparity"),
    )


SCENE = render_scene(
    [
        SceneObject("cup", (8, 40, 30, 60), value="blue"),
        SceneObject("dog", (80, 30, 120, 90), shape="ellipse"),
        SceneObject("horse", (40, 5, 70, 25)),
    ],
    (128, 128),
)


def test_verdicts_and_only_needed_stages_are_called():
    stages = _stages()
    prompts = [
        _prompt("c1", "color", ["cup"], _attr("red", "negated")),  # blue cup: not red -> pass
        _prompt("c2", "color", ["cup"], _attr("blue")),  # pass
        _prompt("d1", "directional", ["cup", "dog"], _rel("left of")),  # pass
        _prompt("d2", "directional", ["cup", "dog"], _rel("left of", "negated")),  # fail
        _prompt("z1", "depth", ["dog", "horse"], _rel("in front of")),  # dog lower -> closer: pass
        _prompt("m1", "material", ["cat"], _attr("wooden")),  # no cat: undetected
    ]
    results = Pipeline(stages).run(prompts, [SCENE] * len(prompts))
    assert [r.ok for r in results] == [True] * 6
    assert [r.verdict.correct for r in results] == [True, True, True, False, True, False]
    assert results[3].verdict.statements[0].cause == "negated_violated"
    assert results[5].verdict.statements[0].cause == "undetected_object"
    assert stages.detector.calls == 1  # one batched call
    assert stages.depth.calls == 1 and stages.segmenter.calls == 3  # d1, d2, z1
    assert stages.attributes.calls == 2  # c1, c2 (m1 has nothing to score)
    assert results[0].perception.attributes is not None and results[0].perception.refined is None


def test_missing_stage_is_an_error_for_the_images_that_need_it():
    pipeline = Pipeline(Stages(SyntheticDetector()))
    results = pipeline.run(
        [
            _prompt("c", "color", ["cup"], _attr("blue")),
            _prompt("p", "proximity", ["cup", "dog"], _rel("near")),
            _prompt("z", "depth", ["dog", "horse"], _rel("behind")),
        ],
        [SCENE] * 3,
    )
    assert [r.error for r in results] == [
        "attributes: this prompt needs attribute scores, but no attribute scorer is configured",
        "segmenter: this prompt needs refined masks, but no segmenter is configured",
        "segmenter: this prompt needs refined masks, but no segmenter is configured",
    ]


class FlakyDetector:
    """Fails on any batch containing an all-black image."""

    info = SyntheticDetector().info

    def detect(self, images: Sequence[np.ndarray]) -> list[Detections]:
        if any(int(im.max()) == 0 for im in images):
            raise RuntimeError("cannot read black images")
        return SyntheticDetector().detect(images)


def test_one_failing_image_does_not_sink_the_batch():
    black = np.zeros((16, 16, 3), np.uint8)
    prompt = _prompt("c", "color", ["cup"], _attr("blue"))
    results = Pipeline(Stages(FlakyDetector(), attributes=SyntheticAttributeScorer())).run(
        [prompt] * 3, [SCENE, black, SCENE]
    )
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].error == "detector: RuntimeError: cannot read black images"


class BadShapeDepth:
    info = SyntheticDepthEstimator().info

    def disparity(self, images):
        return [np.zeros((3, 3), np.float32) for _ in images]


def test_wrong_shaped_stage_output_is_an_error():
    stages = Stages(SyntheticDetector(), SyntheticSegmenter(), depth=BadShapeDepth())
    result = Pipeline(stages).run_one(_prompt("z", "depth", ["dog", "horse"], _rel("behind")), SCENE)
    assert result.error == "depth: returned a map of shape (3, 3), expected (H, W) = (128, 128)"


def test_stages_create_and_models():
    stages = Stages.create(dict.fromkeys(("detector", "segmenter", "attributes", "depth"), "synthetic"), config=CURRENT)
    assert set(stages.models()) == {"detector", "segmenter", "attributes", "depth"}
    with pytest.raises(ValueError, match="unknown stages"):
        Stages.create({"detektor": "synthetic"})
    with pytest.raises(ValueError, match="unknown detector backend 'nope'"):
        Stages.create({"detector": "nope"})


def test_prompt_image_count_mismatch():
    with pytest.raises(ValueError, match="2 prompts for 1 images"):
        Pipeline(Stages(SyntheticDetector())).run([_prompt("c", "color", ["cup"], _attr("blue"))] * 2, [SCENE])
