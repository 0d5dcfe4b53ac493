"""The default plausibility table: which values and relations suit each class.

The paper's selector (an LLM) keeps object / value / predicate combinations that
are *plausible or unusual but depictable in their positive form*, so that every
negated statement denies something that could reasonably appear (Appendix A.1).
This module is the offline, deterministic stand-in: one reviewable row per class.

Reading a row (``_row(group, size, height, ground, colors, materials)``):

- ``colors`` / ``materials``: the values the class can plausibly carry, or carry
  in an unusual but depictable way (painted, dyed, toy, carved, cast, figurine).
  ``all`` means every requestable value. A positive ``a glass banana`` must be a
  thing a picture can show and a detector still calls a banana (decorative glass
  fruit); ``a metal sandwich`` is not, so metal is absent from the sandwich row.
  Gray is never requested (vocab), so gray animals list the colors they can still
  be shown in.
- ``size``: the object's usual largest dimension as a tier, 1 tiny (hand-held,
  up to about 20 cm: cutlery, phones, fruit), 2 small (< 50 cm), 3 medium
  (< 1.2 m), 4 large (< 3 m), 5 huge.
- ``height``: the same tiers for its usual vertical extent.
- ``ground``: heavy things that stand on the ground (most vehicles, large
  animals, large furniture and appliances, street fixtures).

Relation rules, generous on purpose (they only drop what cannot be shown):

- directional ``left of`` / ``right of``, proximity and depth: every pair;
- ``A above B`` is out when ``A`` is a ground object at least three size tiers
  bigger than ``B`` (a bus above a fork); ``A below B`` is the converse;
- ``A bigger than B`` needs ``size(A) >= size(B) - 1`` and ``A smaller than B``
  needs ``size(A) <= size(B) + 1`` (one tier of slack: toys, close-ups); taller /
  shorter use ``height`` the same way.

Each rule agrees with its converse (``A bigger than B`` is plausible exactly when
``B smaller than A`` is); the tests check this and that every class can appear in
every category.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from negt2i.core.vocab import BENCHMARK_CLASSES, COLORS, MATERIALS, PREDICATES, Category


class Group(StrEnum):
    """Coarse class groups (documentation and reports; the rules use the tiers)."""

    VEHICLE = "vehicle"
    STREET = "street"
    ANIMAL = "animal"
    ACCESSORY = "accessory"
    SPORTS = "sports"
    KITCHEN = "kitchen"
    FOOD = "food"
    FURNITURE = "furniture"
    ELECTRONICS = "electronics"
    APPLIANCE = "appliance"
    INDOOR = "indoor"


@dataclass(frozen=True)
class ClassTraits:
    """One row of the table."""

    group: Group
    size: int
    height: int
    ground: bool
    colors: tuple[str, ...]
    materials: tuple[str, ...]


def _values(spec: str, vocabulary: tuple[str, ...]) -> tuple[str, ...]:
    if spec == "all":
        return vocabulary
    names = spec.split()
    unknown = [n for n in names if n not in vocabulary]
    if unknown:
        raise ValueError(f"unknown values {unknown} (expected among {vocabulary})")
    return tuple(v for v in vocabulary if v in names)  # vocabulary order


def _row(  # noqa: PLR0917 - positional on purpose: one aligned table row per class
    group: Group, size: int, height: int, ground: bool, colors: str, materials: str
) -> ClassTraits:
    return ClassTraits(group, size, height, ground, _values(colors, COLORS), _values(materials, MATERIALS))


V, S, A, C, P = Group.VEHICLE, Group.STREET, Group.ANIMAL, Group.ACCESSORY, Group.SPORTS
K, F, U, E, L, H = Group.KITCHEN, Group.FOOD, Group.FURNITURE, Group.ELECTRONICS, Group.APPLIANCE, Group.INDOOR
G, N = True, False  # ground / not

TABLE: Final[dict[str, ClassTraits]] = {
    # class               group size height ground  colors                                   materials
    "bicycle":           _row(V, 4, 3, G, "all",                                      "wooden metal plastic"),
    "car":               _row(V, 5, 4, G, "all",                                      "wooden metal plastic"),
    "motorcycle":        _row(V, 4, 3, G, "all",                                      "metal plastic"),
    "airplane":          _row(V, 5, 4, N, "all",                                      "wooden metal plastic"),
    "bus":               _row(V, 5, 5, G, "all",                                      "wooden metal plastic"),
    "train":             _row(V, 5, 4, G, "all",                                      "wooden metal plastic"),
    "truck":             _row(V, 5, 4, G, "all",                                      "wooden metal plastic"),
    "boat":              _row(V, 5, 4, G, "all",                                      "wooden metal plastic"),
    "traffic light":     _row(S, 3, 4, N, "red yellow green black white",             "metal plastic"),
    "fire hydrant":      _row(S, 3, 3, G, "red orange yellow green blue black white", "metal plastic"),
    "stop sign":         _row(S, 3, 4, N, "red yellow blue black white",              "wooden metal plastic"),
    "parking meter":     _row(S, 4, 4, G, "red yellow green blue black white",        "metal plastic"),
    "bench":             _row(U, 4, 3, G, "red yellow green blue brown black white",  "wooden metal plastic"),
    "bird":              _row(A, 2, 2, N, "all",                                      "all"),
    "cat":               _row(A, 2, 2, N, "orange brown black white",                 "all"),
    "dog":               _row(A, 3, 2, N, "orange yellow brown black white",          "all"),
    "horse":             _row(A, 4, 4, G, "brown black white",                        "all"),
    "sheep":             _row(A, 3, 3, G, "brown black white",                        "all"),
    "cow":               _row(A, 4, 4, G, "brown black white",                        "all"),
    "elephant":          _row(A, 5, 5, G, "pink brown black white",                   "all"),
    "bear":              _row(A, 4, 4, G, "brown black white",                        "all"),
    "zebra":             _row(A, 4, 4, G, "brown black white",                        "all"),
    "giraffe":           _row(A, 5, 5, G, "orange yellow brown white",                "all"),
    "backpack":          _row(C, 2, 2, N, "all",                                      "plastic"),
    "umbrella":          _row(C, 3, 3, N, "all",                                      "wooden metal plastic"),
    "handbag":           _row(C, 2, 2, N, "all",                                      "wooden metal plastic"),
    "tie":               _row(C, 2, 2, N, "all",                                      "wooden plastic"),
    "suitcase":          _row(C, 3, 3, N, "all",                                      "wooden metal plastic"),
    "frisbee":           _row(P, 2, 1, N, "all",                                      "wooden metal plastic"),
    "skis":              _row(P, 4, 3, N, "all",                                      "wooden metal plastic"),
    "snowboard":         _row(P, 4, 3, N, "all",                                      "wooden plastic"),
    "sports ball":       _row(P, 2, 2, N, "all",                                      "wooden metal plastic"),
    "kite":              _row(P, 3, 3, N, "all",                                      "wooden plastic"),
    "baseball bat":      _row(P, 3, 3, N, "all",                                      "wooden metal plastic"),
    "baseball glove":    _row(P, 2, 2, N, "all",                                      "plastic"),
    "skateboard":        _row(P, 3, 1, N, "all",                                      "wooden metal plastic"),
    "surfboard":         _row(P, 4, 3, N, "all",                                      "wooden plastic"),
    "tennis racket":     _row(P, 3, 3, N, "all",                                      "wooden metal plastic"),
    "bottle":            _row(K, 2, 2, N, "all",                                      "metal plastic glass"),
    "wine glass":        _row(K, 2, 2, N, "all",                                      "metal plastic glass"),
    "cup":               _row(K, 1, 1, N, "all",                                      "all"),
    "fork":              _row(K, 1, 1, N, "all",                                      "wooden metal plastic"),
    "knife":             _row(K, 1, 1, N, "all",                                      "wooden metal plastic"),
    "spoon":             _row(K, 1, 1, N, "all",                                      "wooden metal plastic"),
    "bowl":              _row(K, 2, 1, N, "all",                                      "all"),
    "banana":            _row(F, 2, 1, N, "red yellow green brown black",             "wooden plastic glass"),
    "apple":             _row(F, 1, 1, N, "red yellow green pink brown",              "wooden plastic glass"),
    "sandwich":          _row(F, 2, 1, N, "red yellow green brown black white",       "wooden plastic"),
    "orange":            _row(F, 1, 1, N, "red orange yellow green brown",            "wooden plastic glass"),
    "broccoli":          _row(F, 2, 1, N, "yellow green purple brown",                "wooden plastic"),
    "carrot":            _row(F, 2, 1, N, "red orange yellow purple white",           "wooden plastic"),
    "hot dog":           _row(F, 2, 1, N, "red orange yellow pink brown",             "wooden plastic"),
    "pizza":             _row(F, 2, 1, N, "red orange yellow green brown black white", "wooden plastic"),
    "donut":             _row(F, 1, 1, N, "all",                                      "wooden plastic"),
    "cake":              _row(F, 2, 2, N, "all",                                      "wooden plastic"),
    "chair":             _row(U, 3, 3, N, "all",                                      "wooden metal plastic"),
    "couch":             _row(U, 4, 3, G, "all",                                      "wooden metal plastic"),
    "potted plant":      _row(H, 2, 2, N, "all",                                      "all"),
    "bed":               _row(U, 4, 3, G, "all",                                      "wooden metal plastic"),
    "dining table":      _row(U, 4, 3, G, "all",                                      "all"),
    "toilet":            _row(U, 3, 3, G, "all",                                      "wooden metal plastic"),
    "tv":                _row(E, 3, 3, N, "all",                                      "all"),
    "laptop":            _row(E, 2, 2, N, "all",                                      "wooden metal plastic"),
    "computer mouse":    _row(E, 1, 1, N, "all",                                      "wooden metal plastic"),
    "tv remote":         _row(E, 1, 1, N, "all",                                      "wooden metal plastic"),
    "computer keyboard": _row(E, 2, 1, N, "all",                                      "all"),
    "cell phone":        _row(E, 1, 1, N, "all",                                      "all"),
    "microwave":         _row(L, 3, 2, N, "all",                                      "metal plastic"),
    "oven":              _row(L, 3, 3, G, "all",                                      "metal plastic"),
    "toaster":           _row(L, 2, 2, N, "all",                                      "metal plastic"),
    "sink":              _row(L, 3, 2, N, "all",                                      "all"),
    "refrigerator":      _row(L, 4, 4, G, "all",                                      "metal plastic glass"),
    "book":              _row(H, 2, 1, N, "all",                                      "wooden plastic"),
    "clock":             _row(H, 2, 2, N, "all",                                      "all"),
    "vase":              _row(H, 2, 2, N, "all",                                      "all"),
    "scissors":          _row(H, 1, 1, N, "all",                                      "metal plastic"),
    "teddy bear":        _row(H, 2, 2, N, "all",                                      "wooden plastic glass"),
    "hair drier":        _row(H, 2, 2, N, "all",                                      "metal plastic"),
    "toothbrush":        _row(H, 1, 1, N, "all",                                      "wooden plastic"),
}  # fmt: skip
"""One row per benchmark class (the 79 COCO classes without ``person``)."""

if tuple(TABLE) != BENCHMARK_CLASSES:  # pragma: no cover - a broken table must not import
    raise RuntimeError("the plausibility table must list exactly the benchmark classes, in vocab order")


def attribute_values(category: Category, obj: str) -> tuple[str, ...]:
    """The values of ``category`` that ``obj`` can plausibly carry (vocabulary order)."""
    row = TABLE[obj]
    if category is Category.COLOR:
        return row.colors
    if category is Category.MATERIAL:
        return row.materials
    raise ValueError(f"{category} is not an attribute category")


def relation_plausible(predicate: str, subject: str, target: str) -> bool:
    """Whether ``the <subject> is <predicate> the <target>`` is plausible or depictable."""
    a, b = TABLE[subject], TABLE[target]
    if subject == target:
        return False
    if predicate == "above":
        return not (a.ground and a.size >= b.size + 3)
    if predicate == "below":
        return not (b.ground and b.size >= a.size + 3)
    if predicate == "bigger than":
        return a.size >= b.size - 1
    if predicate == "smaller than":
        return a.size <= b.size + 1
    if predicate == "taller than":
        return a.height >= b.height - 1
    if predicate == "shorter than":
        return a.height <= b.height + 1
    if any(predicate in names for names in PREDICATES.values()):
        return True
    raise ValueError(f"unknown predicate {predicate!r}")


__all__ = ["TABLE", "ClassTraits", "Group", "attribute_values", "relation_plausible"]
