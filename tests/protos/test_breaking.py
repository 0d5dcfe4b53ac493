"""negt2i.v1 is additive only: the protos against the committed baseline (scripts/protos/breaking.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.protos.tooling import breaking, codegen


def test_the_protos_only_add_to_the_baseline():
    old = json.loads(breaking.BASELINE.read_text(encoding="utf-8"))
    new = breaking.snapshot(codegen.PROTO_ROOT)
    assert breaking.breaking(old, new) == [], "negt2i.v1 is additive only (docs/api.md, Versioning)"
    assert breaking.render(old) == breaking.BASELINE.read_text(encoding="utf-8")


RENAMED = [
    ("message Vocabulary {", "message Vocab {"),
    ("(Vocabulary)", "(Vocab)"),
    ("  Vocabulary voc", "  Vocab voc"),
]


@pytest.mark.parametrize(
    ("edits", "needle"),
    [
        ([("  int32 count = 2;", "  int32 count = 7;")], "ObjectSpec.count changed"),
        ([("  int32 count = 2;", "  int64 count = 2;")], "ObjectSpec.count changed"),
        ([("  int32 count = 2;", "  int32 amount = 2;")], "ObjectSpec.count was removed or renamed"),
        ([("  int32 count = 2;", "  optional int32 count = 2;")], "ObjectSpec.count changed"),
        ([("  CATEGORY_DEPTH = 6;", "  CATEGORY_DEPTH = 7;")], "Category.CATEGORY_DEPTH changed"),
        ([("returns (Vocabulary);", "returns (stream Vocabulary);")], "Evaluator.GetVocabulary changed"),
        (RENAMED, "message negt2i.v1.Vocabulary was removed or renamed"),
    ],
)
def test_a_breaking_edit_is_caught(tmp_path: Path, edits: list[tuple[str, str]], needle: str):
    root = tmp_path / "protos"
    shutil.copytree(codegen.PROTO_ROOT, root)
    evaluator = root / "negt2i" / "v1" / "evaluator.proto"
    text = evaluator.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    evaluator.write_text(text)
    problems = "\n".join(breaking.breaking(breaking.snapshot(codegen.PROTO_ROOT), breaking.snapshot(root)))
    assert needle in problems, problems


def test_additions_are_allowed(tmp_path: Path):
    root = tmp_path / "protos"
    shutil.copytree(codegen.PROTO_ROOT, root)
    evaluator = root / "negt2i" / "v1" / "evaluator.proto"
    text = evaluator.read_text().replace(
        "  string same_text_as = 13;\n", "  string same_text_as = 13;\n  // New.\n  string added = 14;\n"
    )
    evaluator.write_text(text)
    assert breaking.breaking(breaking.snapshot(codegen.PROTO_ROOT), breaking.snapshot(root)) == []
