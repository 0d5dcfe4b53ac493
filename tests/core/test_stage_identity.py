"""The one check of what a stage states about itself (``negt2i.core.stage_identity.check_model_info``): every
condition on both sides, strict and not."""

from __future__ import annotations

import pytest

from negt2i.core.config import CURRENT, load_config, stage_rules
from negt2i.core.stage_identity import check_model_info, strict_from_env
from negt2i.stages.base import ModelInfo, OperatingPoint

FLOOR = {"detection.prediction_floor": 0.005}
MASKS = stage_rules(CURRENT, "segmenter")


def _det(rules: dict[str, float] | None = None, floor: float | None = 0.005) -> ModelInfo:
    op = None if floor is None else OperatingPoint(prediction_floor=floor)
    return ModelInfo(stage="detector", backend="b", model="m", rules=FLOOR if rules is None else rules,
                     operating_point=op)  # fmt: skip


def test_the_shipped_stages_state_everything_the_current_rules_say():
    from negt2i.stages.registry import create

    for stage in ("detector", "segmenter", "attributes", "depth"):
        backend = create(stage, "synthetic", config=CURRENT)
        check = check_model_info(stage, backend.info, CURRENT, strict=True)
        assert check.ok and check.warnings == (), (stage, check)


@pytest.mark.parametrize("strict", [False, True])
def test_a_stage_that_states_everything_is_accepted_without_warnings(strict: bool):
    assert check_model_info("detector", _det(), CURRENT, strict=strict).warnings == ()
    seg = ModelInfo(stage="segmenter", backend="b", model="m", rules=MASKS)
    assert check_model_info("segmenter", seg, CURRENT, strict=strict).ok
    assert check_model_info("depth", ModelInfo(stage="depth", backend="b", model="m"), CURRENT, strict=strict).ok


def test_identity_stage_and_model():
    assert (
        "names stage 'segmenter', but it serves the detector"
        in check_model_info(
            "detector", ModelInfo(stage="segmenter", backend="b", model="m", rules=MASKS), CURRENT
        ).problem
    )
    nameless = ModelInfo(stage="depth", backend="b", model="")
    assert "names no model" in check_model_info("depth", nameless, CURRENT).problem


@pytest.mark.parametrize("strict", [False, True])
def test_a_stated_value_that_differs_is_always_refused(strict: bool):
    check = check_model_info("detector", _det({"detection.prediction_floor": 0.01}), CURRENT, strict=strict)
    assert "applies rule constants {detection.prediction_floor: 0.01}" in check.problem
    assert "say {detection.prediction_floor: 0.005}" in check.problem
    other = load_config("current").model_copy(update={"name": "other"})
    assert check_model_info("detector", _det(), other, strict=strict).ok
    extra = check_model_info("detector", _det({**FLOOR, "masks.closing_radius": 5.0}), CURRENT, strict=strict)
    assert "states rule constants ['masks.closing_radius'] that a detector does not apply" in extra.problem
    floor = check_model_info("detector", _det(floor=0.05), CURRENT, strict=strict)
    assert "operating point's prediction_floor 0.05 is not this run's detection.prediction_floor 0.005" in floor.problem


def test_unstated_rules_warn_unless_strict():
    loose = check_model_info("detector", _det({}), CURRENT)
    assert loose.ok and len(loose.warnings) == 1
    assert loose.warnings[0].startswith("states no rule constants (ModelInfo.rules")
    assert "assumed to apply this run's {detection.prediction_floor: 0.005} (rules current)" in loose.warnings[0]
    strict = check_model_info("detector", _det({}), CURRENT, strict=True)
    assert strict.problem.startswith("it states no rule constants (ModelInfo.rules) and strict stages are on")
    # a partial set: the missing ones are named
    seg = ModelInfo(stage="segmenter", backend="b", model="m", rules={"masks.closing_radius": 5.0})
    partial = check_model_info("segmenter", seg, CURRENT)
    assert partial.ok and "no value for ['masks.box_chunk_size', 'masks.min_component_fraction']" in partial.warnings[0]
    assert "strict stages are on" in check_model_info("segmenter", seg, CURRENT, strict=True).problem


def test_an_unstated_operating_point_warns_unless_strict():
    loose = check_model_info("detector", _det(floor=None), CURRENT)
    assert loose.ok and loose.warnings == (
        "states no operating point (ModelInfo.operating_point): assumed prediction floor 0.005, no suppression of "
        "its own, as the paper's thresholds assume",
    )
    assert "states no operating point" in check_model_info("detector", _det(floor=None), CURRENT, strict=True).problem
    both = check_model_info("detector", _det({}, floor=None), CURRENT)
    assert [w.split(" (")[0] for w in both.warnings] == ["states no rule constants", "states no operating point"]


@pytest.mark.parametrize(("value", "want"), [("", False), ("0", False), ("no", False), ("1", True), ("on", True),
                                             ("TRUE", True), ("yes", True)])  # fmt: skip
def test_strict_from_env(value: str, want: bool):
    assert strict_from_env({"NEGT2I_STRICT_STAGES": value}) is want
    assert strict_from_env({}) is False
