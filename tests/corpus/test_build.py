"""The built corpus: sizes, coverage, topology, balance, plausibility, determinism, the committed file."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from negt2i.cli import corpus_cmd
from negt2i.core.spec import AttributeStatement, Polarity, Prompt, RelationStatement, read_prompts
from negt2i.core.vocab import BENCHMARK_CLASSES, Category
from negt2i.corpus import plausibility
from negt2i.corpus.build import (
    SETTING_NAMES,
    BuildError,
    build_corpus,
    build_metadata,
    corpus_bytes,
    metadata_path,
    write_corpus,
)
from negt2i.corpus.selectors import Pair, TableSelector
from negt2i.corpus.stats import corpus_stats

from .conftest import COMMITTED, REPO


def test_sizes_and_cells(built: list[Prompt]) -> None:
    assert len(built) == 4800
    cells = Counter((p.category, p.setting) for p in built)
    assert set(cells) == {(c, s) for c in Category for s in SETTING_NAMES}
    assert set(cells.values()) == {100}
    assert len({p.id for p in built}) == 4800
    assert built[0].id == "color-pos1_neg0-000"
    assert built[-1].id == "depth-pos2_neg2-099"
    assert all(p.id.startswith(f"{p.category}-{p.setting}-") for p in built if p.category)


def test_every_class_in_every_category_and_never_person(built: list[Prompt]) -> None:
    for category in Category:
        used = {o.class_name for p in built if p.category is category for o in p.objects}
        assert used == set(BENCHMARK_CLASSES), category
    assert all(o.class_name != "person" for p in built for o in p.objects)


def test_topology_and_no_class_twice(built: list[Prompt]) -> None:
    for p in built:
        assert p.category is not None
        names = [o.class_name for o in p.objects]
        assert len(set(names)) == len(names), p.id
        assert all(o.count == 1 for o in p.objects)
        m = len(p.statements)
        if p.category.is_attribute:
            assert len(names) == m
            assert [s.object for s in p.statements if isinstance(s, AttributeStatement)] == list(range(m))
            assert len({s.value for s in p.statements if isinstance(s, AttributeStatement)}) == 1  # one value
        else:
            assert len(names) == m + 1
            rels = [s for s in p.statements if isinstance(s, RelationStatement)]
            assert [(s.subject, s.target) for s in rels] == [(0, i) for i in range(1, m + 1)]
        pols = [s.polarity for s in p.statements]
        assert pols == sorted(pols, key=lambda x: x is Polarity.NEGATED)  # positives first


def test_same_load_same_object_count(built: list[Prompt]) -> None:
    by_load: dict[tuple[Category | None, int], set[int]] = {}
    for p in built:
        by_load.setdefault((p.category, len(p.statements)), set()).add(len(p.objects))
    for (category, load), counts in by_load.items():
        assert category is not None
        assert counts == {load if category.is_attribute else load + 1}, (category, load)


def test_statement_and_object_means_match_the_paper(built: list[Prompt]) -> None:
    stats = corpus_stats(built)
    assert stats.mean(None, "statements") == pytest.approx(2.25)
    assert stats.mean(True, "objects") == pytest.approx(2.25)
    assert stats.mean(False, "objects") == pytest.approx(3.25)
    assert sum(p.n_negated for p in built) == sum(p.n_positive for p in built)


def test_balance_close_to_most_even(built: list[Prompt]) -> None:
    for c in corpus_stats(built).categories:
        assert c.objects.max - c.objects.min <= 2, c.category
        assert c.objects.off_even <= 20, c.category  # of 1,800 or 2,600 draws
        if c.subjects is not None and c.targets is not None:
            assert c.subjects.max - c.subjects.min <= 2
            assert c.targets.max - c.targets.min <= 2
        totals = [p + n for p, n in c.balance.values()]
        assert max(totals) - min(totals) <= 0.1 * max(totals), c.category


def test_every_statement_is_plausible_per_the_table(built: list[Prompt]) -> None:
    for p in built:
        assert p.category is not None
        for st in p.statements:
            if isinstance(st, AttributeStatement):
                obj = p.objects[st.object].class_name
                assert st.value in plausibility.attribute_values(p.category, obj), (p.id, obj, st.value)
            else:
                subject, target = p.objects[st.subject].class_name, p.objects[st.target].class_name
                assert plausibility.relation_plausible(st.predicate, subject, target), p.id


def test_no_duplicate_prompt_text(built: list[Prompt]) -> None:
    assert len({p.prompt for p in built}) == len(built)


def test_same_seed_is_byte_identical_and_seed_matters(built: list[Prompt]) -> None:
    again = build_corpus(TableSelector(), seed=0, categories=(Category.COLOR, Category.COMPARATIVE))
    assert corpus_bytes(again) == corpus_bytes([p for p in built if p.category in {p.category for p in again}])
    other = build_corpus(TableSelector(), seed=1, categories=(Category.COLOR,), per_cell=20)
    same_shape = build_corpus(TableSelector(), seed=0, categories=(Category.COLOR,), per_cell=20)
    assert corpus_bytes(other) != corpus_bytes(same_shape)


def test_committed_corpus_is_the_default_build(built: list[Prompt]) -> None:
    """data/negt2ibench.jsonl must be rebuilt whenever the table, templates or builder change."""
    assert COMMITTED.read_bytes() == corpus_bytes(built), "rebuild: negt2i corpus build --out data/negt2ibench.jsonl"
    meta = build_metadata(built, TableSelector(), seed=0, per_cell=100, categories=tuple(Category), target_pool=8)
    committed = json.loads(metadata_path(COMMITTED).read_text())
    committed.pop("negt2i_version")  # a release bump alone does not require a rebuild
    meta.pop("negt2i_version")
    assert committed == meta


SUBPROCESS_BUILD = """
import sys
from negt2i.corpus.build import build_corpus, corpus_bytes
from negt2i.corpus.selectors import TableSelector
from negt2i.core.vocab import Category
prompts = build_corpus(TableSelector(), seed=0, categories=(Category.MATERIAL, Category.COMPARATIVE))
sys.stdout.buffer.write(corpus_bytes(prompts))
"""


def test_build_in_another_process_is_byte_identical(built: list[Prompt]) -> None:
    """A fresh interpreter with another hash seed writes the same bytes (no set-order dependence)."""
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", SUBPROCESS_BUILD], check=True, cwd=REPO, env=env, capture_output=True
    ).stdout
    expected = [p for p in built if p.category in (Category.MATERIAL, Category.COMPARATIVE)]
    assert out == corpus_bytes(expected)


class RestrictedSelector(TableSelector):
    """Allows only a few combinations, to show the builder never leaves the selector's answers."""

    @property
    def name(self) -> str:
        return "restricted"

    def attribute_values(self, category: Category, objects: Sequence[str]) -> dict[str, tuple[str, ...]]:
        return {o: ("red",) if i % 2 else ("blue", "white") for i, o in enumerate(objects)}

    def relation_pairs(self, category: Category, subject: str, candidates: Sequence[str]) -> tuple[Pair, ...]:
        i = BENCHMARK_CLASSES.index(subject)
        picks = [BENCHMARK_CLASSES[(i + k) % len(BENCHMARK_CLASSES)] for k in (1, 2, 3, 4, 5)]
        return tuple(("near", t) for t in picks if t in candidates)


def test_builder_uses_only_what_the_selector_allows() -> None:
    prompts = build_corpus(RestrictedSelector(), seed=3, categories=(Category.COLOR, Category.PROXIMITY))
    for p in prompts:
        for st in p.statements:
            if isinstance(st, AttributeStatement):
                i = BENCHMARK_CLASSES.index(p.objects[st.object].class_name)
                assert st.value in (("red",) if i % 2 else ("blue", "white"))
            else:
                assert st.predicate == "near"
                s = BENCHMARK_CLASSES.index(p.objects[st.subject].class_name)
                t = BENCHMARK_CLASSES.index(p.objects[st.target].class_name)
                assert (t - s) % len(BENCHMARK_CLASSES) in {1, 2, 3, 4, 5}
    values = Counter(st.value for p in prompts for st in p.statements if isinstance(st, AttributeStatement))
    assert set(values) == {"red", "blue", "white"}


class EmptyForCat(TableSelector):
    def attribute_values(self, category: Category, objects: Sequence[str]) -> dict[str, tuple[str, ...]]:
        answer = super().attribute_values(category, objects)
        answer["cat"] = ()
        return answer


def test_a_class_without_plausible_values_fails_the_build() -> None:
    with pytest.raises(BuildError, match="no plausible value for cat"):
        build_corpus(EmptyForCat(), categories=(Category.COLOR,), per_cell=2)


def test_write_corpus_writes_jsonl_and_metadata(tmp_path: Path) -> None:
    prompts = build_corpus(TableSelector(), categories=(Category.DEPTH,), per_cell=3)
    meta = build_metadata(prompts, TableSelector(), seed=0, per_cell=3, categories=(Category.DEPTH,), target_pool=8)
    out = write_corpus(tmp_path / "sub" / "d.jsonl", prompts, meta)
    assert read_prompts(out) == prompts
    assert (tmp_path / "sub" / "d.meta.json").exists()
    assert meta["categories"] == ["depth"] and meta["prompts"] == 24
    assert meta["selector"]["name"] == "table" and len(meta["selector"]["table_sha256"]) == 64


def test_cli_build_table_and_argument_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    corpus_cmd.register(parser.add_subparsers())
    out = tmp_path / "p.jsonl"
    args = parser.parse_args(["corpus", "build", "--out", str(out), "--categories", "proximity", "--per-cell", "4"])
    assert args.func(args) == 0
    assert [p.id for p in read_prompts(out)][:2] == ["proximity-pos1_neg0-000", "proximity-pos1_neg0-001"]
    assert "wrote 32 prompts" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        parser.parse_args(["corpus", "build", "--out", str(out), "--per-cell", "0"])
    args = parser.parse_args(["corpus", "build", "--out", str(out), "--categories", "color,shape"])
    with pytest.raises(SystemExit, match="unknown category in 'color,shape'"):
        args.func(args)
