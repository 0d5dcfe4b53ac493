"""The default plausibility table: complete, consistent with converses, and able to feed every cell."""

from __future__ import annotations

import itertools

import pytest

from negt2i.core.vocab import BENCHMARK_CLASSES, CONVERSE, PREDICATES, VALUES, Category
from negt2i.corpus.plausibility import TABLE, attribute_values, relation_plausible
from negt2i.corpus.selectors import TableSelector


def test_table_lists_exactly_the_benchmark_classes() -> None:
    assert tuple(TABLE) == BENCHMARK_CLASSES
    assert "person" not in TABLE
    for row in TABLE.values():
        assert 1 <= row.size <= 5 and 1 <= row.height <= 5


@pytest.mark.parametrize("category", [Category.COLOR, Category.MATERIAL])
def test_every_class_has_a_value_and_every_value_enough_carriers(category: Category) -> None:
    for obj in BENCHMARK_CLASSES:
        values = attribute_values(category, obj)
        assert values, obj
        assert set(values) <= set(VALUES[category])
    for value in VALUES[category]:
        carriers = [o for o in BENCHMARK_CLASSES if value in attribute_values(category, o)]
        assert len(carriers) >= 20, (value, len(carriers))  # plenty for 4-object prompts


def test_reviewed_examples() -> None:
    # Table 4's selections are in the table: a brown orange, plastic bus / knife / sandwich / toilet.
    assert "brown" in attribute_values(Category.COLOR, "orange")
    for obj in ("bus", "knife", "sandwich", "toilet"):
        assert "plastic" in attribute_values(Category.MATERIAL, obj)
    assert "metal" not in attribute_values(Category.MATERIAL, "sandwich")
    assert "glass" not in attribute_values(Category.MATERIAL, "backpack")
    assert relation_plausible("bigger than", "skis", "skateboard")
    assert relation_plausible("in front of", "broccoli", "bench")
    assert not relation_plausible("above", "bus", "fork")  # a ground object 4 tiers bigger
    assert relation_plausible("above", "fork", "bus")
    assert not relation_plausible("bigger than", "fork", "elephant")
    assert not relation_plausible("taller than", "cup", "giraffe")
    assert not relation_plausible("near", "cat", "cat")
    with pytest.raises(ValueError, match="unknown predicate"):
        relation_plausible("on top of", "cat", "dog")
    with pytest.raises(ValueError, match="not an attribute category"):
        attribute_values(Category.DEPTH, "cat")


def test_relations_agree_with_their_converse() -> None:
    predicates = [p for names in PREDICATES.values() for p in names]
    for a, b in itertools.permutations(BENCHMARK_CLASSES, 2):
        for pred in predicates:
            assert relation_plausible(pred, a, b) == relation_plausible(CONVERSE[pred], b, a), (pred, a, b)


@pytest.mark.parametrize("category", [c for c in Category if c.is_relation])
def test_every_class_can_be_subject_and_target(category: Category) -> None:
    selector = TableSelector()
    targets_seen: set[str] = set()
    for subject in BENCHMARK_CLASSES:
        pairs = selector.relation_pairs(category, subject, BENCHMARK_CLASSES)
        assert all(p in PREDICATES[category] and t != subject for p, t in pairs)
        targets = {t for _, t in pairs}
        assert len(targets) >= 4, subject  # enough distinct targets for a pos2_neg2 star
        assert {p for p, _ in pairs} == set(PREDICATES[category]), subject
        targets_seen |= targets
    assert targets_seen == set(BENCHMARK_CLASSES)
