"""``corpus validate``: every broken invariant is reported with its line, nothing stops at the first."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from negt2i.cli import corpus_cmd
from negt2i.corpus.validate import Violation, validate_file

from .conftest import COMMITTED


def _records() -> list[dict[str, Any]]:
    return [json.loads(line) for line in COMMITTED.read_text().splitlines()]


def _write(path: Path, records: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _find(records: list[dict[str, Any]], pid: str) -> int:
    return next(i for i, r in enumerate(records) if r["id"] == pid)


def test_committed_corpus_is_valid() -> None:
    report = validate_file(COMMITTED)
    assert report.ok, report.violations[:5]
    assert report.prompts == 4800


def test_violations_carry_their_lines(tmp_path: Path) -> None:
    records = _records()
    # line numbers are 1-based; each case edits one record
    i_person = _find(records, "color-pos1_neg0-005")
    records[i_person]["include"][0]["class"] = "person"
    records[i_person]["prompt"] = "a photo of a " + records[i_person]["statements"][0]["value"] + " person"
    i_text = _find(records, "material-pos2_neg2-010")
    records[i_text]["prompt"] = records[i_text]["prompt"].replace(", and a", " and a")  # no serial comma
    i_order = _find(records, "depth-pos1_neg1-003")
    st = records[i_order]["statements"]
    st[0], st[1] = st[1], st[0]  # negated first
    i_star = _find(records, "proximity-pos2_neg0-001")
    records[i_star]["statements"][1]["subject"] = 1
    i_dup_text = _find(records, "color-pos1_neg0-050")
    records[i_dup_text] = {**records[_find(records, "color-pos1_neg0-049")], "id": "color-pos1_neg0-050"}
    i_dup_id = _find(records, "comparative-pos2_neg2-001")
    records[i_dup_id]["id"] = "comparative-pos2_neg2-000"
    i_json = _find(records, "directional-pos1_neg0-000")
    i_spec = _find(records, "directional-pos1_neg0-001")
    records[i_spec]["statements"][0]["predicate"] = "on top of"
    lines: list[Any] = list(records)
    lines[i_json] = '{"id": "broken", '
    path = _write(tmp_path / "bad.jsonl", lines)

    report = validate_file(path)
    by_line: dict[int | None, list[Violation]] = {}
    for v in report.violations:
        by_line.setdefault(v.line, []).append(v)

    def fields(i: int) -> set[str | None]:
        return {v.field for v in by_line.get(i + 1, [])}

    assert "include[0].class" in fields(i_person)
    assert fields(i_text) == {"prompt"}
    assert fields(i_order) == {"statements"}
    assert "positive statements must come before negated ones" in str(by_line[i_order + 1])
    assert "statements" in fields(i_star)
    assert fields(i_dup_text) == {"prompt"}
    assert "same prompt text as line" in by_line[i_dup_text + 1][0].message
    assert by_line[i_dup_id + 1][0].message == f"duplicate id (first on line {i_dup_id})"
    assert by_line[i_json + 1][0].message.startswith("not valid JSON")
    assert fields(i_spec) == {"statements[0].predicate"}
    # whole-corpus checks: the two lines that no longer parse leave a cell short, and person is not a class
    corpus_level = [str(v) for v in by_line[None]]
    assert "corpus: directional pos1_neg0: 98 prompts, expected 100" in corpus_level
    # a line-located violation reads like the spec's errors
    assert str(by_line[i_spec + 1][0]).startswith(f"line {i_spec + 1}: directional-pos1_neg0-001: field statements[0]")


def test_missing_class_and_wrong_id(tmp_path: Path) -> None:
    # the depth prompts without any vase
    records = [r for r in _records() if r["category"] == "depth" and all(o["class"] != "vase" for o in r["include"])]
    records[0]["id"] = "color-pos1_neg0-000"
    report = validate_file(_write(tmp_path / "d.jsonl", records))
    messages = [str(v) for v in report.violations]
    assert any("depth: 1 classes never used: vase" in m for m in messages)
    assert any(m.startswith("line 1: color-pos1_neg0-000: field id: id says color pos1_neg0") for m in messages)
    assert any("color pos1_neg0: 0 prompts, expected 100" in m for m in messages)
    partial = validate_file(tmp_path / "d.jsonl", partial=True)
    assert [v.field for v in partial.violations] == ["id"]


def test_geneval_style_file_is_rejected_with_reasons(tmp_path: Path) -> None:
    path = _write(tmp_path / "g.jsonl", [
        {"tag": "single_object", "prompt": "a photo of a bench", "include": [{"class": "bench", "count": 1}]},
        {"tag": "counting", "prompt": "a photo of two cats", "include": [{"class": "cat", "count": 2}]},
    ])  # fmt: skip
    report = validate_file(path, partial=True)
    assert [(v.line, v.field) for v in report.violations] == [(1, "category"), (2, "category")]


def test_cli_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    corpus_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["corpus", "validate", str(COMMITTED)])
    assert args.func(args) == 0
    assert "4800 prompts, all benchmark invariants hold" in capsys.readouterr().out
    records = _records()[:3]
    records[1]["prompt"] += "!"
    bad = _write(tmp_path / "x.jsonl", records)
    args = parser.parse_args(["corpus", "validate", str(bad), "--partial"])
    assert args.func(args) == 1
    out = capsys.readouterr()
    assert f"{bad}: line 2: color-pos1_neg0-001: field prompt: text differs from the template" in out.out
    assert "1 violations" in out.err
    args = parser.parse_args(["corpus", "validate", str(tmp_path / "missing.jsonl")])
    assert args.func(args) == 2
