"""The training split: disjoint from the committed benchmark (on 10,000 prompts), the same record format,
deterministic, described by ``corpus stats``, and refusing what makes no sense."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from itertools import combinations
from pathlib import Path

import pytest

from negt2i.cli import main
from negt2i.core.spec import Prompt, read_prompts
from negt2i.core.vocab import SETTING_NAMES, Category
from negt2i.corpus.build import metadata_path
from negt2i.corpus.selectors import TableSelector
from negt2i.corpus.split import build_train
from negt2i.wire import adapter

REPO = Path(__file__).resolve().parents[2]
BENCHMARK = REPO / "data" / "negt2ibench.jsonl"


def _pairs(p: Prompt) -> set[tuple[str, frozenset[str]]]:
    """Written here, not imported: the objects a relation statement links; every two objects of an attribute
    prompt (the rule docs/corpus.md states), keyed by category."""
    record = p.to_json()
    names = [o["class"] for o in record["include"]]
    cat = str(record["category"])
    if record["category"] in ("color", "material"):
        return {(cat, frozenset(pair)) for pair in combinations(names, 2)}
    return {(cat, frozenset((names[s["subject"]], names[s["target"]]))) for s in record["statements"]}


@pytest.fixture(scope="module")
def benchmark() -> list[Prompt]:
    return read_prompts(BENCHMARK)


def test_a_10000_prompt_training_split_is_disjoint_from_the_benchmark(
    benchmark: list[Prompt], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "train.jsonl"
    assert main(["corpus", "build", "--split", "train", "--size", "10000", "--seed", "3", "--out", str(out)]) == 0
    assert "wrote 10000 training prompts" in capsys.readouterr().out
    train = read_prompts(out)  # the benchmark's record format, parsed by the same reader
    assert len(train) == 10000 and len({p.id for p in train}) == 10000
    assert all(p.id.startswith("train-") for p in train) and not {p.id for p in train} & {p.id for p in benchmark}
    assert not {p.prompt for p in train} & {p.prompt for p in benchmark}
    bench_pairs = set().union(*(_pairs(p) for p in benchmark))
    assert not any(_pairs(p) & bench_pairs for p in train)
    assert len({p.prompt for p in train}) == 10000  # no duplicate inside the split either
    cells = Counter((p.category, p.setting) for p in train)
    assert {c for c, _ in cells} == set(Category) and {s for _, s in cells} == set(SETTING_NAMES)
    per_category = Counter(p.category for p in train)  # 10000 = 48 x 208 + 16: the first 16 cells take 209
    assert per_category == {c: 8 * 209 if c in (Category.COLOR, Category.MATERIAL) else 8 * 208 for c in Category}
    for p in train[::500]:  # inline metadata the orchestrator judges: the wire round trip is exact
        assert adapter.prompt_from_proto(adapter.prompt_to_proto(p)) == p
    meta = json.loads(metadata_path(out).read_text())
    assert meta["split"] == "train" and meta["size"] == 10000 and meta["seed"] == 3
    assert meta["disjoint_from"]["sha256"] == hashlib.sha256(BENCHMARK.read_bytes()).hexdigest()
    assert meta["disjoint_from"]["overlap"] == {"identical_prompts": 0, "shared_object_pairs": 0}
    assert meta["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()

    assert main(["corpus", "stats", str(out), "--against", str(BENCHMARK)]) == 0
    text = capsys.readouterr().out
    assert "10000 prompts in 6 categories" in text
    assert "training split; against" in text and "0 identical prompts, 0 sharing an object pair" in text
    assert main(["corpus", "stats", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["prompts"] == 10000 and stats["split"] == "train"
    assert stats["overlap"]["identical_prompts"] == stats["overlap"]["shared_object_pairs"] == 0


def test_same_seed_same_bytes_and_a_full_cell_spills_within_its_category(benchmark: list[Prompt]) -> None:
    sel = TableSelector()
    a = build_train(sel, benchmark, size=96, seed=5, categories=(Category.MATERIAL, Category.DEPTH))
    b = build_train(sel, benchmark, size=96, seed=5, categories=(Category.MATERIAL, Category.DEPTH))
    assert [p.to_json() for p in a] == [p.to_json() for p in b]
    assert [p.prompt for p in build_train(sel, benchmark, size=96, seed=6, categories=(Category.DEPTH,))] != [
        p.prompt for p in a if p.category is Category.DEPTH
    ]
    # material with one statement has 231 plausible texts, 100 in the benchmark: 200 per cell cannot be met
    big = build_train(sel, benchmark, size=1600, seed=0, categories=(Category.MATERIAL,))
    cells = Counter(p.setting for p in big)
    assert len(big) == 1600 and cells["pos1_neg0"] < 200 and cells["pos0_neg1"] < 200
    assert cells["pos2_neg2"] > 200  # the shortfall went to the category's other settings


def test_shared_pairs_can_be_allowed_texts_never(benchmark: list[Prompt], tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    argv = ["corpus", "build", "--split", "train", "--size", "48", "--allow-shared-pairs", "--out", str(out)]
    assert main(argv) == 0
    meta = json.loads(metadata_path(out).read_text())
    assert meta["disjoint_from"]["rules"] == ["identical_prompts"]
    assert not {p.prompt for p in read_prompts(out)} & {p.prompt for p in benchmark}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--split", "train"], "--split train needs --size N"),
        (["--size", "10"], "--size and --allow-shared-pairs are for --split train"),
        (["--split", "train", "--size", "10", "--per-cell", "3"], "--per-cell is for the test split"),
        (["--split", "train", "--size", "10", "--benchmark", "nowhere.jsonl"], "--benchmark"),
    ],
)
def test_bad_arguments_are_refused(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["corpus", "build", "--out", str(tmp_path / "o.jsonl"), *argv]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_a_split_never_overwrites_its_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = tmp_path / "bench.jsonl"
    bench.write_bytes(BENCHMARK.read_bytes())
    argv = ["corpus", "build", "--split", "train", "--size", "10", "--benchmark", str(bench), "--out", str(bench)]
    assert main(argv) == 2
    assert "is the benchmark the split must be disjoint from" in capsys.readouterr().err
    assert bench.read_bytes() == BENCHMARK.read_bytes()
