"""Check a corpus file against the benchmark's invariants; every violation names its line.

Per prompt (any file in the core's JSONL format, ours or someone else's):

- the line is valid JSON and valid prompt metadata (``negt2i.core.spec``);
- it has a category and one of the eight settings;
- it names only the 79 benchmark classes (never ``person``), each once, count 1;
- attribute prompts name one object per statement; relation prompts are a star:
  one shared subject (object 0), one distinct target per statement, ``M + 1``
  objects;
- positive statements come before negated ones;
- the prompt text is exactly the template's wording for its metadata;
- an id of the form ``<category>-<setting>-NNN`` agrees with the record.

Across the file: unique ids and prompt texts, and (unless ``partial``)
``per_cell`` prompts in each of the 6 x 8 category-setting cells and all 79
classes in every category.

The two probe sets are checked against the corpus they were made from
(``validate_control_file``, ``validate_paraphrase_file``; ``docs/corpus.md``):
every line's ``source_id`` names a source prompt, its objects (and, for a
paraphrase, statements) are the source's exactly, a control's probes are the
source's statements verbatim, its text is the object phrase with no value,
relation or negation word and ``same_text_as`` marks repeated texts; a
paraphrase's text is its form's wording, read back by the form's grammar to
the same objects and statements, and every source prompt comes in every form.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from negt2i.core.jsonl import iter_json_lines
from negt2i.core.spec import (
    AttributeStatement,
    Polarity,
    Prompt,
    RelationStatement,
    SpecError,
    parse_prompt,
    read_prompts,
)
from negt2i.core.vocab import BENCHMARK_CLASSES
from negt2i.corpus.build import CATEGORIES, PROMPTS_PER_CELL, SETTING_NAMES
from negt2i.corpus.templates import render

_ID_RE = re.compile(r"^([a-z]+)-(pos\d+_neg\d+)-\d+$")


@dataclass(frozen=True)
class Violation:
    """One broken invariant: where (line, id, field) and what."""

    message: str
    line: int | None = None
    id: str | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = [f"line {self.line}" if self.line is not None else "corpus"]
        if self.id:
            where.append(self.id)
        if self.field:
            where.append(f"field {self.field}")
        return f"{': '.join(where)}: {self.message}"


def check_prompt(prompt: Prompt, line: int | None = None) -> list[Violation]:
    """The per-prompt invariants (see the module docstring)."""
    out: list[Violation] = []

    def bad(message: str, field: str | None = None) -> None:
        out.append(Violation(message, line, prompt.id, field))

    if prompt.category is None:
        bad("a benchmark prompt needs a category", "category")
        return out
    if prompt.setting not in SETTING_NAMES:
        bad(f"setting {prompt.setting!r} is not one of {', '.join(SETTING_NAMES)}", "setting")
    for i, obj in enumerate(prompt.objects):
        if obj.class_name not in BENCHMARK_CLASSES:
            bad(f"{obj.class_name!r} is not a benchmark class (COCO without person)", f"include[{i}].class")
        if obj.count != 1:
            bad(f"count must be 1, not {obj.count}", f"include[{i}].count")
    m = len(prompt.statements)
    if prompt.category.is_attribute:
        used = [s.object for s in prompt.statements if isinstance(s, AttributeStatement)]
        if len(prompt.objects) != m or sorted(used) != list(range(m)):
            bad(f"an attribute prompt names one object per statement: {m} statements, {len(prompt.objects)} objects",
                "include")  # fmt: skip
    else:
        rels = [s for s in prompt.statements if isinstance(s, RelationStatement)]
        subjects = {s.subject for s in rels}
        targets = [s.target for s in rels]
        if subjects != {0}:
            bad("a relation prompt's statements share one subject, object 0", "statements")
        if len(prompt.objects) != m + 1 or sorted(targets) != list(range(1, m + 1)):
            bad(f"a star-topology prompt names M+1 objects with one distinct target per statement: "
                f"{m} statements, {len(prompt.objects)} objects", "include")  # fmt: skip
    polarities = [s.polarity for s in prompt.statements]
    if Polarity.NEGATED in polarities and Polarity.POSITIVE in polarities[polarities.index(Polarity.NEGATED) :]:
        bad("positive statements must come before negated ones", "statements")
    try:
        expected = render(prompt)
    except ValueError as exc:
        if not out:
            bad(f"no template form: {exc}", "statements")
    else:
        if expected != prompt.prompt:
            bad(f"text differs from the template: expected {expected!r}", "prompt")
    match = _ID_RE.match(prompt.id)
    if match and (match.group(1), match.group(2)) != (prompt.category.value, prompt.setting):
        bad(f"id says {match.group(1)} {match.group(2)}, the record is {prompt.category.value} {prompt.setting}", "id")
    return out


@dataclass(frozen=True)
class ValidationReport:
    """The result of ``validate_file``: how many prompts parsed, and every violation."""

    prompts: int
    violations: tuple[Violation, ...]

    @property
    def ok(self) -> bool:
        return not self.violations


def validate_prompts(
    prompts: list[tuple[int | None, Prompt]], *, per_cell: int = PROMPTS_PER_CELL, partial: bool = False
) -> list[Violation]:
    """Per-prompt and corpus-level invariants over ``(line, prompt)`` pairs."""
    out: list[Violation] = []
    ids: dict[str, int | None] = {}
    texts: dict[str, int | None] = {}
    cells: Counter[tuple[str, str]] = Counter()
    classes: defaultdict[str, set[str]] = defaultdict(set)
    for line, prompt in prompts:
        out.extend(check_prompt(prompt, line))
        if prompt.id in ids:
            out.append(Violation(f"duplicate id (first on line {ids[prompt.id]})", line, prompt.id, "id"))
        ids.setdefault(prompt.id, line)
        if prompt.prompt in texts:
            out.append(Violation(f"the same prompt text as line {texts[prompt.prompt]}", line, prompt.id, "prompt"))
        texts.setdefault(prompt.prompt, line)
        if prompt.category is not None:
            cells[(prompt.category.value, prompt.setting)] += 1
            classes[prompt.category.value].update(o.class_name for o in prompt.objects)
    if partial:
        return out
    for category in CATEGORIES:
        for setting in SETTING_NAMES:
            n = cells[(category.value, setting)]
            if n != per_cell:
                out.append(Violation(f"{category.value} {setting}: {n} prompts, expected {per_cell}"))
        missing = [c for c in BENCHMARK_CLASSES if c not in classes[category.value]]
        if missing:
            out.append(Violation(f"{category.value}: {len(missing)} classes never used: {', '.join(missing)}"))
    return out


def validate_file(path: str | Path, *, per_cell: int = PROMPTS_PER_CELL, partial: bool = False) -> ValidationReport:
    """Read every line of a corpus file (not stopping at the first error) and check all invariants."""
    out: list[Violation] = []
    prompts: list[tuple[int | None, Prompt]] = []
    index = 0
    for line in iter_json_lines(path):
        lineno, record = line.lineno, line.value
        if line.error is not None:
            out.append(Violation(line.error, lineno))
            continue
        pid = record.get("id") if isinstance(record, dict) else None
        try:
            prompt = parse_prompt(record, default_id=f"{index:05d}")
        except SpecError as exc:
            out.append(Violation(exc.message, lineno, str(pid) if pid is not None else None, exc.field))
            continue
        finally:
            index += 1
        prompts.append((lineno, prompt))
    out.extend(validate_prompts(prompts, per_cell=per_cell, partial=partial))
    out.sort(key=lambda v: (v.line is None, v.line or 0))
    return ValidationReport(len(prompts), tuple(out))


# --------------------------------------------------------------------------- probe sets (control, paraphrase)

KINDS: tuple[str, ...] = ("corpus", "control", "paraphrase")


def _read_lines(path: str | Path, out: list[Violation]) -> list[tuple[int | None, Prompt]]:
    prompts: list[tuple[int | None, Prompt]] = []
    for index, line in enumerate(iter_json_lines(path)):
        if line.error is not None:
            out.append(Violation(line.error, line.lineno))
            continue
        record = line.value
        pid = record.get("id") if isinstance(record, dict) else None
        try:
            prompts.append((line.lineno, parse_prompt(record, default_id=f"{index:05d}")))
        except SpecError as exc:
            out.append(Violation(exc.message, line.lineno, str(pid) if pid is not None else None, exc.field))
    return prompts


def _cell(p: Prompt) -> tuple[str, str]:
    return (p.category.value if p.category is not None else "", p.setting)


def detect_kind(path: str | Path) -> str:
    """``paraphrase`` (records with ``form``), ``control`` (``source_id`` and ``probes``) or ``corpus``."""
    for line in iter_json_lines(path):
        record = line.value if line.error is None else None
        if isinstance(record, dict):
            if "form" in record:
                return "paraphrase"
            if "source_id" in record and "probes" in record:
                return "control"
            return "corpus"
    return "corpus"


def _sources(source: str | Path) -> dict[str, Prompt]:
    return {p.id: p for p in read_prompts(source)}


def validate_control_file(path: str | Path, source: str | Path, *, partial: bool = False) -> ValidationReport:
    """A control set against its source corpus (``negt2i.corpus.control``'s invariants), every violation."""
    from negt2i.corpus.control import SAME_TEXT_KEY, control_id, control_text, stray_words

    out: list[Violation] = []
    prompts = _read_lines(path, out)
    sources = _sources(source)
    first_text: dict[str, str] = {}
    seen_ids: dict[str, int | None] = {}
    covered: set[str] = set()
    for line, p in prompts:

        def bad(message: str, field: str | None = None, *, _line: int | None = line, _id: str = p.id) -> None:
            out.append(Violation(message, _line, _id, field))

        if p.id in seen_ids:
            bad(f"duplicate id (first on line {seen_ids[p.id]})", "id")
        seen_ids.setdefault(p.id, line)
        src = sources.get(p.source_id or "")
        if src is None:
            bad(f"source_id {p.source_id!r} is not a prompt of {source}", "source_id")
            continue
        if p.source_id in covered:
            bad(f"a second control prompt for {p.source_id}", "source_id")
        covered.add(src.id)
        if p.id != control_id(src.id):
            bad(f"id must be {control_id(src.id)!r}", "id")
        if p.category != src.category:
            bad(f"category {p.category} differs from the source's {src.category}", "category")
        if p.objects != src.objects:
            bad("include differs from the source's (same classes, counts and order)", "include")
        if p.statements:
            bad("a control prompt has no statements", "statements")
        if p.probes != src.statements:
            bad("probes must be the source's statements, verbatim", "probes")
        if p.form is not None:
            bad("a control prompt has no form", "form")
        names = [o.class_name for o in p.objects]
        if p.prompt != control_text(names):
            bad(f"text differs from the object phrase: expected {control_text(names)!r}", "prompt")
        stray = stray_words(p.prompt, names)
        if stray:
            bad(f"names a value, relation or negation: {', '.join(stray)}", "prompt")
        marked = p.extra.get(SAME_TEXT_KEY)
        expected = first_text.get(p.prompt)
        if marked != expected:
            want = f"{SAME_TEXT_KEY}: {expected!r}" if expected else f"no {SAME_TEXT_KEY} (first line with this text)"
            bad(f"{SAME_TEXT_KEY} is {marked!r}, expected {want}", SAME_TEXT_KEY)
        first_text.setdefault(p.prompt, p.id)
    if not partial:
        missing = [pid for pid in sources if pid not in covered]
        if missing:
            out.append(Violation(f"{len(missing)} source prompts have no control prompt: {', '.join(missing[:5])}"))
    out.sort(key=lambda v: (v.line is None, v.line or 0))
    return ValidationReport(len(prompts), tuple(out))


def validate_paraphrase_file(path: str | Path, source: str | Path, *, partial: bool = False) -> ValidationReport:
    """A paraphrase set against its source corpus (``negt2i.corpus.paraphrase``'s invariants), every violation."""
    from negt2i.corpus.paraphrase import FORMS, means_the_same, paraphrase_id, render

    out: list[Violation] = []
    prompts = _read_lines(path, out)
    sources = _sources(source)
    forms_of: defaultdict[str, set[str]] = defaultdict(set)
    texts: dict[str, int | None] = {}
    for line, p in prompts:

        def bad(message: str, field: str | None = None, *, _line: int | None = line, _id: str = p.id) -> None:
            out.append(Violation(message, _line, _id, field))

        src = sources.get(p.source_id or "")
        if src is None:
            bad(f"source_id {p.source_id!r} is not a prompt of {source}", "source_id")
            continue
        if p.form not in FORMS:
            bad(f"form {p.form!r} is not one of {', '.join(FORMS)}", "form")
            continue
        if p.form in forms_of[src.id]:
            bad(f"a second {p.form} paraphrase of {src.id}", "form")
        forms_of[src.id].add(p.form)
        if p.id != paraphrase_id(p.form, src.id):
            bad(f"id must be {paraphrase_id(p.form, src.id)!r}", "id")
        if p.category != src.category:
            bad(f"category {p.category} differs from the source's {src.category}", "category")
        if p.objects != src.objects:
            bad("include differs from the source's", "include")
        if p.statements != src.statements:
            bad("statements differ from the source's", "statements")
        if p.probes:
            bad("a paraphrase has no probes", "probes")
        expected = render(src, p.form)
        if p.prompt != expected:
            bad(f"text differs from form {p.form}: expected {expected!r}", "prompt")
        for problem in means_the_same(p):
            bad(problem, "prompt")
        if p.prompt in texts:
            bad(f"the same text as line {texts[p.prompt]}", "prompt")
        texts.setdefault(p.prompt, line)
    all_forms = set().union(*forms_of.values()) if forms_of else set()
    for sid, forms in forms_of.items():
        if forms != all_forms:
            out.append(Violation(f"{sid} lacks forms {', '.join(sorted(all_forms - forms))} that other prompts have"))
    if not partial:
        cells = Counter(_cell(sources[s]) for s in forms_of)
        for category in CATEGORIES:
            for setting in SETTING_NAMES:
                if cells[(category.value, setting)] == 0:
                    message = f"{category.value} {setting}: no source prompt (the subset must be stratified)"
                    out.append(Violation(message))
        if len(set(cells.values())) > 1:
            out.append(Violation(f"cells hold different numbers of source prompts: {sorted(set(cells.values()))}"))
    out.sort(key=lambda v: (v.line is None, v.line or 0))
    return ValidationReport(len(prompts), tuple(out))


__all__ = [
    "KINDS",
    "ValidationReport",
    "Violation",
    "check_prompt",
    "detect_kind",
    "validate_control_file",
    "validate_file",
    "validate_paraphrase_file",
    "validate_prompts",
]
