"""Template wording: Table 4 character for character, every setting's form, polarity-only changes."""

from __future__ import annotations

import pytest

from negt2i.core.spec import Polarity, parse_prompt
from negt2i.core.vocab import Category
from negt2i.corpus.templates import (
    AttributeSelection,
    RelationSelection,
    attribute_prompt,
    attribute_text,
    join_list,
    relation_prompt,
    relation_text,
    render,
)

POS, NEG = Polarity.POSITIVE, Polarity.NEGATED


def test_join_list_forms() -> None:
    assert join_list(["a"]) == "a"
    assert join_list(["a", "b"]) == "a and b"
    assert join_list(["a", "b", "c"]) == "a, b, and c"
    assert join_list(["a", "b", "c", "d"]) == "a, b, c, and d"
    with pytest.raises(ValueError, match="empty"):
        join_list([])


# Table 4 of the paper: (category, setting, selections, expected string).
TABLE4_ATTRIBUTE = [
    (Category.COLOR, "pos0_neg1", [("orange", "brown", NEG)], "a photo of a non-brown orange"),
    (
        Category.MATERIAL,
        "pos2_neg2",
        [("bus", "plastic", POS), ("knife", "plastic", POS), ("sandwich", "plastic", NEG), ("toilet", "plastic", NEG)],
        "a photo of a plastic bus, a plastic knife, a non-plastic sandwich, and a non-plastic toilet",
    ),
]
TABLE4_RELATION = [
    (
        Category.COMPARATIVE,
        "pos0_neg1",
        "skis",
        [("bigger than", "skateboard", NEG)],
        "a photo of a skis and a skateboard, where the skis is not bigger than the skateboard",
    ),
    (
        Category.DEPTH,
        "pos0_neg1",
        "broccoli",
        [("in front of", "bench", NEG)],
        "a photo of a broccoli and a bench, where the broccoli is not in front of the bench",
    ),
    (
        Category.DIRECTIONAL,
        "pos2_neg2",
        "laptop",
        [("right of", "zebra", POS), ("right of", "backpack", POS), ("below", "surfboard", NEG),
         ("right of", "carrot", NEG)],
        "a photo of a laptop, a zebra, a backpack, a surfboard, and a carrot, where the laptop is right of the zebra, "
        "is right of the backpack, is not below the surfboard, and is not right of the carrot",
    ),
    (
        Category.PROXIMITY,
        "pos0_neg1",
        "broccoli",
        [("far from", "bench", NEG)],
        "a photo of a broccoli and a bench, where the broccoli is not far from the bench",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("category", "setting", "sel", "expected"), TABLE4_ATTRIBUTE)
def test_table4_attribute_prompts(
    category: Category, setting: str, sel: list[tuple[str, str, Polarity]], expected: str
) -> None:
    prompt = attribute_prompt("x", category, [AttributeSelection(*s) for s in sel])
    assert prompt.prompt == expected
    assert prompt.setting == setting
    assert render(prompt) == expected


@pytest.mark.parametrize(("category", "setting", "subject", "sel", "expected"), TABLE4_RELATION)
def test_table4_relation_prompts(
    category: Category, setting: str, subject: str, sel: list[tuple[str, str, Polarity]], expected: str
) -> None:
    prompt = relation_prompt("x", category, subject, [RelationSelection(*s) for s in sel])
    assert prompt.prompt == expected
    assert prompt.setting == setting
    assert [o.class_name for o in prompt.objects] == [subject, *(t for _, t, _ in sel)]
    assert render(prompt) == expected


# One literal per setting (P, N) for each topology: the forms the paper does not show.
ATTR_VALUES = [("cup", "red"), ("bench", "red"), ("dog", "red"), ("vase", "red")]
ATTRIBUTE_FORMS = {
    (1, 0): "a photo of a red cup",
    (2, 0): "a photo of a red cup and a red bench",
    (0, 1): "a photo of a non-red cup",
    (0, 2): "a photo of a non-red cup and a non-red bench",
    (1, 1): "a photo of a red cup and a non-red bench",
    (1, 2): "a photo of a red cup, a non-red bench, and a non-red dog",
    (2, 1): "a photo of a red cup, a red bench, and a non-red dog",
    (2, 2): "a photo of a red cup, a red bench, a non-red dog, and a non-red vase",
}
REL_TARGETS = [("above", "cup"), ("left of", "bench"), ("below", "dog"), ("right of", "vase")]
RELATION_FORMS = {
    (1, 0): "a photo of a cat and a cup, where the cat is above the cup",
    (2, 0): "a photo of a cat, a cup, and a bench, where the cat is above the cup and is left of the bench",
    (0, 1): "a photo of a cat and a cup, where the cat is not above the cup",
    (0, 2): "a photo of a cat, a cup, and a bench, where the cat is not above the cup and is not left of the bench",
    (1, 1): "a photo of a cat, a cup, and a bench, where the cat is above the cup and is not left of the bench",
    (1, 2): "a photo of a cat, a cup, a bench, and a dog, where the cat is above the cup, is not left of the bench, "
    "and is not below the dog",
    (2, 1): "a photo of a cat, a cup, a bench, and a dog, where the cat is above the cup, is left of the bench, "
    "and is not below the dog",
    (2, 2): "a photo of a cat, a cup, a bench, a dog, and a vase, where the cat is above the cup, is left of the "
    "bench, is not below the dog, and is not right of the vase",
}


def _pols(p: int, n: int) -> list[Polarity]:
    return [POS] * p + [NEG] * n


@pytest.mark.parametrize(("pn", "expected"), ATTRIBUTE_FORMS.items())
def test_attribute_form_per_setting(pn: tuple[int, int], expected: str) -> None:
    pols = _pols(*pn)
    sel = [AttributeSelection(o, v, pol) for (o, v), pol in zip(ATTR_VALUES, pols)]
    prompt = attribute_prompt("x", Category.COLOR, sel)
    assert prompt.prompt == expected
    assert prompt.setting == f"pos{pn[0]}_neg{pn[1]}"
    assert len(prompt.objects) == sum(pn)
    # the record survives a JSON round trip through the core's parser
    assert parse_prompt(prompt.to_json()) == prompt


@pytest.mark.parametrize(("pn", "expected"), RELATION_FORMS.items())
def test_relation_form_per_setting(pn: tuple[int, int], expected: str) -> None:
    pols = _pols(*pn)
    sel = [RelationSelection(p, t, pol) for (p, t), pol in zip(REL_TARGETS, pols)]
    prompt = relation_prompt("x", Category.DIRECTIONAL, "cat", sel)
    assert prompt.prompt == expected
    assert prompt.setting == f"pos{pn[0]}_neg{pn[1]}"
    assert len(prompt.objects) == sum(pn) + 1
    assert expected.count("cat") == 2  # the subject is named once in the list, once in the clauses


def test_polarity_changes_only_non_and_not() -> None:
    pos = attribute_text([AttributeSelection("cup", "glass", POS)])
    neg = attribute_text([AttributeSelection("cup", "glass", NEG)])
    assert neg.replace("non-", "") == pos
    pos = relation_text("backpack", [RelationSelection("above", "parking meter", POS)])
    neg = relation_text("backpack", [RelationSelection("above", "parking meter", NEG)])
    assert pos == "a photo of a backpack and a parking meter, where the backpack is above the parking meter"
    assert neg.replace("not ", "") == pos


def test_negated_before_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="positive statements must come before negated"):
        attribute_text([AttributeSelection("cup", "red", NEG), AttributeSelection("bench", "red", POS)])
    with pytest.raises(ValueError, match="positive statements must come before negated"):
        relation_text("cat", [RelationSelection("near", "cup", NEG), RelationSelection("near", "dog", POS)])


def test_wrong_category_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="not an attribute category"):
        attribute_prompt("x", Category.DEPTH, [AttributeSelection("cup", "red", POS)])
    with pytest.raises(ValueError, match="not a relation category"):
        relation_prompt("x", Category.COLOR, "cat", [RelationSelection("near", "cup", POS)])


def test_render_rejects_non_star_metadata() -> None:
    record = {
        "id": "x", "category": "proximity", "prompt": "whatever",
        "include": [{"class": "cat"}, {"class": "cup"}, {"class": "dog"}],
        "statements": [
            {"kind": "relation", "subject": 0, "target": 1, "predicate": "near"},
            {"kind": "relation", "subject": 1, "target": 2, "predicate": "near"},
        ],
    }  # fmt: skip
    with pytest.raises(ValueError, match="share object 0"):
        render(parse_prompt(record))
