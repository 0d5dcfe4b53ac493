"""Probes (control prompts' source statements): spec fields, judged like statements, never part of `correct`.

Scored through the real per-image flow (``Pipeline`` over the synthetic backends), through
``negt2i evaluate`` into a results file, and through the protobuf adapter.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from negt2i.cli import evaluate_cmd
from negt2i.core.results import read_results
from negt2i.core.spec import Polarity, SpecError, parse_prompt, read_prompts, write_prompts
from negt2i.metrics.records import iter_rows
from negt2i.pipeline import Pipeline, Stages
from negt2i.stages.synthetic import SceneObject, render_scene, write_geneval_layout
from negt2i.wire import adapter

SYNTH = dict.fromkeys(("detector", "segmenter", "attributes", "depth"), "synthetic")


def _stmt(predicate_or_value: str, polarity: str = "positive", *, relation: bool = True) -> dict[str, object]:
    if relation:
        return {"kind": "relation", "subject": 0, "target": 1, "predicate": predicate_or_value, "polarity": polarity}
    return {"kind": "attribute", "object": 0, "value": predicate_or_value, "polarity": polarity}


def _control(category: str, include: list[str], probes: list[dict[str, object]], **extra: object) -> dict:
    return {
        "id": f"control-{category}",
        "category": category,
        "prompt": "a photo of " + " and ".join(f"a {c}" for c in include),
        "include": [{"class": c} for c in include],
        "statements": [],
        "probes": probes,
        "source_id": f"{category}-pos1_neg0-000",
        **extra,
    }


def _scene(a_box, b_box, a_value=None):
    return render_scene([SceneObject("cup", a_box, value=a_value), SceneObject("dog", b_box)], (96, 96))


ABOVE = _scene((40, 5, 60, 25), (40, 60, 60, 80))  # cup straight above the dog
BELOW = _scene((40, 60, 60, 80), (40, 5, 60, 25))  # cup straight below the dog
SAME_SIZE = _scene((5, 5, 20, 20), (60, 60, 75, 75))  # equal areas: comparative dead zone
GREEN_CUP = _scene((10, 10, 40, 40), (60, 60, 80, 80), "green")

# (category, include, probe, scene, outcome, passed): one row per outcome and polarity
PROBE_CASES = [
    ("directional", ["cup", "dog"], _stmt("above"), ABOVE, "holds", True),
    ("directional", ["cup", "dog"], _stmt("above", "negated"), ABOVE, "holds", False),
    ("directional", ["cup", "dog"], _stmt("below", "negated"), ABOVE, "not", True),
    ("directional", ["cup", "dog"], _stmt("left of"), ABOVE, "not", False),
    ("comparative", ["cup", "dog"], _stmt("bigger than"), SAME_SIZE, "dead_zone", False),
    ("comparative", ["cup", "dog"], _stmt("bigger than", "negated"), SAME_SIZE, "dead_zone", True),
    ("color", ["cup"], _stmt("green", relation=False), GREEN_CUP, "holds", True),
    ("color", ["cup"], _stmt("green", "negated", relation=False), GREEN_CUP, "holds", False),
    ("color", ["cup"], _stmt("orange", relation=False), GREEN_CUP, "not", False),
    ("material", ["cup"], _stmt("glass", "negated", relation=False), GREEN_CUP, "not", True),  # green is nearest wood
    ("material", ["cup"], _stmt("wooden", "negated", relation=False), GREEN_CUP, "holds", False),
]


@pytest.mark.parametrize(("category", "include", "probe", "scene", "outcome", "passed"), PROBE_CASES)
def test_probe_outcome_through_the_pipeline(category, include, probe, scene, outcome, passed):
    prompt = parse_prompt(_control(category, include, [probe]))
    result = Pipeline(Stages.create(SYNTH)).run_one(prompt, scene)
    assert result.ok, result.error
    v = result.verdict
    assert v.correct is True and v.reason == "" and v.failure_class is None  # objects present: probes never count
    assert v.statements == [] and len(v.probes) == 1
    assert (v.probes[0].outcome, v.probes[0].passed) == (outcome, passed)
    assert v.probes[0].dead_zone is (outcome == "dead_zone")
    assert v.source_id == f"{category}-pos1_neg0-000" and v.form is None


def test_probes_never_change_correct_reason_or_failure_class():
    base = _control("directional", ["cup", "dog"], [])
    base["statements"] = [_stmt("above")]
    with_probes = {**base, "probes": [_stmt("left of"), _stmt("above", "negated")]}  # both fail as statements
    pipeline = Pipeline(Stages.create(SYNTH))
    plain, probed = (pipeline.run_one(parse_prompt(r), ABOVE).verdict for r in (base, with_probes))
    assert plain.correct and probed.correct
    assert (probed.reason, probed.failure_class) == (plain.reason, plain.failure_class)
    assert [p.cause for p in probed.probes] == ["positive_violated", "negated_violated"]
    assert probed.statements == plain.statements
    # a statement failure still fails the image, with or without probes
    failing = {**with_probes, "statements": [_stmt("below")]}
    v = pipeline.run_one(parse_prompt(failing), ABOVE).verdict
    assert not v.correct and v.failure_class == "positive_violated" and "probe" not in v.reason


def test_missing_object_leaves_probes_unevaluated_and_the_control_incorrect():
    prompt = parse_prompt(_control("directional", ["cup", "cat"], [_stmt("above")]))
    v = Pipeline(Stages.create(SYNTH)).run_one(prompt, ABOVE).verdict
    assert not v.correct and v.failure_class == "undetected_object"
    assert v.probes[0].outcome is None and v.probes[0].cause == "undetected_object" and not v.probes[0].evaluated


def test_probe_perception_is_planned_even_without_statements():
    """A control prompt has no statements, but its probes need refined masks / attribute scores."""
    counting = Stages.create(SYNTH)
    calls = {"refine": 0, "score": 0}
    for stage, method in (("segmenter", "refine"), ("attributes", "score")):
        obj = getattr(counting, stage)
        inner = getattr(obj, method)

        def wrapped(*a, _inner=inner, _m=method, **k):
            calls[_m] += 1
            return _inner(*a, **k)

        setattr(obj, method, wrapped)
    pipeline = Pipeline(counting)
    pipeline.run_one(parse_prompt(_control("directional", ["cup", "dog"], [_stmt("above")])), ABOVE)
    pipeline.run_one(parse_prompt(_control("color", ["cup"], [_stmt("green", relation=False)])), GREEN_CUP)
    assert calls == {"refine": 1, "score": 1}


# --------------------------------------------------------------------------- spec


def test_spec_fields_round_trip_and_plain_records_are_unchanged(tmp_path: Path):
    record = _control("color", ["cup"], [_stmt("red", "negated", relation=False)], same_text_as="control-x")
    para = {**_control("color", ["cup"], []), "probes": [], "form": "which_isnt", "id": "p"}
    path = tmp_path / "p.jsonl"
    write_prompts(path, [parse_prompt(record), parse_prompt(para)])
    back = read_prompts(path)
    assert back[0].probes[0].polarity is Polarity.NEGATED and back[0].statements == ()
    assert back[0].source_id == "color-pos1_neg0-000" and back[0].extra == {"same_text_as": "control-x"}
    assert back[0].setting == "pos0_neg0"
    assert back[1].form == "which_isnt" and back[1].probes == ()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert "probes" not in lines[1] and lines[1]["form"] == "which_isnt"
    plain = parse_prompt({"prompt": "a photo of a cup", "include": [{"class": "cup"}], "id": "00000"})
    assert set(plain.to_json()) == {"id", "tag", "category", "setting", "prompt", "include", "statements"}


@pytest.mark.parametrize(
    ("mutate", "field", "message"),
    [
        (lambda r: r["probes"][0].update({"value": "blurple"}), r"probes\[0\]\.value", "not a color value"),
        (lambda r: r["probes"][0].update({"object": 3}), r"probes\[0\]\.object", "points at object 3"),
        (lambda r: r["probes"].append(dict(r["probes"][0])), r"probes\[1\]", "same statement is made twice"),
        (lambda r: r.pop("category"), "category", "a prompt with probes needs a category"),
        (lambda r: r.update({"probes": {}}), "probes", "must be a list"),
        (lambda r: r.update({"source_id": 3}), "source_id", "non-empty string"),
        (lambda r: r.update({"form": ""}), "form", "non-empty string"),
    ],
)
def test_bad_probe_metadata_names_the_field(mutate, field, message):
    record = _control("color", ["cup"], [_stmt("red", relation=False)])
    mutate(record)
    with pytest.raises(SpecError, match=rf"field {field}: .*{message}"):
        parse_prompt(record)


# --------------------------------------------------------------------------- evaluate + wire


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="negt2i")
    evaluate_cmd.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_evaluate_writes_probe_outcomes_that_the_report_reads(tmp_path: Path):
    control = _control("directional", ["cup", "dog"], [_stmt("above", "negated"), _stmt("below")])
    write_geneval_layout(tmp_path / "images", [(control, [ABOVE, BELOW])])
    out = tmp_path / "r.jsonl"
    assert (
        _main(["evaluate", str(tmp_path / "images"), "--out", str(out), "--backend", "synthetic", "--no-progress"]) == 0
    )
    lines = list(read_results(out))
    assert [ln["correct"] for ln in lines] == [True, True]
    assert [[p["outcome"] for p in ln["probes"]] for ln in lines] == [["holds", "not"], ["not", "holds"]]
    assert all(ln["source_id"] == "directional-pos1_neg0-000" and "form" not in ln for ln in lines)
    rows = list(iter_rows(out))
    assert [[p.outcome for p in r.probes] for r in rows] == [["holds", "not"], ["not", "holds"]]
    assert rows[0].source_id == "directional-pos1_neg0-000" and rows[0].statements == ()


def test_probes_source_id_and_form_travel_over_the_wire_exactly():
    record = _control("directional", ["cup", "dog"], [_stmt("above", "negated")], form="which_isnt")
    prompt = parse_prompt(record)
    msg = adapter.prompt_to_proto(prompt)
    again = type(msg).FromString(msg.SerializeToString())
    assert adapter.prompt_from_proto(again) == prompt
    verdict = Pipeline(Stages.create(SYNTH)).run_one(prompt, ABOVE).verdict
    vmsg = adapter.verdict_to_proto(verdict)
    back = adapter.verdict_from_proto(type(vmsg).FromString(vmsg.SerializeToString()))
    assert back.to_json() == verdict.to_json()
    assert back.probes[0].outcome == "holds" and back.form == "which_isnt"
