"""Prompt records -> ``PromptSpec``, as ``docs/api.md`` tells a client in any language to build it.

``literal`` below is that table written out mechanically, the way a Node.js or Go client would (record
keys renamed, enums by name, through the proto3 JSON mapping); the tests check that it gives the same
prompt as reading the record (``parse_prompt``) over the whole corpus, the probe sets, the demo's
records (no ``count``, no ``tag``) and GenEval-style records, and that the Python adapter sends exactly
that message.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from negt2i.core.spec import _KNOWN_KEYS, parse_prompt, read_prompts
from negt2i.stages.demo_data import prompt_records
from negt2i.wire import adapter
from negt2i.wire.v1 import evaluator_pb2

REPO = Path(__file__).resolve().parents[2]
CORPORA = sorted((REPO / "data").glob("*.jsonl"))
API_DOC = REPO / "docs" / "api.md"

_FIELDS = {"id": "id", "prompt": "prompt", "tag": "tag", "setting": "setting", "source_id": "source_id",
           "form": "form", "same_text_as": "same_text_as"}  # fmt: skip


def _statement(st: dict[str, Any]) -> dict[str, Any]:
    polarity = f"POLARITY_{st['polarity'].upper()}"
    if st["kind"] == "attribute":
        return {"polarity": polarity, "attribute": {"object": st["object"], "value": st["value"]}}
    return {
        "polarity": polarity,
        "relation": {"subject": st["subject"], "target": st["target"], "predicate": st["predicate"]},
    }


def literal(record: dict[str, Any]) -> evaluator_pb2.PromptSpec:
    """docs/api.md's table, applied key by key (what a client in another language writes)."""
    out: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    statements = []
    for i, inc in enumerate(record["include"]):  # GenEval's statement encodings first
        if "color" in inc:
            statements.append(_statement({"kind": "attribute", "object": i, "value": inc["color"],
                                          "polarity": "positive"}))  # fmt: skip
        if "position" in inc:
            pred, j = inc["position"]
            statements.append(_statement({"kind": "relation", "subject": i, "target": j, "predicate": pred,
                                          "polarity": "positive"}))  # fmt: skip
    for key, value in record.items():
        if key in _FIELDS:
            out[_FIELDS[key]] = value
        elif key == "category":
            out["category"] = f"CATEGORY_{value.upper()}" if value else "CATEGORY_UNSPECIFIED"
        elif key in ("include", "exclude"):
            field = "objects" if key == "include" else "exclude"
            out[field] = [{"class_name": o["class"], **({"count": o["count"]} if "count" in o else {})} for o in value]
        elif key in ("statements", "probes"):
            out[key] = [_statement(st) for st in value]
        else:
            extra[key] = value
    if statements:
        out["statements"] = statements + out.get("statements", [])
        inferred = "CATEGORY_COLOR" if "attribute" in statements[0] else "CATEGORY_DIRECTIONAL"
        out.setdefault("category", inferred)
    if extra:
        out["extra_json"] = json.dumps(extra, sort_keys=True, separators=(",", ":"))
    return json_format.ParseDict(out, evaluator_pb2.PromptSpec())


GENEVAL = [
    {"id": "00000", "tag": "single_object", "prompt": "a photo of a bench", "include": [{"class": "bench"}]},
    {"id": "00001", "tag": "color_attr", "prompt": "a photo of a red cup",
     "include": [{"class": "cup", "count": 1, "color": "red"}]},
    {"id": "00002", "tag": "position", "prompt": "a photo of a dog right of a cat",
     "include": [{"class": "dog"}, {"class": "cat", "position": ["left of", 0]}]},
    {"id": "00003", "tag": "counting", "prompt": "a photo of three cups", "include": [{"class": "cup", "count": 3}],
     "exclude": [{"class": "cup", "count": 4}]},
]  # fmt: skip


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.parametrize("path", CORPORA, ids=lambda p: p.name)
def test_every_corpus_record_maps_literally_and_round_trips(path: Path):
    records = _records(path)
    assert len(records) >= 1920
    for record, prompt in zip(records, read_prompts(path), strict=True):
        sent = literal(record)
        assert adapter.prompt_to_proto(prompt) == sent, record["id"]  # the adapter sends the documented message
        assert sent.extra_json == "", record["id"]  # our own files need no unknown-key escape hatch
        wire = evaluator_pb2.PromptSpec.FromString(sent.SerializeToString())
        assert adapter.prompt_from_proto(wire) == prompt, record["id"]


@pytest.mark.parametrize("record", [*prompt_records(12), *GENEVAL], ids=lambda r: r["id"])
def test_records_without_count_or_tag_map_literally(record: dict[str, Any]):
    """The demo's records name no count and no tag: unset count means 1, unset tag the category."""
    sent = literal(record)
    back = adapter.prompt_from_proto(sent)
    assert back == parse_prompt(record)
    assert all(o.count >= 1 for o in back.objects)
    if "tag" not in record:
        assert back.tag == record["category"] and back.tag != ""
    assert adapter.prompt_from_proto(adapter.prompt_to_proto(back)) == back


def test_unknown_keys_travel_in_extra_json_and_known_ones_are_refused_there():
    record = {**prompt_records(1)[0], "note": {"by": "me"}, "seed": 7}
    sent = literal(record)
    assert json.loads(sent.extra_json) == {"note": {"by": "me"}, "seed": 7}
    assert adapter.prompt_from_proto(sent).extra == {"note": {"by": "me"}, "seed": 7}
    for key in sorted(_KNOWN_KEYS - {"setting", "exclude"}):
        bad = literal(record)
        bad.extra_json = json.dumps({key: "x"})
        with pytest.raises(adapter.WireError, match=rf"prompt\.extra_json: the record key '{key}' has its own field"):
            adapter.prompt_from_proto(bad)


def test_setting_is_checked_against_the_statements():
    record = prompt_records(1)[0]  # one negated statement
    sent = literal({**record, "setting": "pos0_neg1"})
    assert adapter.prompt_from_proto(sent).setting == "pos0_neg1"
    sent.setting = "pos1_neg0"
    with pytest.raises(adapter.WireError, match=r"^prompt\.setting: says 'pos1_neg0' but the statements make it"):
        adapter.prompt_from_proto(sent)
    old = literal(record)  # a client of an earlier server sent it in extra_json: still understood
    old.extra_json = '{"setting":"pos1_neg0"}'
    with pytest.raises(adapter.WireError, match=r"prompt\.setting: says 'pos1_neg0'"):
        adapter.prompt_from_proto(old)
    old.setting = "pos0_neg1"
    with pytest.raises(adapter.WireError, match=r"prompt\.setting: extra_json's 'setting' disagrees with the field"):
        adapter.prompt_from_proto(old)


def test_exclude_only_restates_the_over_count_rule():
    record = GENEVAL[3]
    assert adapter.prompt_from_proto(literal(record)) == parse_prompt(record)
    for bad in ([{"class": "cup", "count": 3}], [{"class": "dog", "count": 2}], [{"class": "cup"}]):
        with pytest.raises(adapter.WireError, match=r"^prompt\.exclude\[0\]: only exclude entries that restate"):
            adapter.prompt_from_proto(literal({**record, "exclude": bad}))
    both = literal(record)
    both.extra_json = json.dumps({"exclude": record["exclude"]})
    with pytest.raises(adapter.WireError, match="exclude is set both as a field and in extra_json"):
        adapter.prompt_from_proto(both)


def test_counts_zero_means_one_and_negative_is_refused():
    sent = literal(prompt_records(1)[0])
    sent.objects[0].count = 0
    assert adapter.prompt_from_proto(sent).objects[0].count == 1
    sent.objects[0].count = -2
    with pytest.raises(adapter.WireError, match=r"^prompt\.objects\[0\]\.count: count must be a positive integer"):
        adapter.prompt_from_proto(sent)


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("class", "Computer Mouse", "unknown class 'Computer Mouse' (not one of the 80 COCO classes; "
                                    "did you mean 'computer mouse'?)"),
        ("class", "computer_mouse", "did you mean 'computer mouse'?"),
        ("class", "mouse", "unknown class 'mouse' (not one of the 80 COCO classes; did you mean 'computer mouse'?)"),
        ("class", "Remote", "did you mean 'tv remote'?"),
        ("class", "hotdog", "did you mean 'hot dog'?"),
        ("class", "unicorn", "unknown class 'unicorn' (not one of the 80 COCO classes)"),
        ("value", "Red", "'Red' is not a color value; did you mean 'red'? (expected one of red, orange"),
        ("value", "teal", "'teal' is not a color value (expected one of"),
    ],
)  # fmt: skip
def test_names_are_case_sensitive_and_errors_suggest_the_canonical_spelling(field: str, value: str, needle: str):
    record = {"id": "c", "category": "color", "prompt": "a photo of a red computer mouse",
              "include": [{"class": "computer mouse"}],
              "statements": [{"kind": "attribute", "object": 0, "value": "red", "polarity": "positive"}]}  # fmt: skip
    sent = literal(record)
    if field == "class":
        sent.objects[0].class_name = value
    else:
        sent.statements[0].attribute.value = value
    with pytest.raises(adapter.WireError) as err:
        adapter.prompt_from_proto(sent)
    assert needle in str(err.value)


def test_the_predicate_suggestion():
    record = {"id": "d", "category": "depth", "prompt": "a dog behind a cat", "include": [{"class": "dog"},
              {"class": "cat"}], "statements": [{"kind": "relation", "subject": 0, "target": 1,
              "predicate": "In_Front_Of", "polarity": "positive"}]}  # fmt: skip
    with pytest.raises(adapter.WireError, match=r"unknown predicate 'In_Front_Of' for category depth; did you mean "
                                                r"'in front of'\?"):  # fmt: skip
        adapter.prompt_from_proto(literal(record))


def test_the_guide_maps_every_record_key():
    """docs/api.md's table names every key a record may carry, and each PromptSpec field."""
    text = API_DOC.read_text(encoding="utf-8")
    table = text.split("## Building a request", 1)[1].split("\n## ", 1)[0]
    keys = set(re.findall(r"^\| `([a-z_]+)(?:\[\]|\[\]\.[a-z_]+)?`", table, re.MULTILINE))
    assert _KNOWN_KEYS | {"same_text_as"} <= keys
    for sub in ("include[].class", "include[].count", "include[].color", "include[].position"):
        assert f"`{sub}`" in table
    fields = {f.name for f in evaluator_pb2.PromptSpec.DESCRIPTOR.fields}
    for name in fields:
        assert f"`{name}" in table, name


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", API_DOC.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)


def test_the_guides_worked_example_is_the_mapping():
    """docs/api.md's example record and its PromptSpec (proto3 JSON) are what the table and the adapter give."""
    record_text, spec_text = _blocks("json")[:2]
    record, spec = json.loads(record_text), json.loads(spec_text)
    want = json_format.ParseDict(spec, evaluator_pb2.PromptSpec())
    assert literal(record) == want
    assert adapter.prompt_to_proto(parse_prompt(record)) == want
    assert record in _records(REPO / "data" / "negt2ibench.jsonl")


def test_an_unset_category_is_the_tags_when_the_tag_names_one():
    record = {k: v for k, v in prompt_records(1)[0].items() if k != "category"}
    with pytest.raises(adapter.WireError, match=r"^prompt\.category: a prompt with statements needs a category"):
        adapter.prompt_from_proto(literal(record))
    tagged = adapter.prompt_from_proto(literal({**record, "tag": "color"}))
    assert tagged.category is not None and tagged.category.value == "color" and tagged.tag == "color"
