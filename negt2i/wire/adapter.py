"""The one place that converts between protobuf messages (``negt2i.v1``) and core types.

Everything that crosses a process boundary goes through here: prompts and
verdicts (the orchestrator's public API), detections, refined masks, attribute
scores and disparity maps (the stage contract), model infos and images.
Conversions are exact where the core is exact: scores and boxes are float32 on
both sides, masks are COCO RLE (lossless), verdict details that are free-form
JSON in the core (measurements, the rule config record) travel as JSON text.
Disparity travels as float16 (the default, half the bytes) or float32
(bit-exact); see ``docs/stage-contract.md``.

Errors in what a peer sent raise ``WireError`` naming the field, which the
services turn into HTTP 400 and the orchestrator into ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeVar

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import Message
from numpy.typing import NDArray

from negt2i.core import images, rle
from negt2i.core.config import STAGE_RULES
from negt2i.core.failures import Code, ContractRule, Failure, FailureKind
from negt2i.core.jsonl import JsonError, JsonTooDeep, parse_json
from negt2i.core.perception import (
    AttributeScores,
    BoolMask,
    Detections,
    DisparityMap,
    ImagePerception,
    RefinedMasks,
)
from negt2i.core.spec import (
    MAX_EXTRA_BYTES,
    MAX_EXTRA_DEPTH,
    MAX_OBJECTS,
    MAX_STATEMENTS,
    AttributeStatement,
    Polarity,
    Prompt,
    SpecError,
    parse_prompt,
)
from negt2i.core.stage_types import Image, ModelInfo, OperatingPoint
from negt2i.core.verdict import FailureCause, RowFailure, Verdict
from negt2i.core.vocab import (
    ANSWERS,
    BENCHMARK_CLASSES,
    CASE_RULE,
    COCO_CLASSES,
    DEAD_ZONE_CATEGORIES,
    OVER_COUNT_EXEMPT,
    PREDICATES,
    SETTING_NAMES,
    VALUES,
    Category,
)
from negt2i.wire import errors
from negt2i.wire.v1 import common_pb2, evaluator_pb2, stages_pb2

CONTRACT: Final = "negt2i.v1"
"""Version of the public API and of the stage contract."""
FEATURE_DETECT_CLASSES: Final = "detect.classes"
HEALTH_DETAILS_PREFIX: Final = "negt2i-stage-"
"""Trailing metadata of the orchestrator's health answers: ``negt2i-stage-<stage>`` = why that stage is refused
or down, or the warnings it was accepted with (``orchestrator.discovery``)."""
FEATURE_EXIF_ORIENTATION: Final = "image.exif_orientation"
"""``StageInfo.features``: the stage applies the EXIF orientation (as ``negt2i.core.images.decode_image``); a stage
that does not list it (the contract before the decoder applied it) gets upright pixels instead
(``orchestrator.stages.RemoteStages.image_for``)."""
"""``StageInfo.features`` entry of a detector that honours ``DetectItem.classes`` / ``max_per_class``."""

DEFAULT_MAX_PIXELS: Final = images.DEFAULT_MAX_PIXELS
"""Largest image (H x W) accepted by default (larger files are refused from their header, before decoding)."""

M = TypeVar("M", bound=Message)


class WireError(ValueError):
    """A message is malformed or fails validation; ``field`` names the offending field."""

    def __init__(self, message: str, *, field: str = "") -> None:
        self.message = message
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


# --------------------------------------------------------------------------- JSON transport


def to_json(message: Message) -> dict[str, Any]:
    """The proto3 JSON mapping of a message, field names as written in the ``.proto`` files."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def from_json(data: Any, cls: type[M], *, field: str = "") -> M:
    """Parse the proto3 JSON mapping into ``cls``; unknown fields and bad types raise ``WireError``."""
    if not isinstance(data, Mapping):
        raise WireError(
            f"expected a JSON object for {cls.DESCRIPTOR.full_name}, got {type(data).__name__}", field=field
        )
    try:
        return json_format.ParseDict(dict(data), cls())
    except json_format.ParseError as exc:
        raise WireError(str(exc), field=field) from None


JSON_TYPE: Final = "application/json"
"""The stage contract's body type every stage service accepts (the proto3 JSON mapping)."""

PROTOBUF_TYPE: Final = "application/x-protobuf"
"""The binary body type a stage service may accept (``StageInfo.content_types``): the stage's request and
response messages (``negt2i.wire.stage_table``: ``StageSpec.request`` / ``response``) in the protobuf wire format."""


def from_binary(data: bytes, cls: type[M], *, field: str = "") -> M:
    """Parse the protobuf wire format into ``cls``; malformed bytes raise ``WireError``. Unknown fields are kept
    (check them per item with ``check_known_fields``, so that one item with an unknown field fails alone)."""
    try:
        return cls.FromString(data)
    except Exception as exc:  # DecodeError, and upb's RuntimeError / ValueError on some malformed inputs
        raise WireError(f"not a binary {cls.DESCRIPTOR.full_name} ({type(exc).__name__})", field=field) from None


def check_known_fields(msg: Message, *, field: str = "") -> None:
    """Raise ``WireError`` if ``msg`` (or a message inside it) carries fields its schema does not know: the
    binary transport's equivalent of the JSON mapping refusing unknown fields (``from_json``)."""
    from google.protobuf.unknown_fields import UnknownFieldSet

    stack: list[tuple[Message, str]] = [(msg, field)]
    while stack:
        m, where = stack.pop()
        unknown = UnknownFieldSet(m)
        if len(unknown):
            numbers = sorted({unknown[i].field_number for i in range(len(unknown))})
            raise WireError(
                f"unknown field number {numbers[0]} in {m.DESCRIPTOR.full_name}", field=where or m.DESCRIPTOR.name
            )
        for fd, value in m.ListFields():
            if fd.message_type is None or fd.message_type.GetOptions().map_entry:
                continue
            name = f"{where}.{fd.name}" if where else fd.name
            if fd.is_repeated:
                stack.extend((v, f"{name}[{i}]") for i, v in enumerate(value))
            else:
                stack.append((value, name))


class StageItemError(WireError):
    """A stage reported that one item failed: ``status`` 400 (its inputs) or 500 (the model)."""

    def __init__(self, message: str, *, status: int, field: str = "") -> None:
        self.status = status
        super().__init__(message, field=field)


def check_item(msg: Message, where: str) -> None:
    """Raise ``StageItemError`` if a stage result carries an ``error``."""
    if msg.HasField("error"):  # type: ignore[attr-defined,unused-ignore]
        err = msg.error  # type: ignore[attr-defined]
        raise StageItemError(err.message, status=int(err.status) or 500, field=err.field or where)


def item_failure(exc: BaseException) -> stages_pb2.ItemFailure:
    """The ``ItemFailure`` for an exception raised while handling one item (``WireError`` = 400)."""
    if isinstance(exc, WireError):
        return stages_pb2.ItemFailure(status=400, message=exc.message, field=exc.field)
    return stages_pb2.ItemFailure(status=500, message=f"{type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------- images


def decode_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, field: str = "image") -> Image:
    """``negt2i.core.images.decode_image`` (the one decoder: PNG/JPEG/WebP, pixel limit from the header, EXIF
    orientation applied), its ``ImageError`` raised as ``WireError`` naming ``field`` (gRPC
    ``INVALID_ARGUMENT``, stage item status 400)."""
    try:
        return images.decode_image(data, max_pixels=max_pixels)
    except images.ImageError as exc:
        raise WireError(str(exc), field=field) from None


def encode_png(image: Image) -> bytes:
    """Lossless PNG bytes of an RGB ``uint8`` image."""
    from PIL import Image as PILImage

    buf = io.BytesIO()
    PILImage.fromarray(np.asarray(image, dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def image_to_proto(data: bytes, media_type: str = "") -> common_pb2.Image:
    """An ``Image`` message carrying already encoded bytes (never re-encoded)."""
    return common_pb2.Image(data=data, media_type=media_type)


# --------------------------------------------------------------------------- masks, boxes, model info


def mask_to_proto(mask: BoolMask) -> common_pb2.Mask:
    """A (H, W) bool mask as compressed COCO RLE."""
    record = rle.encode(np.asarray(mask, dtype=bool))
    counts = record["counts"]
    assert isinstance(counts, str)  # encode() compresses by default
    return common_pb2.Mask(height=record["size"][0], width=record["size"][1], counts=counts)


def mask_from_proto(msg: common_pb2.Mask, shape_hw: tuple[int, int] | None = None, *, field: str = "mask") -> BoolMask:
    """Decode a ``Mask``; with ``shape_hw`` the size must match."""
    if shape_hw is not None and (msg.height, msg.width) != tuple(shape_hw):
        raise WireError(f"mask is {msg.height} x {msg.width}, expected {shape_hw[0]} x {shape_hw[1]}", field=field)
    if msg.height * msg.width > DEFAULT_MAX_PIXELS:
        raise WireError(f"mask is {msg.height} x {msg.width}, above {DEFAULT_MAX_PIXELS} pixels", field=field)
    try:
        return rle.decode({"size": [msg.height, msg.width], "counts": msg.counts})
    except ValueError as exc:
        raise WireError(f"bad RLE ({exc})", field=field) from None


def masks_from_proto(msgs: Sequence[common_pb2.Mask], shape_hw: tuple[int, int], *, field: str) -> BoolMask:
    """A stack (K, H, W) of masks."""
    out = np.zeros((len(msgs), *shape_hw), dtype=bool)
    for k, msg in enumerate(msgs):
        out[k] = mask_from_proto(msg, shape_hw, field=f"{field}[{k}]")
    return out


def box_to_proto(xyxy: Sequence[float] | NDArray[np.float32]) -> common_pb2.Box:
    """An ``xyxy`` box."""
    x0, y0, x1, y1 = (float(v) for v in xyxy)
    return common_pb2.Box(x0=x0, y0=y0, x1=x1, y1=y1)


def boxes_from_proto(msgs: Sequence[common_pb2.Box]) -> NDArray[np.float32]:
    """Boxes (K, 4) float32."""
    return np.array([[b.x0, b.y0, b.x1, b.y1] for b in msgs], dtype=np.float32).reshape(-1, 4)


_MODEL_SCALARS: Final = ("stage", "backend", "model", "revision", "sha256", "library", "device", "dtype")


def model_info_to_proto(info: ModelInfo) -> common_pb2.ModelInfo:
    """A stage's ``ModelInfo``."""
    msg = common_pb2.ModelInfo(**{name: getattr(info, name) for name in _MODEL_SCALARS}, rules=dict(info.rules))
    op = info.operating_point
    if op is not None:
        msg.operating_point.CopyFrom(
            common_pb2.OperatingPoint(
                prediction_floor=op.prediction_floor, suppression=op.suppression, input_size=op.input_size
            )
        )
    return msg


def model_info_from_proto(msg: common_pb2.ModelInfo) -> ModelInfo:
    """Back to the core ``ModelInfo``. Its ``rules`` come in a fixed order (the stage's ``STAGE_RULES``, then
    any other path sorted), never the protobuf map's, which differs from process to process: a results
    line's model record is the same bytes on every run."""
    op = None
    if msg.HasField("operating_point"):
        p = msg.operating_point
        op = OperatingPoint(prediction_floor=p.prediction_floor, suppression=p.suppression, input_size=p.input_size)
    known = STAGE_RULES.get(msg.stage, ())
    order = [k for k in known if k in msg.rules] + sorted(k for k in msg.rules if k not in known)
    rules = {k: msg.rules[k] for k in order}
    return ModelInfo(**{name: getattr(msg, name) for name in _MODEL_SCALARS}, operating_point=op, rules=rules)


_KIND_TO: Final[dict[FailureKind, int]] = {
    FailureKind.UNREADABLE_IMAGE: evaluator_pb2.FAILURE_KIND_UNREADABLE_IMAGE,
    FailureKind.MISSING_METADATA: evaluator_pb2.FAILURE_KIND_MISSING_METADATA,
    FailureKind.INVALID_METADATA: evaluator_pb2.FAILURE_KIND_INVALID_METADATA,
    FailureKind.STAGE_ERROR: evaluator_pb2.FAILURE_KIND_STAGE_ERROR,
}
_KIND_FROM: Final[dict[int, FailureKind]] = {v: k for k, v in _KIND_TO.items()}


_STAGE_CODES: Final = frozenset({4, 8, 13, 14})
"""DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, INTERNAL, UNAVAILABLE: the codes ``ItemError.stage`` names a stage for
(``"orchestrator"`` when none failed)."""


def failure_to_proto(failure: Failure) -> evaluator_pb2.ItemError:
    """The ``ItemError`` of an item that got no verdict (``message`` is the failure's details in plain words,
    ``status`` the same error in the rich error model: ``negt2i.wire.errors``)."""
    message = errors.plain(failure.details())
    code = failure.code.number
    stage = failure.stage or ("orchestrator" if code in _STAGE_CODES else "")
    return evaluator_pb2.ItemError(
        code=code,
        message=message,
        field=failure.field,
        stage=stage,
        kind=_KIND_TO[failure.kind],  # type: ignore[arg-type]
        rule=failure.rule or "",
        status=errors.to_status(failure, message),
    )


def failure_from_proto(msg: evaluator_pb2.ItemError) -> Failure:
    """The ``Failure`` of an ``ItemError``; without a kind (older servers) it follows from the field."""
    kind = _KIND_FROM.get(int(msg.kind))
    if kind is None:
        kind = FailureKind.STAGE_ERROR
        if msg.field.startswith("prompt"):
            kind = FailureKind.INVALID_METADATA if msg.code != Code.NOT_FOUND.number else FailureKind.MISSING_METADATA
        elif msg.field.startswith("image"):
            kind = FailureKind.UNREADABLE_IMAGE
    code = Code.of(int(msg.code))
    text = f"{code}: {msg.message}"
    reason = errors.failure_from_status(msg.status).reason if msg.HasField("status") else ""
    rule = ContractRule.parse(msg.rule)
    return Failure(kind, msg.message, stage=msg.stage, rule=rule, field=msg.field, code=code, text=text,
                   reason=reason)  # fmt: skip


# --------------------------------------------------------------------------- detector


def detections_to_proto(det: Detections) -> stages_pb2.DetectResult:
    """A detector's output for one image."""
    h, w = det.shape_hw
    out = stages_pb2.DetectResult(height=h, width=w)
    for i, name in enumerate(det.class_names):
        out.detections.append(
            stages_pb2.Detection(
                class_name=name,
                score=float(det.scores[i]),
                box=box_to_proto(det.xyxy[i]),
                mask=mask_to_proto(det.masks[i]),
            )
        )
    for name, count in (det.class_counts or {}).items():
        out.class_counts[name] = count
    return out


def detections_from_proto(msg: stages_pb2.DetectResult, *, field: str = "result") -> Detections:
    """Validated ``Detections`` (shape errors raise ``WireError``)."""
    check_item(msg, field)
    hw = (int(msg.height), int(msg.width))
    if hw[0] <= 0 or hw[1] <= 0:
        raise WireError(f"image size {hw} must be positive", field=field)
    n = len(msg.detections)
    try:
        return Detections(
            tuple(d.class_name for d in msg.detections),
            np.array([d.score for d in msg.detections], dtype=np.float32),
            boxes_from_proto([d.box for d in msg.detections]),
            masks_from_proto([d.mask for d in msg.detections], hw, field=f"{field}.detections")
            if n
            else np.zeros((0, *hw), dtype=bool),
            hw,
            dict(msg.class_counts) or None,
        )
    except WireError:
        raise
    except ValueError as exc:
        raise WireError(str(exc), field=field) from None


# --------------------------------------------------------------------------- segmenter / attributes


def segment_item(image: bytes, boxes: NDArray[np.float32], reference_masks: BoolMask) -> stages_pb2.SegmentItem:
    """A segmenter request for one image."""
    return stages_pb2.SegmentItem(
        image=image_to_proto(image),
        boxes=[box_to_proto(b) for b in boxes],
        reference_masks=[mask_to_proto(m) for m in reference_masks],
    )


def masks_to_segment_result(masks: BoolMask) -> stages_pb2.SegmentResult:
    """A segmenter's refined masks (K, H, W)."""
    return stages_pb2.SegmentResult(masks=[mask_to_proto(m) for m in masks])


def segment_result_masks(msg: stages_pb2.SegmentResult, k: int, shape_hw: tuple[int, int]) -> BoolMask:
    """The refined masks (K, H, W) of a result that must hold exactly ``k`` masks."""
    check_item(msg, "segment")
    if len(msg.masks) != k:
        raise WireError(f"{len(msg.masks)} masks for {k} boxes", field="segment.masks")
    return masks_from_proto(list(msg.masks), shape_hw, field="segment.masks")


def attributes_item(
    image: bytes, masks: BoolMask, class_names: Sequence[str], answers: Sequence[str]
) -> stages_pb2.AttributesItem:
    """An attribute-scorer request for one image."""
    return stages_pb2.AttributesItem(
        image=image_to_proto(image),
        masks=[mask_to_proto(m) for m in masks],
        class_names=list(class_names),
        answers=list(answers),
    )


def scores_to_attributes_result(scores: NDArray[np.float32]) -> stages_pb2.AttributesResult:
    """Scores (K, A) as one row per instance."""
    rows = np.asarray(scores, dtype=np.float32)
    return stages_pb2.AttributesResult(
        instances=[stages_pb2.InstanceScores(scores=[float(v) for v in row]) for row in rows]
    )


def attributes_result_scores(msg: stages_pb2.AttributesResult, k: int, n_answers: int) -> NDArray[np.float32]:
    """Scores (K, A) float32 of a result that must be ``k`` x ``n_answers``."""
    check_item(msg, "attributes")
    if len(msg.instances) != k or any(len(row.scores) != n_answers for row in msg.instances):
        raise WireError(f"expected {k} rows of {n_answers} scores", field="attributes.instances")
    return np.array([list(row.scores) for row in msg.instances], dtype=np.float32).reshape(k, n_answers)


# --------------------------------------------------------------------------- depth

_DTYPES: Final[dict[int, np.dtype[Any]]] = {
    common_pb2.DEPTH_ENCODING_FLOAT16: np.dtype("<f2"),
    common_pb2.DEPTH_ENCODING_FLOAT32: np.dtype("<f4"),
}


def depth_to_proto(
    disparity: NDArray[np.float32], encoding: int = common_pb2.DEPTH_ENCODING_FLOAT16
) -> stages_pb2.DepthMap:
    """Pack an (H, W) disparity map (float16 unless FLOAT32 is asked for)."""
    if encoding == common_pb2.DEPTH_ENCODING_UNSPECIFIED:
        encoding = common_pb2.DEPTH_ENCODING_FLOAT16
    arr = np.asarray(disparity, dtype=np.float32)
    if arr.ndim != 2:
        raise WireError(f"disparity must be (H, W), got shape {arr.shape}", field="disparity")
    packed = arr.astype(_DTYPES[encoding]).tobytes(order="C")
    return stages_pb2.DepthMap(height=arr.shape[0], width=arr.shape[1], encoding=encoding, data=packed)  # type: ignore[arg-type]


def depth_from_proto(msg: stages_pb2.DepthMap, shape_hw: tuple[int, int] | None = None) -> NDArray[np.float32]:
    """Unpack a disparity map to float32 (H, W); with ``shape_hw`` the size must match."""
    encoding = msg.encoding or common_pb2.DEPTH_ENCODING_FLOAT16
    dtype = _DTYPES.get(encoding)
    if dtype is None:
        raise WireError(f"unknown depth encoding {msg.encoding}", field="disparity.encoding")
    h, w = int(msg.height), int(msg.width)
    if shape_hw is not None and (h, w) != tuple(shape_hw):
        raise WireError(f"disparity is {h} x {w}, expected {shape_hw[0]} x {shape_hw[1]}", field="disparity")
    if len(msg.data) != h * w * dtype.itemsize:
        raise WireError(f"{len(msg.data)} bytes for {h} x {w} {dtype.name} values", field="disparity.data")
    return np.frombuffer(msg.data, dtype=dtype).reshape(h, w).astype(np.float32)


# --------------------------------------------------------------------------- prompts

_CATEGORY_TO: Final[dict[Category | None, int]] = {
    None: evaluator_pb2.CATEGORY_UNSPECIFIED,
    Category.COLOR: evaluator_pb2.CATEGORY_COLOR,
    Category.MATERIAL: evaluator_pb2.CATEGORY_MATERIAL,
    Category.DIRECTIONAL: evaluator_pb2.CATEGORY_DIRECTIONAL,
    Category.PROXIMITY: evaluator_pb2.CATEGORY_PROXIMITY,
    Category.COMPARATIVE: evaluator_pb2.CATEGORY_COMPARATIVE,
    Category.DEPTH: evaluator_pb2.CATEGORY_DEPTH,
}
_CATEGORY_FROM: Final[dict[int, Category | None]] = {v: k for k, v in _CATEGORY_TO.items()}
_POLARITY_TO: Final[dict[Polarity, int]] = {
    Polarity.POSITIVE: evaluator_pb2.POLARITY_POSITIVE,
    Polarity.NEGATED: evaluator_pb2.POLARITY_NEGATED,
}
_POLARITY_FROM: Final[dict[int, Polarity]] = {v: k for k, v in _POLARITY_TO.items()}


SAME_TEXT_KEY: Final = "same_text_as"
"""The record key of ``PromptSpec.same_text_as`` (``negt2i.corpus.control``; kept in ``Prompt.extra``)."""
_COMPAT_EXTRA_KEYS: Final = frozenset({"setting", "exclude", SAME_TEXT_KEY})
"""Record keys with a ``PromptSpec`` field that ``extra_json`` still accepts (clients of earlier servers)."""
_FIELD_OF_KEY: Final[dict[str, str]] = {
    "id": "id",
    "prompt": "prompt",
    "category": "category",
    "tag": "tag",
    "include": "objects",
    "statements": "statements",
    "probes": "probes",
    "source_id": "source_id",
    "form": "form",
}
"""Record keys that have their own ``PromptSpec`` field and are refused inside ``extra_json``."""


def prompt_to_proto(prompt: Prompt) -> evaluator_pb2.PromptSpec:
    """Inline prompt metadata: every record key in its own field, ``extra_json`` only for unknown keys."""
    extra = dict(prompt.extra)
    same_text_as = extra.pop(SAME_TEXT_KEY, None)
    if not isinstance(same_text_as, str):  # not the corpus's key (a string): travels as an unknown key
        if same_text_as is not None:
            extra[SAME_TEXT_KEY] = same_text_as
        same_text_as = ""
    msg = evaluator_pb2.PromptSpec(
        id=prompt.id,
        prompt=prompt.prompt,
        category=_CATEGORY_TO[prompt.category],  # type: ignore[arg-type]
        tag=prompt.tag,
        objects=[evaluator_pb2.ObjectSpec(class_name=o.class_name, count=o.count) for o in prompt.objects],
        extra_json=json.dumps(extra, sort_keys=True, separators=(",", ":")) if extra else "",
        setting=prompt.setting,
        same_text_as=same_text_as,
    )
    for statements, into in ((prompt.statements, msg.statements), (prompt.probes, msg.probes)):
        for st in statements:
            polarity = _POLARITY_TO[st.polarity]
            if isinstance(st, AttributeStatement):
                attr = evaluator_pb2.AttributeStatement(object=st.object, value=st.value)
                into.append(evaluator_pb2.Statement(polarity=polarity, attribute=attr))  # type: ignore[arg-type]
            else:
                rel = evaluator_pb2.RelationStatement(subject=st.subject, target=st.target, predicate=st.predicate)
                into.append(evaluator_pb2.Statement(polarity=polarity, relation=rel))  # type: ignore[arg-type]
    msg.source_id = prompt.source_id or ""
    msg.form = prompt.form or ""
    return msg


def prompt_from_proto(msg: evaluator_pb2.PromptSpec, *, field: str = "prompt") -> Prompt:
    """A validated ``Prompt``; every metadata problem raises ``WireError`` naming the field."""
    if msg.category not in _CATEGORY_FROM:
        raise WireError(f"unknown category value {msg.category}", field=f"{field}.category")
    category = _CATEGORY_FROM[msg.category]
    for name, values in (("statements", msg.statements), ("probes", msg.probes)):
        if len(values) > MAX_STATEMENTS:
            raise WireError(f"{len(values)} {name}, above the limit of {MAX_STATEMENTS}", field=f"{field}.{name}")
    if len(msg.objects) > MAX_OBJECTS:
        raise WireError(f"{len(msg.objects)} objects, above the limit of {MAX_OBJECTS}", field=f"{field}.objects")
    statements = _statements_from_proto(msg.statements, f"{field}.statements")
    probes = _statements_from_proto(msg.probes, f"{field}.probes")
    record: dict[str, Any] = {}
    if msg.extra_json:
        size = len(msg.extra_json.encode())
        if size > MAX_EXTRA_BYTES:
            raise WireError(f"{size} bytes, above the limit of {MAX_EXTRA_BYTES}", field=f"{field}.extra_json")
        try:
            extra = parse_json(msg.extra_json)
        except JsonTooDeep:
            raise WireError(f"nested deeper than {MAX_EXTRA_DEPTH} levels", field=f"{field}.extra_json") from None
        except JsonError as exc:  # not JSON, or a number of more than 4,300 digits
            raise WireError(f"not valid JSON ({exc})", field=f"{field}.extra_json") from None
        if not isinstance(extra, dict):
            raise WireError("must be a JSON object", field=f"{field}.extra_json")
        for key in extra:
            if key in _FIELD_OF_KEY:
                raise WireError(
                    f"the record key {key!r} has its own field ({field}.{_FIELD_OF_KEY[key]}); extra_json is only "
                    "for keys without one",
                    field=f"{field}.extra_json",
                )
        record.update(extra)
    for key, value in (("setting", msg.setting), (SAME_TEXT_KEY, msg.same_text_as)):
        if value:
            if key in record and record[key] != value:
                raise WireError(f"extra_json's {key!r} disagrees with the field", field=f"{field}.{key}")
            record[key] = value
    if len(msg.exclude):
        if "exclude" in record:
            raise WireError("exclude is set both as a field and in extra_json", field=f"{field}.exclude")
        record["exclude"] = [{"class": o.class_name, "count": o.count} for o in msg.exclude]
    record.update(
        {
            "id": msg.id,
            "prompt": msg.prompt,
            "include": [{"class": o.class_name, "count": o.count or 1} for o in msg.objects],
            "statements": statements,
        }
    )
    if msg.tag:
        record["tag"] = msg.tag
    if probes:
        record["probes"] = probes
    if msg.source_id:
        record["source_id"] = msg.source_id
    if msg.form:
        record["form"] = msg.form
    if category is not None:
        record["category"] = category.value
    if not msg.id:
        raise WireError("a prompt needs an id", field=f"{field}.id")
    try:
        return parse_prompt(record)
    except SpecError as exc:
        where = exc.field.replace("include", "objects") if exc.field else ""
        if where == "extra":
            where = "extra_json"
        raise WireError(exc.message, field=errors.proto_path(f"{field}.{where}") if where else field) from None


def _statements_from_proto(msgs: Sequence[evaluator_pb2.Statement], where_prefix: str) -> list[dict[str, Any]]:
    """Statement (or probe) messages as JSON records; a malformed one raises ``WireError`` naming it."""
    statements: list[dict[str, Any]] = []
    for k, st in enumerate(msgs):
        where = f"{where_prefix}[{k}]"
        if st.polarity not in _POLARITY_FROM:
            raise WireError("polarity must be POLARITY_POSITIVE or POLARITY_NEGATED", field=f"{where}.polarity")
        polarity = _POLARITY_FROM[st.polarity].value
        kind = st.WhichOneof("kind")
        if kind == "attribute":
            a = st.attribute
            statements.append({"kind": "attribute", "object": a.object, "value": a.value, "polarity": polarity})
        elif kind == "relation":
            r = st.relation
            statements.append(
                {
                    "kind": "relation",
                    "subject": r.subject,
                    "target": r.target,
                    "predicate": r.predicate,
                    "polarity": polarity,
                }
            )
        else:
            raise WireError("a statement needs an attribute or a relation", field=where)
    return statements


def vocabulary_to_proto() -> evaluator_pb2.Vocabulary:
    """The published vocabulary (``GetVocabulary``, ``ServiceInfo.vocabulary``), from ``negt2i.core.vocab``."""
    categories = []
    for category in Category:
        categories.append(
            evaluator_pb2.CategoryVocabulary(
                category=_CATEGORY_TO[category],  # type: ignore[arg-type]
                name=category.value,
                statement_kind="attribute" if category.is_attribute else "relation",
                values=VALUES.get(category, ()),
                answers=ANSWERS.get(category, ()),
                predicates=PREDICATES.get(category, ()),
                dead_zone=category in DEAD_ZONE_CATEGORIES,
            )
        )
    return evaluator_pb2.Vocabulary(
        classes=COCO_CLASSES,
        benchmark_classes=BENCHMARK_CLASSES,
        over_count_exempt=sorted(OVER_COUNT_EXEMPT),
        categories=categories,
        settings=SETTING_NAMES,
        case_rule=CASE_RULE,
    )


# --------------------------------------------------------------------------- verdicts


_CAUSE_TO: Final[dict[FailureCause | None, int]] = {
    None: evaluator_pb2.FAILURE_CAUSE_UNSPECIFIED,
    FailureCause.UNDETECTED_OBJECT: evaluator_pb2.FAILURE_CAUSE_UNDETECTED_OBJECT,
    FailureCause.OVER_COUNT: evaluator_pb2.FAILURE_CAUSE_OVER_COUNT,
    FailureCause.DEAD_ZONE: evaluator_pb2.FAILURE_CAUSE_DEAD_ZONE,
    FailureCause.POSITIVE_VIOLATED: evaluator_pb2.FAILURE_CAUSE_POSITIVE_VIOLATED,
    FailureCause.NEGATED_VIOLATED: evaluator_pb2.FAILURE_CAUSE_NEGATED_VIOLATED,
}
_CAUSE_FROM: Final[dict[int, FailureCause | None]] = {v: k for k, v in _CAUSE_TO.items()}
_ROW_TO: Final[dict[RowFailure | None, int]] = {
    None: evaluator_pb2.ROW_FAILURE_UNSPECIFIED,
    RowFailure.UNDETECTED_OBJECT: evaluator_pb2.ROW_FAILURE_UNDETECTED_OBJECT,
    RowFailure.OVER_COUNT: evaluator_pb2.ROW_FAILURE_OVER_COUNT,
    RowFailure.POSITIVE_VIOLATED: evaluator_pb2.ROW_FAILURE_POSITIVE_VIOLATED,
    RowFailure.NEGATED_VIOLATED: evaluator_pb2.ROW_FAILURE_NEGATED_VIOLATED,
    RowFailure.BOTH_POLARITIES: evaluator_pb2.ROW_FAILURE_BOTH_POLARITIES,
}
_ROW_FROM: Final[dict[int, RowFailure | None]] = {v: k for k, v in _ROW_TO.items()}


def verdict_to_proto(verdict: Verdict) -> evaluator_pb2.Verdict:
    """A verdict, exact: ``verdict_from_proto(verdict_to_proto(v)).to_json() == v.to_json()``."""
    msg = evaluator_pb2.Verdict(
        prompt_id=verdict.prompt_id,
        tag=verdict.tag,
        prompt=verdict.prompt,
        category=_CATEGORY_TO[verdict.category],  # type: ignore[arg-type]
        setting=verdict.setting,
        correct=verdict.correct,
        reason=verdict.reason,
        failure_class=_ROW_TO[verdict.failure_class],  # type: ignore[arg-type]
        config_json=json.dumps(verdict.config, separators=(",", ":")),
        evaluator_version=verdict.evaluator_version,
        score=verdict.score,
    )
    for o in verdict.objects:
        ov = evaluator_pb2.ObjectVerdict(
            index=o.index,
            class_name=o.class_name,
            requested=o.requested,
            present=o.present,
            counted=o.counted,
            kept=o.kept,
            fallback=o.fallback,
            over_count=o.over_count,
            under_count=o.under_count,
            exempt=o.exempt,
            detections=o.detections,
            measurements_json=json.dumps(o.measurements, separators=(",", ":")),
        )
        if o.top_score is not None:
            ov.top_score = o.top_score
        msg.objects.append(ov)
    msg.source_id = verdict.source_id or ""
    msg.form = verdict.form or ""
    pairs = [(s, msg.statements) for s in verdict.statements] + [(s, msg.probes) for s in verdict.probes]
    for s, into in pairs:
        sv = evaluator_pb2.StatementVerdict(
            index=s.index,
            kind=s.kind,
            polarity=_POLARITY_TO[s.polarity],  # type: ignore[arg-type]
            text=s.text,
            objects=s.objects,
            requested=s.requested,
            evaluated=s.evaluated,
            passed=s.passed,
            cause=_CAUSE_TO[s.cause],  # type: ignore[arg-type]
            dead_zone=s.dead_zone,
            measurements_json=json.dumps(s.measurements, separators=(",", ":")),
        )
        if s.fired is not None:
            sv.fired.values.extend(s.fired)
        into.append(sv)
    return msg


def verdict_from_proto(msg: evaluator_pb2.Verdict) -> Verdict:
    """Back to the core ``Verdict`` (see ``verdict_to_proto``)."""
    data: dict[str, Any] = {
        "prompt_id": msg.prompt_id,
        "tag": msg.tag,
        "prompt": msg.prompt,
        "category": _CATEGORY_FROM[msg.category],
        "setting": msg.setting,
        "correct": msg.correct,
        "reason": msg.reason,
        "failure_class": _ROW_FROM[msg.failure_class],
        "objects": [
            {
                "index": o.index,
                "class_name": o.class_name,
                "requested": o.requested,
                "present": o.present,
                "counted": o.counted,
                "kept": o.kept,
                "fallback": o.fallback,
                "top_score": o.top_score if o.HasField("top_score") else None,
                "over_count": o.over_count,
                "under_count": o.under_count,
                "exempt": o.exempt,
                "detections": list(o.detections),
                "measurements": json.loads(o.measurements_json) if o.measurements_json else {},
            }
            for o in msg.objects
        ],
        "statements": [],
        "config": json.loads(msg.config_json) if msg.config_json else {},
        "evaluator_version": msg.evaluator_version,
    }
    if msg.source_id:
        data["source_id"] = msg.source_id
    if msg.form:
        data["form"] = msg.form
    if msg.HasField("score"):  # unset by an evaluator older than the field: computed from the elements
        data["score"] = msg.score
    data["probes"] = []
    for s, key in [(s, "statements") for s in msg.statements] + [(s, "probes") for s in msg.probes]:
        data[key].append(
            {
                "index": s.index,
                "kind": s.kind,
                "polarity": _POLARITY_FROM[s.polarity],
                "text": s.text,
                "objects": list(s.objects),
                "requested": s.requested,
                "evaluated": s.evaluated,
                "fired": list(s.fired.values) if s.HasField("fired") else None,
                "passed": s.passed,
                "cause": _CAUSE_FROM[s.cause],
                "dead_zone": s.dead_zone,
                "measurements": json.loads(s.measurements_json) if s.measurements_json else {},
            }
        )
    return Verdict.model_validate(data)


def models_record(stages: Sequence[common_pb2.StageService]) -> dict[str, Any]:
    """The results file's ``models`` field: stage -> ``ModelInfo`` JSON (as ``negt2i evaluate`` writes it), with
    ``warnings`` (``StageService.warnings``: what the orchestrator assumed about a stage that does not state
    it) when there are any."""
    return {
        s.stage: {**model_info_from_proto(s.model).model_dump(mode="json"), **({"warnings": list(s.warnings)}
                                                                              if s.warnings else {})}
        for s in stages
    }  # fmt: skip


def services_record(stages: Sequence[common_pb2.StageService]) -> dict[str, str]:
    """The results file's ``services`` field (submit only): stage -> the service URL that ran it."""
    return {s.stage: s.url for s in stages}


def depth_result_map(msg: stages_pb2.DepthResult, shape_hw: tuple[int, int]) -> NDArray[np.float32]:
    """The float32 disparity (H, W) of a depth result for an image of ``shape_hw``."""
    check_item(msg, "depth")
    return depth_from_proto(msg.disparity, shape_hw)


def perception_to_proto(
    perception: ImagePerception, depth_encoding: int = common_pb2.DEPTH_ENCODING_FLOAT16
) -> evaluator_pb2.Perception:
    """What the stages saw, the disparity map packed with ``depth_encoding`` (the orchestrator's: the map it
    received from the depth stage, so the packing loses nothing)."""
    msg = evaluator_pb2.Perception(
        detections=detections_to_proto(perception.detections), used_depth=perception.disparity is not None
    )
    if perception.disparity is not None:
        msg.disparity.CopyFrom(depth_to_proto(perception.disparity.values, depth_encoding))
    if perception.refined is not None:
        for det, mask in sorted(perception.refined.masks.items()):
            msg.refined.append(evaluator_pb2.RefinedMask(detection=det, mask=mask_to_proto(mask)))
    if perception.attributes is not None:
        answers = list(perception.attributes.answers)
        for det, scores in sorted(perception.attributes.scores.items()):
            row = [float(np.float32(scores[a])) for a in answers]
            msg.attributes.append(evaluator_pb2.InstanceAttributes(detection=det, answers=answers, scores=row))
    return msg


def perception_from_proto(msg: evaluator_pb2.Perception) -> ImagePerception:
    """Back to an ``ImagePerception`` (``disparity`` None when the message has none: an older orchestrator)."""
    det = detections_from_proto(msg.detections, field="perception.detections")
    hw = det.shape_hw
    refined = (
        RefinedMasks({r.detection: mask_from_proto(r.mask, hw, field="perception.refined") for r in msg.refined}, hw)
        if len(msg.refined)
        else None
    )
    attributes = None
    if len(msg.attributes):
        answers = tuple(msg.attributes[0].answers)
        attributes = AttributeScores(
            {a.detection: dict(zip(a.answers, a.scores, strict=True)) for a in msg.attributes}, answers
        )
    disparity = None
    if msg.HasField("disparity"):
        disparity = DisparityMap(depth_from_proto(msg.disparity, hw), hw)
    try:
        return ImagePerception(det, refined=refined, attributes=attributes, disparity=disparity)
    except ValueError as exc:
        raise WireError(str(exc), field="perception") from None
