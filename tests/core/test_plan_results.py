"""plan_perception asks only for what a verdict reads; results lines are whole and readable."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from negt2i.core.config import CURRENT
from negt2i.core.perception import Detections
from negt2i.core.plan import plan_perception
from negt2i.core.results import error_record, ok_record, read_results, write_line
from negt2i.core.spec import parse_prompt
from negt2i.core.verdict import judge
from negt2i.core.vocab import COLOR_ANSWERS

from .helpers import perception, rect


def _prompt(category: str, kind: str = "relation") -> object:
    if kind == "relation":
        statements = [
            {"kind": "relation", "subject": 0, "target": 1, "predicate": p, "polarity": "negated"}
            for p in {"depth": ["behind"], "directional": ["above"]}[category]
        ]
        include = [{"class": "cup"}, {"class": "dog"}]
    else:
        statements = [{"kind": "attribute", "object": 0, "value": "red", "polarity": "positive"}]
        include = [{"class": "cup"}]
    return parse_prompt({"id": "x", "prompt": "p", "category": category, "include": include, "statements": statements})


def _dets(classes: list[str], scores: list[float]) -> Detections:
    masks = np.zeros((len(classes), 10, 10), bool)
    return Detections.from_masks(classes, scores, masks, (10, 10))


def test_relation_plan_refines_only_measured_instances() -> None:
    dets = _dets(["dog", "cup", "cup", "zebra", "dog"], [0.9, 0.3, 0.8, 0.9, 0.2])
    plan = plan_perception(_prompt("directional"), dets)  # type: ignore[arg-type]
    assert plan.refine == (0, 2) and not plan.depth and plan.attributes == ()
    assert plan_perception(_prompt("depth"), dets).depth  # type: ignore[arg-type]
    no_sam = CURRENT.model_copy(update={"masks": CURRENT.masks.model_copy(update={"refine": False})})
    assert plan_perception(_prompt("directional"), dets, no_sam).refine == ()  # type: ignore[arg-type]


def test_plan_skips_unevaluable_statements() -> None:
    over = _dets(["dog", "cup", "cup"], [0.9, 0.8, 0.7])  # two counted cups: over-count
    plan = plan_perception(_prompt("depth"), over)  # type: ignore[arg-type]
    assert plan.empty
    missing = _dets(["dog"], [0.9])
    assert plan_perception(_prompt("depth"), missing).empty  # type: ignore[arg-type]


def test_attribute_plan() -> None:
    plan = plan_perception(_prompt("color", "attribute"), _dets(["cup", "cup"], [0.4, 0.45]))  # type: ignore[arg-type]
    assert plan.attributes == (1,) and plan.answers == COLOR_ANSWERS and plan.refine == ()


def test_results_lines(tmp_path: Path) -> None:
    prompt = _prompt("directional")
    # the cup is below the dog, so "the cup is not above the dog" holds
    v = judge(prompt, perception(["cup", "dog"], [rect(50, 50, 5, 5), rect(0, 0, 5, 5)]))  # type: ignore[arg-type]
    out = tmp_path / "results.jsonl"
    with out.open("w") as fh:
        write_line(fh, ok_record(v, filename="00000/samples/0000.png", sample=0, models={"detector": {"model": "m"}}))
        write_line(fh, error_record(filename="00000/samples/0001.png", error="truncated PNG", prompt_id="x", sample=1))
    with out.open("a") as fh:
        fh.write('{"filename": "00000/samples/0002.png", "sta')  # an interrupted write
    records = list(read_results(out))
    assert [r["status"] for r in records] == ["ok", "error"]
    assert records[0]["correct"] is True and records[0]["filename"] == "00000/samples/0000.png"
    assert records[1]["correct"] is False and records[1]["reason"] == "truncated PNG"
    assert json.loads(out.read_text().splitlines()[0])["config"]["name"] == "current"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        list(read_results(bad))
