"""Prompt records: what a prompt asks for, read from and written to GenEval-style JSONL.

One JSON object per line. GenEval's keys are kept (``tag``, ``prompt``, ``include`` with
``class`` / ``count``) so GenEval tooling still reads our files; NegT2IBench adds
``id``, ``category``, ``setting`` and ``statements``::

    {"id": "color-pos0_neg1-000", "tag": "color", "category": "color",
     "setting": "pos0_neg1", "prompt": "a photo of a non-brown orange",
     "include": [{"class": "orange", "count": 1}],
     "statements": [{"kind": "attribute", "object": 0, "value": "brown",
                     "polarity": "negated"}]}

Relation statements read ``{"kind": "relation", "subject": 0, "target": 1,
"predicate": "left of", "polarity": "positive"}``; ``object``, ``subject`` and
``target`` index ``include``.

Three optional keys serve the probe sets (``docs/corpus.md``), and are written
only when set, so every other record reads and writes exactly as before:

- ``probes``: statements in the same encoding that are *measured* on the image
  and recorded per probe in the verdict, but are never part of correctness (a
  control prompt keeps its source prompt's statements here);
- ``source_id``: the id of the corpus prompt a control or paraphrase was made from;
- ``form``: the wording of a paraphrase (``docs/corpus.md`` lists the forms).

Reading also accepts GenEval's own statement encodings as positive statements: an
``include`` entry's ``"color": "red"`` (a color statement on that object) and
``"position": ["left of", j]`` (this object is left of object ``j``). GenEval's
``exclude`` entries are accepted only where they restate the over-count rule
(``count`` one more than the same class's ``include`` count); anything else is an
error, never silently dropped. Unknown top-level keys are kept in ``extra`` and
written back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from negt2i.core.jsonl import iter_json_lines
from negt2i.core.vocab import BENCHMARK_CLASSES, COCO_CLASSES, PREDICATES, VALUES, Category, did_you_mean, setting_name

SETTING_RE = re.compile(r"^pos(\d+)_neg(\d+)$")

MAX_OBJECTS = 16
"""Most ``include`` entries per prompt (the corpus uses at most 5)."""
MAX_STATEMENTS = 64
"""Most statements per prompt (the corpus uses at most 4)."""
MAX_TEXT_CHARS = 4096
"""Longest text field of a prompt: ``id``, ``prompt``, ``tag``, class names, values, predicates."""
MAX_EXTRA_BYTES = 64 * 1024
"""Largest JSON of the extra (unknown) keys of a prompt, in bytes (UTF-8)."""
MAX_EXTRA_DEPTH = 16
"""Deepest nesting of the extra keys' JSON values (a scalar is depth 0, ``[1]`` depth 1)."""
_KNOWN_KEYS = frozenset(
    {"id", "tag", "category", "setting", "prompt", "include", "statements", "exclude", "probes", "source_id", "form"}
)


class SpecError(ValueError):
    """Invalid prompt metadata; names the line (when read from a file) and the field."""

    def __init__(self, message: str, *, field: str | None = None, line: int | None = None) -> None:
        self.message = message
        self.field = field
        self.line = line
        where = []
        if line is not None:
            where.append(f"line {line}")
        if field:
            where.append(f"field {field}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)

    def at_line(self, line: int) -> SpecError:
        """The same error, located at ``line`` of a file."""
        return SpecError(self.message, field=self.field, line=line)


class Polarity(StrEnum):
    """Whether a statement must hold (positive) or must not hold (negated)."""

    POSITIVE = "positive"
    NEGATED = "negated"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class ObjectSpec(_Frozen):
    """A named object: its class and how many instances the prompt asks for."""

    class_name: str = Field(alias="class")
    count: int = Field(1, ge=1)

    def to_json(self) -> dict[str, Any]:
        return {"class": self.class_name, "count": self.count}


class AttributeStatement(_Frozen):
    """``object`` carries (positive) or does not carry (negated) the attribute ``value``."""

    kind: Literal["attribute"] = "attribute"
    object: int = Field(ge=0)
    value: str
    polarity: Polarity = Polarity.POSITIVE

    @property
    def object_indices(self) -> tuple[int, ...]:
        return (self.object,)


class RelationStatement(_Frozen):
    """``subject`` stands (positive) or does not stand (negated) in ``predicate`` to ``target``."""

    kind: Literal["relation"] = "relation"
    subject: int = Field(ge=0)
    target: int = Field(ge=0)
    predicate: str
    polarity: Polarity = Polarity.POSITIVE

    @property
    def object_indices(self) -> tuple[int, ...]:
        return (self.subject, self.target)


Statement = Annotated[AttributeStatement | RelationStatement, Field(discriminator="kind")]


class Prompt(_Frozen):
    """A validated prompt: its objects, its statements and their polarity."""

    id: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    category: Category | None = None
    tag: str = ""
    objects: tuple[ObjectSpec, ...] = Field(min_length=1)
    statements: tuple[Statement, ...] = ()
    probes: tuple[Statement, ...] = ()
    """Measured and recorded, never part of correctness (see the module docstring)."""
    source_id: str | None = None
    """The corpus prompt this control / paraphrase was made from."""
    form: str | None = None
    """The wording of a paraphrase."""
    extra: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> Prompt:
        _validate(self)
        return self

    @property
    def n_positive(self) -> int:
        return sum(s.polarity is Polarity.POSITIVE for s in self.statements)

    @property
    def n_negated(self) -> int:
        return sum(s.polarity is Polarity.NEGATED for s in self.statements)

    @property
    def setting(self) -> str:
        """``pos{P}_neg{N}``: the numbers of positive and negated statements."""
        return setting_name(self.n_positive, self.n_negated)

    def describe(self, index: int) -> str:
        """Statement ``index`` in words, e.g. ``the laptop is not right of the carrot``."""
        return self.describe_statement(self.statements[index])

    def describe_statement(self, st: AttributeStatement | RelationStatement) -> str:
        """A statement (or probe) over this prompt's objects in words."""
        neg = st.polarity is Polarity.NEGATED
        if isinstance(st, AttributeStatement):
            name = self.objects[st.object].class_name
            return f"a {'non-' if neg else ''}{st.value} {name}"
        subject = self.objects[st.subject].class_name
        target = self.objects[st.target].class_name
        return f"the {subject} is {'not ' if neg else ''}{st.predicate} the {target}"

    def to_json(self) -> dict[str, Any]:
        """The JSONL record (GenEval keys first, then NegT2IBench's)."""
        out: dict[str, Any] = {
            "id": self.id,
            "tag": self.tag or (self.category.value if self.category else ""),
            "category": self.category.value if self.category else None,
            "setting": self.setting,
            "prompt": self.prompt,
            "include": [o.to_json() for o in self.objects],
            "statements": [s.model_dump(mode="json") for s in self.statements],
        }
        if self.probes:
            out["probes"] = [s.model_dump(mode="json") for s in self.probes]
        if self.source_id is not None:
            out["source_id"] = self.source_id
        if self.form is not None:
            out["form"] = self.form
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out


def _fail(field: str, message: str) -> None:
    raise SpecError(message, field=field)


def _validate(p: Prompt) -> None:
    """Every check on a prompt's metadata; raises ``SpecError`` naming the field."""
    seen: dict[str, int] = {}
    for i, obj in enumerate(p.objects):
        if obj.class_name not in COCO_CLASSES:
            hint = did_you_mean(obj.class_name, COCO_CLASSES)
            _fail(f"include[{i}].class", f"unknown class {obj.class_name!r} (not one of the 80 COCO classes{hint})")
        if obj.class_name in seen:
            _fail(
                f"include[{i}].class", f"class {obj.class_name!r} is already named by include[{seen[obj.class_name]}]"
            )
        seen[obj.class_name] = i
    if p.statements and p.category is None:
        _fail("category", "a prompt with statements needs a category")
    if p.probes and p.category is None:
        _fail("category", "a prompt with probes needs a category")
    _validate_statements(p, p.statements, "statements")
    _validate_statements(p, p.probes, "probes")


def _validate_statements(p: Prompt, statements: tuple[Statement, ...], key: str) -> None:
    """The checks on ``statements`` (or ``probes``): indices, counts, category, vocabulary, no repeats."""
    for k, st in enumerate(statements):
        field = f"{key}[{k}]"
        for name, idx in (("object", getattr(st, "object", None)), ("subject", getattr(st, "subject", None)),
                          ("target", getattr(st, "target", None))):  # fmt: skip
            if idx is not None and idx >= len(p.objects):
                _fail(f"{field}.{name}", f"points at object {idx}, but the prompt names {len(p.objects)} objects")
        for idx in st.object_indices:
            if p.objects[idx].count != 1:
                _fail(
                    f"include[{idx}].count",
                    f"object {p.objects[idx].class_name!r} is used by {field} and must have count 1, "
                    f"not {p.objects[idx].count}",
                )
        assert p.category is not None  # checked above
        if isinstance(st, AttributeStatement):
            if not p.category.is_attribute:
                _fail(f"{field}.kind", f"an attribute statement in a {p.category} prompt")
            if st.value not in VALUES[p.category]:
                _fail(
                    f"{field}.value",
                    f"{st.value!r} is not a {p.category} value{did_you_mean(st.value, VALUES[p.category])} "
                    f"(expected one of {', '.join(VALUES[p.category])})",
                )
        else:
            if not p.category.is_relation:
                _fail(f"{field}.kind", f"a relation statement in a {p.category} prompt")
            if st.predicate not in PREDICATES[p.category]:
                allowed = ", ".join(PREDICATES[p.category])
                _fail(
                    f"{field}.predicate",
                    f"unknown predicate {st.predicate!r} for category {p.category}"
                    f"{did_you_mean(st.predicate, PREDICATES[p.category])} (expected one of {allowed})",
                )
            if st.subject == st.target:
                _fail(f"{field}.target", "a relation's subject and target must be different objects")
    made: set[tuple[Any, ...]] = set()  # linear: one set lookup per statement
    for k, st in enumerate(statements):
        same: tuple[Any, ...] = (
            ("attribute", st.object, st.value)
            if isinstance(st, AttributeStatement)
            else ("relation", st.subject, st.target, st.predicate)
        )
        if same in made:
            _fail(f"{key}[{k}]", "the same statement is made twice")
        made.add(same)


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value (scalar 0, ``[]`` / ``{}`` 1), counted iteratively up to ``limit + 1``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, Mapping | list | tuple):
            d += 1
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((c, d) for c in (v.values() if isinstance(v, Mapping) else v))
    return deepest


def check_extra(extra: Mapping[str, Any], field: str = "extra") -> None:
    """The size and depth limits of a prompt's extra keys (``MAX_EXTRA_BYTES``, ``MAX_EXTRA_DEPTH``)."""
    depth = json_depth(extra, MAX_EXTRA_DEPTH + 1)
    if depth > MAX_EXTRA_DEPTH + 1:  # the record itself is one level
        raise SpecError(f"nested deeper than {MAX_EXTRA_DEPTH} levels", field=field)
    try:
        size = len(json.dumps(dict(extra), ensure_ascii=False, separators=(",", ":")).encode())
    except (TypeError, ValueError) as exc:
        raise SpecError(f"not JSON-serializable ({exc})", field=field) from None
    if size > MAX_EXTRA_BYTES:
        raise SpecError(f"{size} bytes of extra keys, above the limit of {MAX_EXTRA_BYTES}", field=field)


def _check_text(value: Any, field: str) -> None:
    if isinstance(value, str) and len(value) > MAX_TEXT_CHARS:
        raise SpecError(f"{len(value)} characters, above the limit of {MAX_TEXT_CHARS}", field=field)


def check_limits(record: Mapping[str, Any]) -> None:
    """The size limits of a prompt record (``MAX_*`` above), checked before any other validation so that
    the work a record can cause is bounded and linear in its size; raises ``SpecError``."""
    for key in ("id", "prompt", "tag", "category", "setting", "source_id", "form"):
        _check_text(record.get(key), key)
    include = record.get("include")
    if isinstance(include, list):
        if len(include) > MAX_OBJECTS:
            raise SpecError(f"{len(include)} objects, above the limit of {MAX_OBJECTS}", field="include")
        for i, entry in enumerate(include):
            if isinstance(entry, Mapping):
                _check_text(entry.get("class"), f"include[{i}].class")
                _check_text(entry.get("color"), f"include[{i}].color")
    for list_key in ("statements", "probes"):
        statements = record.get(list_key)
        if isinstance(statements, list):
            if len(statements) > MAX_STATEMENTS:
                raise SpecError(f"{len(statements)} {list_key}, above the limit of {MAX_STATEMENTS}", field=list_key)
            for k, st in enumerate(statements):
                if isinstance(st, Mapping):
                    for key in ("kind", "value", "predicate", "polarity"):
                        _check_text(st.get(key), f"{list_key}[{k}].{key}")
    exclude = record.get("exclude")
    if isinstance(exclude, list) and len(exclude) > MAX_OBJECTS:
        raise SpecError(f"{len(exclude)} entries, above the limit of {MAX_OBJECTS}", field="exclude")
    extra = {k: v for k, v in record.items() if k not in _KNOWN_KEYS}
    if extra:
        check_extra(extra)


def parse_prompt(record: Mapping[str, Any], *, default_id: str | None = None) -> Prompt:
    """Build a prompt from one JSON record (ours or GenEval's); raises ``SpecError``."""
    if not isinstance(record, Mapping):
        raise SpecError(f"expected a JSON object, got {type(record).__name__}")
    check_limits(record)
    for key in ("prompt", "include"):
        if key not in record:
            raise SpecError("missing required key", field=key)
    include = record["include"]
    if not isinstance(include, list) or not include:
        raise SpecError("must be a non-empty list of objects", field="include")
    pid = record.get("id", default_id)
    if pid is None:
        raise SpecError("missing required key", field="id")

    objects: list[dict[str, Any]] = []
    statements: list[dict[str, Any]] = []
    inferred: set[Category] = set()
    for i, entry in enumerate(include):
        if not isinstance(entry, Mapping):
            raise SpecError("must be an object", field=f"include[{i}]")
        unknown = set(entry) - {"class", "count", "color", "position"}
        if unknown:
            raise SpecError(f"unknown keys {sorted(unknown)}", field=f"include[{i}]")
        if "class" not in entry:
            raise SpecError("missing required key", field=f"include[{i}].class")
        count = entry.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise SpecError(f"count must be a positive integer, got {count!r}", field=f"include[{i}].count")
        objects.append({"class": entry["class"], "count": count})
        if "color" in entry:
            inferred.add(Category.COLOR)
            statements.append({"kind": "attribute", "object": i, "value": entry["color"], "polarity": "positive"})
        if "position" in entry:
            pos = entry["position"]
            if not (isinstance(pos, list) and len(pos) == 2 and isinstance(pos[0], str) and isinstance(pos[1], int)):
                raise SpecError(f"expected [relation, index], got {pos!r}", field=f"include[{i}].position")
            inferred.add(Category.DIRECTIONAL)
            statements.append(
                {"kind": "relation", "subject": i, "target": pos[1], "predicate": pos[0], "polarity": "positive"}
            )

    for j, ex in enumerate(record.get("exclude", []) or []):
        field = f"exclude[{j}]"
        match = [o for o in objects if isinstance(ex, Mapping) and o["class"] == ex.get("class")]
        if not match or ex.get("count") != match[0]["count"] + 1 or set(ex) - {"class", "count"}:
            raise SpecError(
                "only exclude entries that restate the over-count rule are supported "
                "(same class as an include entry, count one more)",
                field=field,
            )

    raw_statements = record.get("statements", [])
    if not isinstance(raw_statements, list):
        raise SpecError("must be a list", field="statements")
    statements.extend(raw_statements)
    probes = record.get("probes", [])
    if not isinstance(probes, list):
        raise SpecError("must be a list", field="probes")
    for key in ("source_id", "form"):
        if record.get(key) is not None and (not isinstance(record[key], str) or not record[key]):
            raise SpecError(f"must be a non-empty string, got {record[key]!r}", field=key)

    category = record.get("category")
    if category is None and inferred:
        if len(inferred) > 1:
            raise SpecError("mixes color and position entries; one category per prompt", field="include")
        category = inferred.pop()
    elif category is None and record.get("tag") in {c.value for c in Category}:
        category = record["tag"]
    if category is not None and category not in {c.value for c in Category}:
        names = [c.value for c in Category]
        hint = did_you_mean(category, names) if isinstance(category, str) else ""
        raise SpecError(f"unknown category {category!r}{hint} (expected one of {', '.join(names)})", field="category")
    tag = record.get("tag") or category or ""  # GenEval's tag; absent or empty: the category's name

    try:
        prompt = Prompt(
            id=str(pid),
            prompt=record["prompt"],
            category=category,
            tag=tag,
            objects=tuple(ObjectSpec.model_validate(o) for o in objects),
            statements=tuple(statements),
            probes=tuple(probes),
            source_id=record.get("source_id"),
            form=record.get("form"),
            extra={k: v for k, v in record.items() if k not in _KNOWN_KEYS},
        )
    except ValidationError as exc:
        raise _from_validation_error(exc) from None
    if "setting" in record and record["setting"] != prompt.setting:
        raise SpecError(f"says {record['setting']!r} but the statements make it {prompt.setting!r}", field="setting")
    return prompt


def _from_validation_error(exc: ValidationError) -> SpecError:
    err = exc.errors()[0]
    cause = err.get("ctx", {}).get("error")
    if isinstance(cause, SpecError):
        return SpecError(cause.message, field=cause.field)
    loc = ".".join(str(p) for p in err["loc"])
    loc = loc.replace("objects.", "include.")
    loc = re.sub(r"\.(\d+)", r"[\1]", loc)
    loc = re.sub(r"\.(attribute|relation)\b", "", loc)
    return SpecError(plain_message(err), field=loc or None)


def plain_message(err: Mapping[str, Any]) -> str:
    """A pydantic error (one entry of ``ValidationError.errors()``) in this project's words.

    Pydantic's own texts ("String should have at least 1 character", "Input should be greater than or
    equal to 0") are its phrasing, not ours, and reach API clients; the error ``type`` is mapped here
    instead. An unlisted type keeps pydantic's text, prefixed ``invalid value``.
    """
    kind = str(err.get("type", ""))
    ctx: Mapping[str, Any] = err.get("ctx") or {}
    got = err.get("input")
    shown = f", got {got!r}" if isinstance(got, int | float | str) and not isinstance(got, bool) else ""
    if kind == "string_too_short":
        n = int(ctx.get("min_length", 1))
        return "must not be empty" if n <= 1 else f"must have at least {n} characters"
    if kind == "too_short":
        n = int(ctx.get("min_length", 1))
        return "must not be empty" if n <= 1 else f"needs at least {n} entries"
    bounds = {"greater_than_equal": ("ge", "at least"), "greater_than": ("gt", "above"),
              "less_than_equal": ("le", "at most"), "less_than": ("lt", "below")}  # fmt: skip
    if kind in bounds:
        key, words = bounds[kind]
        return f"must be {words} {ctx.get(key)}{shown}"
    simple = {
        "missing": "missing required key",
        "extra_forbidden": "unknown key",
        "string_type": "must be a string",
        "int_type": "must be an integer",
        "int_parsing": "must be an integer",
        "int_from_float": "must be a whole number",
        "float_type": "must be a number",
        "float_parsing": "must be a number",
        "bool_type": "must be true or false",
        "bool_parsing": "must be true or false",
        "dict_type": "must be an object",
        "model_type": "must be an object",
        "model_attributes_type": "must be an object",
        "list_type": "must be a list",
        "tuple_type": "must be a list",
        "union_tag_not_found": "needs a 'kind' (attribute or relation)",
    }
    if kind in simple:
        return simple[kind] + (shown if kind.endswith(("_type", "_parsing", "_from_float")) else "")
    if kind in {"enum", "literal_error"}:
        return f"must be one of {ctx.get('expected', 'the listed values')}{shown}"
    if kind == "union_tag_invalid":
        return f"unknown kind {ctx.get('tag')!r} (expected {ctx.get('expected_tags', 'attribute or relation')})"
    return f"invalid value ({str(err.get('msg', kind)).lower()})"


def iter_prompts(path: str | Path) -> Iterator[Prompt]:
    """Yield the prompts of a JSONL file; the first bad line raises ``SpecError`` with its number.

    Blank lines are allowed. A record without ``id`` gets its 0-based record index,
    zero-padded to five digits, as GenEval names its output folders.
    """
    ids: dict[str, int] = {}
    for index, line in enumerate(iter_json_lines(path)):
        lineno = line.lineno
        if line.error is not None:
            raise SpecError(line.error, line=lineno)
        try:
            prompt = parse_prompt(line.value, default_id=f"{index:05d}")
        except SpecError as exc:
            raise exc.at_line(lineno) from None
        if prompt.id in ids:
            raise SpecError(f"duplicate id {prompt.id!r} (first on line {ids[prompt.id]})", field="id", line=lineno)
        ids[prompt.id] = lineno
        yield prompt


def read_prompts(path: str | Path) -> list[Prompt]:
    """All prompts of a JSONL file (see ``iter_prompts``)."""
    return list(iter_prompts(path))


def dumps_prompt(prompt: Prompt) -> str:
    """One JSONL line (without the newline)."""
    return json.dumps(prompt.to_json(), ensure_ascii=False, separators=(", ", ": "))


def write_prompts(path: str | Path, prompts: Iterable[Prompt]) -> int:
    """Write prompts as JSONL, atomically; returns how many were written."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    n = 0
    with tmp.open("w", encoding="utf-8", newline="\n") as fh:
        for prompt in prompts:
            fh.write(dumps_prompt(prompt) + "\n")
            n += 1
    tmp.replace(target)
    return n


__all__ = [
    "BENCHMARK_CLASSES",
    "AttributeStatement",
    "ObjectSpec",
    "Polarity",
    "Prompt",
    "RelationStatement",
    "SpecError",
    "Statement",
    "check_limits",
    "dumps_prompt",
    "iter_prompts",
    "parse_prompt",
    "read_prompts",
    "setting_name",
    "write_prompts",
]
