"""Results-file lines as the compact, validated rows the metrics need.

A results line (``negt2i.core.results``) is a verdict (``negt2i.core.verdict.Verdict.to_json()``)
plus ``filename``, ``sample``, ``status`` and ``models``; an ``error`` line carries
what was known about the image (``prompt_id``, ``category``, ``setting`` may be
``null``) and is never correct. ``parse_line`` keeps what scoring needs and
fails with the file, the line number and the field on anything malformed, so a
bad line is never skipped silently.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from negt2i.core.failures import kind_of
from negt2i.core.results import read_results
from negt2i.core.spec import SETTING_RE
from negt2i.core.vocab import Category

CATEGORY_ORDER: tuple[Category, ...] = (
    Category.COLOR,
    Category.MATERIAL,
    Category.COMPARATIVE,
    Category.DEPTH,
    Category.DIRECTIONAL,
    Category.PROXIMITY,
)
"""Table 3's category columns: attributes (color, material), then relations."""

CATEGORY_LABELS: dict[str, str] = {
    "color": "Color",
    "material": "Material",
    "comparative": "Compar.",
    "depth": "Depth",
    "directional": "Direct.",
    "proximity": "Proxim.",
}
"""Short column / axis labels of the categories (Table 3's headings)."""

SETTING_ORDER: tuple[str, ...] = (
    "pos1_neg0",
    "pos0_neg1",
    "pos2_neg0",
    "pos1_neg1",
    "pos0_neg2",
    "pos2_neg1",
    "pos1_neg2",
    "pos2_neg2",
)
"""Table 3's polarity columns, grouped by statement load (1, 2, 3, 4)."""

CAUSES: tuple[str, ...] = ("undetected_object", "over_count", "positive_violated", "negated_violated", "dead_zone")
"""Statement failure causes (Appendix C.3), in Figure 3's order."""

ROW_CLASSES: tuple[str, ...] = (
    "negated_violated",
    "positive_violated",
    "both_polarities",
    "over_count",
    "undetected_object",
)
"""Row-level failure classes of incorrect judged images (Appendix E.2)."""


class ResultsFormatError(ValueError):
    """A results line that does not follow ``negt2i.core.results``; names the file, line and field."""


def setting_label(setting: str) -> str:
    """``pos2_neg1`` -> ``2:1`` (Table 3's P:N notation); other strings are returned unchanged."""
    m = SETTING_RE.match(setting)
    return f"{m.group(1)}:{m.group(2)}" if m else setting


def setting_load(setting: str) -> int | None:
    """Statement load P + N of a ``pos{P}_neg{N}`` setting, ``None`` for other strings."""
    m = SETTING_RE.match(setting)
    return int(m.group(1)) + int(m.group(2)) if m else None


@dataclass(frozen=True, slots=True)
class StatementRow:
    """What the metrics need of one statement verdict."""

    polarity: str
    """``positive`` or ``negated``."""
    passed: bool
    evaluated: bool
    cause: str | None
    empty: bool
    """Evaluated with an empty fired set (no predicate resolved): a dead-zone pass when negated and passed."""
    outcome: str | None = None
    """What the image shows whatever the polarity: ``holds`` / ``not`` / ``dead_zone``; ``None`` if not evaluated."""
    objects: tuple[int, ...] = ()
    """The ``include`` indices the statement is about (attribute: its object; relation: subject, target);
    empty for results written without them."""


@dataclass(frozen=True, slots=True)
class ImageRow:
    """One results line, reduced to what scoring and agreement need."""

    source: str
    line: int
    filename: str
    status: str
    prompt_id: str | None
    sample: int | None
    category: str | None
    setting: str | None
    correct: bool
    failure_class: str | None
    error: str | None
    error_kind: str | None
    """An error line's ``negt2i.core.failures.FailureKind`` value (``other`` when the file names none we know)."""
    objects_ok: tuple[bool, ...]
    statements: tuple[StatementRow, ...]
    config_name: str | None
    config_digest: str | None
    models: tuple[tuple[str, str], ...]
    """(stage, identity) pairs; identity joins model, revision and weight hash."""
    evaluator_version: str | None
    probes: tuple[StatementRow, ...] = ()
    """The prompt's probes (control prompts), judged like statements, never part of ``correct``."""
    source_id: str | None = None
    """The corpus prompt a control / paraphrase prompt was made from."""
    form: str | None = None
    """The wording of a paraphrase prompt."""
    tag: str | None = None
    """GenEval's ``tag`` of the prompt (its task for GenEval prompts; the category name for ours)."""

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"

    @property
    def key(self) -> str:
        """Identity of the image: ``prompt_id#sample`` when both are known, else the file name."""
        if self.prompt_id is not None and self.sample is not None:
            return f"{self.prompt_id}#{self.sample}"
        return self.filename


def model_identity(info: Mapping[str, Any]) -> str:
    """``model@revision sha256:abcd1234`` from a ``ModelInfo`` JSON (missing parts omitted)."""
    out = str(info.get("model") or info.get("backend") or "?")
    if info.get("revision"):
        out += f"@{info['revision']}"
    if info.get("sha256"):
        out += f" sha256:{str(info['sha256'])[:12]}"
    return out


def _need(rec: Mapping[str, Any], key: str, types: type | tuple[type, ...], where: str) -> Any:
    if key not in rec:
        raise ResultsFormatError(f"{where}: missing field {key!r}")
    value = rec[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        raise ResultsFormatError(f"{where}: field {key!r} has type {type(value).__name__}")
    return value


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _optional_str(rec: Mapping[str, Any], key: str, where: str) -> str | None:
    value = rec.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ResultsFormatError(f"{where}: field {key!r} has type {type(value).__name__}")
    return value


def parse_line(rec: Mapping[str, Any], *, source: str = "<memory>", line: int = 0) -> ImageRow:
    """Validate one results record and reduce it to an ``ImageRow``; raises ``ResultsFormatError``."""
    where = f"{source}:{line}"
    if not isinstance(rec, Mapping):
        raise ResultsFormatError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    status = _need(rec, "status", str, where)
    if status not in ("ok", "error"):
        raise ResultsFormatError(f"{where}: field 'status' must be 'ok' or 'error', got {status!r}")
    filename = _need(rec, "filename", str, where)
    sample = rec.get("sample")
    if sample is not None and (not isinstance(sample, int) or isinstance(sample, bool) or sample < 0):
        raise ResultsFormatError(f"{where}: field 'sample' must be a non-negative integer or null, got {sample!r}")
    category = _optional_str(rec, "category", where)
    if category is not None and category not in {c.value for c in Category}:
        raise ResultsFormatError(f"{where}: unknown category {category!r}")
    setting = _optional_str(rec, "setting", where)
    config = rec.get("config") or {}
    if not isinstance(config, Mapping):
        raise ResultsFormatError(f"{where}: field 'config' must be an object")
    models_raw = rec.get("models") or {}
    if not isinstance(models_raw, Mapping):
        raise ResultsFormatError(f"{where}: field 'models' must be an object")
    models = tuple(
        sorted(
            (str(stage), model_identity(info) if isinstance(info, Mapping) else str(info))
            for stage, info in models_raw.items()
        )
    )
    cfg_name = config.get("name")
    cfg_digest = config.get("digest")
    common: dict[str, Any] = {
        "source": source,
        "line": line,
        "filename": filename,
        "status": status,
        "sample": sample,
        "category": category,
        "setting": setting,
        "config_name": str(cfg_name) if cfg_name else None,
        "config_digest": str(cfg_digest) if cfg_digest else None,
        "models": models,
        "evaluator_version": _optional_str(rec, "evaluator_version", where),
        "tag": _optional_str(rec, "tag", where),
    }
    if status == "error":
        unplaced = rec.get("prompt_id") is None
        if rec.get("correct", False) is not False and not (unplaced and rec.get("correct") is None):
            raise ResultsFormatError(f"{where}: an error line cannot be correct")
        return ImageRow(
            prompt_id=_optional_str(rec, "prompt_id", where),
            correct=False,
            failure_class=None,
            error=str(rec.get("error") or rec.get("reason") or "unknown error"),
            error_kind=kind_of(rec.get("error"), rec.get("error_kind")),
            objects_ok=(),
            statements=(),
            **common,
        )
    prompt_id = _need(rec, "prompt_id", str, where)
    correct = _need(rec, "correct", bool, where)
    if setting is None:
        raise ResultsFormatError(f"{where}: missing field 'setting'")
    failure_class = _optional_str(rec, "failure_class", where)
    if correct and failure_class is not None:
        raise ResultsFormatError(f"{where}: a correct image has failure_class {failure_class!r}")
    if not correct and failure_class not in ROW_CLASSES:
        raise ResultsFormatError(
            f"{where}: an incorrect image needs a failure_class in {ROW_CLASSES}, got {failure_class!r}"
        )
    objects = _need(rec, "objects", list, where)
    objects_ok: list[bool] = []
    for i, obj in enumerate(objects):
        if not isinstance(obj, Mapping) or not all(k in obj for k in ("present", "over_count", "under_count")):
            raise ResultsFormatError(f"{where}: objects[{i}] lacks present / over_count / under_count")
        objects_ok.append(bool(obj["present"]) and not obj["over_count"] and not obj["under_count"])
    statements = _statement_rows(_need(rec, "statements", list, where), "statements", where)
    probes = _statement_rows(rec.get("probes") or [], "probes", where)
    return ImageRow(
        prompt_id=prompt_id,
        correct=correct,
        failure_class=failure_class,
        error=None,
        error_kind=None,
        objects_ok=tuple(objects_ok),
        statements=statements,
        probes=probes,
        source_id=_optional_str(rec, "source_id", where),
        form=_optional_str(rec, "form", where),
        **common,
    )


_OUTCOMES = ("holds", "not", "dead_zone")


def _statement_rows(items: Any, name: str, where: str) -> tuple[StatementRow, ...]:
    """``statements`` (or ``probes``) of a results line as rows; raises ``ResultsFormatError`` naming the field."""
    if not isinstance(items, list):
        raise ResultsFormatError(f"{where}: field {name!r} must be a list")
    out: list[StatementRow] = []
    for k, st in enumerate(items):
        field = f"{name}[{k}]"
        if not isinstance(st, Mapping):
            raise ResultsFormatError(f"{where}: {field} must be an object")
        for key in ("polarity", "passed", "evaluated"):
            if key not in st:
                raise ResultsFormatError(f"{where}: missing field '{field}.{key}'")
        polarity = st["polarity"]
        if polarity not in ("positive", "negated"):
            raise ResultsFormatError(f"{where}: {field}.polarity must be 'positive' or 'negated', got {polarity!r}")
        cause = st.get("cause")
        passed = bool(st["passed"])
        if passed and cause is not None:
            raise ResultsFormatError(f"{where}: {field} passed but has cause {cause!r}")
        if not passed and cause not in CAUSES:
            raise ResultsFormatError(f"{where}: {field} failed with cause {cause!r}, expected one of {CAUSES}")
        fired = st.get("fired")
        evaluated = bool(st["evaluated"])
        empty = evaluated and (fired == [] or bool(st.get("dead_zone", False)))
        outcome = st.get("outcome")
        if outcome is None and evaluated and isinstance(fired, list) and "requested" in st:  # written before outcome
            outcome = "holds" if st["requested"] in fired else ("not" if fired else "dead_zone")
        if outcome is not None and (outcome not in _OUTCOMES or not evaluated):
            raise ResultsFormatError(f"{where}: {field}.outcome must be one of {_OUTCOMES} (evaluated only), "
                                     f"got {outcome!r}")  # fmt: skip
        objs = st.get("objects") or []
        if not isinstance(objs, list) or not all(type(o) is int and o >= 0 for o in objs):
            raise ResultsFormatError(f"{where}: {field}.objects must be a list of object indices, got {objs!r}")
        out.append(StatementRow(polarity, passed, evaluated, cause, empty, outcome, tuple(objs)))
    return tuple(out)


def iter_rows(path: str | Path) -> Iterator[ImageRow]:
    """Rows of a results file, in file order, each knowing its line number (a torn last line is skipped by
    ``read_results``, blank lines are ignored)."""
    source = str(path)
    with Path(path).open(encoding="utf-8") as fh:
        numbers = [i for i, line in enumerate(fh, start=1) if line.strip()]
    for lineno, rec in zip(numbers, read_results(path), strict=False):
        yield parse_line(rec, source=source, line=lineno)
