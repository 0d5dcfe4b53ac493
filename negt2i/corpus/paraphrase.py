"""The paraphrase set: corpus prompts reworded in other negation forms, same objects and statements (Appendix F).

The corpus expresses negation in one English form ("a non-red cup", "the cup is
not left of the dog"). A paraphrase keeps a corpus prompt's ``include`` and
``statements`` exactly (so it is scored by the same rules) and changes only the
wording; positive statements are reworded in the same style, so no form ever
equals the original text:

================== ============================================== ==============================================
form               attribute prompt                               relation prompt
================== ============================================== ==============================================
(original)         a photo of a red cup and a non-red bench       a photo of a cup and a dog, where the cup is
                                                                  not left of the dog
``that_is_not``    a photo of a cup that is red and a bench that  a photo of a cup that is not left of a dog
                   is not red
``which_isnt``     a photo of a cup which is red and a bench      a photo of a cup which isn't left of a dog
                   which isn't red
``with_not``       a photo of a cup and a bench, with the cup     a photo of a cup and a dog, with the cup not
                   red and the bench not red                      left of the dog
``sentences_isnt`` a photo of a cup and a bench. The cup is red.  a photo of a cup and a dog. The cup isn't left
                   The bench isn't red.                           of the dog.
================== ============================================== ==============================================

The four differ in where the negation sits (before the noun in the original;
in a relative clause right after it; in a trailing absolute phrase; in a
separate sentence), in its spelling (``non-``, ``is not``, ``isn't``, bare
``not``) and in the distance between the noun and its negated value. Relation
prompts keep the star topology: in ``that_is_not`` / ``which_isnt`` the subject
is named once and every clause names its target with ``a`` ("a photo of a
laptop that is right of a zebra, is not below a surfboard, and is not right of
a carrot"); in ``with_not`` and ``sentences_isnt`` the object list comes first,
as in the templates. Lists join as in ``templates.join_list``. Every object is
named by its class name; no form adds or drops an object.

``render(prompt, form)`` writes a form; ``parse(text, form, category)`` reads
one back with the same grammar (objects and statements), which is how the
tests and ``negt2i corpus validate`` check that a text says exactly what its
metadata says.

The set is a stratified subset: ``per_cell`` source prompts from every
category x setting cell (drawn with ``random.Random("negt2ibench-paraphrase:
<seed>:<category>/<setting>")``, then in corpus order), each in every form. A
paraphrase's id is ``paraphrase-<form>-<source id>``; lines go by source prompt,
then form.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from negt2i import __version__
from negt2i.core.spec import AttributeStatement, Polarity, Prompt, RelationStatement
from negt2i.core.vocab import COCO_CLASSES, PREDICATES, VALUES, Category
from negt2i.corpus.control import file_sha256, set_bytes
from negt2i.corpus.templates import PREFIX, join_list

FORMAT: Final[str] = "negt2ibench-paraphrase/1"
ID_PREFIX: Final[str] = "paraphrase-"
FORMS: Final[tuple[str, ...]] = ("that_is_not", "which_isnt", "with_not", "sentences_isnt")
"""The negation forms, in file order (see the module docstring)."""
FORM_DESCRIPTIONS: Final[dict[str, str]] = {
    "that_is_not": "relative clause after the noun, full negation: 'a cup that is not red'",
    "which_isnt": "relative clause after the noun, contracted negation: 'a cup which isn't red'",
    "with_not": "object list, then an absolute phrase, bare negation: 'with the cup not red'",
    "sentences_isnt": "object list, then one sentence per statement, contracted: 'The cup isn't red.'",
}
DEFAULT_PER_CELL: Final[int] = 10

_RELATIVE: Final[dict[str, str]] = {"that_is_not": "that", "which_isnt": "which"}
_SEPARATOR: Final[dict[str, str]] = {"with_not": ", with ", "sentences_isnt": ". "}


class ParseError(ValueError):
    """A text that the form's grammar does not produce."""


def paraphrase_id(form: str, source_id: str) -> str:
    """``paraphrase-<form>-<source id>``."""
    return f"{ID_PREFIX}{form}-{source_id}"


def _check_form(form: str) -> None:
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r} (expected one of {', '.join(FORMS)})")


def copula(polarity: Polarity, form: str) -> str:
    """The words before a value / predicate, with their trailing space: ``is ``, ``is not ``, ``isn't ``,
    ``not `` or nothing (``with_not``'s positive)."""
    if form == "with_not":
        return "not " if polarity is Polarity.NEGATED else ""
    if polarity is Polarity.POSITIVE:
        return "is "
    return "is not " if form == "that_is_not" else "isn't "


def render(prompt: Prompt, form: str) -> str:
    """The text of ``prompt`` in ``form`` (the prompt must have a template form: one object per attribute
    statement in order, or a star with subject 0 and targets 1, 2, ... in order)."""
    _check_form(form)
    if prompt.category is None or not prompt.statements:
        raise ValueError("only prompts with a category and statements have paraphrases")
    names = [o.class_name for o in prompt.objects]
    head = PREFIX + join_list([f"a {n}" for n in names])
    if prompt.category.is_attribute:
        attrs = [s for s in prompt.statements if isinstance(s, AttributeStatement)]
        if [s.object for s in attrs] != list(range(len(names))) or len(attrs) != len(prompt.statements):
            raise ValueError("attribute statements must name objects 0, 1, ... in order, one each")
        if form in _RELATIVE:
            items = [f"a {names[s.object]} {_RELATIVE[form]} {copula(s.polarity, form)}{s.value}" for s in attrs]
            return PREFIX + join_list(items)
        if form == "with_not":
            return head + ", with " + join_list([f"the {names[s.object]} {copula(s.polarity, form)}{s.value}"
                                                 for s in attrs])  # fmt: skip
        return head + ". " + " ".join(f"The {names[s.object]} {copula(s.polarity, form)}{s.value}." for s in attrs)
    rels = [s for s in prompt.statements if isinstance(s, RelationStatement)]
    if len(rels) != len(prompt.statements) or any(s.subject != 0 for s in rels):
        raise ValueError("relation statements must share object 0 as their subject")
    if [s.target for s in rels] != list(range(1, len(names))):
        raise ValueError("relation statements must target objects 1, 2, ... in order, one each")
    subject = names[0]
    if form in _RELATIVE:
        clauses = [f"{copula(s.polarity, form)}{s.predicate} a {names[s.target]}" for s in rels]
        return f"{PREFIX}a {subject} {_RELATIVE[form]} {join_list(clauses)}"
    if form == "with_not":
        clauses = [f"{copula(s.polarity, form)}{s.predicate} the {names[s.target]}" for s in rels]
        return f"{head}, with the {subject} {join_list(clauses)}"
    sentences = [f"The {subject} {copula(s.polarity, form)}{s.predicate} the {names[s.target]}." for s in rels]
    return head + ". " + " ".join(sentences)


def paraphrase_prompt(source: Prompt, form: str) -> Prompt:
    """``source`` reworded in ``form``: same category, tag, ``include`` and ``statements``."""
    return Prompt(
        id=paraphrase_id(form, source.id),
        prompt=render(source, form),
        category=source.category,
        tag=source.tag,
        objects=source.objects,
        statements=source.statements,
        source_id=source.id,
        form=form,
    )


# --------------------------------------------------------------------------- the grammar, read back


def _alt(words: Sequence[str]) -> str:
    """A regex alternation, longest first (so "wine glass" wins over "glass")."""
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


_CLASS = f"(?:{_alt(COCO_CLASSES)})"
_COPULA_RE: Final[dict[str, str]] = {
    "that_is_not": "(is |is not )",
    "which_isnt": "(is |isn't )",
    "with_not": "((?:not )?)",
    "sentences_isnt": "(is |isn't )",
}


def split_list(text: str) -> list[str]:
    """The inverse of ``join_list`` (items never contain ``", "`` or ``" and "``); raises ``ParseError``."""
    if ", " in text:
        parts = text.split(", ")
        if len(parts) < 3 or not parts[-1].startswith("and "):
            raise ParseError(f"not a serial-comma list: {text!r}")
        parts[-1] = parts[-1][4:]
    else:
        parts = text.split(" and ")
        if len(parts) > 2:
            raise ParseError(f"three or more items need the serial comma: {text!r}")
    if join_list(parts) != text or any(not p for p in parts):
        raise ParseError(f"not a list: {text!r}")
    return parts


def _match(pattern: str, text: str) -> re.Match[str]:
    m = re.fullmatch(pattern, text)
    if m is None:
        raise ParseError(f"{text!r} does not match {pattern!r}")
    return m


def _polarity(words: str, form: str) -> Polarity:
    for polarity in Polarity:
        if copula(polarity, form) == words:
            return polarity
    raise ParseError(f"form {form} never writes {words!r}")  # pragma: no cover - the regex admits only these


def parse(text: str, form: str, category: Category) -> tuple[list[str], list[AttributeStatement | RelationStatement]]:
    """Objects (class names, in order) and statements of a text in ``form``; raises ``ParseError``.

    The exact inverse of ``render``: ``parse(render(p, f), f, p.category)`` gives ``p``'s class
    names and statements, and a text ``render`` cannot produce raises.
    """
    _check_form(form)
    if not text.startswith(PREFIX):
        raise ParseError(f"does not start with {PREFIX!r}")
    body = text[len(PREFIX) :]
    cop = _COPULA_RE[form]
    word = f"(?:{_alt(VALUES[category])})" if category.is_attribute else f"(?:{_alt(PREDICATES[category])})"
    out: list[AttributeStatement | RelationStatement] = []
    if category.is_attribute:
        if form in _RELATIVE:
            names = []
            for i, item in enumerate(split_list(body)):
                m = _match(rf"a ({_CLASS}) {_RELATIVE[form]} {cop}({word})", item)
                names.append(m.group(1))
                out.append(AttributeStatement(object=i, value=m.group(3), polarity=_polarity(m.group(2), form)))
            return names, out
        head, rest = _split_head(body, form)
        names = _object_list(head)
        the = "The" if form == "sentences_isnt" else "the"
        items = _sentences(rest) if form == "sentences_isnt" else split_list(rest)
        if len(items) != len(names):
            raise ParseError(f"{len(names)} objects but {len(items)} statements")
        for i, item in enumerate(items):
            m = _match(rf"{the} ({_CLASS}) {cop}({word})", item)
            if m.group(1) != names[i]:
                raise ParseError(f"statement {i} is about {m.group(1)!r}, object {i} is {names[i]!r}")
            out.append(AttributeStatement(object=i, value=m.group(3), polarity=_polarity(m.group(2), form)))
        return names, out
    if form in _RELATIVE:
        m = _match(rf"a ({_CLASS}) {_RELATIVE[form]} (.+)", body)
        names = [m.group(1)]
        for item in split_list(m.group(2)):
            c = _match(rf"{cop}({word}) a ({_CLASS})", item)
            names.append(c.group(3))
            out.append(_relation(len(names) - 1, c.group(2), _polarity(c.group(1), form)))
        return names, out
    head, rest = _split_head(body, form)
    names = _object_list(head)
    if form == "with_not":
        m = _match(rf"the ({_CLASS}) (.+)", rest)
        subjects = [m.group(1)]
        parts = [_match(rf"{cop}({word}) the ({_CLASS})", item).groups() for item in split_list(m.group(2))]
    else:
        matched = [_match(rf"The ({_CLASS}) {cop}({word}) the ({_CLASS})", item).groups() for item in _sentences(rest)]
        subjects = [g[0] for g in matched]
        parts = [g[1:] for g in matched]
    if any(s != names[0] for s in subjects):
        raise ParseError(f"every statement must be about the subject {names[0]!r}")
    if [p[2] for p in parts] != names[1:]:
        raise ParseError(f"the statements' targets {[p[2] for p in parts]} are not the objects {names[1:]}")
    for k, (words, predicate, _) in enumerate(parts):
        out.append(_relation(k + 1, predicate, _polarity(words, form)))
    return names, out


def _relation(target: int, predicate: str, polarity: Polarity) -> RelationStatement:
    return RelationStatement(subject=0, target=target, predicate=predicate, polarity=polarity)


def _split_head(body: str, form: str) -> tuple[str, str]:
    """The object list and the statements: split at the one ``, with `` or at the first ``. ``."""
    sep = _SEPARATOR[form]
    if sep not in body or (form == "with_not" and body.count(sep) != 1):
        raise ParseError(f"expected {sep.strip()!r} between the objects and the statements")
    head, rest = body.split(sep, 1)
    return head, rest


def _object_list(head: str) -> list[str]:
    return [_match(rf"a ({_CLASS})", item).group(1) for item in split_list(head)]


def _sentences(text: str) -> list[str]:
    if not text.endswith("."):
        raise ParseError("the last sentence needs a full stop")
    items = text[:-1].split(". ")
    if any(not s for s in items):
        raise ParseError(f"empty sentence in {text!r}")
    return items


def means_the_same(prompt: Prompt) -> list[str]:
    """Problems with a paraphrase's text against its metadata (empty when the form's grammar reads back exactly
    its ``include`` and ``statements``)."""
    if prompt.form is None or prompt.category is None:
        return ["a paraphrase needs a form and a category"]
    try:
        names, statements = parse(prompt.prompt, prompt.form, prompt.category)
    except (ParseError, ValueError) as exc:
        return [f"the text is not in form {prompt.form}: {exc}"]
    out: list[str] = []
    if names != [o.class_name for o in prompt.objects]:
        out.append(f"the text names {names}, the record {[o.class_name for o in prompt.objects]}")
    if tuple(statements) != prompt.statements:
        out.append("the text's statements differ from the record's")
    return out


# --------------------------------------------------------------------------- the set


def select_sources(sources: Sequence[Prompt], *, per_cell: int, seed: int = 0) -> list[Prompt]:
    """``per_cell`` prompts of every category x setting cell (seeded draw), in corpus order."""
    cells: dict[tuple[str, str], list[Prompt]] = {}
    for p in sources:
        if p.category is None or not p.statements:
            raise ValueError(f"{p.id}: only prompts with a category and statements have paraphrases")
        cells.setdefault((p.category.value, p.setting), []).append(p)
    chosen: set[str] = set()
    for (category, setting), prompts in sorted(cells.items()):
        rng = random.Random(f"negt2ibench-paraphrase:{seed}:{category}/{setting}")
        ids = sorted(p.id for p in prompts)
        chosen.update(rng.sample(ids, min(per_cell, len(ids))))
    return [p for p in sources if p.id in chosen]


def build_paraphrase(
    sources: Sequence[Prompt], *, per_cell: int = DEFAULT_PER_CELL, seed: int = 0, forms: Sequence[str] = FORMS
) -> list[Prompt]:
    """The paraphrase set: every selected source prompt in every form (by source, then form)."""
    for form in forms:
        _check_form(form)
    return [paraphrase_prompt(p, form) for p in select_sources(sources, per_cell=per_cell, seed=seed) for form in forms]


def paraphrase_metadata(
    prompts: Sequence[Prompt], source: str | Path, *, per_cell: int, seed: int, forms: Sequence[str]
) -> dict[str, Any]:
    """What made a paraphrase set: source corpus (path, SHA-256), draw, forms, sizes, the file's SHA-256."""
    return {
        "format": FORMAT,
        "negt2i_version": __version__,
        "source": {"path": Path(source).as_posix(), "sha256": file_sha256(source)},
        "per_cell": per_cell,
        "seed": seed,
        "forms": {f: FORM_DESCRIPTIONS[f] for f in forms},
        "source_prompts": len({p.source_id for p in prompts}),
        "prompts": len(prompts),
        "sha256": hashlib.sha256(set_bytes(prompts)).hexdigest(),
    }


__all__ = [
    "DEFAULT_PER_CELL",
    "FORMAT",
    "FORMS",
    "FORM_DESCRIPTIONS",
    "ParseError",
    "build_paraphrase",
    "copula",
    "means_the_same",
    "paraphrase_id",
    "paraphrase_metadata",
    "paraphrase_prompt",
    "parse",
    "render",
    "select_sources",
    "split_list",
]
