"""Results lines written from real ``judge`` verdicts are read back into the rows the metrics use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from negt2i.core.results import error_record, ok_record, write_line
from negt2i.core.spec import parse_prompt
from negt2i.core.verdict import judge
from negt2i.core.vocab import COLOR_ANSWERS
from negt2i.metrics.records import ResultsFormatError, iter_rows, parse_line, setting_label, setting_load
from tests.core.helpers import perception, rect

MODELS = {
    "detector": {
        "stage": "detector",
        "backend": "rfdetr-seg-xl",
        "model": "RFDETRSegXLarge",
        "revision": "v1",
        "sha256": "ab" * 32,
    }
}


def _directional_prompt() -> dict[str, object]:
    return {
        "id": "dir-1",
        "prompt": "a photo of a backpack and a cup, where the backpack is not above the cup",
        "category": "directional",
        "include": [{"class": "backpack"}, {"class": "cup"}],
        "statements": [{"kind": "relation", "subject": 0, "target": 1, "predicate": "above", "polarity": "negated"}],
    }


def test_judged_dead_zone_pass_is_read_as_an_empty_fired_pass(tmp_path: Path) -> None:
    prompt = parse_prompt(_directional_prompt())
    mid, same = rect(40, 40, 20, 20), rect(40, 41, 20, 20)  # centroids 1 px apart: no predicate fires
    verdict = judge(prompt, perception(["backpack", "cup"], [mid, same]))
    path = tmp_path / "r.jsonl"
    with path.open("w") as fh:
        write_line(fh, ok_record(verdict, filename="00000/samples/0000.png", sample=0, models=MODELS))
        write_line(fh, error_record(filename="00000/samples/0001.png", error="corrupt", prompt_id="dir-1", sample=1))
    ok, err = list(iter_rows(path))
    assert ok.correct and ok.status == "ok" and ok.key == "dir-1#0" and ok.where == f"{path}:1"
    assert ok.statements[0].polarity == "negated" and ok.statements[0].passed and ok.statements[0].empty
    assert ok.objects_ok == (True, True) and ok.category == "directional" and ok.setting == "pos0_neg1"
    assert ok.config_name == "current" and ok.models == (("detector", "RFDETRSegXLarge@v1 sha256:abababababab"),)
    assert not err.correct and err.status == "error" and err.error == "corrupt" and err.statements == ()


def test_judged_attribute_failure_keeps_cause_and_row_class() -> None:
    prompt = parse_prompt(
        {"id": "c-1", "prompt": "a photo of a non-red cup", "category": "color", "include": [{"class": "cup"}],
         "statements": [{"kind": "attribute", "object": 0, "value": "red", "polarity": "negated"}]}
    )  # fmt: skip
    scores = {v: (30.0 if v == "red" else 10.0) for v in COLOR_ANSWERS}
    verdict = judge(prompt, perception(["cup"], [rect(10, 10, 30, 30)], attributes={0: scores}, answers=COLOR_ANSWERS))
    row = parse_line(json.loads(json.dumps(ok_record(verdict, filename="a.png", sample=0, models={}))))
    assert not row.correct and row.failure_class == "negated_violated"
    assert row.statements[0].cause == "negated_violated" and row.statements[0].evaluated and not row.statements[0].empty


def test_error_line_cannot_be_correct() -> None:
    rec = error_record(filename="a.png", error="x") | {"correct": True}
    with pytest.raises(ResultsFormatError, match="f:4: an error line cannot be correct"):
        parse_line(rec, source="f", line=4)


def test_setting_helpers() -> None:
    assert setting_label("pos2_neg1") == "2:1" and setting_load("pos2_neg1") == 3
    assert setting_label("odd") == "odd" and setting_load("odd") is None


def test_line_numbers_skip_blank_lines(tmp_path: Path) -> None:
    prompt = parse_prompt(_directional_prompt())
    verdict = judge(prompt, perception(["backpack", "cup"], [rect(40, 40, 20, 20), rect(40, 41, 20, 20)]))
    line = json.dumps(ok_record(verdict, filename="a.png", sample=0, models={}))
    bad = json.dumps({"status": "ok", "filename": "b.png"})
    path = tmp_path / "r.jsonl"
    path.write_text(f"{line}\n\n{bad}\n")
    with pytest.raises(ResultsFormatError, match=rf"{path}:3: missing field 'prompt_id'"):
        list(iter_rows(path))
