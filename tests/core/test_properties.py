"""Invariants of the rules and the judge, checked with Hypothesis on random rectangle scenes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from negt2i.core.config import CURRENT, PREVIOUS
from negt2i.core.rules import (
    attribute_confusion_set,
    comparative_predicates,
    depth_predicates,
    directional_predicates,
    proximity_predicates,
)
from negt2i.core.spec import parse_prompt
from negt2i.core.verdict import judge
from negt2i.core.vocab import CONVERSE, PREDICATES, Category

from .helpers import perception

SIZE = 64


@st.composite
def blobs(draw: st.DrawFn) -> np.ndarray:
    """A union of one to three rectangles (possibly disconnected) in a 64x64 image."""
    mask = np.zeros((SIZE, SIZE), bool)
    for _ in range(draw(st.integers(1, 3))):
        r0, c0 = draw(st.integers(0, SIZE - 1)), draw(st.integers(0, SIZE - 1))
        h, w = draw(st.integers(1, 30)), draw(st.integers(1, 30))
        mask[r0 : r0 + h, c0 : c0 + w] = True
    return mask


configs = st.sampled_from([CURRENT, PREVIOUS])


def converse(preds: frozenset[str]) -> frozenset[str]:
    return frozenset(CONVERSE[p] for p in preds)


@settings(max_examples=200, deadline=None)
@given(blobs(), blobs(), configs)
def test_directional_antisymmetry(a: np.ndarray, b: np.ndarray, config: object) -> None:
    ab = directional_predicates(a, b, config)  # type: ignore[arg-type]
    assert directional_predicates(b, a, config) == converse(ab)  # type: ignore[arg-type]
    assert not {"left of", "right of"} <= ab and not {"above", "below"} <= ab


@settings(max_examples=200, deadline=None)
@given(blobs(), blobs(), configs)
def test_proximity_complementary_and_symmetric(a: np.ndarray, b: np.ndarray, config: object) -> None:
    ab = proximity_predicates(a, b, config)  # type: ignore[arg-type]
    assert len(ab) == 1  # exactly one of near / far: no dead zone
    assert proximity_predicates(b, a, config) == ab  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(blobs(), blobs(), configs)
def test_comparative_antisymmetry(a: np.ndarray, b: np.ndarray, config: object) -> None:
    ab = comparative_predicates(a, b, config)  # type: ignore[arg-type]
    assert comparative_predicates(b, a, config) == converse(ab)  # type: ignore[arg-type]
    assert not {"bigger than", "smaller than"} <= ab and not {"taller than", "shorter than"} <= ab
    assert comparative_predicates(a, a, config) == frozenset()  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(blobs(), blobs(), st.integers(0, 2**31 - 1))
def test_depth_antisymmetry(a: np.ndarray, b: np.ndarray, seed: int) -> None:
    disp = np.random.default_rng(seed).random((SIZE, SIZE)).astype(np.float32)
    ab = depth_predicates(a, b, disp)
    assert len(ab) <= 1
    assert depth_predicates(b, a, disp) == converse(ab)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["red", "blue", "green", "gray", "pink"]), st.floats(-50, 50), min_size=1),
    st.floats(0, 5),
    st.floats(0, 5),
)
def test_confusion_set_contains_top_and_grows_with_beta(scores: dict[str, float], b1: float, b2: float) -> None:
    small, large = sorted((b1, b2))
    c_small, c_large = attribute_confusion_set(scores, small), attribute_confusion_set(scores, large)
    assert max(scores, key=scores.__getitem__) in c_small
    assert c_small <= c_large


@settings(max_examples=80, deadline=None)
@given(
    st.lists(blobs(), min_size=3, max_size=3),
    st.sampled_from([Category.DIRECTIONAL, Category.PROXIMITY, Category.COMPARATIVE]),
    st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=2, max_size=2),
    st.permutations([0, 1, 2]),
)
def test_judge_is_independent_of_object_order(
    masks: list[np.ndarray], category: Category, picks: list[tuple[int, bool]], order: list[int]
) -> None:
    classes = ["backpack", "cup", "dog"]
    preds = PREDICATES[category]
    statements = [
        {"kind": "relation", "subject": 0, "target": t + 1, "predicate": preds[k % len(preds)],
         "polarity": "negated" if neg else "positive"}
        for t, (k, neg) in enumerate(picks)
    ]  # fmt: skip
    base = {"id": "p", "prompt": "x", "category": category.value}
    prompt = parse_prompt({**base, "include": [{"class": c} for c in classes], "statements": statements})
    # the same prompt with its objects listed in another order, statement indices remapped
    where = {old: new for new, old in enumerate(order)}
    shuffled = parse_prompt(
        {
            **base,
            "include": [{"class": classes[old]} for old in order],
            "statements": [{**s, "subject": where[s["subject"]], "target": where[s["target"]]} for s in statements],
        }
    )
    # detections listed in yet another order
    det_order = [2, 0, 1]
    p = perception([classes[i] for i in det_order], [masks[i] for i in det_order])
    v1, v2 = judge(prompt, p), judge(shuffled, p)
    assert v1.correct == v2.correct and v1.failure_class == v2.failure_class
    assert [(s.fired, s.passed, s.cause) for s in v1.statements] == [
        (s.fired, s.passed, s.cause) for s in v2.statements
    ]


@settings(max_examples=300, deadline=None)
@given(blobs(), blobs(), st.one_of(st.sampled_from([0.0, 1.0, 3.0, 16.0]), st.floats(0, 40)))
def test_geometry_matches_brute_force(a: np.ndarray, b: np.ndarray, window: float) -> None:
    """Cropped / boundary / cell-based measurements equal full-image distance transforms.

    Integer windows put pixels exactly at the facing limit (a rounding trap once found here)."""
    from scipy import ndimage

    from negt2i.core.geometry import facing_surface, gap, mask_stats

    sa, sb = mask_stats(a), mask_stats(b)
    dist_to_b = ndimage.distance_transform_edt(~b)
    g = gap(sa, sb)
    assert g == float(dist_to_b[a].min())
    rows, cols = facing_surface(sa, sb, g + window)
    expected = a & (dist_to_b <= g + window)
    got = np.zeros_like(a)
    got[rows, cols] = True
    np.testing.assert_array_equal(got, expected)
    ys, xs = np.nonzero(a)
    assert (sa.cy, sa.cx) == (ys.mean(), xs.mean()) or np.allclose((sa.cy, sa.cx), (ys.mean(), xs.mean()))
    assert (sa.width, sa.height, sa.area) == (xs.max() - xs.min() + 1, ys.max() - ys.min() + 1, a.sum())


@settings(max_examples=150, deadline=None)
@given(st.lists(blobs(), min_size=2, max_size=4), st.sampled_from([0.0, 3.0, 16.0]))
def test_batched_pairs_match_brute_force_and_single_pairs(masks: list[np.ndarray], window: float) -> None:
    """A star's pairs measured together (one k-d tree call per round) equal each pair alone and the EDT.

    The facing pixels must also come back in the same order as for a pair alone: the depth
    rule's mean disparity sums them in that order."""
    from scipy import ndimage

    from negt2i.core.geometry import facing_pairs, facing_surface, gap, gaps, mask_stats

    masks = [m for m in masks if m.any()]
    stats = [mask_stats(m) for m in masks]
    pairs = [(stats[0], s) for s in stats[1:]]
    together = facing_pairs(pairs, window)
    assert gaps(pairs) == [p.gap for p in together]
    for (sa, sb), (a, b), measured in zip(pairs, [(masks[0], m) for m in masks[1:]], together, strict=True):
        g = gap(sa, sb)
        assert measured.gap == g == float(ndimage.distance_transform_edt(~b)[a].min())
        for (x, y), (sx, sy), got in (((a, b), (sa, sb), measured.a), ((b, a), (sb, sa), measured.b)):
            alone = facing_surface(sx, sy, g + window)
            np.testing.assert_array_equal(got[0], alone[0])
            np.testing.assert_array_equal(got[1], alone[1])
            expected = x & (ndimage.distance_transform_edt(~y) <= g + window)
            image = np.zeros_like(x)
            image[got] = True
            np.testing.assert_array_equal(image, expected)
