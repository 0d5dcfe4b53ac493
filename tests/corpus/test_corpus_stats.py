"""``corpus stats``: most-even reference, per-category numbers, text and JSON output."""

from __future__ import annotations

import argparse
import json
import random

import pytest

from negt2i.cli import corpus_cmd
from negt2i.core.spec import Prompt
from negt2i.core.vocab import BENCHMARK_CLASSES, Category
from negt2i.corpus.balancing import least_used, most_even, off_even
from negt2i.corpus.stats import Allocation, category_stats

from .conftest import COMMITTED


@pytest.mark.parametrize(
    ("draws", "n", "expected"),
    [(10, 4, [3, 3, 2, 2]), (8, 4, [2, 2, 2, 2]), (1800, 79, [23] * 62 + [22] * 17), (0, 3, [0, 0, 0])],
)
def test_most_even(draws: int, n: int, expected: list[int]) -> None:
    assert most_even(draws, n) == expected
    assert sum(expected) == draws


@pytest.mark.parametrize(
    ("counts", "n", "off"),
    [([3, 3, 2, 2], 4, 0), ([4, 2, 2, 2], 4, 1), ([10], 4, 7), ([5, 5], 4, 4), ([], 2, 0)],
)
def test_off_even(counts: list[int], n: int, off: int) -> None:
    assert off_even(counts, n) == off


def test_least_used_refuses_sets_and_breaks_ties_by_seed() -> None:
    with pytest.raises(TypeError, match="not a set"):
        least_used({"a", "b"}, lambda x: (0,), random.Random(0))  # type: ignore[arg-type]
    picks = {least_used(["a", "b", "c"], lambda x: (0,), random.Random(s))[0] for s in range(30)}
    assert picks == {"a", "b", "c"}  # ties are not resolved by list order
    assert least_used(["a", "b", "c"], lambda x: (x != "c",), random.Random(0)) == ["c"]


def test_allocation_reports_missing_classes() -> None:
    a = Allocation({"cat": 3, "dog": 1})
    assert a.draws == 4 and a.used == 2 and a.min == 0 and a.max == 3
    assert len(a.missing) == len(BENCHMARK_CLASSES) - 2
    assert a.even_range == (0, 1) and a.off_even == 2


def test_category_stats_of_the_default_build(built: list[Prompt]) -> None:
    color = category_stats(Category.COLOR, built)
    assert color.prompts == 800 and set(color.per_setting.values()) == {100}
    assert color.objects.draws == 1800 and color.objects.used == 79
    assert color.subjects is None
    assert color.statements_per_prompt == pytest.approx(2.25)
    assert sum(p + n for p, n in color.balance.values()) == 1800
    depth = category_stats(Category.DEPTH, built)
    assert depth.objects.draws == 2600 and depth.objects_per_prompt == pytest.approx(3.25)
    assert depth.subjects is not None and depth.subjects.draws == 800
    assert depth.targets is not None and depth.targets.draws == 1800
    assert list(depth.balance) == ["in front of", "behind"]


def test_cli_stats_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    corpus_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["corpus", "stats", str(COMMITTED)])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "4800 prompts in 6 categories" in text
    assert "statements per prompt 2.25; objects per prompt: attribute 2.25, relation 3.25" in text
    assert text.count("79/79 classes") == 2 + 4 * 3  # objects per category, plus subjects and targets
    args = parser.parse_args(["corpus", "stats", str(COMMITTED), "--json"])
    assert args.func(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["prompts"] == 4800
    assert data["objects_per_prompt"] == {"attribute": 2.25, "relation": 3.25}
    assert [c["category"] for c in data["categories"]] == [c.value for c in Category]
