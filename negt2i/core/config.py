"""The evaluator's constants: one typed, frozen config with the paper's two presets.

``current`` is Table 15 (used for every benchmark score); ``previous`` replaces the
directional, proximity and comparative constants with Table 16's and uses Table 16's older
*depth* rule, the contact band (12 px band, at least 20 rim or contact pixels). The paper
gives only those two constants, so ``negt2i.core.rules.measure_depth_contact_band`` is this
project's reading of it (its docstring says which parts are ours); the ``depth.rule`` field
names the rule so that results always say which one produced them. ``geneval`` takes
GenEval's published constants where they map onto ours (``GENEVAL``).

Every verdict records the config it was judged with (name, digest and values).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DetectionConfig(_Frozen):
    """Detection and instance counting (Appendix C.1, "Detection and instance counting")."""

    prediction_floor: float = Field(0.005, ge=0.0, le=1.0)
    """Detections scoring below this are discarded (RF-DETR's internal floor)."""
    presence_threshold: float = Field(0.03, ge=0.0, le=1.0)
    """A class is present when one detection reaches this score."""
    count_threshold: float = Field(0.5, ge=0.0, le=1.0)
    """Detections reaching this score are counted as instances."""
    per_class_cap: int = Field(16, ge=1)
    """At most this many detections per class are kept (highest scores first)."""
    overlap_iou: float = Field(1.0, ge=0.0, le=1.0)
    """Overlap suppression IoU; 1.0 disables suppression (the paper's setting)."""


class MaskConfig(_Frozen):
    """SAM 2 mask refinement and its post-processing (Appendix C.1, "SAM 2 mask refinement")."""

    refine: bool = True
    """Use refined (SAM) masks for relation measurements; False uses detector masks."""
    closing_radius: int = Field(5, ge=0)
    """Radius in pixels of the disk used for morphological closing."""
    min_component_fraction: float = Field(0.05, ge=0.0, le=1.0)
    """Connected components smaller than this fraction of the largest are dropped."""
    box_chunk_size: int = Field(50, ge=1)
    """Box prompts sent to SAM per call."""


TEXT_TEMPLATES: dict[str, tuple[str, ...]] = {
    "single": ("a photo of {article} {value} {class_name}.",),
    "geneval": ("a photo of a {value} {class_name}", "a photo of a {value}-colored {class_name}",
                "a photo of a {value} object"),
}  # fmt: skip
"""The attribute scorer's text template sets (``AttributeConfig.text_templates``). ``single``: one prompt per
answer, ``{article}`` = ``an`` before a vowel, else ``a`` (the paper does not state its template). ``geneval``:
GenEval's colour classifier (``evaluation/evaluate_images.py``), verbatim (always ``a``, no full stop), whose
per-answer text embedding is the mean of the three normalised template embeddings, normalised again
(``clip_benchmark``'s ``zero_shot_classifier``); GenEval has no material task, so material answers keep the
single template under it."""

TEXT_TEMPLATE_CODES: dict[str, int] = {"single": 0, "geneval": 1}
"""How a stage states the template set it applies in ``ModelInfo.rules`` (numbers, as every stage rule is;
published: never renumbered). A stage that states nothing applies ``single`` (code 0)."""


class AttributeConfig(_Frozen):
    """Attribute confusion buffers in 100 x cosine-similarity units (Table 15), and the text template set the
    attribute scorer embeds each answer with (``TEXT_TEMPLATES``).

    ``text_templates`` was added after the first results files: at its default (``single``) it is left out of
    the digest and the record, so that the ``current`` digest is the one results files already carry; any
    other set is recorded (and changes the digest)."""

    color_beta: float = Field(0.5, ge=0.0)
    material_beta: float = Field(0.0, ge=0.0)
    text_templates: Literal["single", "geneval"] = "single"


class DirectionalConfig(_Frozen):
    """Directional rule constants: extent margin tau and axis threshold alpha."""

    extent_margin: float = Field(0.075, ge=0.0)
    axis_threshold: float = Field(0.45, ge=0.0, le=1.0)


class ProximityConfig(_Frozen):
    """Proximity rule constant: gap factor gamma."""

    gap_factor: float = Field(0.75, gt=0.0)


class ComparativeConfig(_Frozen):
    """Comparative rule constant: size ratio rho."""

    size_ratio: float = Field(1.05, ge=1.0)


DEPTH_RULES: tuple[str, ...] = ("facing_surfaces", "contact_band")
"""Depth rules: Table 15's facing surfaces with coupled confidence; Table 16's contact band."""


class DepthConfig(_Frozen):
    """Depth rule constants: facing window w, base margin beta0, separation slope beta1 (``facing_surfaces``);
    band width and minimum band pixels (``contact_band``, which reads ``base_margin`` as its margin).

    ``band_width`` / ``min_band_pixels`` are ``None`` under ``facing_surfaces`` (and then left out of the
    digest and the record, so that the ``current`` digest is the one results files already carry); under
    ``contact_band`` they default to Table 16's 12 px and 20 pixels.
    """

    rule: Literal["facing_surfaces", "contact_band"] = "facing_surfaces"
    facing_window: float = Field(16.0, ge=0.0)
    base_margin: float = Field(0.05, ge=0.0)
    separation_slope: float = Field(0.10, ge=0.0)
    band_width: float | None = Field(None, ge=0.0)
    """Contact band: pixels of one mask within this distance (px) of the other (also the rim's width)."""
    min_band_pixels: int | None = Field(None, ge=1)
    """Contact band: fewer contact (then rim) pixels than this on either object and no predicate fires."""

    @model_validator(mode="after")
    def _band(self) -> DepthConfig:
        if self.rule == "contact_band":
            if self.band_width is None:
                object.__setattr__(self, "band_width", 12.0)
            if self.min_band_pixels is None:
                object.__setattr__(self, "min_band_pixels", 20)
        elif self.band_width is not None or self.min_band_pixels is not None:
            raise ValueError("depth.band_width / depth.min_band_pixels apply only to depth.rule = 'contact_band'")
        return self


class RuleConfig(_Frozen):
    """All constants a verdict depends on."""

    name: str = "current"
    detection: DetectionConfig = DetectionConfig()
    masks: MaskConfig = MaskConfig()
    attributes: AttributeConfig = AttributeConfig()
    directional: DirectionalConfig = DirectionalConfig()
    proximity: ProximityConfig = ProximityConfig()
    comparative: ComparativeConfig = ComparativeConfig()
    depth: DepthConfig = DepthConfig()

    def values(self) -> dict[str, Any]:
        """Every constant (the name excluded) as JSON; a constant that does not apply (``None``) is left out, and
        so is one added after the first results files while it has its default (``ADDED_DEFAULTS``)."""
        values: dict[str, Any] = _drop_none(self.model_dump(mode="json", exclude={"name"}))
        for path, default in ADDED_DEFAULTS.items():
            group, name = path.split(".")
            if values.get(group, {}).get(name) == default:
                del values[group][name]
        return values

    def digest(self) -> str:
        """A short, stable hash of every constant (the name excluded)."""
        blob = json.dumps(self.values(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def record(self) -> dict[str, Any]:
        """What results files store: name, digest and every value."""
        return {"name": self.name, "digest": self.digest(), **self.values()}


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    return value


CURRENT = RuleConfig()
"""Table 15: the configuration behind every reported benchmark score."""

PREVIOUS = RuleConfig(
    name="previous",
    directional=DirectionalConfig(extent_margin=0.10, axis_threshold=0.50),
    proximity=ProximityConfig(gap_factor=0.50),
    comparative=ComparativeConfig(size_ratio=1.15),
    depth=DepthConfig(rule="contact_band", band_width=12.0, min_band_pixels=20),
)
"""Table 16: the directional, proximity and comparative constants and the contact-band depth rule (the
ablation's "previous constants")."""

GENEVAL = RuleConfig(
    name="geneval",
    detection=DetectionConfig(presence_threshold=0.3, count_threshold=0.9, per_class_cap=16, overlap_iou=1.0),
    masks=MaskConfig(refine=False),
    attributes=AttributeConfig(color_beta=0.0),
    directional=DirectionalConfig(extent_margin=0.10, axis_threshold=0.50),
)
"""GenEval's published constants (its ``evaluation/evaluate_images.py``) where they map onto ours:
``threshold`` 0.3 -> presence threshold; ``counting_threshold`` 0.9 -> count threshold (GenEval applies
it to counting prompts only, and to nothing else; we count every prompt's instances at it); ``max_objects``
16 -> per-class cap; ``max_overlap`` 1.0 -> no overlap suppression; ``position_threshold`` 0.1 and its fixed
0.5 axis cut -> directional extent margin and axis threshold; top-1 colour -> colour buffer 0; boxes, not
SAM masks -> no refinement (we measure the detector's masks, GenEval its boxes). What does not map is listed
in docs/rules.md ("The geneval preset")."""

PRESETS: dict[str, RuleConfig] = {"current": CURRENT, "previous": PREVIOUS, "geneval": GENEVAL}


ADDED_DEFAULTS: dict[str, Any] = {"attributes.text_templates": "single"}
"""Constants added after the first results files, by config path, with the default at which they are left out
of ``RuleConfig.values`` (the digest and the record) and of a stage's stated rules."""

STAGE_RULES: dict[str, tuple[str, ...]] = {
    "detector": ("detection.prediction_floor",),
    "segmenter": ("masks.closing_radius", "masks.min_component_fraction", "masks.box_chunk_size"),
    "attributes": (),
    "depth": (),
}
"""The rule constants each stage applies itself (by config path); a stage reports their values in its
model info and the orchestrator refuses a stage whose values differ from its own config."""

OPTIONAL_STAGE_RULES: dict[str, tuple[str, ...]] = {
    "detector": (),
    "segmenter": (),
    "attributes": ("attributes.text_templates",),
    "depth": (),
}
"""Rule constants a stage applies itself that were added later (``ADDED_DEFAULTS``): stated only when not at
their default, so that a stage built before them (which states nothing) still matches a config at the
default; a template set is stated by its number (``TEXT_TEMPLATE_CODES``)."""


def _stage_value(config: RuleConfig, path: str) -> float:
    group, name = path.split(".")
    value = getattr(getattr(config, group), name)
    return float(TEXT_TEMPLATE_CODES[value]) if path == "attributes.text_templates" else float(value)


def stage_rules(config: RuleConfig, stage: str) -> dict[str, float]:
    """The values of ``STAGE_RULES[stage]`` in ``config``, and of ``OPTIONAL_STAGE_RULES[stage]`` not at their
    default."""
    out = {path: _stage_value(config, path) for path in STAGE_RULES[stage]}
    for path in OPTIONAL_STAGE_RULES[stage]:
        group, name = path.split(".")
        if getattr(getattr(config, group), name) != ADDED_DEFAULTS[path]:
            out[path] = _stage_value(config, path)
    return out


def stated_stage_rules(stage: str, stated: dict[str, float]) -> dict[str, float]:
    """A stage's stated rules (``ModelInfo.rules``) with the optional ones at their default dropped (a stage may
    state them or not), for comparing with ``stage_rules``."""
    defaults = {path: _stage_value(RuleConfig(), path) for path in OPTIONAL_STAGE_RULES[stage]}
    return {k: float(v) for k, v in stated.items() if k not in defaults or float(v) != defaults[k]}


def load_config(source: str) -> RuleConfig:
    """Load a config from a preset name or a JSON file (fields not given keep Table 15's values)."""
    if source in PRESETS:
        return PRESETS[source]
    from pathlib import Path

    path = Path(source)
    if not path.is_file():
        raise ValueError(f"rule config {source!r} is neither a preset ({', '.join(PRESETS)}) nor a JSON file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"rule config {source}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"rule config {source}: expected a JSON object")
    data.pop("digest", None)
    data.pop("provenance", None)  # how a fitted rules file was made (``negt2i calibrate``); not a constant
    return RuleConfig.model_validate(data)
