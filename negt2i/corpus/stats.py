"""Per-category corpus statistics (paper, Appendix A.2, Figures 5 and 6).

For each category: prompts per setting, object coverage (of the 79 classes),
occurrence counts against the most even allocation reachable for the same
number of draws (and, for relations, subjects and targets separately), value or
predicate balance by polarity, and statements and objects per prompt. The paper
reports 2.25 statements per prompt, 2.25 objects for attribute prompts and 3.25
for relation prompts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from negt2i.core.spec import AttributeStatement, Polarity, Prompt, RelationStatement
from negt2i.core.vocab import BENCHMARK_CLASSES, PREDICATES, VALUES, Category
from negt2i.corpus.balancing import most_even, off_even
from negt2i.corpus.build import CATEGORIES, SETTING_NAMES


@dataclass(frozen=True)
class Allocation:
    """Occurrence counts over the 79 classes, compared with the most even allocation."""

    counts: dict[str, int]

    @property
    def draws(self) -> int:
        return sum(self.counts.values())

    @property
    def used(self) -> int:
        return sum(1 for c in BENCHMARK_CLASSES if self.counts.get(c, 0) > 0)

    @property
    def missing(self) -> list[str]:
        return [c for c in BENCHMARK_CLASSES if self.counts.get(c, 0) == 0]

    @property
    def min(self) -> int:
        return min(self.counts.get(c, 0) for c in BENCHMARK_CLASSES)

    @property
    def max(self) -> int:
        return max(self.counts.get(c, 0) for c in BENCHMARK_CLASSES)

    @property
    def even_range(self) -> tuple[int, int]:
        even = most_even(self.draws, len(BENCHMARK_CLASSES))
        return even[-1], even[0]

    @property
    def off_even(self) -> int:
        """Draws that would have to move to reach the most even allocation (0 = most even)."""
        return off_even([self.counts.get(c, 0) for c in BENCHMARK_CLASSES], len(BENCHMARK_CLASSES))

    def to_json(self) -> dict[str, Any]:
        lo, hi = self.even_range
        return {
            "draws": self.draws,
            "classes_used": self.used,
            "missing": self.missing,
            "min": self.min,
            "max": self.max,
            "most_even": [lo, hi],
            "off_even": self.off_even,
            "counts": {c: self.counts.get(c, 0) for c in BENCHMARK_CLASSES},
        }


@dataclass(frozen=True)
class CategoryStats:
    """Everything ``negt2i corpus stats`` prints for one category."""

    category: Category
    per_setting: dict[str, int]
    objects: Allocation
    subjects: Allocation | None
    targets: Allocation | None
    balance: dict[str, tuple[int, int]]
    """Value or predicate -> (positive, negated) statement counts, in vocabulary order."""
    statements: int
    object_mentions: int

    @property
    def prompts(self) -> int:
        return sum(self.per_setting.values())

    @property
    def statements_per_prompt(self) -> float:
        return self.statements / self.prompts if self.prompts else 0.0

    @property
    def objects_per_prompt(self) -> float:
        return self.object_mentions / self.prompts if self.prompts else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "category": self.category.value,
            "prompts": self.prompts,
            "per_setting": self.per_setting,
            "objects": self.objects.to_json(),
            "subjects": self.subjects.to_json() if self.subjects else None,
            "targets": self.targets.to_json() if self.targets else None,
            "balance": {k: {"positive": p, "negated": n} for k, (p, n) in self.balance.items()},
            "statements_per_prompt": round(self.statements_per_prompt, 4),
            "objects_per_prompt": round(self.objects_per_prompt, 4),
        }


def category_stats(category: Category, prompts: Iterable[Prompt]) -> CategoryStats:
    """Statistics of the prompts of one category (others are ignored)."""
    mine = [p for p in prompts if p.category is category]
    per_setting = dict.fromkeys(SETTING_NAMES, 0)
    objects: Counter[str] = Counter()
    subjects: Counter[str] = Counter()
    targets: Counter[str] = Counter()
    vocabulary = VALUES[category] if category.is_attribute else PREDICATES[category]
    pos: Counter[str] = Counter()
    neg: Counter[str] = Counter()
    statements = mentions = 0
    for p in mine:
        per_setting[p.setting] = per_setting.get(p.setting, 0) + 1
        objects.update(o.class_name for o in p.objects)
        mentions += len(p.objects)
        statements += len(p.statements)
        for st in p.statements:
            name = st.value if isinstance(st, AttributeStatement) else st.predicate
            (pos if st.polarity is Polarity.POSITIVE else neg)[name] += 1
            if isinstance(st, RelationStatement):
                targets[p.objects[st.target].class_name] += 1
        if category.is_relation and p.statements and isinstance(p.statements[0], RelationStatement):
            subjects[p.objects[p.statements[0].subject].class_name] += 1
    names = [*vocabulary, *sorted(set(pos) | set(neg) - set(vocabulary))]
    return CategoryStats(
        category=category,
        per_setting=per_setting,
        objects=Allocation(dict(objects)),
        subjects=Allocation(dict(subjects)) if category.is_relation else None,
        targets=Allocation(dict(targets)) if category.is_relation else None,
        balance={n: (pos[n], neg[n]) for n in names},
        statements=statements,
        object_mentions=mentions,
    )


@dataclass(frozen=True)
class CorpusStats:
    """Statistics of a whole corpus."""

    categories: tuple[CategoryStats, ...]

    @property
    def prompts(self) -> int:
        return sum(c.prompts for c in self.categories)

    def mean(self, attribute: bool | None, what: str) -> float:
        """Mean ``statements`` or ``objects`` per prompt over attribute / relation / all categories."""
        chosen = [c for c in self.categories if attribute is None or c.category.is_attribute is attribute]
        n = sum(c.prompts for c in chosen)
        total = sum(c.statements if what == "statements" else c.object_mentions for c in chosen)
        return total / n if n else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "prompts": self.prompts,
            "statements_per_prompt": round(self.mean(None, "statements"), 4),
            "objects_per_prompt": {
                "attribute": round(self.mean(True, "objects"), 4),
                "relation": round(self.mean(False, "objects"), 4),
            },
            "categories": [c.to_json() for c in self.categories],
        }


def corpus_stats(prompts: Sequence[Prompt]) -> CorpusStats:
    """Statistics per category, for the categories present, in vocabulary order."""
    present = {p.category for p in prompts}
    return CorpusStats(tuple(category_stats(c, prompts) for c in CATEGORIES if c in present))


def _allocation_line(label: str, a: Allocation) -> str:
    lo, hi = a.even_range
    missing = f" (missing: {', '.join(a.missing)})" if a.missing else ""
    return (
        f"  {label:<12} {a.used}/{len(BENCHMARK_CLASSES)} classes{missing}; {a.draws} draws; "
        f"counts {a.min}..{a.max}, most even {lo}..{hi}; {a.off_even} draws off most-even"
    )


def format_stats(stats: CorpusStats, title: str = "") -> str:
    """The text ``negt2i corpus stats`` prints."""
    lines = [
        f"{title + ': ' if title else ''}{stats.prompts} prompts in {len(stats.categories)} categories",
        f"statements per prompt {stats.mean(None, 'statements'):.2f}; objects per prompt: "
        f"attribute {stats.mean(True, 'objects'):.2f}, relation {stats.mean(False, 'objects'):.2f}",
    ]
    for c in stats.categories:
        lines.append("")
        lines.append(
            f"{c.category.value} ({c.prompts} prompts; {c.statements_per_prompt:.2f} statements, "
            f"{c.objects_per_prompt:.2f} objects per prompt)"
        )
        lines.append("  per setting  " + "  ".join(f"{s} {n}" for s, n in c.per_setting.items()))
        lines.append(_allocation_line("objects", c.objects))
        if c.subjects is not None and c.targets is not None:
            lines.append(_allocation_line("subjects", c.subjects))
            lines.append(_allocation_line("targets", c.targets))
        label = "values" if c.category.is_attribute else "predicates"
        lines.append(f"  {label:<12} " + "  ".join(f"{n} {p}+/{q}-" for n, (p, q) in c.balance.items()))
    return "\n".join(lines)


__all__ = ["Allocation", "CategoryStats", "CorpusStats", "category_stats", "corpus_stats", "format_stats"]
