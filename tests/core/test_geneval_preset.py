"""The ``geneval`` rule preset: GenEval's published constants where they map (docs/rules.md)."""

from __future__ import annotations

import numpy as np
import pytest

from negt2i.core.config import CURRENT, GENEVAL, PRESETS, load_config
from negt2i.core.spec import parse_prompt
from negt2i.core.verdict import judge

from .helpers import perception


def box(r0: int, c0: int, r1: int, c1: int, shape: tuple[int, int] = (64, 64)) -> np.ndarray:
    m = np.zeros(shape, bool)
    m[r0:r1, c0:c1] = True
    return m


def test_the_preset_holds_genevals_constants() -> None:
    assert load_config("geneval") is GENEVAL and PRESETS["geneval"].name == "geneval"
    d = GENEVAL.detection
    assert (d.presence_threshold, d.count_threshold, d.per_class_cap, d.overlap_iou) == (0.3, 0.9, 16, 1.0)
    assert (GENEVAL.directional.extent_margin, GENEVAL.directional.axis_threshold) == (0.10, 0.50)
    assert GENEVAL.attributes.color_beta == 0.0 and GENEVAL.masks.refine is False
    # what has no GenEval counterpart keeps Table 15's values
    assert (GENEVAL.proximity, GENEVAL.comparative, GENEVAL.depth) == (CURRENT.proximity, CURRENT.comparative,
                                                                      CURRENT.depth)  # fmt: skip
    assert GENEVAL.attributes.material_beta == CURRENT.attributes.material_beta
    assert GENEVAL.digest() != CURRENT.digest() and GENEVAL.record()["name"] == "geneval"


SINGLE = parse_prompt({"tag": "single_object", "id": "s", "prompt": "a photo of a dog",
                       "include": [{"class": "dog", "count": 1}]})  # fmt: skip
COUNTING = parse_prompt({"tag": "counting", "id": "c", "prompt": "a photo of two dogs",
                         "include": [{"class": "dog", "count": 2}]})  # fmt: skip


@pytest.mark.parametrize(
    ("score", "current", "geneval"),
    [(0.29, True, False), (0.3, True, True), (0.031, True, False), (0.029, False, False)],
)
def test_presence_threshold_on_both_sides(score: float, current: bool, geneval: bool) -> None:
    p = perception(["dog"], [box(10, 10, 30, 30)], [score], refined=False)
    assert (judge(SINGLE, p, CURRENT).correct, judge(SINGLE, p, GENEVAL).correct) == (current, geneval)


@pytest.mark.parametrize(
    ("scores", "current", "geneval"),
    [
        ((0.95, 0.9), True, True),  # both reach 0.9
        ((0.95, 0.89), True, False),  # the second counts at 0.5, not at 0.9
        ((0.95, 0.6, 0.9), False, True),  # three at 0.5 (over-count), two at 0.9
    ],
)
def test_count_threshold_on_both_sides(scores: tuple[float, ...], current: bool, geneval: bool) -> None:
    masks = [box(2 + 20 * i, 2, 18 + 20 * i, 18) for i in range(len(scores))]
    p = perception(["dog"] * len(scores), masks, list(scores), refined=False)
    assert (judge(COUNTING, p, CURRENT).correct, judge(COUNTING, p, GENEVAL).correct) == (current, geneval)
