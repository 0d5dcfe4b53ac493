"""Benchmark metrics (Section 3.1, Appendix C.3, Section 5, Table 19) as a mergeable state.

Definitions, for a model's images I, each with correct(I) in {0, 1} (an error line
is an image that is never correct), and prompts p with images I(p):

- cell image accuracy, for category c and setting s with prompts P_cs:
  ``Acc(c, s) = sum_{p in P_cs} sum_{I in I(p)} correct(I) / sum_{p in P_cs} |I(p)|``;
- category accuracy: ``Acc(c) = mean_s Acc(c, s)`` over the settings present (the
  paper's "averaged over all eight settings");
- setting accuracy: ``Acc(s) = mean_c Acc(c, s)`` over the categories present (equal
  to the pooled image accuracy when cells are equally sized, as in the corpus);
- overall accuracy: ``Acc = mean_c Acc(c)``, the equal-weight mean of the categories;
- prompt accuracy: ``Acc_prompt(c, s) = |{p in P_cs : exists I in I(p), correct(I)}| / |P_cs|``,
  aggregated over settings, categories and overall by the same equal-weight means.

``BenchmarkState`` holds integer tallies only (per-prompt image / correct / error
counts, statement and row failure counters, dead-zone counters, provenance), so
``update`` on shards followed by ``merge`` gives exactly the state, and therefore
exactly the metrics, of ``update`` on the concatenated results (torchmetrics'
``update / merge_state / compute`` pattern). An image seen twice is an error.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from negt2i.core.failures import OTHER_KIND
from negt2i.metrics.records import CATEGORY_ORDER, CAUSES, ROW_CLASSES, SETTING_ORDER, ImageRow
from negt2i.metrics.views import GENEVAL_TASKS, geneval_tasks, polarity_imbalance, positive_vs_drop

RELATION_CATEGORIES: tuple[str, ...] = tuple(c.value for c in CATEGORY_ORDER if c.is_relation)


@dataclass(slots=True)
class PromptTally:
    """Per-prompt counts: images scored (errors included), correct images, error images."""

    category: str | None
    setting: str | None
    images: int = 0
    correct: int = 0
    errors: int = 0
    tag: str | None = None
    """GenEval's tag (``negt2i.metrics.views.GENEVAL_TASKS`` for GenEval's own prompts)."""


@dataclass(slots=True)
class Provenance:
    """Where numbers came from: results files, rule configs, stage models, evaluator versions (with line counts)."""

    files: Counter[str] = field(default_factory=Counter)
    configs: Counter[tuple[str, str]] = field(default_factory=Counter)
    models: Counter[tuple[str, str]] = field(default_factory=Counter)
    versions: Counter[str] = field(default_factory=Counter)

    def update(self, row: ImageRow) -> None:
        self.files[row.source] += 1
        if row.config_digest is not None:
            self.configs[(row.config_name or "?", row.config_digest)] += 1
        for stage_model in row.models:
            self.models[stage_model] += 1
        if row.evaluator_version is not None:
            self.versions[row.evaluator_version] += 1

    def merge(self, other: Provenance) -> None:
        self.files.update(other.files)
        self.configs.update(other.configs)
        self.models.update(other.models)
        self.versions.update(other.versions)

    def stage_models(self) -> dict[str, list[str]]:
        """Stage -> the distinct model identities seen, sorted."""
        out: dict[str, list[str]] = {}
        for stage, ident in sorted(self.models):
            out.setdefault(stage, []).append(ident)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "lines_per_file": dict(sorted(self.files.items())),
            "configs": [{"name": n, "digest": d, "lines": c} for (n, d), c in sorted(self.configs.items())],
            "models": [{"stage": s, "model": m, "lines": c} for (s, m), c in sorted(self.models.items())],
            "evaluator_versions": dict(sorted(self.versions.items())),
        }

    def warnings(self, label: str) -> list[str]:
        """Disagreements inside one model's results (mixed configs, model versions or evaluator versions)."""
        out: list[str] = []
        if len(self.configs) > 1:
            seen = ", ".join(f"{n} ({d}, {c} lines)" for (n, d), c in sorted(self.configs.items()))
            out.append(f"{label}: images were scored with different rule configs: {seen}")
        for stage, idents in self.stage_models().items():
            if len(idents) > 1:
                out.append(f"{label}: stage {stage} used different models: {', '.join(idents)}")
        if len(self.versions) > 1:
            out.append(f"{label}: different evaluator versions: {', '.join(sorted(self.versions))}")
        return out


@dataclass(slots=True)
class BenchmarkState:
    """Mergeable tallies of one model's results; ``compute()`` turns them into metrics."""

    prompts: dict[str, PromptTally] = field(default_factory=dict)
    seen: dict[str, str] = field(default_factory=dict)
    """Image key -> ``file:line`` where it was read (duplicates are an error)."""
    unplaced_errors: list[str] = field(default_factory=list)
    """``file:line`` of error lines without a prompt id (reported, not scored)."""
    errors: Counter[str] = field(default_factory=Counter)
    """Failure kind (``negt2i.core.failures.FailureKind``) -> number of error lines (never counted by message)."""
    failed_statements: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    """(category, setting, polarity, cause) -> failed statements."""
    statements: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """(category, setting, polarity) -> all statements of judged images."""
    row_failures: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """(category, setting, failure class) -> incorrect judged images."""
    negated_relations: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(category, total | evaluable | passed | dead_zone_passes) -> negated relation statements."""
    provenance: Provenance = field(default_factory=Provenance)

    def update(self, rows: Iterable[ImageRow]) -> None:
        """Add results rows (one per image)."""
        for row in rows:
            self._add(row)

    def _add(self, row: ImageRow) -> None:
        if row.key in self.seen:
            raise ValueError(f"image {row.key} appears twice: {self.seen[row.key]} and {row.where}")
        self.seen[row.key] = row.where
        self.provenance.update(row)
        if row.status == "error":
            self.errors[row.error_kind or OTHER_KIND] += 1
            if row.prompt_id is None:
                self.unplaced_errors.append(row.where)
                return
        assert row.prompt_id is not None  # ok lines always carry one (records.parse_line)
        tally = self.prompts.get(row.prompt_id)
        if tally is None:
            tally = self.prompts[row.prompt_id] = PromptTally(row.category, row.setting)
        _fill(tally, row)
        tally.images += 1
        tally.correct += int(row.correct)
        tally.errors += int(row.status == "error")
        if row.status == "error":
            return
        cat, setting = row.category or "-", row.setting or "-"
        for st in row.statements:
            self.statements[(cat, setting, st.polarity)] += 1
            if not st.passed and st.cause is not None:
                self.failed_statements[(cat, setting, st.polarity, st.cause)] += 1
            if st.polarity == "negated" and cat in RELATION_CATEGORIES:
                self.negated_relations[(cat, "total")] += 1
                if st.evaluated:
                    self.negated_relations[(cat, "evaluable")] += 1
                    if st.passed:
                        self.negated_relations[(cat, "passed")] += 1
                        if st.empty:
                            self.negated_relations[(cat, "dead_zone_passes")] += 1
        if not row.correct and row.failure_class is not None:
            self.row_failures[(cat, setting, row.failure_class)] += 1

    def merge(self, other: BenchmarkState) -> None:
        """Fold ``other`` (e.g. another shard of the same model) into this state, exactly."""
        both = self.seen.keys() & other.seen.keys()
        if both:
            key = min(both)
            raise ValueError(f"image {key} appears in two shards: {self.seen[key]} and {other.seen[key]}")
        self.seen.update(other.seen)
        for pid, t in other.prompts.items():
            mine = self.prompts.get(pid)
            if mine is None:
                self.prompts[pid] = PromptTally(t.category, t.setting, t.images, t.correct, t.errors, t.tag)
                continue
            for name in ("category", "setting", "tag"):
                a, b = getattr(mine, name), getattr(t, name)
                if a is not None and b is not None and a != b:
                    raise ValueError(f"prompt {pid} has {name} {a!r} in one shard and {b!r} in another")
                if a is None:
                    setattr(mine, name, b)
            mine.images += t.images
            mine.correct += t.correct
            mine.errors += t.errors
        self.unplaced_errors.extend(other.unplaced_errors)
        self.errors.update(other.errors)
        self.failed_statements.update(other.failed_statements)
        self.statements.update(other.statements)
        self.row_failures.update(other.row_failures)
        self.negated_relations.update(other.negated_relations)
        self.provenance.merge(other.provenance)

    @classmethod
    def from_rows(cls, rows: Iterable[ImageRow]) -> BenchmarkState:
        state = cls()
        state.update(rows)
        return state

    def cells(self) -> dict[tuple[str, str], list[str]]:
        """(category, setting) -> sorted prompt ids of scorable prompts (category and setting known)."""
        out: dict[tuple[str, str], list[str]] = {}
        for pid in sorted(self.prompts):
            t = self.prompts[pid]
            if t.category is not None and t.setting is not None:
                out.setdefault((t.category, t.setting), []).append(pid)
        return out

    def compute(self) -> dict[str, Any]:
        """Every metric of this state as a JSON-ready dict (see the module docstring for the formulas)."""
        cells = self.cells()
        arrays = {k: self.counts(pids) for k, pids in cells.items()}
        img = {k: _image_acc(c, n) for k, (c, n) in arrays.items()}
        prm = {k: _prompt_acc(c) for k, (c, n) in arrays.items()}
        accuracy = aggregate(img)
        prompt_accuracy = aggregate(prm)
        images = sum(t.images for t in self.prompts.values())
        return {
            "images": images + len(self.unplaced_errors),
            "scored_images": images,
            "correct_images": sum(t.correct for t in self.prompts.values()),
            "prompts": len(self.prompts),
            "images_per_prompt": dict(sorted(Counter(t.images for t in self.prompts.values()).items())),
            "errors": {
                "lines": sum(self.errors.values()),
                "unplaced": len(self.unplaced_errors),
                "kinds": dict(sorted(self.errors.items())),
            },
            "unscorable_prompts": sorted(
                pid
                for pid, t in self.prompts.items()
                if (t.category is None or t.setting is None) and t.tag not in GENEVAL_TASKS
            ),
            "cells": {
                f"{c}/{s}": {
                    "category": c,
                    "setting": s,
                    "prompts": len(cells[(c, s)]),
                    "images": int(arrays[(c, s)][1].sum()),
                    "correct": int(arrays[(c, s)][0].sum()),
                    "errors": sum(self.prompts[p].errors for p in cells[(c, s)]),
                    "image_accuracy": img[(c, s)],
                    "prompt_accuracy": prm[(c, s)],
                }
                for c, s in sorted(cells, key=cell_order)
            },
            "image_accuracy": accuracy,
            "prompt_accuracy": prompt_accuracy,
            "failures": self.failure_decomposition(),
            "row_failures": self.row_failure_classes(),
            "dead_zone": self.dead_zone_exposure(),
            "geneval": geneval_tasks(self),
            "polarity_imbalance": polarity_imbalance(self),
            "positive_vs_drop": positive_vs_drop(img),
        }

    def counts(self, pids: list[str]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Correct-image and image counts of ``pids``, as two int arrays in that order."""
        correct = np.array([self.prompts[p].correct for p in pids], dtype=np.int64)
        images = np.array([self.prompts[p].images for p in pids], dtype=np.int64)
        return correct, images

    def failure_decomposition(self) -> dict[str, Any]:
        """Figure 3: failed statements by cause per setting and per category (counts, shares), and by polarity."""

        def block(keep: dict[str, Counter[str]]) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for name, counter in keep.items():
                total = sum(counter.values())
                out[name] = {
                    "failed": total,
                    "counts": {c: counter[c] for c in CAUSES},
                    "shares": {c: (counter[c] / total if total else None) for c in CAUSES},
                }
            return out

        by_setting: dict[str, Counter[str]] = {}
        by_category: dict[str, Counter[str]] = {}
        by_setting_polarity: dict[str, Counter[str]] = {}
        overall: Counter[str] = Counter()
        for (cat, setting, polarity, cause), n in self.failed_statements.items():
            by_setting.setdefault(setting, Counter())[cause] += n
            by_category.setdefault(cat, Counter())[cause] += n
            by_setting_polarity.setdefault(f"{setting}/{polarity}", Counter())[cause] += n
            overall[cause] += n
        total_failed = sum(overall.values())
        statements_total = sum(self.statements.values())
        return {
            "overall": block({"all": overall})["all"],
            "by_setting": block(dict(sorted(by_setting.items(), key=lambda kv: setting_order(kv[0])))),
            "by_category": block(dict(sorted(by_category.items(), key=lambda kv: category_order(kv[0])))),
            "by_setting_polarity": block(dict(sorted(by_setting_polarity.items()))),
            "statements": statements_total,
            "failed_statements": total_failed,
            "negated_violation_share": overall["negated_violated"] / total_failed if total_failed else None,
        }

    def row_failure_classes(self) -> dict[str, Any]:
        """Appendix E.2: incorrect judged images by row-level failure class (counts, shares), plus error lines."""
        by_class: Counter[str] = Counter()
        by_setting: dict[str, Counter[str]] = {}
        by_category: dict[str, Counter[str]] = {}
        for (cat, setting, cls), n in self.row_failures.items():
            by_class[cls] += n
            by_setting.setdefault(setting, Counter())[cls] += n
            by_category.setdefault(cat, Counter())[cls] += n
        total = sum(by_class.values())

        def shares(c: Counter[str]) -> dict[str, Any]:
            t = sum(c.values())
            return {
                "incorrect": t,
                "counts": {k: c[k] for k in ROW_CLASSES},
                "shares": {k: (c[k] / t if t else None) for k in ROW_CLASSES},
            }

        return {
            "overall": shares(by_class),
            "by_setting": {k: shares(v) for k, v in sorted(by_setting.items(), key=lambda kv: setting_order(kv[0]))},
            "by_category": {k: shares(v) for k, v in sorted(by_category.items(), key=lambda kv: category_order(kv[0]))},
            "incorrect_judged": total,
            "error_lines": sum(self.errors.values()),
        }

    def dead_zone_exposure(self) -> dict[str, Any]:
        """Table 19: dead-zone passes among passed, evaluable negated relation statements, per category.

        share = dead_zone_passes / passed; ``of_all`` = dead_zone_passes / total negated relation statements.
        """
        rows: dict[str, Any] = {}
        sums: Counter[str] = Counter()
        for cat in RELATION_CATEGORIES:
            vals = {k: self.negated_relations[(cat, k)] for k in ("total", "evaluable", "passed", "dead_zone_passes")}
            if not vals["total"]:
                continue
            sums.update(vals)
            rows[cat] = _dz(vals)
        rows["total"] = _dz({k: sums[k] for k in ("total", "evaluable", "passed", "dead_zone_passes")})
        return rows


def _dz(vals: dict[str, int]) -> dict[str, Any]:
    return {
        **vals,
        "unevaluable": vals["total"] - vals["evaluable"],
        "share_of_passes": vals["dead_zone_passes"] / vals["passed"] if vals["passed"] else None,
        "share_of_all": vals["dead_zone_passes"] / vals["total"] if vals["total"] else None,
    }


def _fill(tally: PromptTally, row: ImageRow) -> None:
    for name in ("category", "setting", "tag"):
        have, got = getattr(tally, name), getattr(row, name)
        if got is None:
            continue
        if have is None:
            setattr(tally, name, got)
        elif have != got:
            raise ValueError(f"{row.where}: prompt {row.prompt_id} has {name} {got!r}, earlier lines say {have!r}")


def _image_acc(correct: NDArray[np.int64], images: NDArray[np.int64]) -> float:
    return float(correct.sum() / images.sum())


def _prompt_acc(correct: NDArray[np.int64]) -> float:
    return float(np.mean(correct > 0))


def category_order(cat: str) -> tuple[int, str]:
    """Sort key: Table 3's category order, unknown names last."""
    values = [c.value for c in CATEGORY_ORDER]
    return (values.index(cat), cat) if cat in values else (len(values), cat)


def setting_order(setting: str) -> tuple[int, str]:
    """Sort key: Table 3's setting order (by load), unknown names last."""
    return (SETTING_ORDER.index(setting), setting) if setting in SETTING_ORDER else (len(SETTING_ORDER), setting)


def cell_order(cell: tuple[str, str]) -> tuple[tuple[int, str], tuple[int, str]]:
    """Sort key of (category, setting) cells."""
    return (category_order(cell[0]), setting_order(cell[1]))


def aggregate(cell_values: dict[tuple[str, str], Any]) -> dict[str, Any]:
    """Table 3's aggregates of per-cell values (floats, or arrays of bootstrap replicates).

    ``by_category[c] = mean_s v(c, s)``, ``by_setting[s] = mean_c v(c, s)``, ``overall = mean_c by_category[c]``
    (each mean over the cells present); ``by_load[L]`` is the mean of the settings of load L.
    """
    cats = sorted({c for c, _ in cell_values}, key=category_order)
    settings = sorted({s for _, s in cell_values}, key=setting_order)
    by_category = {c: _mean([v for (cc, _), v in cell_values.items() if cc == c]) for c in cats}
    by_setting = {s: _mean([v for (_, ss), v in cell_values.items() if ss == s]) for s in settings}
    overall = _mean(list(by_category.values())) if by_category else None
    return {
        "overall": overall,
        "by_category": by_category,
        "by_setting": by_setting,
        "by_cell": {f"{c}/{s}": cell_values[(c, s)] for c, s in sorted(cell_values, key=cell_order)},
    }


def _mean(values: list[Any]) -> Any:
    if not values:
        return None
    if isinstance(values[0], np.ndarray):
        return np.mean(np.stack(values), axis=0)
    return float(sum(values) / len(values))


def expected_cells() -> list[tuple[str, str]]:
    """The corpus design: every category x setting cell (48)."""
    return [(c.value, s) for c in CATEGORY_ORDER for s in SETTING_ORDER]


def missing_cells(state: BenchmarkState) -> list[str]:
    """Cells of the corpus design that have no scorable prompt in ``state``."""
    have = set(state.cells())
    return [f"{c}/{s}" for c, s in expected_cells() if (c, s) not in have]


__all__ = [
    "RELATION_CATEGORIES",
    "BenchmarkState",
    "PromptTally",
    "Provenance",
    "aggregate",
    "category_order",
    "cell_order",
    "expected_cells",
    "missing_cells",
    "setting_order",
]
