"""Element questions: every template against every category and polarity, the file, the digest check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from negt2i.annotation.questions import (
    QuestionsError,
    check_questions,
    element_questions,
    plural,
    prompt_digest,
    prompt_question,
    read_questions,
    write_questions,
)
from negt2i.cli import main
from negt2i.core.spec import Prompt, parse_prompt
from negt2i.core.vocab import PREDICATES, Category

SUBJECT, TARGET = "backpack", "parking meter"
ATTRIBUTE_VALUES = {"color": "red", "material": "wooden"}


def _attribute(category: str, polarity: str) -> Prompt:
    value = ATTRIBUTE_VALUES[category]
    return parse_prompt(
        {
            "id": f"{category}-{polarity}",
            "category": category,
            "prompt": f"a photo of a {'non-' if polarity == 'negated' else ''}{value} bench",
            "include": [{"class": "bench", "count": 1}],
            "statements": [{"kind": "attribute", "object": 0, "value": value, "polarity": polarity}],
        }
    )


def _relation(category: str, predicate: str, polarity: str) -> Prompt:
    return parse_prompt(
        {
            "id": f"{category}-{polarity}",
            "category": category,
            "prompt": f"a photo of a {SUBJECT} and a {TARGET}",
            "include": [{"class": SUBJECT, "count": 1}, {"class": TARGET, "count": 1}],
            "statements": [
                {"kind": "relation", "subject": 0, "target": 1, "predicate": predicate, "polarity": polarity}
            ],
        }
    )


def _modes(prompt: Prompt, element: str) -> dict[str, tuple[str, str]]:
    (q,) = [q for q in element_questions(prompt) if q.element == element]
    return dict(q.modes)


@pytest.mark.parametrize("category", ["color", "material"])
@pytest.mark.parametrize("polarity", ["positive", "negated"])
def test_attribute_questions_in_both_wordings(category: str, polarity: str) -> None:
    prompt = _attribute(category, polarity)
    v = ATTRIBUTE_VALUES[category]
    assert _modes(prompt, "object:0") == {
        "pos": ("Is there exactly one bench?", "yes"),
        "neg": ("Is there exactly one bench?", "yes"),
    }
    if polarity == "positive":
        assert _modes(prompt, "statement:0") == {
            "pos": (f"Is the bench {v}?", "yes"),
            "neg": (f"Is the bench {v}?", "yes"),
        }
    else:  # the paper's "a non-wooden bench": asked "is the bench wooden?" (expected no) or "non-wooden?" (yes)
        assert _modes(prompt, "statement:0") == {
            "pos": (f"Is the bench {v}?", "no"),
            "neg": (f"Is the bench non-{v}?", "yes"),
        }


RELATIONS = [(c.value, p) for c, preds in PREDICATES.items() for p in preds]


@pytest.mark.parametrize(("category", "predicate"), RELATIONS)
@pytest.mark.parametrize("polarity", ["positive", "negated"])
def test_relation_questions_in_both_wordings(category: str, predicate: str, polarity: str) -> None:
    prompt = _relation(category, predicate, polarity)
    assert [q.element for q in element_questions(prompt)] == ["object:0", "object:1", "statement:0"]
    assert _modes(prompt, "object:1")["pos"] == ("Is there exactly one parking meter?", "yes")
    affirmative = f"Is the backpack {predicate} the parking meter?"
    if polarity == "positive":
        assert _modes(prompt, "statement:0") == {"pos": (affirmative, "yes"), "neg": (affirmative, "yes")}
    else:
        assert _modes(prompt, "statement:0") == {
            "pos": (affirmative, "no"),
            "neg": (f"Is the backpack not {predicate} the parking meter?", "yes"),
        }
    (q,) = [q for q in element_questions(prompt) if q.element == "statement:0"]
    assert q.kind == "relation" and q.polarity == polarity and q.objects == (0, 1)


def test_every_category_is_covered() -> None:
    covered = set(ATTRIBUTE_VALUES) | {c for c, _ in RELATIONS}
    assert covered == {c.value for c in Category}


def test_counts_use_plurals_and_the_whole_prompt_question() -> None:
    counting = parse_prompt(
        {"id": "c", "prompt": "a photo of two benches", "include": [{"class": "bench", "count": 2}]}
    )
    assert _modes(counting, "object:0")["pos"] == ("Are there exactly two benches?", "yes")
    prompt = _attribute("material", "negated")
    q = prompt_question(prompt)
    assert q.element == "prompt" and dict(q.modes) == {
        "whole": ('Does this image match the description "a photo of a non-wooden bench"?', "yes")
    }
    assert [plural(n) for n in ("person", "wine glass", "bus", "toothbrush", "knife", "teddy bear", "skis")] == [
        "people",
        "wine glasses",
        "buses",
        "toothbrushes",
        "knives",
        "teddy bears",
        "skis",
    ]


def _prompts_file(tmp_path: Path) -> tuple[Path, list[Prompt]]:
    prompts = [_attribute("material", "negated"), _relation("directional", "above", "negated")]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p.to_json()) + "\n" for p in prompts), encoding="utf-8")
    return path, prompts


def test_the_command_writes_the_file_and_prints_the_mean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, prompts = _prompts_file(tmp_path)
    out = tmp_path / "q.jsonl"
    assert main(["questions", str(src), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "mean element questions per image: 2.50" in printed  # (2 + 3) / 2
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["negt2i"] for r in lines] == ["questions/1"] * 2
    assert [q["element"] for q in lines[1]["questions"]] == ["object:0", "object:1", "statement:0", "prompt"]
    assert lines[1]["questions"][2]["modes"]["neg"] == {
        "text": "Is the backpack not above the parking meter?",
        "expected": "yes",
    }
    read = read_questions(out)
    check_questions(read, prompts, "prompts.jsonl")  # same corpus: fine
    assert main(["questions", str(src), "--out", str(out)]) == 0  # its own file may be rewritten


def test_a_question_file_from_another_corpus_version_is_refused(tmp_path: Path) -> None:
    _, prompts = _prompts_file(tmp_path)
    out = tmp_path / "q.jsonl"
    write_questions(out, prompts, "0" * 64)
    changed = parse_prompt(
        {**prompts[0].to_json(), "statements": [{**prompts[0].to_json()["statements"][0], "value": "metal"}]}
    )
    assert prompt_digest(changed) != prompt_digest(prompts[0])
    with pytest.raises(QuestionsError, match="made from another corpus version"):
        check_questions(read_questions(out), [changed], "results.jsonl")
    with pytest.raises(QuestionsError, match="no questions for prompt"):
        check_questions(read_questions(out), [_attribute("color", "positive")], "results.jsonl")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"negt2i": "results/1"}\n', "not a question file line"),
        ('{"negt2i": "questions/1", "prompt_id": "x"}\n', "malformed question record"),
        ("{oops\n", "q.jsonl:1"),
    ],
)
def test_malformed_question_files_name_the_line(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "q.jsonl").write_text(content)
    with pytest.raises(QuestionsError, match=message):
        read_questions(tmp_path / "q.jsonl")


def test_the_command_refuses_to_overwrite_user_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, _ = _prompts_file(tmp_path)
    precious = tmp_path / "notes.jsonl"
    precious.write_text('{"mine": 1}\n')
    assert main(["questions", str(src), "--out", str(precious)]) == 2
    assert "not a question file; refusing" in capsys.readouterr().err
    assert precious.read_text() == '{"mine": 1}\n'


def test_question_records_round_trip(tmp_path: Path) -> None:
    _, prompts = _prompts_file(tmp_path)
    write_questions(tmp_path / "q.jsonl", prompts, None)
    read: Any = read_questions(tmp_path / "q.jsonl")
    pq = read[prompts[1].id]
    assert pq.prompt_sha256 == prompt_digest(prompts[1]) and pq.setting == "pos0_neg1"
    assert [q.modes for q in pq.questions[:-1]] == [q.modes for q in element_questions(prompts[1])]
