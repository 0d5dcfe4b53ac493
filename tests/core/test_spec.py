"""Prompt records: validation, GenEval compatibility, JSONL round trips and error messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from negt2i.core.spec import (
    AttributeStatement,
    Polarity,
    RelationStatement,
    SpecError,
    parse_prompt,
    read_prompts,
    write_prompts,
)
from negt2i.core.vocab import BENCHMARK_CLASSES, COCO_CLASSES, Category

RELATION = {
    "id": "directional-pos2_neg2-007",
    "tag": "directional",
    "category": "directional",
    "setting": "pos2_neg2",
    "prompt": "a photo of a laptop, a zebra, a backpack, a surfboard, and a carrot, where the laptop is right of the "
    "zebra, is right of the backpack, is not below the surfboard, and is not right of the carrot",
    "include": [{"class": c, "count": 1} for c in ("laptop", "zebra", "backpack", "surfboard", "carrot")],
    "statements": [
        {"kind": "relation", "subject": 0, "target": 1, "predicate": "right of", "polarity": "positive"},
        {"kind": "relation", "subject": 0, "target": 2, "predicate": "right of", "polarity": "positive"},
        {"kind": "relation", "subject": 0, "target": 3, "predicate": "below", "polarity": "negated"},
        {"kind": "relation", "subject": 0, "target": 4, "predicate": "right of", "polarity": "negated"},
    ],
}


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_vocabulary_sizes() -> None:
    assert len(COCO_CLASSES) == 80
    assert len(BENCHMARK_CLASSES) == 79 and "person" not in BENCHMARK_CLASSES
    assert "computer mouse" in BENCHMARK_CLASSES and "skis" in BENCHMARK_CLASSES


def test_relation_prompt_parses_with_setting_and_text() -> None:
    p = parse_prompt(RELATION)
    assert p.category is Category.DIRECTIONAL
    assert p.setting == "pos2_neg2" and (p.n_positive, p.n_negated) == (2, 2)
    assert p.describe(2) == "the laptop is not below the surfboard"
    assert isinstance(p.statements[0], RelationStatement)


def test_round_trip_is_exact(tmp_path: Path) -> None:
    attr = {
        "id": "material-pos1_neg1-000",
        "tag": "material",
        "category": "material",
        "setting": "pos1_neg1",
        "prompt": "a photo of a plastic bus and a non-plastic toilet",
        "include": [{"class": "bus", "count": 1}, {"class": "toilet", "count": 1}],
        "statements": [
            {"kind": "attribute", "object": 0, "value": "plastic", "polarity": "positive"},
            {"kind": "attribute", "object": 1, "value": "plastic", "polarity": "negated"},
        ],
        "source": "unit-test",
    }
    src = write_jsonl(tmp_path / "a.jsonl", [RELATION, attr])
    prompts = read_prompts(src)
    out = tmp_path / "b.jsonl"
    assert write_prompts(out, prompts) == 2
    again = read_prompts(out)
    assert again == prompts
    assert [json.loads(line) for line in out.read_text().splitlines()] == [RELATION, attr]
    assert prompts[1].extra == {"source": "unit-test"}  # unknown keys are kept, not dropped


def test_geneval_color_and_position_entries_become_positive_statements(tmp_path: Path) -> None:
    records = [
        {"tag": "color_attr", "include": [{"class": "cup", "count": 1, "color": "red"},
                                          {"class": "bench", "count": 1, "color": "blue"}],
         "prompt": "a photo of a red cup and a blue bench"},
        {"tag": "position", "include": [{"class": "bear", "count": 1},
                                        {"class": "bench", "count": 1, "position": ["left of", 0]}],
         "prompt": "a photo of a bench left of a bear"},
        {"tag": "counting", "include": [{"class": "cup", "count": 3}], "exclude": [{"class": "cup", "count": 4}],
         "prompt": "a photo of three cups"},
    ]  # fmt: skip
    colors, position, counting = read_prompts(write_jsonl(tmp_path / "g.jsonl", records))
    assert colors.id == "00000" and position.id == "00001" and counting.id == "00002"
    assert colors.category is Category.COLOR and colors.setting == "pos2_neg0"
    assert colors.statements[1] == AttributeStatement(object=1, value="blue", polarity=Polarity.POSITIVE)
    assert position.category is Category.DIRECTIONAL
    assert position.statements == (RelationStatement(subject=1, target=0, predicate="left of"),)
    assert position.describe(0) == "the bench is left of the bear"
    assert counting.category is None and counting.objects[0].count == 3
    # GenEval keys survive a write
    line = json.loads((tmp_path / "g.jsonl").read_text().splitlines()[0])
    assert {"tag", "prompt", "include"} <= set(line)


@pytest.mark.parametrize(
    ("mutate", "field", "message"),
    [
        (lambda r: r["include"][1].update({"class": "zebrafish"}), r"include\[1\]\.class", "unknown class 'zebrafish'"),
        (lambda r: r["statements"][0].update({"predicate": "near"}), r"statements\[0\]\.predicate",
         "unknown predicate 'near' for category directional"),
        (lambda r: r["statements"][1].update({"target": 9}), r"statements\[1\]\.target", "points at object 9"),
        (lambda r: r["include"][2].update({"count": 2}), r"include\[2\]\.count", "must have count 1"),
        (lambda r: r["include"][2].update({"count": 0}), r"include\[2\]\.count", "positive integer"),
        (lambda r: r.update({"setting": "pos1_neg3"}), "setting", "statements make it 'pos2_neg2'"),
        (lambda r: r["include"][3].update({"class": "laptop"}), r"include\[3\]\.class", "already named"),
        (lambda r: r["statements"][3].update({"target": 0}), r"statements\[3\]\.target", "must be different"),
        (lambda r: r["statements"][3].update({"target": 1}), r"statements\[3\]", "same statement is made twice"),
        (lambda r: r["statements"][0].update({"polarity": "maybe"}), r"statements\[0\]\.polarity", "positive"),
        (lambda r: r.update({"category": "texture"}), "category", "unknown category 'texture'"),
        (lambda r: r["statements"].append({"kind": "attribute", "object": 0, "value": "red"}),
         r"statements\[4\]\.kind", "attribute statement in a directional prompt"),
        (lambda r: r.pop("prompt"), "prompt", "missing required key"),
        (lambda r: r["include"][0].update({"colour": "red"}), r"include\[0\]", "unknown keys"),
    ],
)  # fmt: skip
def test_bad_metadata_names_line_and_field(tmp_path: Path, mutate: Any, field: str, message: str) -> None:
    bad = json.loads(json.dumps(RELATION))
    bad["id"] = "second"
    mutate(bad)
    src = write_jsonl(tmp_path / "bad.jsonl", [RELATION, bad])
    with pytest.raises(SpecError, match=rf"^line 2, field {field}: .*{message}") as info:
        read_prompts(src)
    assert info.value.line == 2


def test_duplicate_id_names_both_lines(tmp_path: Path) -> None:
    src = tmp_path / "dup.jsonl"
    src.write_text(json.dumps(RELATION) + "\n\n" + json.dumps(RELATION) + "\n")
    with pytest.raises(SpecError, match=r"line 3, field id: duplicate id .* \(first on line 1\)"):
        read_prompts(src)


def test_invalid_json_and_unsupported_exclude(tmp_path: Path) -> None:
    src = tmp_path / "x.jsonl"
    src.write_text('{"prompt": "a photo of a cup", "include": [{"class": "cup"}]}\n{"prompt": \n')
    with pytest.raises(SpecError, match=r"line 2: not valid JSON"):
        read_prompts(src)
    with pytest.raises(SpecError, match=r"field exclude\[0\]: only exclude entries that restate"):
        parse_prompt(
            {"prompt": "x", "include": [{"class": "cup"}], "exclude": [{"class": "dog", "count": 1}]}, default_id="1"
        )


def test_mixed_geneval_statements_are_rejected() -> None:
    with pytest.raises(SpecError, match="one category per prompt"):
        parse_prompt(
            {"prompt": "x", "include": [{"class": "cup", "color": "red"}, {"class": "dog", "position": ["above", 0]}]},
            default_id="1",
        )
