"""The published JSON Schemas of the JSON-in-a-string fields: reproducible, and real verdicts validate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from jsonschema import Draft202012Validator

from negt2i.core.config import PRESETS, PREVIOUS, RuleConfig
from negt2i.core.spec import parse_prompt
from negt2i.core.verdict import judge
from negt2i.core.vocab import Category
from negt2i.pipeline import Pipeline, Stages
from negt2i.stages.demo_data import demo_entries
from negt2i.wire import adapter
from tests.core.test_measurements import _prompt, _scene
from tests.protos.tooling import schemas

SYNTH = dict.fromkeys(("detector", "segmenter", "attributes", "depth"), "synthetic")


def _validator(name: str) -> Draft202012Validator:
    schema = json.loads((schemas.SCHEMA_DIR / name).read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


OBJECT = _validator("object-measurements.schema.json")
STATEMENT = _validator("statement-measurements.schema.json")
CONFIG = _validator("rule-config.schema.json")


def _errors(validator: Draft202012Validator, value: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(value)]


def test_committed_schemas_match_a_fresh_generation(tmp_path: Path):
    fresh = schemas.generate(tmp_path)
    committed = sorted(schemas.SCHEMA_DIR.glob("*.schema.json"))
    assert [p.name for p in fresh] == [p.name for p in committed], "run scripts/gen_protos.sh"
    for new in fresh:
        assert new.read_text() == (schemas.SCHEMA_DIR / new.name).read_text(), f"{new.name}: run scripts/gen_protos.sh"


def _check_wire_verdict(v: Any, seen: set[str]) -> None:
    """A verdict as a client in another language reads it: the proto's JSON strings, parsed."""
    msg = adapter.verdict_to_proto(v)
    assert not _errors(CONFIG, json.loads(msg.config_json))
    for o in msg.objects:
        assert not _errors(OBJECT, json.loads(o.measurements_json)), o
    for s in [*msg.statements, *msg.probes]:
        m = json.loads(s.measurements_json)
        assert not _errors(STATEMENT, m), (m, _errors(STATEMENT, m))
        seen.add(f"{m['rule']}{'/degenerate' if m.get('degenerate') else ''}")


@pytest.mark.parametrize("config", [RuleConfig(), PREVIOUS], ids=["current", "previous"])
def test_every_rules_measurements_validate(config: RuleConfig):
    """Random scenes of every category (tests/core/test_measurements.py): every rule, degenerate pairs and
    unevaluated statements included."""
    seen: set[str] = set()
    for category in Category:
        rng = np.random.default_rng(sum(map(ord, category.value)))
        for _ in range(40):
            prompt = _prompt(category, rng)
            _check_wire_verdict(judge(prompt, _scene(prompt, rng), config), seen)
    rules = {"unevaluated", "attribute", "directional", "proximity", "comparative", "depth"}
    assert rules <= seen and any(s.endswith("/degenerate") for s in seen), seen


def test_pipeline_verdicts_and_service_rules_validate():
    pipeline = Pipeline(Stages.create(SYNTH))
    seen: set[str] = set()
    for record, images in demo_entries(prompts=12, samples=2, seed=7):
        prompt = parse_prompt(record)
        for result in pipeline.run([prompt] * len(images), images):
            assert result.verdict is not None
            _check_wire_verdict(result.verdict, seen)
    assert {"attribute", "directional"} <= seen
    for preset in PRESETS.values():
        assert not _errors(CONFIG, preset.record())


@pytest.mark.parametrize(
    ("validator", "value", "needle"),
    [
        ("statement", {"rule": "proximity", "area_a": 1, "area_b": 2, "gap": 0, "radius": 1, "threshold": 1,
                       "gap_factor": 0.75, "detections": [0, 1], "mask": "refined", "extra": 1}, "is not valid"),
        ("statement", {"rule": "proximity", "area_a": 1}, "is not valid"),
        ("statement", {"rule": "teleport"}, "is not valid"),
        ("object", {"kept": [[0, 0.5]], "candidates": 1}, "is a required property"),
        ("config", {**RuleConfig().record(), "digest": "xyz"}, "does not match"),
        ("config", {k: v for k, v in RuleConfig().record().items() if k != "depth"}, "'depth' is a required property"),
    ],
)  # fmt: skip
def test_the_schemas_refuse_what_a_verdict_never_holds(validator: str, value: Any, needle: str):
    found = _errors({"statement": STATEMENT, "object": OBJECT, "config": CONFIG}[validator], value)
    assert found and any(needle in e for e in found), found
