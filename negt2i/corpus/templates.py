"""Deterministic prompt templates (paper, Appendix A.1 and Table 4).

Selections (which objects, which value or predicate, which polarity) come from the
builder; the wording comes only from here, so it never drifts between polarities.

Attribute prompts name one object per statement::

    a photo of a <value> <object>                      (positive)
    a photo of a non-<value> <object>                  (negated)
    a photo of a plastic bus, a plastic knife, a non-plastic sandwich, and a non-plastic toilet

Relation prompts use the star topology: one shared subject ``A`` named once, one
target ``B_i`` per statement::

    a photo of a <A> and a <B1>, where the <A> is [not] <pred> the <B1>
    a photo of a <A>, a <B1>, and a <B2>, where the <A> is <p1> the <B1> and is not <p2> the <B2>

Conventions (fixed by Table 4, kept for the forms the paper does not show):

- the article is always ``a`` (Table 4 writes "a skis" and "a non-brown orange");
- lists join two items with ``and`` and three or more with the serial comma
  (``x, y, and z``), both for the object list and for the clauses;
- positive statements come before negated ones; polarity changes only ``non-`` / ``not``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from negt2i.core.spec import AttributeStatement, ObjectSpec, Polarity, Prompt, RelationStatement
from negt2i.core.vocab import Category

PREFIX = "a photo of "


@dataclass(frozen=True)
class AttributeSelection:
    """One attribute statement as selected: ``obj`` is (not) ``value``."""

    obj: str
    value: str
    polarity: Polarity


@dataclass(frozen=True)
class RelationSelection:
    """One star-topology clause as selected: the shared subject is (not) ``predicate`` the ``target``."""

    predicate: str
    target: str
    polarity: Polarity


def join_list(items: Sequence[str]) -> str:
    """``x``; ``x and y``; ``x, y, and z`` (serial comma from three items on)."""
    if not items:
        raise ValueError("cannot join an empty list")
    if len(items) == 1:
        return items[0]
    if len(items) == 2:
        return f"{items[0]} and {items[1]}"
    return ", ".join(items[:-1]) + f", and {items[-1]}"


def _check_order(polarities: Sequence[Polarity]) -> None:
    seen_negated = False
    for polarity in polarities:
        if polarity is Polarity.NEGATED:
            seen_negated = True
        elif seen_negated:
            raise ValueError("positive statements must come before negated ones")


def attribute_phrase(sel: AttributeSelection) -> str:
    """``a red cup`` or ``a non-red cup``."""
    neg = "non-" if sel.polarity is Polarity.NEGATED else ""
    return f"a {neg}{sel.value} {sel.obj}"


def attribute_text(selections: Sequence[AttributeSelection]) -> str:
    """The prompt string of an attribute prompt (one object per statement, in order)."""
    _check_order([s.polarity for s in selections])
    return PREFIX + join_list([attribute_phrase(s) for s in selections])


def relation_clause(sel: RelationSelection) -> str:
    """``is right of the zebra`` or ``is not right of the zebra``."""
    neg = "not " if sel.polarity is Polarity.NEGATED else ""
    return f"is {neg}{sel.predicate} the {sel.target}"


def relation_text(subject: str, selections: Sequence[RelationSelection]) -> str:
    """The prompt string of a star-topology relation prompt (subject named once)."""
    _check_order([s.polarity for s in selections])
    if not selections:
        raise ValueError("a relation prompt needs at least one statement")
    objects = join_list([f"a {subject}", *(f"a {s.target}" for s in selections)])
    clauses = join_list([relation_clause(s) for s in selections])
    return f"{PREFIX}{objects}, where the {subject} {clauses}"


def attribute_prompt(pid: str, category: Category, selections: Sequence[AttributeSelection]) -> Prompt:
    """A validated attribute ``Prompt``: object ``i`` carries statement ``i``."""
    if not category.is_attribute:
        raise ValueError(f"{category} is not an attribute category")
    return Prompt(
        id=pid,
        prompt=attribute_text(selections),
        category=category,
        tag=category.value,
        objects=tuple(ObjectSpec.model_validate({"class": s.obj, "count": 1}) for s in selections),
        statements=tuple(
            AttributeStatement(object=i, value=s.value, polarity=s.polarity) for i, s in enumerate(selections)
        ),
    )


def relation_prompt(pid: str, category: Category, subject: str, selections: Sequence[RelationSelection]) -> Prompt:
    """A validated star-topology ``Prompt``: object 0 is the subject, object ``i`` the target of statement ``i-1``."""
    if not category.is_relation:
        raise ValueError(f"{category} is not a relation category")
    return Prompt(
        id=pid,
        prompt=relation_text(subject, selections),
        category=category,
        tag=category.value,
        objects=tuple(
            ObjectSpec.model_validate({"class": name, "count": 1})
            for name in (subject, *(s.target for s in selections))
        ),
        statements=tuple(
            RelationStatement(subject=0, target=i + 1, predicate=s.predicate, polarity=s.polarity)
            for i, s in enumerate(selections)
        ),
    )


def render(prompt: Prompt) -> str:
    """The template string for a prompt's metadata (used by validation to check the wording).

    Raises ``ValueError`` when the metadata has no template form (not one object per
    attribute statement, or not a star topology).
    """
    if prompt.category is None or not prompt.statements:
        raise ValueError("only prompts with a category and statements have a template form")
    names = [o.class_name for o in prompt.objects]
    if prompt.category.is_attribute:
        attrs = [s for s in prompt.statements if isinstance(s, AttributeStatement)]
        if [s.object for s in attrs] != list(range(len(names))) or len(attrs) != len(prompt.statements):
            raise ValueError("attribute statements must name objects 0, 1, ... in order, one each")
        return attribute_text([AttributeSelection(names[s.object], s.value, s.polarity) for s in attrs])
    rels = [s for s in prompt.statements if isinstance(s, RelationStatement)]
    if len(rels) != len(prompt.statements) or any(s.subject != 0 for s in rels):
        raise ValueError("relation statements must share object 0 as their subject")
    if [s.target for s in rels] != list(range(1, len(names))):
        raise ValueError("relation statements must target objects 1, 2, ... in order, one each")
    return relation_text(names[0], [RelationSelection(s.predicate, names[s.target], s.polarity) for s in rels])


__all__ = [
    "PREFIX",
    "AttributeSelection",
    "RelationSelection",
    "attribute_phrase",
    "attribute_prompt",
    "attribute_text",
    "join_list",
    "relation_clause",
    "relation_prompt",
    "relation_text",
    "render",
]
