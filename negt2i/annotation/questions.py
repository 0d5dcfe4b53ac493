"""Element questions of the annotation study (Section 4, Appendix B.2), in both wordings, and their file.

Every prompt is broken into *elements*, keyed as ``negt2i agreement`` keys them:

- ``object:I``: one question per named object (``include[I]``) with its count;
- ``statement:K``: one question per statement (``statements[K]``);
- ``prompt``: one question for the whole prompt.

Each element question comes in the modes the agreement study scores (``negt2i.metrics.agreement.MODES``):

- ``pos``: the annotators' wording, always affirmative ("Is the bench wooden?" for "a non-wooden bench");
  expected answer ``yes`` for objects and positive statements, ``no`` for negated statements;
- ``neg``: negated statements asked in negated form ("Is the bench non-wooden?", "Is the backpack not above
  the parking meter?"), expected ``yes``; objects and positive statements are the ``pos`` questions;
- ``whole`` (element ``prompt`` only): "Does this image match the description "<prompt>"?", expected ``yes``.

Templates (``S``/``T``: the subject / target class, ``v``: the value, ``p``: the predicate; a count n > 1
uses the plural, "Are there exactly two benches?", "Are the benches wooden?")::

    object                      Is there exactly one {S}?
    attribute, pos wording      Is the {S} {v}?
    attribute, neg wording      Is the {S} non-{v}?
    relation, pos wording       Is the {S} {p} the {T}?
    relation, neg wording       Is the {S} not {p} the {T}?
    whole prompt                Does this image match the description "{prompt}"?

File (``negt2i questions``), JSONL, one line per prompt, every line self-describing::

    {"negt2i": "questions/1", "corpus_sha256": "<sha256 of the prompts file>",
     "prompt_sha256": "<sha256 of the prompt record>", "prompt_id": "material-pos0_neg1-000",
     "category": "material", "setting": "pos0_neg1", "prompt": "a photo of a non-wooden bench",
     "questions": [
       {"element": "object:0", "kind": "object", "polarity": "positive", "objects": [0],
        "modes": {"pos": {"text": "Is there exactly one bench?", "expected": "yes"},
                  "neg": {"text": "Is there exactly one bench?", "expected": "yes"}}},
       {"element": "statement:0", "kind": "attribute", "polarity": "negated", "objects": [0],
        "modes": {"pos": {"text": "Is the bench wooden?", "expected": "no"},
                  "neg": {"text": "Is the bench non-wooden?", "expected": "yes"}}},
       {"element": "prompt", "kind": "prompt", "polarity": null, "objects": [],
        "modes": {"whole": {"text": "Does this image match the description \\"a photo of a non-wooden bench\\"?",
                            "expected": "yes"}}}]}

``prompt_sha256`` is the SHA-256 of the prompt record as ``canonical_prompt_json`` writes it (sorted keys,
no spaces): a results line's ``metadata`` gives the same digest for the same prompt, so a question file made
from another corpus version is caught per prompt (``check_questions``). Version 1 is stable: later versions
only add keys.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from negt2i.core.jsonl import iter_json_lines
from negt2i.core.spec import AttributeStatement, Polarity, Prompt, parse_prompt

FORMAT = "questions/1"
MODES_OF_ELEMENTS: tuple[str, ...] = ("pos", "neg")
NUMBER_WORDS: dict[int, str] = {
    1: "one",
    2: "two",
    3: "three",
    4: "four",
    5: "five",
    6: "six",
    7: "seven",
    8: "eight",
    9: "nine",
    10: "ten",
}
_IRREGULAR: dict[str, str] = {
    "person": "people",
    "mouse": "mice",
    "sheep": "sheep",
    "skis": "skis",
    "scissors": "scissors",
    "knife": "knives",
    "hair drier": "hair driers",
}


class QuestionsError(ValueError):
    """A question file that cannot be used (malformed, or made from another corpus version); names the file."""


def plural(name: str) -> str:
    """English plural of a COCO class name ("bench" -> "benches", "wine glass" -> "wine glasses")."""
    if name in _IRREGULAR:
        return _IRREGULAR[name]
    head, _, last = name.rpartition(" ")
    if last in _IRREGULAR:
        word = _IRREGULAR[last]
    elif last.endswith(("s", "x", "ch", "sh")):
        word = last + "es"
    elif last.endswith("y") and last[-2:-1] not in ("a", "e", "i", "o", "u"):
        word = last[:-1] + "ies"
    else:
        word = last + "s"
    return f"{head} {word}" if head else word


def _count_word(n: int) -> str:
    return NUMBER_WORDS.get(n, str(n))


def _the(prompt: Prompt, index: int) -> tuple[str, str]:
    """("the bench", "Is") or ("the benches", "Are") for object ``index``."""
    obj = prompt.objects[index]
    if obj.count > 1:
        return f"the {plural(obj.class_name)}", "Are"
    return f"the {obj.class_name}", "Is"


def object_question(prompt: Prompt, index: int) -> str:
    """``Is there exactly one bench?`` / ``Are there exactly two benches?``."""
    obj = prompt.objects[index]
    if obj.count == 1:
        return f"Is there exactly one {obj.class_name}?"
    return f"Are there exactly {_count_word(obj.count)} {plural(obj.class_name)}?"


def statement_question(prompt: Prompt, index: int, *, negated_form: bool) -> str:
    """Statement ``index`` as a yes / no question; ``negated_form`` words a negated statement as a negation."""
    st = prompt.statements[index]
    neg = negated_form and st.polarity is Polarity.NEGATED
    if isinstance(st, AttributeStatement):
        subject, verb = _the(prompt, st.object)
        return f"{verb} {subject} {'non-' if neg else ''}{st.value}?"
    subject, verb = _the(prompt, st.subject)
    target = f"the {prompt.objects[st.target].class_name}"
    return f"{verb} {subject} {'not ' if neg else ''}{st.predicate} {target}?"


def whole_question(prompt: Prompt) -> str:
    return f'Does this image match the description "{prompt.prompt}"?'


@dataclass(frozen=True, slots=True)
class Question:
    """One element's questions: ``modes`` maps ``pos`` / ``neg`` (or ``whole``) to (text, expected answer)."""

    element: str
    kind: str
    """``object``, ``attribute``, ``relation`` or ``prompt``."""
    polarity: str | None
    objects: tuple[int, ...]
    modes: Mapping[str, tuple[str, str]]

    def to_json(self) -> dict[str, Any]:
        return {
            "element": self.element,
            "kind": self.kind,
            "polarity": self.polarity,
            "objects": list(self.objects),
            "modes": {m: {"text": t, "expected": e} for m, (t, e) in self.modes.items()},
        }


def element_questions(prompt: Prompt) -> list[Question]:
    """The prompt's object and statement questions, in element order (objects, then statements)."""
    out: list[Question] = []
    for i in range(len(prompt.objects)):
        text = object_question(prompt, i)
        out.append(Question(f"object:{i}", "object", "positive", (i,), {"pos": (text, "yes"), "neg": (text, "yes")}))
    for k, st in enumerate(prompt.statements):
        negated = st.polarity is Polarity.NEGATED
        modes = {
            "pos": (statement_question(prompt, k, negated_form=False), "no" if negated else "yes"),
            "neg": (statement_question(prompt, k, negated_form=True), "yes"),
        }
        out.append(Question(f"statement:{k}", st.kind, st.polarity.value, st.object_indices, modes))
    return out


def prompt_question(prompt: Prompt) -> Question:
    return Question("prompt", "prompt", None, (), {"whole": (whole_question(prompt), "yes")})


def canonical_prompt_json(prompt: Prompt) -> str:
    """The prompt record with sorted keys and no spaces: the text ``prompt_sha256`` digests."""
    return json.dumps(prompt.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def prompt_digest(prompt: Prompt) -> str:
    return hashlib.sha256(canonical_prompt_json(prompt).encode("utf-8")).hexdigest()


def question_record(prompt: Prompt, corpus_sha256: str | None) -> dict[str, Any]:
    """One line of the question file (format in the module docstring)."""
    return {
        "negt2i": FORMAT,
        "corpus_sha256": corpus_sha256,
        "prompt_sha256": prompt_digest(prompt),
        "prompt_id": prompt.id,
        "category": prompt.category.value if prompt.category else None,
        "setting": prompt.setting,
        "prompt": prompt.prompt,
        "questions": [q.to_json() for q in [*element_questions(prompt), prompt_question(prompt)]],
    }


def write_questions(path: str | Path, prompts: Iterable[Prompt], corpus_sha256: str | None) -> dict[str, Any]:
    """Write the question file; returns a summary: prompts, element questions, mean per image, by category."""
    n = 0
    elements = 0
    by_category: dict[str, list[int]] = {}
    tmp = Path(str(path) + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for prompt in prompts:
            rec = question_record(prompt, corpus_sha256)
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            k = len(rec["questions"]) - 1
            n += 1
            elements += k
            cat = by_category.setdefault(rec["category"] or "-", [0, 0])
            cat[0] += 1
            cat[1] += k
    tmp.replace(path)
    return {
        "prompts": n,
        "element_questions": elements,
        "mean_element_questions": elements / n if n else 0.0,
        "by_category": {c: v[1] / v[0] for c, v in by_category.items()},
    }


@dataclass(frozen=True, slots=True)
class PromptQuestions:
    """One line of a question file, read back."""

    prompt_id: str
    prompt: str
    prompt_sha256: str
    corpus_sha256: str | None
    category: str | None
    setting: str | None
    questions: tuple[Question, ...]
    where: str


def read_questions(path: str | Path) -> dict[str, PromptQuestions]:
    """A question file by prompt id; raises ``QuestionsError`` naming the line on anything malformed."""
    out: dict[str, PromptQuestions] = {}
    for line in iter_json_lines(path):
        where = f"{path}:{line.lineno}"
        if line.error is not None:
            raise QuestionsError(f"{where}: {line.error}")
        rec = line.value
        if not isinstance(rec, dict) or rec.get("negt2i") != FORMAT:
            raise QuestionsError(f'{where}: not a question file line (expected "negt2i": "{FORMAT}")')
        try:
            qs = tuple(
                Question(
                    str(q["element"]),
                    str(q["kind"]),
                    q.get("polarity"),
                    tuple(int(o) for o in q.get("objects", [])),
                    {str(m): (str(v["text"]), str(v["expected"])) for m, v in q["modes"].items()},
                )
                for q in rec["questions"]
            )
            pq = PromptQuestions(
                str(rec["prompt_id"]),
                str(rec["prompt"]),
                str(rec["prompt_sha256"]),
                rec.get("corpus_sha256"),
                rec.get("category"),
                rec.get("setting"),
                qs,
                where,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise QuestionsError(f"{where}: malformed question record ({exc!r})") from None
        if pq.prompt_id in out:
            raise QuestionsError(f"{where}: prompt {pq.prompt_id} again (first at {out[pq.prompt_id].where})")
        out[pq.prompt_id] = pq
    return out


def check_questions(questions: Mapping[str, PromptQuestions], prompts: Iterable[Prompt], source: str) -> None:
    """Every prompt must have questions made from the same prompt record (digest), else ``QuestionsError``."""
    for prompt in prompts:
        pq = questions.get(prompt.id)
        if pq is None:
            raise QuestionsError(f"the question file has no questions for prompt {prompt.id} (from {source})")
        if pq.prompt_sha256 != prompt_digest(prompt):
            raise QuestionsError(
                f"{pq.where}: prompt {prompt.id} differs from the one in {source} (prompt_sha256 "
                f"{pq.prompt_sha256[:12]} vs {prompt_digest(prompt)[:12]}): the question file was made from another "
                f"corpus version (corpus sha256 {str(pq.corpus_sha256)[:12]}); run `negt2i questions` on the "
                "prompts the images were generated from"
            )


def prompt_of_metadata(metadata: Any, where: str) -> Prompt:
    """The prompt of a results line's ``metadata`` (a JSON string or object)."""
    try:
        rec = json.loads(metadata) if isinstance(metadata, str) else metadata
        return parse_prompt(rec)
    except (ValueError, TypeError) as exc:
        raise QuestionsError(f"{where}: the results line has no readable prompt metadata ({exc})") from None


def iter_question_texts(record: Mapping[str, Any]) -> Iterator[tuple[str, str, str, str]]:
    """(element, mode, text, expected) of one question-file record, for judge harnesses."""
    for q in record["questions"]:
        for mode, v in q["modes"].items():
            yield q["element"], mode, v["text"], v["expected"]
