"""The rules the stages apply travel with the configuration: services started with a non-default rules file
give exactly the in-process verdicts under that file, and an orchestrator whose rules differ refuses them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from negt2i.client import ClientError, EvaluatorClient
from negt2i.core.config import CURRENT, load_config
from negt2i.core.spec import parse_prompt
from negt2i.pipeline import Pipeline, Stages
from negt2i.stages.synthetic import BACKGROUND, SceneObject, render_scene
from negt2i.wire import adapter
from tests.services.live import Proc, start_orchestrator, start_stage, wait_health, wait_ready

pytestmark = pytest.mark.xdist_group("services")

RULES = {
    "name": "custom",
    "detection": {"prediction_floor": 0.01},
    "masks": {"closing_radius": 0, "min_component_fraction": 0.5, "box_chunk_size": 1},
}
"""Another prediction floor and other mask post-processing constants (no closing, big components only)."""

BIGGER = parse_prompt({
    "id": "cmp-x", "category": "comparative", "prompt": "a photo of a dog bigger than a cat",
    "include": [{"class": "dog"}, {"class": "cat"}],
    "statements": [{"kind": "relation", "subject": 0, "target": 1, "predicate": "bigger than", "polarity": "positive"}],
})  # fmt: skip


def _scene() -> np.ndarray:
    """A dog with a narrow notch (closing radius 5 fills it, 0 does not) beside a slightly smaller cat."""
    image = render_scene([SceneObject("dog", (4, 10, 44, 50)), SceneObject("cat", (56, 10, 94, 49))], (64, 100))
    image[10:40, 22:28] = BACKGROUND  # the notch: 6 px wide, open at the top
    return image


@pytest.fixture(scope="module")
def custom(live_tmp: Path, stage_urls: dict[str, str]) -> Iterator[tuple[Path, dict[str, str]]]:
    rules = live_tmp / "custom-rules.json"
    rules.write_text(json.dumps(RULES))
    procs: list[Proc] = []
    try:
        for stage in ("detector", "segmenter"):
            procs.append(start_stage(stage, live_tmp, env={"NEGT2I_RULES": str(rules)}))
        for proc in procs:
            wait_ready(proc)
        yield rules, {**stage_urls, **{p.name: p.url for p in procs}}
    finally:
        for proc in procs:
            proc.kill()


def test_services_apply_the_rules_file_exactly_as_in_process(custom: tuple[Path, dict[str, str]], live_tmp: Path):
    rules, urls = custom
    config = load_config(str(rules))
    image = _scene()
    names = dict.fromkeys(("detector", "segmenter", "attributes", "depth"), "synthetic")
    want = Pipeline(Stages.create(names, config=config), config).run_one(BIGGER, image)
    default = Pipeline(Stages.create(names, config=CURRENT), CURRENT).run_one(BIGGER, image)
    assert want.verdict is not None and default.verdict is not None
    # the constants matter here: without closing the notched dog is smaller, so the verdicts differ
    assert want.verdict.correct != default.verdict.correct
    proc = start_orchestrator(urls, live_tmp, env={"NEGT2I_RULES": str(rules)})
    try:
        assert wait_health(proc.target, "SERVING", timeout=60) == "SERVING", proc.tail()
        with EvaluatorClient(proc.target) as client:
            got = client.evaluate(adapter.encode_png(image), prompt=BIGGER)
            info = client.info()
        assert got.verdict.to_json() == want.verdict.to_json()
        detector = next(s for s in got.stages if s.stage == "detector")
        assert detector.model.operating_point.prediction_floor == pytest.approx(0.01)
        assert dict(detector.model.rules) == {"detection.prediction_floor": pytest.approx(0.01)}
        assert {s.stage: dict(s.model.rules) for s in info.stages}["segmenter"] == {
            "masks.closing_radius": 0.0, "masks.min_component_fraction": 0.5, "masks.box_chunk_size": 1.0,
        }  # fmt: skip
    finally:
        proc.kill()


def test_an_orchestrator_with_other_rules_refuses_the_stages(custom: tuple[Path, dict[str, str]], live_tmp: Path):
    _, urls = custom
    proc = start_orchestrator(urls, live_tmp)  # the default rules: the custom stages do not apply them
    try:
        assert wait_health(proc.target, "NOT_SERVING", timeout=30) == "NOT_SERVING"
        with EvaluatorClient(proc.target) as client, pytest.raises(ClientError) as err:
            client.evaluate(adapter.encode_png(_scene()), prompt=BIGGER)
        assert err.value.code == "UNAVAILABLE"
        assert "detector: [stage-info]" in err.value.details and "rule constants" in err.value.details
    finally:
        proc.kill()
