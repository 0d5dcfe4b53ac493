"""The training split: prompts made like the benchmark's, disjoint from it (docs/reward.md, docs/corpus.md).

A generator trained with the judge as its reward (``negt2i.reward``) must not train on the test set.
``build_train`` makes ``size`` prompts with the benchmark's builder (``negt2i.corpus.build``: the same
templates, plausibility selector, categories, the eight polarity settings and the same least-used
balancing, from its own seeded RNG, ``negt2ibench-train:<seed>:<category>``), and the same record
format, so a training prompt travels inline to the orchestrator like a benchmark one. Disjointness
from the benchmark file (by default ``data/negt2ibench.jsonl``):

- **texts**: no training prompt has the text of a benchmark prompt (always);
- **object pairs** (the default; ``pairs=False`` turns it off): no training prompt names together two
  objects that a benchmark prompt of the same category names together, where a relation's pair is the
  two objects one statement links (subject and target, either order) and an attribute prompt's pairs
  are every two of its objects. A one-object attribute prompt has no pair: only its text must be new
  (every plausible (object, value) pair of the table already appears in the benchmark, so a rule on
  them would leave no single-statement attribute prompt).

Sizes: ``size`` is split evenly over the ``len(categories) x 8`` cells in (category, setting) order,
the first ``size mod cells`` cells taking one more. Settings are filled round-robin, one prompt per
setting per round, so a cell that runs out of new prompts (material with one statement: 231 plausible
texts, 100 of them in the benchmark) stops early and its remaining share goes to the other settings
of its category, round-robin; ``BuildError`` when the category cannot reach its share at all.
Ids are ``train-<category>-<setting>-<index:05d>``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Final

from negt2i import __version__
from negt2i.core.spec import AttributeStatement, Prompt, RelationStatement, setting_name
from negt2i.core.vocab import SETTINGS, Category
from negt2i.corpus.build import (
    CATEGORIES,
    DEFAULT_TARGET_POOL,
    FORMAT,
    BuildError,
    category_rng,
    category_state,
    corpus_bytes,
)
from negt2i.corpus.selectors import PlausibilitySelector

SPLITS: Final[tuple[str, ...]] = ("test", "train")
TRAIN_PREFIX: Final[str] = "train-"


def object_pairs(prompt: Prompt) -> set[frozenset[str]]:
    """The object pairs of a prompt (module docstring): per relation statement its subject and target;
    for an attribute prompt every two of its objects."""
    names = [o.class_name for o in prompt.objects]
    if any(isinstance(st, RelationStatement) for st in prompt.statements):
        return {
            frozenset((names[st.subject], names[st.target]))
            for st in prompt.statements
            if isinstance(st, RelationStatement)
        }
    if any(isinstance(st, AttributeStatement) for st in prompt.statements):
        return {frozenset(pair) for pair in combinations(names, 2) if pair[0] != pair[1]}
    return set()


@dataclass(frozen=True)
class Exclusion:
    """What training prompts must avoid: the benchmark's texts and (per category) its object pairs."""

    texts: frozenset[str]
    pairs: dict[Category, frozenset[frozenset[str]]]

    @classmethod
    def of(cls, benchmark: Iterable[Prompt], *, pairs: bool = True) -> Exclusion:
        texts: set[str] = set()
        by_category: dict[Category, set[frozenset[str]]] = {c: set() for c in Category}
        for p in benchmark:
            texts.add(p.prompt)
            if pairs and p.category is not None:
                by_category[p.category] |= object_pairs(p)
        return cls(frozenset(texts), {c: frozenset(v) for c, v in by_category.items()})

    def overlap(self, prompts: Iterable[Prompt]) -> dict[str, int]:
        """How many of ``prompts`` share a text, and how many share an object pair, with the benchmark."""
        same_text = same_pair = 0
        for p in prompts:
            same_text += p.prompt in self.texts
            forbidden = self.pairs.get(p.category, frozenset()) if p.category is not None else frozenset()
            same_pair += bool(object_pairs(p) & forbidden)
        return {"identical_prompts": same_text, "shared_object_pairs": same_pair}


def train_prompt_id(category: Category, setting: str, index: int) -> str:
    """``train-<category>-<setting>-<index:05d>``: never an id of the benchmark."""
    return f"{TRAIN_PREFIX}{category.value}-{setting}-{index:05d}"


def cell_quotas(size: int, categories: Sequence[Category]) -> dict[tuple[Category, str], int]:
    """``size`` prompts over the (category, setting) cells, as even as can be (module docstring)."""
    cells = [(c, setting_name(p, n)) for c in CATEGORIES if c in categories for p, n in SETTINGS]
    if not cells:
        raise ValueError("no category to build")
    base, extra = divmod(size, len(cells))
    return {cell: base + (1 if i < extra else 0) for i, cell in enumerate(cells)}


def _train_category(
    category: Category,
    selector: PlausibilitySelector,
    quotas: dict[str, int],
    exclusion: Exclusion,
    *,
    seed: int,
    target_pool: int,
) -> list[Prompt]:
    state = category_state(
        category,
        selector,
        category_rng(seed, category, "negt2ibench-train"),
        target_pool=target_pool,
        forbidden=exclusion.pairs.get(category, frozenset()),
    )
    seen = set(exclusion.texts)
    made: dict[str, list[Prompt]] = {setting_name(p, n): [] for p, n in SETTINGS}
    counts = dict(zip(made, SETTINGS, strict=True))
    exhausted: set[str] = set()
    spill = 0

    def make_one(setting: str) -> bool:
        positive, negated = counts[setting]
        try:
            prompt = state.make(train_prompt_id(category, setting, len(made[setting])), positive, negated, seen)
        except BuildError:
            exhausted.add(setting)
            return False
        seen.add(prompt.prompt)
        made[setting].append(prompt)
        return True

    while any(len(made[s]) < quotas[s] and s not in exhausted for s in made):
        for setting, have in made.items():
            if len(have) < quotas[setting] and setting not in exhausted and not make_one(setting):
                spill += quotas[setting] - len(have)
    while spill:
        progressed = False
        for setting in made:
            if spill and setting not in exhausted and make_one(setting):
                spill -= 1
                progressed = True
        if not progressed:
            total = sum(quotas.values())
            raise BuildError(
                f"{category}: only {total - spill} new prompts of the {total} asked for (the benchmark's texts and "
                "object pairs leave no more); ask for fewer, or allow shared object pairs"
            )
    return [p for setting in made for p in made[setting]]


def build_train(
    selector: PlausibilitySelector,
    benchmark: Sequence[Prompt],
    *,
    size: int,
    seed: int = 0,
    categories: Sequence[Category] = CATEGORIES,
    target_pool: int = DEFAULT_TARGET_POOL,
    pairs: bool = True,
) -> list[Prompt]:
    """``size`` training prompts disjoint from ``benchmark`` (module docstring), categories in vocab order."""
    if size < 1:
        raise ValueError(f"size must be at least 1, got {size}")
    exclusion = Exclusion.of(benchmark, pairs=pairs)
    quotas = cell_quotas(size, categories)
    prompts: list[Prompt] = []
    for category in CATEGORIES:
        if category in categories:
            mine = {s: n for (c, s), n in quotas.items() if c is category}
            prompts.extend(_train_category(category, selector, mine, exclusion, seed=seed, target_pool=target_pool))
    return prompts


def train_metadata(
    prompts: Sequence[Prompt],
    selector: PlausibilitySelector,
    benchmark: Sequence[Prompt],
    *,
    benchmark_path: str,
    benchmark_sha256: str,
    seed: int,
    size: int,
    categories: Sequence[Category],
    target_pool: int,
    pairs: bool,
) -> dict[str, Any]:
    """What made a training split, and what it was made disjoint from (path, SHA-256, the rules, the overlap)."""
    return {
        "format": FORMAT,
        "split": "train",
        "negt2i_version": __version__,
        "seed": seed,
        "size": size,
        "categories": [c.value for c in CATEGORIES if c in categories],
        "target_pool": target_pool,
        "selector": selector.describe(),
        "disjoint_from": {
            "path": benchmark_path,
            "sha256": benchmark_sha256,
            "rules": ["identical_prompts", *(["shared_object_pairs"] if pairs else [])],
            "overlap": Exclusion.of(benchmark).overlap(prompts),
        },
        "prompts": len(prompts),
        "sha256": hashlib.sha256(corpus_bytes(prompts)).hexdigest(),
    }


__all__ = [
    "SPLITS",
    "TRAIN_PREFIX",
    "Exclusion",
    "build_train",
    "cell_quotas",
    "object_pairs",
    "train_metadata",
    "train_prompt_id",
]
