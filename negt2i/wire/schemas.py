"""The shapes of the JSON that ``negt2i.v1`` carries in string fields, as published JSON Schemas.

A verdict's measurements and the rule config record are free-form JSON in the core
(``negt2i.core.verdict``, ``negt2i.core.rules``, ``negt2i.core.config``) and travel as JSON text
(``ObjectVerdict.measurements_json``, ``StatementVerdict.measurements_json``,
``Verdict.config_json``, ``ServiceInfo.rules_json``). The models below describe that JSON
exactly (every key required, no other key allowed); ``scripts/protos/schemas.py`` writes
their JSON Schemas (draft 2020-12) to ``protos/negt2i/v1/schemas/``, so they ship with the
protos, and ``tests/protos/test_schemas.py`` fails when the committed files differ or when
a real verdict's JSON does not validate. Key meanings and formulas: ``docs/results.md``.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from negt2i.core.config import ADDED_DEFAULTS, RuleConfig

SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_DIR: Final = "negt2i/v1/schemas"
"""Where the schemas live under the protos' include root."""

Number = float
"""A JSON number (integers included)."""
Mask = Literal["refined", "detector"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ObjectMeasurements(_Strict):
    """``ObjectVerdict.measurements_json``: what presence and counting were decided from."""

    kept: list[tuple[Annotated[int, Field(ge=0)], Number]] = Field(
        description="[detection index, score] of every kept detection of the class, highest score first"
    )
    candidates: int = Field(ge=0, description="detections of the class before the floor and the cap")
    prediction_floor: Number = Field(description="kept = scores >= floor")
    presence_threshold: Number = Field(description="present iff some kept score reaches it")
    count_threshold: Number = Field(description="kept scores reaching it are counted")
    per_class_cap: int = Field(ge=1, description="at most this many detections kept")
    overlap_iou: Number = Field(description="overlap suppression IoU (1: none)")


class UnevaluatedObject(_Strict):
    """What was found of one object an unevaluated statement refers to."""

    object: int = Field(ge=0, description="index into the prompt's objects")
    class_name: str = Field(alias="class", description="the object's class")
    requested: int = Field(ge=1)
    present: bool
    counted: int = Field(ge=0)
    top_score: Number | None = Field(description="highest score of the class (null: no detection)")
    over_count: bool
    under_count: bool


class Unevaluated(_Strict):
    """A statement whose objects are missing, under- or over-counted: the rule was not applied."""

    rule: Literal["unevaluated"]
    unevaluated: Literal["undetected_object", "over_count"] = Field(description="why (the statement's cause)")
    objects: list[UnevaluatedObject]


class AttributeMeasurements(_Strict):
    """``rule: "attribute"`` (color, material)."""

    rule: Literal["attribute"]
    detection: int = Field(ge=0, description="the instance scored (the first counted detection)")
    mask: Mask = Field(description="the mask it was scored with")
    scores: dict[str, Number] = Field(description="value -> 100 x cosine similarity, for every answer")
    top_score: Number
    top_values: list[str] = Field(description="the values reaching top_score")
    value_score: Number = Field(description="the requested value's score")
    margin: Number = Field(description="top_score - value_score")
    beta: Number = Field(description="confusion buffer: fired = {v : scores[v] >= top_score - beta}")


class _Relation(_Strict):
    detections: list[int] = Field(min_length=2, max_length=2, description="[A, B], detector indices measured")
    mask: Mask = Field(description="refined (SAM 2) or detector masks")


class DirectionalMeasurements(_Relation):
    """``rule: "directional"``."""

    rule: Literal["directional"]
    centroid_a_x: Number
    centroid_a_y: Number
    centroid_b_x: Number
    centroid_b_y: Number
    width_a: Number
    width_b: Number
    height_a: Number
    height_b: Number
    offset_x: Number
    offset_y: Number
    center_distance: Number
    extent_sum_x: Number
    extent_sum_y: Number
    dx: Number
    dy: Number
    axis_threshold: Number = Field(description="alpha")
    extent_margin: Number = Field(description="tau")


class ProximityMeasurements(_Relation):
    """``rule: "proximity"``."""

    rule: Literal["proximity"]
    area_a: Number
    area_b: Number
    gap: Number = Field(description="g: minimum distance between the masks (0 if they overlap)")
    radius: Number = Field(description="R = (sqrt(|A|/pi) + sqrt(|B|/pi)) / 2")
    threshold: Number = Field(description="gamma * R")
    gap_factor: Number = Field(description="gamma")


class ComparativeMeasurements(_Relation):
    """``rule: "comparative"``."""

    rule: Literal["comparative"]
    area_a: Number
    area_b: Number
    area_ratio: Number
    height_a: Number
    height_b: Number
    height_ratio: Number
    size_ratio: Number = Field(description="rho")


class DepthMeasurements(_Relation):
    """``rule: "depth"``."""

    rule: Literal["depth"]
    area_a: Number
    area_b: Number
    disparity_a: Number
    disparity_b: Number
    disparity_range: Number
    normalized_difference: Number
    required_margin: Number
    gap: Number
    radius: Number
    facing_pixels_a: int = Field(ge=0)
    facing_pixels_b: int = Field(ge=0)
    facing_window: Number
    base_margin: Number
    separation_slope: Number


class _ContactBand(_Relation):
    """The fields both contact-band records share (``depth.rule = "contact_band"``, Table 16)."""

    rule: Literal["depth"]
    depth_rule: Literal["contact_band"]
    surface: Literal["contact", "rim"]
    area_a: Number
    area_b: Number
    contact_pixels_a: int = Field(ge=0)
    contact_pixels_b: int = Field(ge=0)
    surface_pixels_a: int = Field(ge=0)
    surface_pixels_b: int = Field(ge=0)
    disparity_range: Number
    band_width: Number
    min_band_pixels: int
    base_margin: Number


class ContactBandMeasurements(_ContactBand):
    """``rule: "depth"`` with ``depth.rule = "contact_band"`` (Table 16's previous rule): both surfaces large enough."""

    disparity_a: Number
    disparity_b: Number
    normalized_difference: Number
    required_margin: Number


class ContactBandTooFewMeasurements(_ContactBand):
    """``rule: "depth"``, contact band, a surface with fewer than ``min_band_pixels`` pixels: nothing fires."""

    too_few_pixels: Literal[1]


class DegenerateMeasurements(_Relation):
    """A relation whose A or B mask is empty: nothing fires."""

    rule: Literal["directional", "proximity", "comparative", "depth"]
    degenerate: Literal[1]
    area_a: Number
    area_b: Number


class StatementMeasurements(_Strict):
    """``StatementVerdict.measurements_json``: one shape per ``rule`` (a relation may be degenerate)."""

    measurements: (
        Unevaluated
        | AttributeMeasurements
        | DirectionalMeasurements
        | ProximityMeasurements
        | ComparativeMeasurements
        | DepthMeasurements
        | ContactBandMeasurements
        | ContactBandTooFewMeasurements
        | DegenerateMeasurements
    )


def _require_all(node: Any) -> None:
    """Every property required (the JSON always carries every key), recursively; defaults dropped."""
    if isinstance(node, dict):
        props = node.get("properties")
        if isinstance(props, dict):
            node["required"] = list(props)
            node["additionalProperties"] = False
            for prop in props.values():
                if isinstance(prop, dict):
                    prop.pop("default", None)
        for value in node.values():
            _require_all(value)
    elif isinstance(node, list):
        for value in node:
            _require_all(value)


def _schema(model: type[BaseModel], name: str, title: str, description: str) -> dict[str, Any]:
    body = model.model_json_schema(by_alias=True, mode="serialization")
    if model is StatementMeasurements:  # the union itself, not the wrapper object
        defs = body.pop("$defs")
        body = {"oneOf": body["properties"]["measurements"]["anyOf"], "$defs": defs}  # exactly one shape fits
    if model is RuleConfig:  # RuleConfig.record(): the model's fields and the digest
        digest = {"type": "string", "pattern": "^[0-9a-f]{16}$", "description": "RuleConfig.digest()"}
        body["properties"] = {"name": body["properties"].pop("name"), "digest": digest, **body["properties"]}
    _require_all(body)
    if model is RuleConfig:  # a constant that does not apply (None) is left out of the record, never null
        for node in body.get("$defs", {}).values():
            props = node.get("properties", {})
            optional = [k for k, v in props.items() if {"type": "null"} in v.get("anyOf", [])]
            node["required"] = [k for k in node.get("required", []) if k not in optional]
            for k in optional:
                props[k]["anyOf"] = [a for a in props[k]["anyOf"] if a != {"type": "null"}]
                if len(props[k]["anyOf"]) == 1:
                    props[k].update(props[k].pop("anyOf")[0])
        for path in ADDED_DEFAULTS:  # added later: left out of the record at its default (RuleConfig.values)
            group, key = path.split(".")
            node = body["$defs"][RuleConfig.model_fields[group].annotation.__name__]  # type: ignore[union-attr]
            node["required"] = [k for k in node.get("required", []) if k != key]
    body.pop("title", None)
    body.pop("description", None)
    return {"$schema": SCHEMA_DIALECT, "$id": f"{SCHEMA_DIR}/{name}", "title": title, "description": description,
            **body}  # fmt: skip


def schemas() -> dict[str, dict[str, Any]]:
    """File name -> JSON Schema, for every JSON-in-a-string field of ``negt2i.v1``."""
    return {
        "object-measurements.schema.json": _schema(
            ObjectMeasurements,
            "object-measurements.schema.json",
            "ObjectVerdict.measurements_json",
            "The evidence of an object's presence and count (docs/results.md, objects).",
        ),
        "statement-measurements.schema.json": _schema(
            StatementMeasurements,
            "statement-measurements.schema.json",
            "StatementVerdict.measurements_json",
            "The evidence of a statement's decision, one shape per rule (docs/results.md, statements).",
        ),
        "rule-config.schema.json": _schema(
            RuleConfig,
            "rule-config.schema.json",
            "Verdict.config_json, ServiceInfo.rules_json",
            "The rule config record: name, digest and every constant (docs/rules.md).",
        ),
    }
