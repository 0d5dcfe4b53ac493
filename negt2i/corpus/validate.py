"""Check a corpus file against the benchmark's invariants; every violation names its line.

Per prompt (any file in the core's JSONL format, ours or someone else's):

- the line is valid JSON and valid prompt metadata (``negt2i.spec``);
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
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from negt2i.corpus.build import CATEGORIES, PROMPTS_PER_CELL, SETTING_NAMES
from negt2i.corpus.templates import render
from negt2i.jsonl import iter_json_lines
from negt2i.spec import AttributeStatement, Polarity, Prompt, RelationStatement, SpecError, parse_prompt
from negt2i.vocab import BENCHMARK_CLASSES

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


__all__ = ["ValidationReport", "Violation", "check_prompt", "validate_file", "validate_prompts"]
