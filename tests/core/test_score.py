"""Verdict.score: the share of satisfied elements (the paper's continuous human score, Appendix B.1)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from negt2i.core.perception import ImagePerception
from negt2i.core.spec import Prompt, parse_prompt
from negt2i.core.verdict import FailureCause, Verdict, element_score, judge
from negt2i.core.vocab import COLOR_ANSWERS, MATERIALS

from .helpers import perception, rect

LEFT, MID, RIGHT = rect(40, 5, 20, 20), rect(40, 40, 20, 20), rect(40, 75, 20, 20)
BIG, SMALL = rect(10, 5, 60, 30), rect(40, 60, 10, 10)


def _prompt(category: str, classes: list[str], statements: list[dict[str, object]]) -> Prompt:
    return parse_prompt(
        {
            "id": "s",
            "prompt": "x",
            "category": category,
            "include": [{"class": c, "count": 1} for c in classes],
            "statements": statements,
        }
    )


def _attribute(category: str, value: str, polarity: str) -> Prompt:
    return _prompt(category, ["bench"], [{"kind": "attribute", "object": 0, "value": value, "polarity": polarity}])


def _relation(category: str, predicate: str, polarity: str) -> Prompt:
    statement = {"kind": "relation", "subject": 0, "target": 1, "predicate": predicate, "polarity": polarity}
    return _prompt(category, ["backpack", "cup"], [statement])


def _image(category: str) -> ImagePerception:
    """One image per category whose decisive value / predicate is the first of ``SHOWN[category]``."""
    if category == "color":
        scores = {0: {**dict.fromkeys(COLOR_ANSWERS, 1.0), "red": 10.0}}
        return perception(["bench"], [LEFT], refined=False, attributes=scores, answers=COLOR_ANSWERS)
    if category == "material":
        scores = {0: {"wooden": 5.0, "metal": 1.0, "plastic": 1.0, "glass": 0.0}}
        return perception(["bench"], [LEFT], refined=False, attributes=scores, answers=MATERIALS)
    if category == "proximity":
        return perception(["backpack", "cup"], [LEFT, RIGHT])
    if category == "comparative":
        return perception(["backpack", "cup"], [BIG, SMALL])
    disparity = None
    if category == "depth":
        disparity = np.zeros((100, 100), np.float32)
        disparity[LEFT], disparity[MID] = 0.9, 0.1
    return perception(["backpack", "cup"], [LEFT, MID], disparity=disparity)


# category -> (a value / predicate the image shows, one it does not show)
SHOWN = {
    "color": ("red", "blue"),
    "material": ("wooden", "metal"),
    "directional": ("left of", "right of"),
    "proximity": ("far from", "near"),
    "comparative": ("bigger than", "smaller than"),
    "depth": ("in front of", "behind"),
}
CASES = [
    (category, polarity, shown) for category in SHOWN for polarity in ("positive", "negated") for shown in (True, False)
]


@pytest.mark.parametrize(("category", "polarity", "shown"), CASES)
def test_every_category_and_polarity(category: str, polarity: str, shown: bool) -> None:
    # passes iff (shown and positive) or (not shown and negated); every object is present either way
    value = SHOWN[category][0 if shown else 1]
    attribute = category in ("color", "material")
    prompt = _attribute(category, value, polarity) if attribute else _relation(category, value, polarity)
    v = judge(prompt, _image(category))
    passes = shown == (polarity == "positive")
    assert v.statements[0].passed is passes and all(o.ok for o in v.objects)
    elements = 2 if attribute else 3  # objects + the one statement
    assert v.score == pytest.approx(1.0 if passes else (elements - 1) / elements)
    assert (v.score == 1.0) is v.correct


def test_a_missing_object_costs_itself_and_every_statement_over_it() -> None:
    prompt = _prompt(
        "directional",
        ["backpack", "cup", "dog"],
        [
            {"kind": "relation", "subject": 0, "target": 1, "predicate": "left of", "polarity": "positive"},
            {"kind": "relation", "subject": 0, "target": 2, "predicate": "left of", "polarity": "negated"},
        ],
    )
    # the dog is below the presence threshold: its object and the negated statement over it fail
    v = judge(prompt, perception(["backpack", "cup", "dog"], [LEFT, MID, RIGHT], [0.9, 0.9, 0.02]))
    assert v.statements[1].cause is FailureCause.UNDETECTED_OBJECT
    assert v.score == pytest.approx(3 / 5)  # backpack, cup, statement 0 of 5 elements


def test_no_reward_for_omission() -> None:
    # "a non-wooden bench" with no bench: neither the object nor the negated statement is satisfied
    v = judge(_attribute("material", "wooden", "negated"), perception([], [], refined=False))
    assert v.score == 0.0 and not v.correct


def test_over_count_fails_the_object_and_its_statements() -> None:
    prompt = _prompt(
        "comparative",
        ["skateboard", "cup"],
        [{"kind": "relation", "subject": 0, "target": 1, "predicate": "bigger than", "polarity": "negated"}],
    )
    v = judge(prompt, perception(["skateboard", "skateboard", "cup"], [LEFT, RIGHT, MID]))
    assert v.objects[0].over_count and v.statements[0].cause is FailureCause.OVER_COUNT
    assert v.score == pytest.approx(1 / 3)  # only the cup


def test_counts_and_statement_less_prompts() -> None:
    prompt = parse_prompt({"prompt": "two cups", "include": [{"class": "cup", "count": 2}]}, default_id="c")
    assert judge(prompt, perception(["cup", "cup"], [LEFT, MID], refined=False)).score == 1.0
    assert judge(prompt, perception(["cup"], [LEFT], refined=False)).score == 0.0  # under-count


def test_probes_never_count() -> None:
    prompt = parse_prompt(
        {
            "id": "ctl",
            "prompt": "a photo of a backpack and a cup",
            "category": "directional",
            "include": [{"class": "backpack", "count": 1}, {"class": "cup", "count": 1}],
            "statements": [],
            "probes": [
                {"kind": "relation", "subject": 0, "target": 1, "predicate": "right of", "polarity": "positive"}
            ],
        }
    )
    v = judge(prompt, perception(["backpack", "cup"], [LEFT, MID]))
    assert v.probes and not v.probes[0].passed and v.score == 1.0


def test_score_travels_in_json_and_is_checked_on_read() -> None:
    v = judge(_relation("directional", "right of", "positive"), _image("directional"))
    data = json.loads(v.dumps())
    assert data["score"] == pytest.approx(2 / 3)
    assert Verdict.model_validate(data) == v
    old = {k: x for k, x in data.items() if k != "score"}  # a line written before the field: filled
    assert Verdict.model_validate(old).score == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match=r"score 1\.0 contradicts objects / statements"):
        Verdict.model_validate({**data, "score": 1.0})


@settings(max_examples=60, deadline=None)
@given(
    present=st.lists(st.booleans(), min_size=3, max_size=3),
    columns=st.lists(st.integers(min_value=0, max_value=80), min_size=3, max_size=3),
    polarities=st.lists(st.sampled_from(["positive", "negated"]), min_size=2, max_size=2),
)
def test_score_invariants(present: list[bool], columns: list[int], polarities: list[str]) -> None:
    prompt = _prompt(
        "directional",
        ["backpack", "cup", "dog"],
        [
            {"kind": "relation", "subject": 0, "target": t, "predicate": "left of", "polarity": pol}
            for t, pol in zip((1, 2), polarities, strict=True)
        ],
    )
    masks = [rect(40, c, 20, 20) for c in columns]
    v = judge(prompt, perception(["backpack", "cup", "dog"], masks, [0.9 if p else 0.01 for p in present]))
    satisfied = round(v.score * 5)
    assert 0.0 <= v.score <= 1.0 and v.score == pytest.approx(satisfied / 5)
    assert (v.score == 1.0) is v.correct
    assert v.score == element_score(v.objects, v.statements)
    # a missing object is never rewarded: it and the statements over it are unsatisfied
    for k in (k for k, p in enumerate(present) if not p):
        over = [s for s in v.statements if k in s.objects]
        assert satisfied <= 5 - 1 - len(over)
