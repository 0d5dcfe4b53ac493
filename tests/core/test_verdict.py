"""judge(): objects, statements, failure causes, dead zones, row classes and serialisation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from negt2i.core.config import PREVIOUS
from negt2i.core.spec import Prompt, parse_prompt
from negt2i.core.verdict import FailureCause, PerceptionError, RowFailure, Verdict, judge
from negt2i.core.vocab import COLOR_ANSWERS, MATERIALS

from .helpers import perception, rect


def relation_prompt(category: str, statements: list[tuple[int, str, str]], classes: tuple[str, ...]) -> Prompt:
    return parse_prompt(
        {
            "id": "p",
            "prompt": "test prompt",
            "category": category,
            "include": [{"class": c, "count": 1} for c in classes],
            "statements": [
                {"kind": "relation", "subject": 0, "target": t, "predicate": pred, "polarity": pol}
                for t, pred, pol in statements
            ],
        }
    )


LEFT, MID, RIGHT = rect(40, 5, 20, 20), rect(40, 40, 20, 20), rect(40, 75, 20, 20)


def test_directional_positive_and_negated_pass() -> None:
    prompt = relation_prompt(
        "directional", [(1, "left of", "positive"), (2, "right of", "negated")], ("backpack", "cup", "dog")
    )
    v = judge(prompt, perception(["backpack", "cup", "dog"], [LEFT, MID, RIGHT]))
    assert v.correct and v.failure_class is None and v.reason == ""
    assert [s.fired for s in v.statements] == [["left of"], ["left of"]]
    assert [s.cause for s in v.statements] == [None, None]
    assert v.setting == "pos1_neg1" and v.config["name"] == "current"


def test_negated_violation_and_row_class() -> None:
    prompt = relation_prompt("directional", [(1, "left of", "negated")], ("backpack", "cup"))
    v = judge(prompt, perception(["backpack", "cup"], [LEFT, MID]))
    assert not v.correct
    assert v.statements[0].cause is FailureCause.NEGATED_VIOLATED
    assert v.failure_class is RowFailure.NEGATED_VIOLATED
    assert "the backpack is not left of the cup: negated_violated (fired: left of)" in v.reason


def test_dead_zone_fails_positive_and_passes_negated() -> None:
    same = rect(40, 41, 20, 20)  # centroids 1 px apart: nothing fires
    for polarity, passed, cause in (("positive", False, FailureCause.DEAD_ZONE), ("negated", True, None)):
        prompt = relation_prompt("directional", [(1, "above", polarity)], ("backpack", "cup"))
        v = judge(prompt, perception(["backpack", "cup"], [MID, same]))
        st = v.statements[0]
        assert st.fired == [] and st.dead_zone and st.passed is passed and st.cause is cause
    # proximity has no dead zone: never flagged
    prompt = relation_prompt("proximity", [(1, "near", "negated")], ("backpack", "cup"))
    st = judge(prompt, perception(["backpack", "cup"], [LEFT, RIGHT])).statements[0]
    assert st.fired == ["far from"] and not st.dead_zone and st.passed


def test_positive_violation_is_not_a_dead_zone() -> None:
    prompt = relation_prompt("directional", [(1, "right of", "positive")], ("backpack", "cup"))
    v = judge(prompt, perception(["backpack", "cup"], [LEFT, MID]))
    assert v.statements[0].cause is FailureCause.POSITIVE_VIOLATED and not v.statements[0].dead_zone
    assert v.failure_class is RowFailure.POSITIVE_VIOLATED


def test_both_polarities_row_class() -> None:
    prompt = relation_prompt(
        "directional", [(1, "right of", "positive"), (2, "left of", "negated")], ("backpack", "cup", "dog")
    )
    v = judge(prompt, perception(["backpack", "cup", "dog"], [LEFT, MID, RIGHT]))
    assert [s.cause for s in v.statements] == [FailureCause.POSITIVE_VIOLATED, FailureCause.NEGATED_VIOLATED]
    assert v.failure_class is RowFailure.BOTH_POLARITIES


def test_undetected_object_precedes_everything() -> None:
    prompt = relation_prompt(
        "directional", [(1, "left of", "negated"), (2, "left of", "positive")], ("backpack", "cup", "dog")
    )
    # the dog is only seen at 0.02 (< presence 0.03); the first statement is still evaluated and violated
    v = judge(prompt, perception(["backpack", "cup", "dog"], [LEFT, MID, RIGHT], [0.9, 0.9, 0.02]))
    assert not v.objects[2].present
    assert v.statements[1].cause is FailureCause.UNDETECTED_OBJECT and not v.statements[1].evaluated
    assert v.statements[1].fired is None
    assert v.statements[0].cause is FailureCause.NEGATED_VIOLATED
    assert v.failure_class is RowFailure.UNDETECTED_OBJECT
    assert "expected dog>=1, found 0" in v.reason


def test_over_count_makes_statements_unevaluable_except_for_skis() -> None:
    prompt = relation_prompt("comparative", [(1, "bigger than", "negated")], ("skateboard", "cup"))
    v = judge(prompt, perception(["skateboard", "skateboard", "cup"], [LEFT, RIGHT, MID]))
    assert v.objects[0].over_count and v.objects[0].counted == 2
    assert v.statements[0].cause is FailureCause.OVER_COUNT
    assert v.failure_class is RowFailure.OVER_COUNT and "expected 1 skateboard, found 2" in v.reason
    skis = relation_prompt("comparative", [(1, "bigger than", "negated")], ("skis", "cup"))
    v = judge(skis, perception(["skis", "skis", "cup"], [LEFT, RIGHT, MID], [0.9, 0.8, 0.9]))
    assert v.objects[0].exempt and not v.objects[0].over_count and v.correct
    assert v.objects[0].detections == [0, 1]  # both counted; the first (most confident) is measured


def test_fallback_instance_is_judged() -> None:
    prompt = relation_prompt("directional", [(1, "left of", "positive")], ("backpack", "cup"))
    v = judge(prompt, perception(["backpack", "cup"], [LEFT, MID], [0.04, 0.9]))
    assert v.objects[0].fallback and v.objects[0].present and v.correct


def test_refined_masks_are_used_and_required() -> None:
    prompt = relation_prompt("directional", [(1, "left of", "positive")], ("backpack", "cup"))
    with pytest.raises(PerceptionError, match="no refined mask for detection 0"):
        judge(prompt, perception(["backpack", "cup"], [LEFT, MID], refined=False))
    no_sam = PREVIOUS.model_copy(update={"masks": PREVIOUS.masks.model_copy(update={"refine": False})})
    assert judge(prompt, perception(["backpack", "cup"], [LEFT, MID], refined=False), no_sam).correct


def test_refined_mask_overrides_detector_mask() -> None:
    from negt2i.core.perception import Detections, ImagePerception, RefinedMasks

    prompt = relation_prompt("directional", [(1, "left of", "positive")], ("backpack", "cup"))
    dets = Detections.from_masks(["backpack", "cup"], [0.9, 0.9], [RIGHT, MID], (100, 100))
    refined = RefinedMasks({0: LEFT, 1: MID}, (100, 100))
    assert judge(prompt, ImagePerception(dets, refined=refined)).correct


def attribute_prompt(category: str, items: list[tuple[str, str, str]]) -> Prompt:
    return parse_prompt(
        {
            "id": "a",
            "prompt": "x",
            "category": category,
            "include": [{"class": c, "count": 1} for c, _, _ in items],
            "statements": [
                {"kind": "attribute", "object": i, "value": v, "polarity": pol} for i, (_, v, pol) in enumerate(items)
            ],
        }
    )


def color_scores(**overrides: float) -> dict[str, float]:
    scores = dict.fromkeys(COLOR_ANSWERS, 1.0)
    scores.update(overrides)
    return scores


def test_color_near_tie_fails_the_negation() -> None:
    prompt = attribute_prompt("color", [("cup", "red", "negated"), ("bench", "blue", "positive")])
    p = perception(
        ["cup", "bench"],
        [LEFT, RIGHT],
        refined=False,
        attributes={0: color_scores(orange=10.0, red=9.7), 1: color_scores(gray=8.0, blue=7.6)},
        answers=COLOR_ANSWERS,
    )
    v = judge(prompt, p)
    assert v.statements[0].fired == ["orange", "red"] and v.statements[0].cause is FailureCause.NEGATED_VIOLATED
    assert v.statements[1].passed and v.statements[1].measurements["top_score"] == 8.0
    assert not v.statements[0].dead_zone  # attributes have no dead zone


def test_material_top1_and_missing_scores() -> None:
    prompt = attribute_prompt("material", [("bench", "wooden", "positive")])
    scores = {0: {"wooden": 3.0, "metal": 3.2, "plastic": 1.0, "glass": 0.0}}
    v = judge(prompt, perception(["bench"], [LEFT], refined=False, attributes=scores, answers=MATERIALS))
    assert v.statements[0].fired == ["metal"] and v.statements[0].cause is FailureCause.POSITIVE_VIOLATED
    with pytest.raises(PerceptionError, match="no attribute scores for detection 0"):
        judge(prompt, perception(["bench"], [LEFT], refined=False))


def test_depth_requires_disparity() -> None:
    prompt = relation_prompt("depth", [(1, "behind", "negated")], ("backpack", "cup"))
    with pytest.raises(PerceptionError, match="disparity"):
        judge(prompt, perception(["backpack", "cup"], [LEFT, MID]))
    disp = np.zeros((100, 100), np.float32)
    disp[LEFT], disp[MID] = 0.9, 0.1
    v = judge(prompt, perception(["backpack", "cup"], [LEFT, MID], disparity=disp))
    assert v.statements[0].fired == ["in front of"] and v.correct


def test_statement_less_prompt_checks_objects_only() -> None:
    prompt = parse_prompt({"prompt": "two cups", "include": [{"class": "cup", "count": 2}]}, default_id="c")
    assert judge(prompt, perception(["cup", "cup"], [LEFT, MID], refined=False)).correct
    v = judge(prompt, perception(["cup", "cup", "cup"], [LEFT, MID, RIGHT], refined=False))
    assert v.failure_class is RowFailure.OVER_COUNT
    v = judge(prompt, perception(["cup"], [LEFT], refined=False))
    assert v.objects[0].under_count and v.failure_class is RowFailure.UNDETECTED_OBJECT


def test_verdict_json_round_trip_and_geneval_keys() -> None:
    prompt = relation_prompt("depth", [(1, "behind", "positive")], ("backpack", "cup"))
    disp = np.zeros((100, 100), np.float32)
    disp[LEFT], disp[MID] = 0.9, 0.1
    v = judge(prompt, perception(["backpack", "cup"], [LEFT, MID], disparity=disp))
    data = json.loads(v.dumps())
    assert {"tag", "prompt", "correct", "reason"} <= set(data)
    assert data["objects"][0]["class"] == "backpack"
    assert data["statements"][0]["measurements"]["disparity_a"] == pytest.approx(0.9)
    assert data["config"]["digest"] and data["config"]["depth"]["facing_window"] == 16.0
    assert Verdict.model_validate(data) == v
