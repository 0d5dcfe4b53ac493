"""Vocabularies of the benchmark: object classes, categories, values and predicates.

Class names follow GenEval's ``object_names.txt`` (COCO's 80 classes with GenEval's
spelling, e.g. ``computer mouse`` for COCO's ``mouse``). The benchmark uses the 79
classes without ``person`` (paper, Appendix A.1). Predicate strings are the
paper's (Table 1); the color list is GenEval's and the material list the four
OVAD values the paper selects.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from enum import StrEnum
from typing import Final

COCO_CLASSES: Final[tuple[str, ...]] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck",
    "boat", "traffic light", "fire hydrant", "stop sign", "parking meter", "bench",
    "bird", "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra",
    "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee", "skis",
    "snowboard", "sports ball", "kite", "baseball bat", "baseball glove", "skateboard",
    "surfboard", "tennis racket", "bottle", "wine glass", "cup", "fork", "knife",
    "spoon", "bowl", "banana", "apple", "sandwich", "orange", "broccoli", "carrot",
    "hot dog", "pizza", "donut", "cake", "chair", "couch", "potted plant", "bed",
    "dining table", "toilet", "tv", "laptop", "computer mouse", "tv remote",
    "computer keyboard", "cell phone", "microwave", "oven", "toaster", "sink",
    "refrigerator", "book", "clock", "vase", "scissors", "teddy bear", "hair drier",
    "toothbrush",
)  # fmt: skip
"""The 80 COCO classes in COCO's category order, spelled as GenEval spells them."""

BENCHMARK_CLASSES: Final[tuple[str, ...]] = tuple(c for c in COCO_CLASSES if c != "person")
"""The 79 classes prompts may name (COCO without ``person``)."""

OVER_COUNT_EXEMPT: Final[frozenset[str]] = frozenset({"skis"})
"""Classes exempt from the over-count rule: one pair of skis is often detected twice."""


class Category(StrEnum):
    """The six benchmark categories (paper, Table 1)."""

    COLOR = "color"
    MATERIAL = "material"
    DIRECTIONAL = "directional"
    PROXIMITY = "proximity"
    COMPARATIVE = "comparative"
    DEPTH = "depth"

    @property
    def is_attribute(self) -> bool:
        """True for color and material, whose statements assign a value to one object."""
        return self in ATTRIBUTE_CATEGORIES

    @property
    def is_relation(self) -> bool:
        """True for the four categories whose statements relate two objects."""
        return not self.is_attribute

    @property
    def has_dead_zone(self) -> bool:
        """True where the rule may fire no predicate: directional, comparative, depth."""
        return self in DEAD_ZONE_CATEGORIES


ATTRIBUTE_CATEGORIES: Final[frozenset[Category]] = frozenset({Category.COLOR, Category.MATERIAL})
RELATION_CATEGORIES: Final[frozenset[Category]] = frozenset(
    {Category.DIRECTIONAL, Category.PROXIMITY, Category.COMPARATIVE, Category.DEPTH}
)
DEAD_ZONE_CATEGORIES: Final[frozenset[Category]] = frozenset(
    {Category.DIRECTIONAL, Category.COMPARATIVE, Category.DEPTH}
)

COLORS: Final[tuple[str, ...]] = (
    "red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white",
)  # fmt: skip
"""Requestable colors (GenEval's list)."""

COLOR_ANSWERS: Final[tuple[str, ...]] = (*COLORS, "gray")
"""Colors the attribute stage scores: the ten requestable ones plus ``gray``."""

MATERIALS: Final[tuple[str, ...]] = ("wooden", "metal", "plastic", "glass")
"""Requestable (and scored) materials."""

PREDICATES: Final[dict[Category, tuple[str, ...]]] = {
    Category.DIRECTIONAL: ("left of", "right of", "above", "below"),
    Category.PROXIMITY: ("near", "far from"),
    Category.COMPARATIVE: ("bigger than", "smaller than", "taller than", "shorter than"),
    Category.DEPTH: ("in front of", "behind"),
}
"""Relation predicates per relation category, in the paper's spelling."""

VALUES: Final[dict[Category, tuple[str, ...]]] = {
    Category.COLOR: COLORS,
    Category.MATERIAL: MATERIALS,
}
"""Requestable attribute values per attribute category."""

ANSWERS: Final[dict[Category, tuple[str, ...]]] = {
    Category.COLOR: COLOR_ANSWERS,
    Category.MATERIAL: MATERIALS,
}
"""Values the attribute stage must score per attribute category."""

CONVERSE: Final[dict[str, str]] = {
    "left of": "right of",
    "right of": "left of",
    "above": "below",
    "below": "above",
    "near": "near",
    "far from": "far from",
    "bigger than": "smaller than",
    "smaller than": "bigger than",
    "taller than": "shorter than",
    "shorter than": "taller than",
    "in front of": "behind",
    "behind": "in front of",
}
"""The predicate that holds for (B, A) when a predicate holds for (A, B)."""

SETTINGS: Final[tuple[tuple[int, int], ...]] = ((1, 0), (2, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 1), (2, 2))
"""The eight polarity settings (positive, negated) of the corpus, in the paper's order."""


def setting_name(positive: int, negated: int) -> str:
    """The polarity setting ``pos{P}_neg{N}``."""
    return f"pos{positive}_neg{negated}"


SETTING_NAMES: Final[tuple[str, ...]] = tuple(setting_name(p, n) for p, n in SETTINGS)
"""The eight settings' names ``pos{P}_neg{N}`` (a prompt's setting counts its statements)."""

CASE_RULE: Final[str] = (
    "Names are matched exactly (case-sensitive, single spaces, as listed); a near miss is refused "
    "with the canonical spelling suggested, never normalised silently."
)
"""How class names, values, predicates and category names are matched (published in the API's vocabulary)."""


COCO_SPELLINGS: Final[dict[str, str]] = {
    "mouse": "computer mouse",
    "remote": "tv remote",
    "keyboard": "computer keyboard",
}
"""COCO's own names of the classes GenEval renamed -> GenEval's spelling (only ever suggested, never accepted)."""


def _fold(word: str) -> str:
    return " ".join(word.replace("_", " ").replace("-", " ").split()).casefold()


def suggest(word: str, vocabulary: Iterable[str]) -> str | None:
    """The canonical spelling a refused ``word`` most likely meant, or None.

    First a match ignoring case, repeated / surrounding blanks and ``_`` / ``-`` for a blank
    (``"Computer_Mouse"`` -> ``"computer mouse"``); then COCO's own name of a class GenEval renamed
    (``COCO_SPELLINGS``: ``"mouse"`` -> ``"computer mouse"``); else the closest name by
    ``difflib.get_close_matches`` (cutoff 0.8; ``"compter mouse"`` -> ``"computer mouse"``).
    """
    names = list(vocabulary)
    folded = _fold(word)
    for name in names:
        if _fold(name) == folded:
            return name
    renamed = COCO_SPELLINGS.get(folded)
    if renamed in names:
        return renamed
    close = difflib.get_close_matches(folded, names, n=1, cutoff=0.8)
    return close[0] if close else None


def did_you_mean(word: str, vocabulary: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for a refused ``word`` with a likely canonical spelling, else ``""``."""
    hit = suggest(word, vocabulary)
    return f"; did you mean {hit!r}?" if hit is not None and hit != word else ""
