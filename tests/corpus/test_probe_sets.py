"""The control and paraphrase sets: invariants against the corpus, the forms' grammar, rebuilds, validation."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from negt2i.cli import main
from negt2i.core.spec import Polarity, Prompt, read_prompts
from negt2i.core.vocab import Category
from negt2i.corpus.control import build_control, control_text, stray_words, unique_texts
from negt2i.corpus.paraphrase import (
    FORMS,
    ParseError,
    build_paraphrase,
    means_the_same,
    paraphrase_prompt,
    parse,
    render,
    split_list,
)
from negt2i.corpus.templates import AttributeSelection as A
from negt2i.corpus.templates import RelationSelection as R
from negt2i.corpus.templates import attribute_prompt, relation_prompt
from negt2i.corpus.validate import detect_kind, validate_control_file, validate_paraphrase_file

from .conftest import COMMITTED, REPO

CONTROL = REPO / "data" / "negt2ibench-control.jsonl"
PARAPHRASE = REPO / "data" / "negt2ibench-paraphrase.jsonl"
POS, NEG = Polarity.POSITIVE, Polarity.NEGATED


@pytest.fixture(scope="module")
def corpus() -> list[Prompt]:
    return read_prompts(COMMITTED)


@pytest.fixture(scope="module")
def control() -> list[Prompt]:
    return read_prompts(CONTROL)


@pytest.fixture(scope="module")
def paraphrase() -> list[Prompt]:
    return read_prompts(PARAPHRASE)


# --------------------------------------------------------------------------- control


def test_committed_sets_are_byte_identical_rebuilds(tmp_path: Path) -> None:
    for command, committed in (("control", CONTROL), ("paraphrase", PARAPHRASE)):
        outs = [tmp_path / f"{command}.jsonl"]
        assert main(["corpus", command, "--source", str(COMMITTED), "--out", str(outs[0])]) == 0
        assert outs[0].read_bytes() == committed.read_bytes(), f"rebuild: negt2i corpus {command} --out {committed}"
        meta = json.loads(outs[0].with_suffix(".meta.json").read_text())
        committed_meta = json.loads(committed.with_suffix(".meta.json").read_text())
        for m in (meta, committed_meta):
            m.pop("negt2i_version")
            m["source"].pop("path")
        assert meta == committed_meta


def test_one_control_per_corpus_prompt_same_objects_probes_verbatim(corpus, control) -> None:
    assert [c.source_id for c in control] == [p.id for p in corpus]
    for src, c in zip(corpus, control, strict=True):
        assert c.id == f"control-{src.id}" and c.category == src.category
        assert c.objects == src.objects  # same classes, counts and order
        assert c.statements == () and c.probes == src.statements and c.setting == "pos0_neg0"
        assert c.prompt == control_text([o.class_name for o in src.objects])
        for o in src.objects:
            assert f"a {o.class_name}" in c.prompt


def test_control_texts_name_no_value_relation_or_negation(control) -> None:
    for c in control:
        assert stray_words(c.prompt, [o.class_name for o in c.objects]) == [], c.id
    # the class names that are also value words are really in the set, and handled
    names = Counter(o.class_name for c in control for o in c.objects)
    assert names["orange"] > 0 and names["wine glass"] > 0


@pytest.mark.parametrize(
    ("text", "names", "stray"),
    [
        ("a photo of a orange", ["orange"], []),  # the class, not the color
        ("a photo of a wine glass and a cup", ["wine glass", "cup"], []),  # "glass" is a material
        ("a photo of a orange", [], ["orange"]),  # without the class name it is a color word
        ("a photo of a orange orange", ["orange"], []),  # ... ambiguous text: every occurrence is the class
        ("a photo of a glass wine glass", ["wine glass"], ["glass"]),  # the material outside the class
        ("a photo of a non-red cup", ["cup"], ["non", "red"]),
        ("a photo of a cup which isn't wooden", ["cup"], ["isn't", "wooden"]),
        ("a photo of a cup and a dog, where the cup is left of the dog", ["cup", "dog"], ["where", "left"]),
        ("a photo of a cup in front of a dog", ["cup", "dog"], ["front"]),
        ("a photo of a hot dog near a gray bench", ["hot dog", "bench"], ["near", "gray"]),
    ],
)
def test_stray_words(text: str, names: list[str], stray: list[str]) -> None:
    assert stray_words(text, names) == stray


def test_identical_control_texts_are_marked_once(control) -> None:
    first: dict[str, str] = {}
    for c in control:
        if c.prompt in first:
            assert c.extra == {"same_text_as": first[c.prompt]}
        else:
            assert c.extra == {}
            first[c.prompt] = c.id
    unmarked = [c for c in control if "same_text_as" not in c.extra]
    assert len(unmarked) == unique_texts(control) == len(first) < len(control)
    # colors of one object coincide; so do a material and a color prompt about the same objects
    tie = [c for c in control if c.prompt == "a photo of a tie"]
    assert len(tie) > 1 and len({c.category for c in tie}) == 2


def test_control_subset_follows_the_paraphrase_draw(tmp_path: Path, paraphrase) -> None:
    out = tmp_path / "c.jsonl"
    assert main(["corpus", "control", "--source", str(COMMITTED), "--out", str(out), "--per-cell", "10"]) == 0
    subset = read_prompts(out)
    assert len(subset) == 480 and {c.source_id for c in subset} == {p.source_id for p in paraphrase}
    assert validate_control_file(out, COMMITTED, partial=True).ok
    assert not validate_control_file(out, COMMITTED).ok  # not every source covered


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_control_validation_names_each_broken_line(tmp_path: Path) -> None:
    assert validate_control_file(CONTROL, COMMITTED).ok and detect_kind(CONTROL) == "control"
    records = _records(CONTROL)[:200]
    records[0]["prompt"] = "a photo of a red tie"  # a value in the text
    records[1]["probes"][0]["polarity"] = "negated"  # probes not verbatim
    records[2]["include"][0]["class"] = "bench"  # objects differ
    records[3]["source_id"] = "color-pos9_neg9-000"  # no such source
    marked = next(i for i, r in enumerate(records) if "same_text_as" in r)
    records[marked]["same_text_as"] = records[0]["id"]
    records[5]["statements"] = records[5].pop("probes")
    del records[5]["setting"]
    report = validate_control_file(_write(tmp_path / "c.jsonl", records), COMMITTED, partial=True)
    by_line = {(v.line, v.field) for v in report.violations}
    assert {(1, "prompt"), (2, "probes"), (3, "include"), (4, "source_id"), (6, "statements"), (6, "probes")} <= by_line
    assert (marked + 1, "same_text_as") in by_line
    assert any("names a value, relation or negation: red" in str(v) for v in report.violations)


# --------------------------------------------------------------------------- paraphrase


def test_paraphrases_keep_include_and_statements_exactly(corpus, paraphrase) -> None:
    by_id = {p.id: p for p in corpus}
    for p in paraphrase:
        src = by_id[p.source_id]
        assert p.id == f"paraphrase-{p.form}-{src.id}" and p.category == src.category
        assert p.objects == src.objects and p.statements == src.statements and p.probes == ()
        assert p.prompt != src.prompt
        for o in src.objects:  # every object still named
            assert o.class_name in p.prompt


def test_stratified_subset_every_form_for_every_source(paraphrase) -> None:
    sources = {p.source_id: p for p in paraphrase}
    cells = Counter((p.category, p.setting) for p in sources.values())
    assert len(cells) == 48 and set(cells.values()) == {10}
    forms = Counter(p.form for p in paraphrase)
    assert forms == dict.fromkeys(FORMS, 480) and len(FORMS) >= 3
    per_category = {c: {p.form for p in paraphrase if p.category == c} for c in Category}
    assert all(len(f) >= 3 for f in per_category.values())


def test_every_paraphrase_reads_back_to_its_metadata_with_the_form_grammar(paraphrase, corpus) -> None:
    for p in paraphrase:
        assert p.form is not None and p.category is not None
        names, statements = parse(p.prompt, p.form, p.category)
        assert names == [o.class_name for o in p.objects] and tuple(statements) == p.statements, p.id
    # the grammar covers every corpus prompt, not only the drawn subset
    for src in corpus[::7]:
        for form in FORMS:
            assert means_the_same(paraphrase_prompt(src, form)) == [], (src.id, form)


ORANGE = attribute_prompt(
    "color-pos1_neg1-900", Category.COLOR, [A("orange", "orange", POS), A("wine glass", "orange", NEG)]
)
STAR = relation_prompt(
    "directional-pos2_neg1-900",
    Category.DIRECTIONAL,
    "laptop",
    [R("right of", "zebra", POS), R("above", "parking meter", POS), R("left of", "wine glass", NEG)],
)
DEPTH = relation_prompt("depth-pos0_neg1-900", Category.DEPTH, "backpack", [R("in front of", "hot dog", NEG)])

# the forms as documented in docs/corpus.md and the module docstring, character for character
EXPECTED = {
    (ORANGE.id, "that_is_not"): "a photo of a orange that is orange and a wine glass that is not orange",
    (ORANGE.id, "which_isnt"): "a photo of a orange which is orange and a wine glass which isn't orange",
    (ORANGE.id, "with_not"): "a photo of a orange and a wine glass, with the orange orange and the wine glass not "
    "orange",
    (ORANGE.id, "sentences_isnt"): "a photo of a orange and a wine glass. The orange is orange. The wine glass "
    "isn't orange.",
    (STAR.id, "that_is_not"): "a photo of a laptop that is right of a zebra, is above a parking meter, and is not "
    "left of a wine glass",
    (STAR.id, "which_isnt"): "a photo of a laptop which is right of a zebra, is above a parking meter, and isn't "
    "left of a wine glass",
    (STAR.id, "with_not"): "a photo of a laptop, a zebra, a parking meter, and a wine glass, with the laptop "
    "right of the zebra, above the parking meter, and not left of the wine glass",
    (STAR.id, "sentences_isnt"): "a photo of a laptop, a zebra, a parking meter, and a wine glass. The laptop is "
    "right of the zebra. The laptop is above the parking meter. The laptop isn't left of the wine glass.",
    (DEPTH.id, "sentences_isnt"): "a photo of a backpack and a hot dog. The backpack isn't in front of the hot dog.",
    (DEPTH.id, "that_is_not"): "a photo of a backpack that is not in front of a hot dog",
}


@pytest.mark.parametrize(("key", "text"), EXPECTED.items(), ids=[f"{k[0]}-{k[1]}" for k in EXPECTED])
def test_forms_render_and_parse_back(key: tuple[str, str], text: str) -> None:
    prompt = {p.id: p for p in (ORANGE, STAR, DEPTH)}[key[0]]
    assert render(prompt, key[1]) == text
    assert prompt.category is not None
    names, statements = parse(text, key[1], prompt.category)
    assert names == [o.class_name for o in prompt.objects] and tuple(statements) == prompt.statements


@pytest.mark.parametrize(
    ("text", "form", "category", "problem"),
    [
        ("a photo of a cup which is not red", "which_isnt", Category.COLOR, "does not match"),  # wrong style
        ("a photo of a cup that isn't red", "that_is_not", Category.COLOR, "does not match"),
        ("a photo of a cup that is not blurple", "that_is_not", Category.COLOR, "does not match"),
        ("a photo of a cup and a dog, with the dog not red", "with_not", Category.COLOR, "2 objects"),
        ("a photo of a cup. The dog is red.", "sentences_isnt", Category.COLOR, "is about 'dog'"),
        (
            "a photo of a cup and a dog. The dog isn't left of the cup.",
            "sentences_isnt",
            Category.DIRECTIONAL,
            "subject",
        ),
        ("a photo of a cup, a dog and a cat, with the cup", "with_not", Category.DIRECTIONAL, "serial-comma"),
        ("a photo of a cup that is not near a dog", "that_is_not", Category.DIRECTIONAL, "does not match"),
        (
            "a photo of a cup and a dog, where the cup isn't left of the dog",
            "with_not",
            Category.DIRECTIONAL,
            "expected ', with'",
        ),
    ],
)
def test_the_grammar_rejects_what_the_forms_never_write(text, form, category, problem) -> None:
    with pytest.raises(ParseError, match=problem):
        parse(text, form, category)


def test_a_changed_meaning_is_caught() -> None:
    p = paraphrase_prompt(STAR, "which_isnt")
    flipped = p.model_copy(update={"prompt": p.prompt.replace("isn't left of", "is left of")})
    assert means_the_same(flipped) == ["the text's statements differ from the record's"]
    swapped = p.model_copy(update={"prompt": p.prompt.replace("zebra", "cat")})
    assert "names" in means_the_same(swapped)[0]


def test_split_list_inverts_join_list() -> None:
    assert split_list("a cup") == ["a cup"]
    assert split_list("a cup and a dog") == ["a cup", "a dog"]
    assert split_list("a, b, and c") == ["a", "b", "c"]
    with pytest.raises(ParseError):
        split_list("a, b and c")


def test_paraphrase_validation_names_each_broken_line(tmp_path: Path) -> None:
    assert validate_paraphrase_file(PARAPHRASE, COMMITTED).ok and detect_kind(PARAPHRASE) == "paraphrase"
    records = _records(PARAPHRASE)
    records[0]["prompt"] = records[0]["prompt"].replace(" is ", " is not ", 1)
    records[1]["statements"][0]["value"] = "blue" if records[1]["statements"][0]["value"] != "blue" else "red"
    records[2]["form"] = "passive"
    del records[7]  # source 1 loses its last form
    report = validate_paraphrase_file(_write(tmp_path / "p.jsonl", records), COMMITTED)
    by_line = {(v.line, v.field) for v in report.violations}
    assert {(1, "prompt"), (2, "statements"), (3, "form")} <= by_line
    assert any("lacks forms sentences_isnt" in str(v) for v in report.violations)


def test_cli_validate_detects_the_kind_and_exits_non_zero_on_violations(tmp_path: Path, capsys) -> None:
    assert main(["corpus", "validate", str(CONTROL), "--source", str(COMMITTED)]) == 0
    assert "4800 prompts, all control set invariants hold" in capsys.readouterr().out
    records = _records(PARAPHRASE)
    records[0]["include"][0]["class"] = "cat" if records[0]["include"][0]["class"] != "cat" else "dog"
    bad = _write(tmp_path / "p.jsonl", records)
    assert main(["corpus", "validate", str(bad), "--source", str(COMMITTED)]) == 1
    assert "line 1" in capsys.readouterr().out
    assert main(["corpus", "paraphrase", "--out", str(tmp_path / "x.jsonl"), "--forms", "nope"]) == 2


def test_small_builds_are_deterministic(corpus) -> None:
    a = build_paraphrase(corpus, per_cell=2, seed=3)
    b = build_paraphrase(corpus, per_cell=2, seed=3)
    c = build_paraphrase(corpus, per_cell=2, seed=4)
    assert a == b and a != c and len(a) == 48 * 2 * len(FORMS)
    assert build_control(corpus[:50]) == build_control(corpus[:50])
