"""Per-image verdicts: one pure function judges a prompt against what the stages saw.

``judge(prompt, perception, config)`` decides, exactly as Appendix C.1 does, which
objects are present and validly counted, which predicates fire for each
statement, whether each statement passes, why it failed, and whether the image
is correct (every object present with a valid count and every statement passed).

Failure causes (Appendix C.3) and the precedence used when several apply to one
statement, first match wins:

1. ``undetected_object``: an object the statement refers to is not present
   (no detection reaches the presence threshold), or, for ``count > 1`` objects,
   fewer instances were counted than requested;
2. ``over_count``: an object it refers to has more counted instances than requested;
3. ``dead_zone``: a positive directional / comparative / depth statement whose
   fired set is empty (no predicate was decisive);
4. ``positive_violated``: a positive statement whose predicate / value did not fire;
5. ``negated_violated``: a negated statement whose predicate / value fired.

The statement is *evaluated* only when 1 and 2 do not apply; otherwise its fired
set is ``null``. A negated statement that passes with an empty fired set is a
*dead-zone pass* (``dead_zone: true``, Table 19).

Probes (``Prompt.probes``: a control prompt's source statements) are judged by
the same code as statements and recorded under ``probes`` with the same fields,
but never enter ``correct``, ``reason`` or ``failure_class``.

Every statement and probe also records its ``outcome``, what the image shows
whatever the polarity: ``holds`` (the requested value / predicate fired),
``dead_zone`` (evaluated, but no predicate was decisive: an empty fired set),
``not`` (evaluated, and it did not fire) or ``null`` (not evaluated: an object
is missing or mis-counted).

The continuous score (``score``) is the share of satisfied elements, the definition of the paper's
continuous human score (Section 4, Appendix B.1: one element per named object and one per statement):

    score = (#{objects present with a valid count} + #{statements passed}) / (#objects + #statements)

A statement over a missing or mis-counted object is not evaluated and so not passed: a missing object
costs its own element and every statement that refers to it (no reward for omission). Probes never
count. ``score == 1.0`` iff ``correct``.

Row-level failure class of an incorrect image (Appendix E.2), first match wins:
``undetected_object`` (any named object missing or under-counted),
``over_count``, then by the polarity of the violated statements
``positive_violated`` (positive violations and dead-zone failures only),
``negated_violated`` (negated only) or ``both_polarities``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from negt2i import __version__
from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.geometry import FacingPair, MaskStats, facing_pairs, gaps, mask_stats
from negt2i.core.perception import ImagePerception
from negt2i.core.rules import (
    InstanceSelection,
    Measurement,
    attribute_confusion_set,
    measure_comparative,
    measure_depth,
    measure_directional,
    measure_proximity,
    select_instances,
    statement_passes,
)
from negt2i.core.spec import AttributeStatement, Polarity, Prompt, RelationStatement
from negt2i.core.vocab import ANSWERS, Category


class PerceptionError(ValueError):
    """The perception lacks something the prompt needs; no verdict is produced from partial perception."""


class FailureCause(StrEnum):
    """Why a statement failed (Appendix C.3)."""

    UNDETECTED_OBJECT = "undetected_object"
    OVER_COUNT = "over_count"
    DEAD_ZONE = "dead_zone"
    POSITIVE_VIOLATED = "positive_violated"
    NEGATED_VIOLATED = "negated_violated"


class RowFailure(StrEnum):
    """Why an image failed, at the row level (Appendix C.3 / E.2)."""

    UNDETECTED_OBJECT = "undetected_object"
    OVER_COUNT = "over_count"
    POSITIVE_VIOLATED = "positive_violated"
    NEGATED_VIOLATED = "negated_violated"
    BOTH_POLARITIES = "both_polarities"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class ObjectVerdict(_Model):
    """Presence and count of one named object."""

    index: int
    class_name: str = Field(alias="class")
    requested: int
    present: bool
    counted: int
    kept: int
    fallback: bool
    top_score: float | None
    over_count: bool
    under_count: bool
    exempt: bool
    detections: list[int]
    """Indices (into the detector's output) of the counted instances."""
    measurements: dict[str, Any] = Field(default_factory=dict)
    """The evidence of presence and count: the kept detections with their scores and the
    detection thresholds (schema in ``docs/results.md``)."""

    @property
    def ok(self) -> bool:
        """Present with a valid count."""
        return self.present and not self.over_count and not self.under_count


class StatementVerdict(_Model):
    """One statement's decision and the numbers it came from."""

    index: int
    kind: str
    polarity: Polarity
    text: str
    objects: list[int]
    requested: str
    """The value (attribute) or predicate (relation) the statement names."""
    evaluated: bool
    fired: list[str] | None
    passed: bool
    cause: FailureCause | None
    dead_zone: bool
    measurements: dict[str, Any]

    outcome: str | None = None
    """``holds`` / ``not`` / ``dead_zone`` / ``None`` (not evaluated), always ``outcome_of(fired, requested)``."""

    @model_validator(mode="before")
    @classmethod
    def _fill_outcome(cls, data: Any) -> Any:
        if isinstance(data, dict) and "outcome" not in data:
            return {**data, "outcome": outcome_of(data.get("fired"), str(data.get("requested", "")))}
        return data

    @model_validator(mode="after")
    def _check_outcome(self) -> StatementVerdict:
        expected = outcome_of(self.fired, self.requested)
        if self.outcome != expected:
            raise ValueError(f"outcome {self.outcome!r} contradicts fired / requested (expected {expected!r})")
        return self


def outcome_of(fired: Sequence[str] | None, requested: str) -> str | None:
    """What the image shows for a statement, whatever its polarity (see the module docstring)."""
    if fired is None:
        return None
    if requested in fired:
        return "holds"
    return "not" if fired else "dead_zone"


class Verdict(_Model):
    """The judgement of one image against one prompt."""

    prompt_id: str
    tag: str
    prompt: str
    category: Category | None
    setting: str
    correct: bool
    reason: str
    """GenEval-style summary of every failure, ``""`` when correct."""
    failure_class: RowFailure | None
    objects: list[ObjectVerdict]
    statements: list[StatementVerdict]
    config: dict[str, Any]
    evaluator_version: str = __version__
    probes: list[StatementVerdict] = Field(default_factory=list)
    """The prompt's probes, judged like statements, never part of ``correct``."""
    source_id: str | None = None
    """The prompt's ``source_id`` (control and paraphrase prompts)."""
    form: str | None = None
    """The prompt's ``form`` (paraphrases)."""
    score: float = Field(default=0.0, ge=0.0, le=1.0)
    """The continuous score, the share of satisfied elements (``element_score``; module docstring).
    Always ``element_score(objects, statements)``: filled when absent, refused when it disagrees."""

    @model_validator(mode="before")
    @classmethod
    def _fill_score(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("score") is None:
            objects = [_raw_ok(o) for o in data.get("objects", [])]
            passed = [
                s.passed if isinstance(s, StatementVerdict) else bool(s["passed"]) for s in data.get("statements", [])
            ]
            return {**data, "score": _share(objects + passed)}
        return data

    @model_validator(mode="after")
    def _check_score(self) -> Verdict:
        expected = element_score(self.objects, self.statements)
        if not math.isclose(self.score, expected, rel_tol=0.0, abs_tol=1e-9):
            raise ValueError(f"score {self.score!r} contradicts objects / statements (expected {expected!r})")
        if (self.score == 1.0) != self.correct:
            raise ValueError(f"score {self.score!r} contradicts correct={self.correct}")
        return self

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (aliases used, e.g. ``class``); ``probes`` / ``source_id`` / ``form`` only when set."""
        out = self.model_dump(mode="json", by_alias=True)
        for key in ("probes", "source_id", "form"):
            if out[key] in (None, []):
                del out[key]
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False)


def element_score(objects: Sequence[ObjectVerdict], statements: Sequence[StatementVerdict]) -> float:
    """The share of satisfied elements (module docstring): ok objects plus passed statements, over both.

    ``1.0`` for a prompt with no element (none in the corpus: every prompt names an object)."""
    return _share([o.ok for o in objects] + [s.passed for s in statements])


def _share(satisfied: Sequence[bool]) -> float:
    return sum(satisfied) / len(satisfied) if satisfied else 1.0


def _raw_ok(o: ObjectVerdict | dict[str, Any]) -> bool:
    """``ObjectVerdict.ok`` of a verdict being validated (its objects may still be plain dicts)."""
    if isinstance(o, ObjectVerdict):
        return o.ok
    return bool(o["present"]) and not o["over_count"] and not o["under_count"]


def object_measurements(sel: InstanceSelection, perception: ImagePerception, config: RuleConfig) -> dict[str, Any]:
    """What presence and counting were decided from (``docs/results.md``, object measurements).

    ``kept``: ``[detection index, score]`` of every kept detection of the class, highest score first;
    ``present`` iff some kept score >= ``presence_threshold``; ``counted`` = kept scores >=
    ``count_threshold``, or the top one alone when none reaches it but the class is present.
    """
    cfg = config.detection
    scores = perception.detections.scores
    candidates = perception.detections.candidates(sel.class_name)
    return {
        "kept": [[i, float(scores[i])] for i in sel.kept],
        "candidates": candidates,
        "prediction_floor": cfg.prediction_floor,
        "presence_threshold": cfg.presence_threshold,
        "count_threshold": cfg.count_threshold,
        "per_class_cap": cfg.per_class_cap,
        "overlap_iou": cfg.overlap_iou,
    }


def _object_verdict(index: int, sel: InstanceSelection, measurements: dict[str, Any]) -> ObjectVerdict:
    return ObjectVerdict(
        index=index,
        class_name=sel.class_name,
        requested=sel.requested,
        present=sel.present,
        counted=len(sel.counted),
        kept=len(sel.kept),
        fallback=sel.fallback,
        top_score=sel.top_score,
        over_count=sel.over_count,
        under_count=sel.under_count,
        exempt=sel.exempt,
        detections=list(sel.counted),
        measurements=measurements,
    )


class _Masks:
    """Relation masks of counted instances, measured once per image."""

    def __init__(
        self, perception: ImagePerception, config: RuleConfig, shared: dict[tuple[int, bool], MaskStats] | None = None
    ) -> None:
        self.perception = perception
        self.refine = config.masks.refine
        self.cache: dict[int, MaskStats] = {}
        self.shared = shared
        self.facing: dict[tuple[int, int], FacingPair] = {}
        self.gaps: dict[tuple[int, int], float] = {}

    def measure_pairs(self, category: Category, pairs: list[tuple[int, int]], config: RuleConfig) -> None:
        """Measure every proximity / depth pair of the image at once; they share k-d trees.

        Proximity: the gaps (``geometry.gaps``); depth: gap and facing surfaces
        (``geometry.facing_pairs``). Other categories measure nothing here.
        """
        if category not in (Category.PROXIMITY, Category.DEPTH):
            return
        if category is Category.DEPTH and config.depth.rule != "facing_surfaces":
            return  # the contact band measures its own surfaces (``rules.measure_depth_contact_band``)
        todo = [p for p in dict.fromkeys(pairs) if p[0] != p[1]]
        todo = [p for p in todo if not (self.stats(p[0]).empty or self.stats(p[1]).empty)]
        stats = [(self.stats(a), self.stats(b)) for a, b in todo]
        if category is Category.PROXIMITY:
            self.gaps.update(zip(todo, gaps(stats), strict=True))
        else:
            self.facing.update(zip(todo, facing_pairs(stats, config.depth.facing_window), strict=True))

    def stats(self, det: int) -> MaskStats:
        if det not in self.cache and self.shared is not None and (det, self.refine) in self.shared:
            self.cache[det] = self.shared[(det, self.refine)]
        if det not in self.cache:
            if self.refine:
                refined = self.perception.refined
                if refined is None or det not in refined:
                    raise PerceptionError(
                        f"no refined mask for detection {det}; relation prompts need SAM-refined masks "
                        "(or a config with masks.refine = false)"
                    )
                mask = refined[det]
            else:
                mask = self.perception.detections.masks[det]
            self.cache[det] = mask_stats(mask)
            if self.shared is not None:
                self.shared[(det, self.refine)] = self.cache[det]
        return self.cache[det]


def _measure(
    prompt: Prompt,
    st: AttributeStatement | RelationStatement,
    dets: list[int],
    *,
    perception: ImagePerception,
    masks: _Masks,
    config: RuleConfig,
) -> tuple[frozenset[str], dict[str, Any]]:  # fmt: skip
    category = prompt.category
    assert category is not None  # a prompt with statements always has one
    if isinstance(st, AttributeStatement):
        attrs = perception.attributes
        if attrs is None or dets[0] not in attrs:
            raise PerceptionError(
                f"no attribute scores for detection {dets[0]} ({prompt.objects[st.object].class_name})"
            )
        if set(ANSWERS[category]) - set(attrs.answers):
            raise PerceptionError(
                f"attribute scores cover {list(attrs.answers)}, a {category} prompt needs {list(ANSWERS[category])}"
            )
        scores = {v: attrs[dets[0]][v] for v in ANSWERS[category]}
        beta = config.attributes.color_beta if category is Category.COLOR else config.attributes.material_beta
        fired = attribute_confusion_set(scores, beta)
        top = max(scores.values())
        return fired, {
            "rule": "attribute",
            "detection": dets[0],
            "mask": "detector",
            "scores": scores,
            "top_score": top,
            "top_values": sorted(v for v, sc in scores.items() if sc == top),
            "value_score": scores[st.value],
            "margin": top - scores[st.value],
            "beta": beta,
        }
    a, b = masks.stats(dets[0]), masks.stats(dets[1])
    m: Measurement
    if category is Category.DIRECTIONAL:
        m = measure_directional(a, b, config)
    elif category is Category.PROXIMITY:
        m = measure_proximity(a, b, config, measured_gap=masks.gaps.get((dets[0], dets[1])))
    elif category is Category.COMPARATIVE:
        m = measure_comparative(a, b, config)
    else:
        disp = perception.disparity
        if disp is None:
            raise PerceptionError("depth prompts need a disparity map")
        facing = masks.facing.get((dets[0], dets[1]))
        m = measure_depth(a, b, disp.values, config, disparity_range=disp.value_range, facing=facing)
    return m.predicates, {**m.values, "detections": dets[:2], "mask": "refined" if config.masks.refine else "detector"}


def _unmeasurable(involved: Sequence[ObjectVerdict]) -> FailureCause | None:
    """Why a statement over these objects cannot be measured (a missing object first), or None."""
    if any(not o.present or o.under_count for o in involved):
        return FailureCause.UNDETECTED_OBJECT
    if any(o.over_count for o in involved):
        return FailureCause.OVER_COUNT
    return None


def _unevaluated(cause: FailureCause, involved: Sequence[ObjectVerdict]) -> dict[str, Any]:
    """Why a statement was not evaluated: the cause and, per object it refers to, what was found."""
    return {
        "rule": "unevaluated",
        "unevaluated": cause.value,
        "objects": [
            {
                "object": o.index,
                "class": o.class_name,
                "requested": o.requested,
                "present": o.present,
                "counted": o.counted if o.present else 0,
                "top_score": o.top_score,
                "over_count": o.over_count,
                "under_count": o.under_count,
            }
            for o in involved
        ],
    }


def judge(
    prompt: Prompt,
    perception: ImagePerception,
    config: RuleConfig = CURRENT,
    *,
    mask_cache: dict[tuple[int, bool], MaskStats] | None = None,
) -> Verdict:
    """Judge one image's perception against a prompt; see the module docstring for the rules.

    ``mask_cache``: mask measurements (``MaskStats``, keyed by detection index and whether the mask is the
    refined one) kept across calls on the same perception, for re-judging one image under many configs
    (``negt2i.core.rejudge``); the verdict is the same with or without it."""
    selections = [select_instances(perception.detections, obj.class_name, obj.count, config) for obj in prompt.objects]
    objects = [
        _object_verdict(i, sel, object_measurements(sel, perception, config)) for i, sel in enumerate(selections)
    ]
    masks = _Masks(perception, config, mask_cache)
    statements: list[StatementVerdict] = []
    probes: list[StatementVerdict] = []
    reasons: list[str] = []
    for ov in objects:
        if not ov.present or ov.under_count:
            reasons.append(f"expected {ov.class_name}>={ov.requested}, found {ov.counted if ov.present else 0}")
        elif ov.over_count:
            reasons.append(f"expected {ov.requested} {ov.class_name}, found {ov.counted}")

    judged = [(k, st, statements) for k, st in enumerate(prompt.statements)]
    judged += [(k, st, probes) for k, st in enumerate(prompt.probes)]  # probes: same rules, never in `correct`
    if prompt.category is not None and (prompt.category is not Category.DEPTH or perception.disparity is not None):
        # the image's pairs in one batch: a star prompt's pairs share the subject's k-d tree
        pairs = [
            (objects[st.subject].detections[0], objects[st.target].detections[0])
            for _, st, _ in judged
            if isinstance(st, RelationStatement) and _unmeasurable([objects[i] for i in st.object_indices]) is None
        ]
        masks.measure_pairs(prompt.category, pairs, config)
    for k, st, into in judged:
        involved = [objects[i] for i in st.object_indices]
        text = prompt.describe_statement(st)
        requested = st.value if isinstance(st, AttributeStatement) else st.predicate
        cause: FailureCause | None = _unmeasurable(involved)
        fired: frozenset[str] | None = None
        values: dict[str, Any] = {}
        if cause is not None:
            values = _unevaluated(cause, involved)
        else:
            dets = [o.detections[0] for o in involved]
            fired, values = _measure(prompt, st, dets, perception=perception, masks=masks, config=config)
        passed = fired is not None and statement_passes(requested, fired, st.polarity)
        empty = fired is not None and not fired and prompt.category is not None and prompt.category.has_dead_zone
        if fired is not None and not passed:
            if st.polarity is Polarity.NEGATED:
                cause = FailureCause.NEGATED_VIOLATED
            elif empty:
                cause = FailureCause.DEAD_ZONE
            else:
                cause = FailureCause.POSITIVE_VIOLATED
        if not passed and fired is not None and into is statements:
            reasons.append(f"{text}: {cause} (fired: {', '.join(sorted(fired)) or 'nothing'})")
        into.append(
            StatementVerdict(
                index=k,
                kind=st.kind,
                polarity=st.polarity,
                text=text,
                objects=list(st.object_indices),
                requested=requested,
                evaluated=fired is not None,
                fired=sorted(fired) if fired is not None else None,
                passed=passed,
                cause=cause,
                dead_zone=empty,
                measurements=values,
            )
        )

    correct = all(o.ok for o in objects) and all(s.passed for s in statements)
    return Verdict(
        prompt_id=prompt.id,
        tag=prompt.tag,
        prompt=prompt.prompt,
        category=prompt.category,
        setting=prompt.setting,
        correct=correct,
        reason="; ".join(reasons),
        failure_class=None if correct else row_failure(objects, statements),
        objects=objects,
        statements=statements,
        config=config.record(),
        probes=probes,
        source_id=prompt.source_id,
        form=prompt.form,
    )


def row_failure(objects: Sequence[ObjectVerdict], statements: Sequence[StatementVerdict]) -> RowFailure:
    """The row-level failure class of an incorrect image (precedence in the module docstring)."""
    if any(not o.present or o.under_count for o in objects):
        return RowFailure.UNDETECTED_OBJECT
    if any(o.over_count for o in objects):
        return RowFailure.OVER_COUNT
    positive = any(s.cause in (FailureCause.POSITIVE_VIOLATED, FailureCause.DEAD_ZONE) for s in statements)
    negated = any(s.cause is FailureCause.NEGATED_VIOLATED for s in statements)
    if positive and negated:
        return RowFailure.BOTH_POLARITIES
    return RowFailure.NEGATED_VIOLATED if negated else RowFailure.POSITIVE_VIOLATED
