"""The attribute scorer's text template set as part of the rule config (issue 30 item 2): recorded, stated by
the attributes stage, checked by the orchestrator and conformance, refused by re-judging."""

from __future__ import annotations

import json

import pytest

from negt2i.core.config import (
    CURRENT,
    GENEVAL,
    PREVIOUS,
    TEXT_TEMPLATE_CODES,
    TEXT_TEMPLATES,
    AttributeConfig,
    RuleConfig,
    load_config,
    stage_rules,
    stated_stage_rules,
)

ENSEMBLE = RuleConfig(name="geneval-templates", attributes=AttributeConfig(text_templates="geneval"))


def test_the_default_template_set_keeps_every_published_digest():
    # the digests results files carry (main before the template set existed)
    assert CURRENT.digest() == "a8af11ec4b18c939"
    assert GENEVAL.digest() == "fb9140ec42903c21"
    assert PREVIOUS.digest() == "6dedb1b0e35be5fe"
    assert "text_templates" not in CURRENT.record()["attributes"]
    assert CURRENT.attributes.text_templates == "single"


def test_the_geneval_ensemble_is_recorded_and_changes_the_digest(tmp_path):
    record = ENSEMBLE.record()
    assert record["attributes"]["text_templates"] == "geneval"
    assert ENSEMBLE.digest() != CURRENT.digest()
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"name": "geneval-templates", "attributes": {"text_templates": "geneval"}}))
    assert load_config(str(path)) == ENSEMBLE
    path.write_text(json.dumps(record))  # a results file's record loads back to the same config
    assert load_config(str(path)).digest() == ENSEMBLE.digest()
    path.write_text(json.dumps({"attributes": {"text_templates": "single"}}))  # stated default: same digest
    assert load_config(str(path)).digest() == CURRENT.digest()
    path.write_text(json.dumps({"attributes": {"text_templates": "five"}}))
    with pytest.raises(ValueError, match="text_templates"):
        load_config(str(path))


def test_template_sets_are_geneval_s_three_colour_templates():
    assert TEXT_TEMPLATES["single"] == ("a photo of {article} {value} {class_name}.",)
    assert TEXT_TEMPLATES["geneval"] == (
        "a photo of a {value} {class_name}",
        "a photo of a {value}-colored {class_name}",
        "a photo of a {value} object",
    )
    assert TEXT_TEMPLATE_CODES == {"single": 0, "geneval": 1}  # published numbers


def test_the_attributes_stage_states_a_non_default_template_set_only():
    assert stage_rules(CURRENT, "attributes") == {}  # stages built before the template set state nothing
    assert stage_rules(ENSEMBLE, "attributes") == {"attributes.text_templates": 1.0}
    assert stage_rules(ENSEMBLE, "detector") == stage_rules(CURRENT, "detector")
    # a stage may state the default explicitly: the same as stating nothing
    assert stated_stage_rules("attributes", {"attributes.text_templates": 0.0}) == {}
    assert stated_stage_rules("attributes", {"attributes.text_templates": 1.0}) == {"attributes.text_templates": 1.0}
    floor = {"detection.prediction_floor": 0.005}
    assert stated_stage_rules("detector", floor) == floor


def test_the_synthetic_scorer_states_the_config_it_was_built_with():
    from negt2i.stages.synthetic import SyntheticAttributeScorer

    assert SyntheticAttributeScorer().info.rules == {}
    assert SyntheticAttributeScorer(config=ENSEMBLE).info.rules == {"attributes.text_templates": 1.0}


def test_the_orchestrator_refuses_an_attributes_stage_with_another_template_set():
    from negt2i.core.stage_types import ModelInfo
    from negt2i.wire import adapter
    from negt2i.wire.v1 import stages_pb2
    from orchestrator.settings import DEFAULT_URLS
    from orchestrator.stages import RemoteStages

    def info(rules: dict[str, float]) -> stages_pb2.StageInfo:
        model = ModelInfo(stage="attributes", backend="b", model="m", rules=rules)
        return stages_pb2.StageInfo(contract=adapter.CONTRACT, model=adapter.model_info_to_proto(model))

    current, ensemble = RemoteStages(DEFAULT_URLS, config=CURRENT), RemoteStages(DEFAULT_URLS, config=ENSEMBLE)
    assert current.check_info("attributes", info({})).ok
    assert current.check_info("attributes", info({"attributes.text_templates": 0.0})).ok
    assert "NEGT2I_RULES" in current.check_info("attributes", info({"attributes.text_templates": 1.0})).problem
    assert "NEGT2I_RULES" in ensemble.check_info("attributes", info({})).problem  # an older stage: single template
    assert ensemble.check_info("attributes", info({"attributes.text_templates": 1.0})).ok
    assert "does not apply" in current.check_info("attributes", info({"masks.closing_radius": 5.0})).problem


def test_the_in_process_check_holds_a_backend_to_the_template_set():
    from negt2i.core.stage_identity import check_model_info
    from negt2i.stages.synthetic import SyntheticAttributeScorer

    assert check_model_info("attributes", SyntheticAttributeScorer(config=ENSEMBLE).info, ENSEMBLE).ok
    assert not check_model_info("attributes", SyntheticAttributeScorer().info, ENSEMBLE).ok
    assert not check_model_info("attributes", SyntheticAttributeScorer(config=ENSEMBLE).info, CURRENT).ok
    assert check_model_info("attributes", SyntheticAttributeScorer().info, CURRENT, strict=True).ok


def test_re_judging_refuses_another_template_set():
    from negt2i.core.rejudge import RejudgeError, SavedRun, check_config

    saved = SavedRun([], {}, CURRENT.record(), [])
    check_config(saved, CURRENT)
    with pytest.raises(RejudgeError, match="text templates 'geneval' differ from the saved run's 'single'"):
        check_config(saved, ENSEMBLE)
    check_config(SavedRun([], {}, ENSEMBLE.record(), []), ENSEMBLE)
    with pytest.raises(RejudgeError, match="text templates"):
        check_config(SavedRun([], {}, ENSEMBLE.record(), []), CURRENT)


def test_both_records_validate_against_the_published_rule_config_schema():
    from pathlib import Path

    from jsonschema import Draft202012Validator

    committed = Path(__file__).resolve().parents[2] / "protos/negt2i/v1/schemas/rule-config.schema.json"
    schema = json.loads(committed.read_text())
    validator = Draft202012Validator(schema)
    assert not list(validator.iter_errors(CURRENT.record()))  # the field left out at its default
    assert not list(validator.iter_errors(ENSEMBLE.record()))
    bad = {**ENSEMBLE.record(), "attributes": {**ENSEMBLE.record()["attributes"], "text_templates": "five"}}
    assert list(validator.iter_errors(bad))
