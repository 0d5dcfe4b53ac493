"""Build the benchmark corpus: 6 categories x 8 settings x 100 prompts = 4,800 (paper, Section 3, A.1).

For each category (independently, with its own seeded RNG and counters) and each
setting in the paper's order, ``per_cell`` prompts are made:

- **attribute** (color, material), ``M = P + N`` statements, one object each.
  Evidence from Table 4 ("a plastic bus, a plastic knife, a non-plastic sandwich,
  and a non-plastic toilet") and Table 1 ("the same objects and value, differing
  only in polarity") is that one prompt uses one value, so the builder picks the
  least-used value (counted per statement), then the ``M`` least-used objects
  that can plausibly carry it (preferring objects not yet paired with that
  value), shuffles them and makes the first ``P`` positive.
- **relation** (directional, proximity, comparative, depth), star topology. The
  subject is the least-used subject (ties: least-used overall); for statement
  ``i`` (positives first) the candidate targets are the ``target_pool``
  least-used targets (separate counter) among those with a plausible predicate
  for this subject, and the pair with the under-used predicate for that polarity
  wins, then the least-used target.

  A selector that answers per pool (``asks_per_pool``, the LLM selector) is asked
  during balancing, as the paper's selector is ("receives a shared subject, a
  candidate pool of target objects, and the allowed predicates"): the pool is the
  ``target_pool`` least-used targets of all classes (not yet in the prompt), the
  selector returns the plausible pairs among them, and the under-used predicate,
  then the least-used target, wins; a pool with no plausible pair is doubled until
  it holds one (or the subject is redrawn). The offline table selector answers for
  the whole vocabulary up front (the paths agree in the policy; the committed
  corpus is the table's).

A prompt whose text already exists in the category is redrawn. Everything is a
function of (seed, selector answers), so the same seed, selector and cache give
a byte-identical file.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from negt2i import __version__
from negt2i.core.spec import Polarity, Prompt, dumps_prompt, setting_name
from negt2i.core.vocab import BENCHMARK_CLASSES, SETTING_NAMES, SETTINGS, VALUES, Category
from negt2i.corpus.balancing import least_used
from negt2i.corpus.selectors import Pair, PlausibilitySelector
from negt2i.corpus.templates import AttributeSelection, RelationSelection, attribute_prompt, relation_prompt

PROMPTS_PER_CELL: Final[int] = 100
CATEGORIES: Final[tuple[Category, ...]] = tuple(Category)
FORMAT: Final[str] = "negt2ibench-corpus/1"
DEFAULT_TARGET_POOL: Final[int] = 8
_MAX_ATTEMPTS: Final[int] = 50
_EXPLORE_AFTER: Final[int] = 3


class BuildError(RuntimeError):
    """The selector's answers leave no valid prompt (e.g. a class with no plausible value)."""


def prompt_id(category: Category, setting: str, index: int) -> str:
    """The stable id ``<category>-<setting>-<index:03d>``, e.g. ``color-pos1_neg0-000``."""
    return f"{category.value}-{setting}-{index:03d}"


def _polarities(positive: int, negated: int) -> list[Polarity]:
    return [Polarity.POSITIVE] * positive + [Polarity.NEGATED] * negated


@dataclass
class _AttributeState:
    category: Category
    plausible: dict[str, tuple[str, ...]]
    rng: random.Random
    objects: Counter[str] = field(default_factory=Counter)
    values: Counter[str] = field(default_factory=Counter)
    pairs: Counter[tuple[str, str]] = field(default_factory=Counter)
    forbidden: frozenset[frozenset[str]] = frozenset()
    """Object pairs no prompt may name together (the training split's pair rule, ``negt2i.corpus.split``)."""

    def __post_init__(self) -> None:
        self.n_carriers = {v: sum(v in vs for vs in self.plausible.values()) for v in VALUES[self.category]}

    def _objects(self, value: str, m: int, *, novel_first: bool) -> list[str]:
        """The ``m`` least-used objects that can carry ``value`` (a redraw prefers novel pairs)."""
        carriers = [c for c in BENCHMARK_CLASSES if value in self.plausible[c]]

        def key(c: str) -> tuple[float, ...]:
            use, novelty = self.objects[c], self.pairs[(c, value)]
            return (novelty, use) if novel_first else (use, novelty)

        if not self.forbidden:
            return least_used(carriers, key, self.rng, m)
        chosen: list[str] = []  # the least-used carriers, skipping any that would make a forbidden pair
        for c in least_used(carriers, key, self.rng, len(carriers)):
            if all(frozenset((c, x)) not in self.forbidden for x in chosen):
                chosen.append(c)
                if len(chosen) == m:
                    break
        return chosen

    def _value_key(self, *, explore: bool) -> Callable[[str], tuple[float, ...]]:
        """Least-used value first; when stuck on duplicates (``explore``), any value."""
        return lambda v: () if explore else (self.values[v],)

    def make(self, pid: str, positive: int, negated: int, seen: set[str]) -> Prompt:
        m = positive + negated
        for attempt in range(_MAX_ATTEMPTS):
            values = [v for v in VALUES[self.category] if self.n_carriers[v] >= m]
            if not values:
                raise BuildError(f"{self.category}: no value is plausible for {m} objects")
            value = least_used(values, self._value_key(explore=attempt >= _EXPLORE_AFTER), self.rng)[0]
            chosen = self._objects(value, m, novel_first=attempt > 0)
            if len(chosen) < m:
                continue
            self.rng.shuffle(chosen)
            selections = [
                AttributeSelection(obj, value, pol)
                for obj, pol in zip(chosen, _polarities(positive, negated), strict=True)
            ]
            prompt = attribute_prompt(pid, self.category, selections)
            if prompt.prompt in seen:
                continue
            self.values[value] += m
            for obj in chosen:
                self.objects[obj] += 1
                self.pairs[(obj, value)] += 1
            return prompt
        raise BuildError(f"{pid}: no new prompt after {_MAX_ATTEMPTS} attempts")


class _NoPair(Exception):
    """The selector finds no plausible pair for this subject among every remaining target."""


@dataclass
class _RelationState:
    category: Category
    plausible: dict[str, tuple[Pair, ...]]
    rng: random.Random
    target_pool: int
    ask: Callable[[str, list[str]], tuple[Pair, ...]] | None = None
    """Per-pool selector (``asks_per_pool``): ``plausible`` is unused and the pool is asked during balancing."""
    subjects: Counter[str] = field(default_factory=Counter)
    targets: Counter[str] = field(default_factory=Counter)
    predicates: Counter[tuple[str, Polarity]] = field(default_factory=Counter)
    clauses: Counter[tuple[str, str, str, Polarity]] = field(default_factory=Counter)
    forbidden: frozenset[frozenset[str]] = frozenset()
    """Object pairs no statement may link (the training split's pair rule, ``negt2i.corpus.split``)."""

    def _allowed(self, subject: str, pairs: Sequence[Pair]) -> list[Pair]:
        if not self.forbidden:
            return list(pairs)
        return [(p, t) for p, t in pairs if frozenset((subject, t)) not in self.forbidden]

    def _total(self, c: str) -> int:
        return self.subjects[c] + self.targets[c]

    def __post_init__(self) -> None:
        if self.ask is not None:  # unknown until asked: every subject may try, a failed pick redraws it
            self.n_targets = {s: len(BENCHMARK_CLASSES) - 1 for s in BENCHMARK_CLASSES}
        else:
            self.n_targets = {s: len({t for _, t in self.plausible[s]}) for s in BENCHMARK_CLASSES}

    def _open_pairs(
        self, subject: str, used: set[str], target_use: Callable[[str], tuple[float, ...]], pool_size: int
    ) -> tuple[list[Pair], list[str]]:
        """The open (predicate, target) pairs and the candidate pool they are chosen from."""
        if self.ask is None:
            open_pairs = self._allowed(subject, [(p, t) for p, t in self.plausible[subject] if t not in used])
            if not open_pairs:
                raise _NoPair(subject)
            pool = least_used(list(dict.fromkeys(t for _, t in open_pairs)), target_use, self.rng, pool_size)
            return open_pairs, pool
        candidates = [t for t in BENCHMARK_CLASSES if t not in used]
        size = pool_size
        while True:
            pool = least_used(candidates, target_use, self.rng, size)
            pairs = self._allowed(subject, [(p, t) for p, t in self.ask(subject, pool) if t in pool and t not in used])
            if pairs:
                return pairs, list(dict.fromkeys(t for _, t in pairs))
            if size >= len(candidates):
                raise _NoPair(subject)
            size *= 2

    def _pick(
        self,
        subject: str,
        *,
        polarity: Polarity,
        used: set[str],
        targets: Counter[str],
        predicates: Counter[tuple[str, Polarity]],
        pool_size: int,
        novel_first: bool,
    ) -> Pair:
        """One clause: the under-used predicate among the least-used candidate targets.

        ``targets`` / ``predicates`` are this prompt's own (not yet committed) uses; a
        redraw (``novel_first``) prefers clauses this subject has not made yet.
        """

        def target_use(t: str) -> tuple[float, ...]:
            return (self.targets[t] + targets[t], self._total(t) + targets[t])

        open_pairs, pool = self._open_pairs(subject, used, target_use, pool_size)
        ranks = {t: self.rng.random() for t in sorted(pool)}

        def key(pair: Pair) -> tuple[float, ...]:
            p, t = pair
            balance = (self.predicates[(p, polarity)] + predicates[(p, polarity)], *target_use(t), ranks[t])
            return (self.clauses[(subject, p, t, polarity)], *balance) if novel_first else balance

        return min((pair for pair in open_pairs if pair[1] in ranks), key=key)

    def _subject_key(self, *, explore: bool) -> Callable[[str], tuple[float, ...]]:
        """Least-used subject first (ties: least-used overall); when stuck on duplicates, any subject."""
        return lambda s: () if explore else (self.subjects[s], self._total(s))

    def make(self, pid: str, positive: int, negated: int, seen: set[str]) -> Prompt:
        m = positive + negated
        able = [s for s in BENCHMARK_CLASSES if self.n_targets[s] >= m]
        if not able:
            raise BuildError(f"{self.category}: no subject has {m} plausible targets")
        for attempt in range(_MAX_ATTEMPTS):
            subject = least_used(able, self._subject_key(explore=attempt >= _EXPLORE_AFTER), self.rng)[0]
            pool_size = self.target_pool + attempt
            targets: Counter[str] = Counter()
            predicates: Counter[tuple[str, Polarity]] = Counter()
            used = {subject}
            selections: list[RelationSelection] = []
            try:
                for polarity in _polarities(positive, negated):
                    pred, target = self._pick(
                        subject,
                        polarity=polarity,
                        used=used,
                        targets=targets,
                        predicates=predicates,
                        pool_size=pool_size,
                        novel_first=attempt > 0,
                    )
                    selections.append(RelationSelection(pred, target, polarity))
                    used.add(target)
                    targets[target] += 1
                    predicates[(pred, polarity)] += 1
            except _NoPair:
                continue
            prompt = relation_prompt(pid, self.category, subject, selections)
            if prompt.prompt in seen:
                continue
            self.subjects[subject] += 1
            self.targets.update(targets)
            self.predicates.update(predicates)
            self.clauses.update((subject, c.predicate, c.target, c.polarity) for c in selections)
            return prompt
        raise BuildError(f"{pid}: no new prompt after {_MAX_ATTEMPTS} attempts")


def category_rng(seed: int, category: Category, namespace: str = "negt2ibench") -> random.Random:
    """The random source of one category's draws: seeded by ``namespace``, ``seed`` and the category, so each
    category (and each split, through ``namespace``) draws the same prompts whatever else is built."""
    return random.Random(f"{namespace}:{seed}:{category.value}")


_State = _AttributeState | _RelationState


def category_state(
    category: Category,
    selector: PlausibilitySelector,
    rng: random.Random,
    *,
    target_pool: int = DEFAULT_TARGET_POOL,
    forbidden: frozenset[frozenset[str]] = frozenset(),
) -> _State:
    """The balancing state of one category: ``state.make(pid, positive, negated, seen)`` makes the next prompt
    (its text not in ``seen``) or raises ``BuildError``; ``forbidden``: object pairs no prompt may name together."""
    if category.is_attribute:
        plausible = selector.attribute_values(category, BENCHMARK_CLASSES)
        empty = [c for c in BENCHMARK_CLASSES if not plausible.get(c)]
        if empty:
            raise BuildError(f"{category}: the selector finds no plausible value for {', '.join(empty)}")
        return _AttributeState(category, {c: plausible[c] for c in BENCHMARK_CLASSES}, rng, forbidden=forbidden)
    if getattr(selector, "asks_per_pool", False):

        def ask(subject: str, pool: list[str]) -> tuple[Pair, ...]:
            return selector.relation_pairs(category, subject, pool)

        return _RelationState(category, {}, rng, target_pool, ask=ask, forbidden=forbidden)
    pairs = {s: selector.relation_pairs(category, s, BENCHMARK_CLASSES) for s in BENCHMARK_CLASSES}
    empty = [c for c in BENCHMARK_CLASSES if not pairs[c] and not any(t == c for v in pairs.values() for _, t in v)]
    if empty:
        raise BuildError(f"{category}: the selector finds no plausible relation for {', '.join(empty)}")
    return _RelationState(category, pairs, rng, target_pool, forbidden=forbidden)


def build_category(
    category: Category,
    selector: PlausibilitySelector,
    *,
    seed: int = 0,
    per_cell: int = PROMPTS_PER_CELL,
    target_pool: int = DEFAULT_TARGET_POOL,
) -> list[Prompt]:
    """The ``8 x per_cell`` prompts of one category, settings in the paper's order."""
    state = category_state(category, selector, category_rng(seed, category), target_pool=target_pool)
    seen: set[str] = set()
    prompts: list[Prompt] = []
    for positive, negated in SETTINGS:
        setting = setting_name(positive, negated)
        for index in range(per_cell):
            prompt = state.make(prompt_id(category, setting, index), positive, negated, seen)
            seen.add(prompt.prompt)
            prompts.append(prompt)
    return prompts


def build_corpus(
    selector: PlausibilitySelector,
    *,
    seed: int = 0,
    per_cell: int = PROMPTS_PER_CELL,
    categories: Sequence[Category] = CATEGORIES,
    target_pool: int = DEFAULT_TARGET_POOL,
) -> list[Prompt]:
    """The corpus: categories in vocab order, then settings, then index (see the module docstring)."""
    prompts: list[Prompt] = []
    for category in CATEGORIES:
        if category in categories:
            prompts.extend(build_category(category, selector, seed=seed, per_cell=per_cell, target_pool=target_pool))
    return prompts


def corpus_bytes(prompts: Sequence[Prompt]) -> bytes:
    """The JSONL bytes of a corpus (what ``write_corpus`` writes)."""
    return "".join(dumps_prompt(p) + "\n" for p in prompts).encode("utf-8")


def metadata_path(path: str | Path) -> Path:
    """Where the build metadata of a corpus file lives: ``X.jsonl`` -> ``X.meta.json``."""
    p = Path(path)
    return p.with_suffix(".meta.json")


def build_metadata(
    prompts: Sequence[Prompt],
    selector: PlausibilitySelector,
    *,
    seed: int,
    per_cell: int,
    categories: Sequence[Category],
    target_pool: int,
) -> dict[str, Any]:
    """What made a corpus: seed, selector (with its table or model), sizes and the file's SHA-256."""
    return {
        "format": FORMAT,
        "negt2i_version": __version__,
        "seed": seed,
        "per_cell": per_cell,
        "categories": [c.value for c in CATEGORIES if c in categories],
        "settings": list(SETTING_NAMES),
        "target_pool": target_pool,
        "selector": selector.describe(),
        "prompts": len(prompts),
        "sha256": hashlib.sha256(corpus_bytes(prompts)).hexdigest(),
    }


def write_corpus(path: str | Path, prompts: Sequence[Prompt], metadata: dict[str, Any] | None = None) -> Path:
    """Write the JSONL (atomically) and, if given, its metadata beside it; returns the JSONL path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(corpus_bytes(prompts))
    tmp.replace(target)
    if metadata is not None:
        metadata_path(target).write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")
    return target


__all__ = [
    "CATEGORIES",
    "FORMAT",
    "PROMPTS_PER_CELL",
    "SETTINGS",
    "SETTING_NAMES",
    "BuildError",
    "build_category",
    "build_corpus",
    "build_metadata",
    "category_rng",
    "corpus_bytes",
    "metadata_path",
    "prompt_id",
    "write_corpus",
]
