"""Transport-free handlers of the stage contract: items in (JSON mapping or messages), results out.

A BentoML service (``services/<stage>/service.py``) is a thin shell over one of
these: it owns the HTTP side (routes, both body types, the micro-batcher that
merges concurrent requests, readiness, metrics), the handler owns the contract
(``docs/stage-contract.md``) in three steps:

1. ``prepare``: parse each item (the proto3 JSON mapping, or a binary message
   checked for unknown fields), check its limits, decode its image and masks,
   and, for a backend that prepares its own inputs (``PreparesInputs``: the
   image transforms, SigLIP's crops), that preprocessing too: a service runs
   this step on a worker thread, so its model thread only runs the model;
2. ``run``: one backend call for the model inputs of many items, from any
   number of requests (detector ``detect``, segmenter ``refine_batch``,
   attribute scorer ``score_batch``, depth ``disparity``: each batched across
   images);
3. ``pack``: one result message per item.

One bad item never fails its batch: it gets a result whose ``error`` says why
(status 400 for its inputs, 500 when the model failed on it), and a batch is
retried item by item when the backend raises on the whole batch.

No BentoML, torch or grpc import here; backends come from the stage registry.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from google.protobuf.message import Message

from negt2i.core.stage_types import STAGES, Image, ModelInfo
from negt2i.core.vocab import COCO_CLASSES
from negt2i.stages.base import PreparesInputs
from negt2i.stages.common import detect_requested
from negt2i.stages.registry import DEFAULT_BACKENDS, create
from negt2i.stages.torch_support import parse_dtypes
from negt2i.wire import adapter
from negt2i.wire.limits import ItemLimits
from negt2i.wire.stage_table import spec
from negt2i.wire.v1 import common_pb2, stages_pb2

_VOCAB: Final = frozenset(COCO_CLASSES)

DEFAULT_MAX_REQUEST_BYTES: Final = 64 * 1024 * 1024
"""Largest request body a stage service accepts by default (HTTP 413 above)."""

DEFAULT_MAX_BATCH_SIZE: Final = 16
"""Most items a stage runs through its model at once by default."""

DEFAULT_MAX_WAIT_MS: Final = 10.0
"""How long an idle stage waits for more items to merge into a batch, from the first item's arrival."""

DEFAULT_MAX_QUEUE: Final = 64
"""Most items a stage service holds at once (being decoded, waiting for the model, in it); more: HTTP 503."""


@dataclass(frozen=True)
class StageSettings:
    """What a stage service runs, from the environment (``docs/architecture.md``)."""

    stage: str
    backend: str
    device: str
    weights_dir: str | None
    max_pixels: int
    max_request_bytes: int
    max_batch_size: int
    rules: str = "current"
    """Rule preset or JSON file whose stage constants the backend applies (``NEGT2I_RULES``, as the orchestrator)."""
    limits: ItemLimits = field(default_factory=ItemLimits)
    """Per-item limits (``negt2i.wire.limits``)."""
    dtype: str = "fp32"
    max_wait_ms: float = DEFAULT_MAX_WAIT_MS
    """Micro-batching: wait at most this long for more items when the model is idle (``NEGT2I_MAX_WAIT_MS``)."""
    max_queue: int = DEFAULT_MAX_QUEUE
    """Micro-batching: most items admitted at once; a request beyond it is refused with 503 (``NEGT2I_MAX_QUEUE``)."""

    @classmethod
    def from_env(cls, stage: str, env: dict[str, str] | None = None) -> StageSettings:
        """``NEGT2I_<STAGE>_BACKEND`` (else ``NEGT2I_BACKEND``, else the paper's model), ``NEGT2I_DEVICE``,
        ``NEGT2I_WEIGHTS_DIR``, ``NEGT2I_MAX_PIXELS``,
        ``NEGT2I_MAX_REQUEST_BYTES``, ``NEGT2I_MAX_BATCH_SIZE``, ``NEGT2I_MAX_WAIT_MS``, ``NEGT2I_MAX_QUEUE``,
        ``NEGT2I_RULES`` (and ``NEGT2I_BACKEND_MODULES``:
        modules imported before the backend is built, to register more backends), ``NEGT2I_DTYPE`` (``fp32``,
        ``bf16``, ``fp16``, or ``stage=dtype`` pairs as ``negt2i evaluate --dtype``)."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
        e = dict(os.environ if env is None else env)
        return cls(
            stage=stage,
            backend=e.get(f"NEGT2I_{stage.upper()}_BACKEND") or e.get("NEGT2I_BACKEND") or DEFAULT_BACKENDS[stage],
            device=e.get("NEGT2I_DEVICE", "auto"),
            weights_dir=e.get("NEGT2I_WEIGHTS_DIR") or None,
            max_pixels=int(e.get("NEGT2I_MAX_PIXELS", adapter.DEFAULT_MAX_PIXELS)),
            max_request_bytes=int(e.get("NEGT2I_MAX_REQUEST_BYTES", DEFAULT_MAX_REQUEST_BYTES)),
            max_batch_size=int(e.get("NEGT2I_MAX_BATCH_SIZE", DEFAULT_MAX_BATCH_SIZE)),
            rules=e.get("NEGT2I_RULES") or "current",
            limits=ItemLimits.from_env(e),
            dtype=parse_dtypes(e.get("NEGT2I_DTYPE", "fp32"), STAGES)[stage],
            max_wait_ms=float(e.get("NEGT2I_MAX_WAIT_MS", DEFAULT_MAX_WAIT_MS)),
            max_queue=int(e.get("NEGT2I_MAX_QUEUE", DEFAULT_MAX_QUEUE)),
        )


def _create_backend(settings: StageSettings) -> Any:
    from negt2i.core.config import load_config

    options: dict[str, Any] = {
        "device": settings.device,
        "config": load_config(settings.rules),
        "dtype": settings.dtype,
    }
    if settings.weights_dir:
        options["weights_dir"] = settings.weights_dir
    return create(settings.stage, settings.backend, **options)


@dataclass
class Prepared:
    """One item after ``StageHandler.prepare``: its parsed message and model input, or its failure result."""

    msg: Message | None
    input: Any = None
    failure: Message | None = None


@dataclass(frozen=True)
class Ready:
    """An item's model input with the backend's own preprocessing of it (``PreparesInputs.prepare``), made by
    ``StageHandler.prepare`` on the request's worker thread, so that the model thread only runs the model."""

    value: Any
    prepared: Any


def _unready(batch: Sequence[Any]) -> tuple[list[Any], list[Any] | None]:
    """The items' model inputs, and their prepared forms when every item has one (else None)."""
    values = [x.value if isinstance(x, Ready) else x for x in batch]
    ready = [x.prepared for x in batch if isinstance(x, Ready)]
    return values, ready if batch and len(ready) == len(batch) else None


_BACKEND_REQUEST: Final[dict[str, Callable[[Any], Any]]] = {
    "detector": lambda item: item[0],  # (image, classes, cap): the image
    "segmenter": lambda item: item,  # a RefineItem
    "attributes": lambda item: item,  # a ScoreItem
    "depth": lambda item: item,  # the image
}


FEATURES: Final[dict[str, tuple[str, ...]]] = {
    "detector": (adapter.FEATURE_DETECT_CLASSES, adapter.FEATURE_EXIF_ORIENTATION),
    "segmenter": (adapter.FEATURE_EXIF_ORIENTATION,),
    "attributes": (adapter.FEATURE_EXIF_ORIENTATION,),
    "depth": (adapter.FEATURE_EXIF_ORIENTATION,),
}
"""Optional contract features each stage's handler honours (``StageInfo.features``)."""


def check_classes(classes: list[str]) -> tuple[str, ...]:
    """``DetectItem.classes``: benchmark class names (at most one entry per class); 400 otherwise."""
    if len(classes) > len(COCO_CLASSES):
        raise adapter.WireError(f"{len(classes)} classes, above the {len(COCO_CLASSES)} of the vocabulary",
                                field="classes")  # fmt: skip
    for i, name in enumerate(classes):
        if name not in _VOCAB:
            raise adapter.WireError(f"{name[:64]!r} is not a benchmark class", field=f"classes[{i}]")
    return tuple(classes)


def check_max_per_class(value: int) -> int:
    """``DetectItem.max_per_class``: >= 0 (0: no cap); 400 otherwise."""
    if value < 0:
        raise adapter.WireError(f"max_per_class must be >= 0, got {value}", field="max_per_class")
    return int(value)


class StageHandler:
    """Loads one stage backend and answers its contract's items."""

    def __init__(self, settings: StageSettings, backend: Any | None = None) -> None:
        self.settings = settings
        self.stage = settings.stage
        self.spec = spec(settings.stage)
        self.route = self.spec.route
        self.backend = backend if backend is not None else _create_backend(settings)
        self.ready = False
        steps: dict[str, tuple[Callable[[Any], Any], Callable[[list[Any]], list[Any]], Callable[[Any, Any], Message]]]
        steps = {
            "detector": (self._detect_prepare, self._detect_run, self._detect_pack),
            "segmenter": (self._segment_prepare, self._segment_run, self._segment_pack),
            "attributes": (self._attributes_prepare, self._attributes_run, self._attributes_pack),
            "depth": (self._depth_prepare, self._depth_run, self._depth_pack),
        }
        self._prepare_one, self._run_batch, self._pack_one = steps[self.stage]

    @property
    def model_info(self) -> ModelInfo:
        """The backend's ``ModelInfo``."""
        info: ModelInfo = self.backend.info
        return info

    def warm_up(self) -> None:
        """Run one tiny item through the backend, then mark the handler ready."""
        from negt2i.core.perception import mask_to_xyxy

        image = np.full((32, 32, 3), 250, dtype=np.uint8)
        png = adapter.encode_png(image)
        mask = np.zeros((32, 32), dtype=bool)
        mask[8:24, 8:24] = True
        item = self.spec.probe(png, mask[None], np.array([mask_to_xyxy(mask)], np.float32), ["cup"])
        result = self.handle([adapter.to_json(item)])[0]
        if "error" in result and result["error"].get("status") == 500:
            raise RuntimeError(f"{self.stage} backend failed its warm-up: {result['error'].get('message')}")
        self.ready = True

    def info(self) -> stages_pb2.StageInfo:
        """What ``GET /info`` answers (the service adds the body types it accepts besides JSON)."""
        return stages_pb2.StageInfo(
            contract=adapter.CONTRACT,
            model=adapter.model_info_to_proto(self.model_info),
            limits=stages_pb2.StageLimits(
                max_request_bytes=self.settings.max_request_bytes,
                max_batch_size=self.settings.max_batch_size,
                max_pixels=self.settings.max_pixels,
                max_masks_per_item=self.settings.limits.max_masks_per_item,
                max_mask_pixels=self.settings.limits.max_mask_pixels,
                max_answers=self.settings.limits.max_answers,
                max_text_chars=self.settings.limits.max_text_chars,
                max_rle_chars=self.settings.limits.max_rle_chars,
                body_timeout_s=self.settings.limits.body_timeout_s,
            ),
            ready=self.ready,
            features=FEATURES.get(self.stage, ()),
        )

    # ------------------------------------------------------------------ the three steps

    def handle(self, items: Sequence[Any]) -> list[dict[str, Any]]:
        """One JSON result per item (JSON mapping or message), in order: ``prepare``, ``run``, ``pack``."""
        return [adapter.to_json(m) for m in self.handle_messages(items)]

    def handle_messages(self, items: Sequence[Any]) -> list[Message]:
        """One result message per item, in order, with no other request merged in."""
        prepared = self.prepare(items)
        return self.pack(prepared, self.run([p.input for p in prepared if p.failure is None]))

    def prepare(self, items: Sequence[Any]) -> list[Prepared]:
        """Parse and check each item (a dict in the JSON mapping, or an item message from a binary body) and
        decode its inputs; an item that fails gets its failure result instead."""
        out: list[Prepared] = []
        for i, raw in enumerate(items):
            msg: Message | None = None
            try:
                if isinstance(raw, self.spec.item):
                    msg = raw
                    adapter.check_known_fields(msg, field=f"items[{i}]")
                else:
                    msg = adapter.from_json(raw, self.spec.item, field=f"items[{i}]")
                value = self._prepare_one(msg)
                if isinstance(self.backend, PreparesInputs):  # its own preprocessing too, off the model thread
                    value = Ready(value, self.backend.prepare(_BACKEND_REQUEST[self.stage](value)))
                out.append(Prepared(msg, value))
            except Exception as exc:
                out.append(Prepared(msg, failure=self.spec.failed_result(adapter.item_failure(exc))))
        return out

    def run(self, inputs: list[Any]) -> list[Any]:
        """The model on many items' inputs in one backend call: one output per input, or the exception that
        input failed with. When the call raises, each input is run alone, so a failing item fails alone."""
        if not inputs:
            return []
        try:
            outs = list(self._run_batch(inputs))
            if len(outs) != len(inputs):
                raise RuntimeError(f"backend returned {len(outs)} results for {len(inputs)} items")
            return outs
        except Exception:
            if len(inputs) == 1:
                return [self._run_alone(inputs[0])]
            return [self._run_alone(x) for x in inputs]

    def _run_alone(self, x: Any) -> Any:
        try:
            out = list(self._run_batch([x]))
            if len(out) != 1:
                raise RuntimeError(f"backend returned {len(out)} results for 1 item")
            return out[0]
        except Exception as exc:
            return exc

    def pack(self, prepared: Sequence[Prepared], outputs: Sequence[Any]) -> list[Message]:
        """One result message per prepared item: ``outputs`` are ``run``'s, for the items that have no failure,
        in order. Results that are not errors carry the model's digest."""
        digest = self.model_info.digest()
        outs = iter(outputs)
        results: list[Message] = []
        for p in prepared:
            if p.failure is not None:
                results.append(p.failure)
                continue
            out = next(outs)
            try:
                if isinstance(out, BaseException):
                    raise out
                result = self._pack_one(p.msg, out)
                result.model_digest = digest  # type: ignore[attr-defined]
            except Exception as exc:
                result = self.spec.failed_result(adapter.item_failure(exc))
            results.append(result)
        return results

    def _image(self, msg: common_pb2.Image, field: str = "image") -> Image:
        return adapter.decode_image(msg.data, max_pixels=self.settings.max_pixels, field=field)

    # ------------------------------------------------------------------ detector

    def _detect_prepare(self, msg: stages_pb2.DetectItem) -> tuple[Image, tuple[str, ...], int]:
        return self._image(msg.image), check_classes(list(msg.classes)), check_max_per_class(msg.max_per_class)

    def _detect_run(self, inputs: list[Any]) -> list[Any]:
        # one backend call per cap (callers with the same rules send the same cap: usually one call)
        batch, ready = _unready(inputs)
        out: list[Any] = [None] * len(batch)
        for cap in dict.fromkeys(c for _, _, c in batch):
            idx = [i for i, (_, _, c) in enumerate(batch) if c == cap]
            images, classes = [batch[i][0] for i in idx], [batch[i][1] for i in idx]
            prepared = None if ready is None else [ready[i] for i in idx]
            found = detect_requested(self.backend, images, classes, cap, prepared=prepared)
            if len(found) != len(idx):
                raise RuntimeError(f"backend returned {len(found)} results for {len(idx)} items")
            for i, det in zip(idx, found, strict=True):
                out[i] = det
        return out

    def _detect_pack(self, _msg: stages_pb2.DetectItem, det: Any) -> Message:
        return adapter.detections_to_proto(det)

    # ------------------------------------------------------------------ segmenter

    def _segment_prepare(self, msg: stages_pb2.SegmentItem) -> tuple[Image, Any, Any]:
        limits = self.settings.limits
        limits.check_boxes(list(msg.boxes))  # counts and numbers first: nothing large is decoded before
        if len(msg.reference_masks) != len(msg.boxes):
            raise adapter.WireError(
                f"{len(msg.reference_masks)} reference masks for {len(msg.boxes)} boxes", field="reference_masks"
            )
        image = self._image(msg.image)
        hw = (image.shape[0], image.shape[1])
        limits.check_masks(list(msg.reference_masks), hw, "reference_masks")
        boxes = adapter.boxes_from_proto(list(msg.boxes))
        refs = adapter.masks_from_proto(list(msg.reference_masks), hw, field="reference_masks")
        return image, boxes, refs

    def _segment_run(self, inputs: list[Any]) -> list[Any]:
        batch, ready = _unready(inputs)
        if ready is not None:  # SAM 2: the transformed images encoded together
            return list(self.backend.run_prepared(ready))
        many = getattr(self.backend, "refine_batch", None)
        if many is not None:  # SAM 2: the images encoded together (SAM2Segmenter.refine_batch)
            return list(many(batch))
        return [self.backend.refine(image, boxes, refs) for image, boxes, refs in batch]

    def _segment_pack(self, _msg: stages_pb2.SegmentItem, masks: Any) -> Message:
        return adapter.masks_to_segment_result(np.asarray(masks, dtype=bool))

    # ------------------------------------------------------------------ attributes

    def _attributes_prepare(self, msg: stages_pb2.AttributesItem) -> tuple[Image, Any, list[str], list[str]]:
        limits = self.settings.limits
        if len(msg.masks) > limits.max_masks_per_item:
            raise adapter.WireError(
                f"{len(msg.masks)} masks, above the limit of {limits.max_masks_per_item} per item", field="masks"
            )
        limits.check_texts(list(msg.answers), "answers", most=limits.max_answers)
        limits.check_texts(list(msg.class_names), "class_names", most=limits.max_masks_per_item)
        image = self._image(msg.image)
        hw = (image.shape[0], image.shape[1])
        limits.check_masks(list(msg.masks), hw, "masks")
        if len(msg.class_names) != len(msg.masks):
            raise adapter.WireError(
                f"{len(msg.class_names)} class names for {len(msg.masks)} masks", field="class_names"
            )
        if not msg.answers:
            raise adapter.WireError("at least one answer is needed", field="answers")
        masks = adapter.masks_from_proto(list(msg.masks), hw, field="masks")
        return image, masks, list(msg.class_names), list(msg.answers)

    def _attributes_run(self, inputs: list[Any]) -> list[Any]:
        batch, ready = _unready(inputs)
        if ready is not None:  # SigLIP 2: the prepared crops of all items through the image tower together
            return list(self.backend.run_prepared(ready))
        many = getattr(self.backend, "score_batch", None)
        if many is not None:  # SigLIP 2: the crops of all items through the image tower together
            return list(many(batch))
        return [self.backend.score(image, masks, names, answers) for image, masks, names, answers in batch]

    def _attributes_pack(self, _msg: stages_pb2.AttributesItem, scores: Any) -> Message:
        return adapter.scores_to_attributes_result(np.asarray(scores, dtype=np.float32))

    # ------------------------------------------------------------------ depth

    def _depth_prepare(self, msg: stages_pb2.DepthItem) -> Image:
        self.settings.limits.check_depth_encoding(msg.encoding)
        return self._image(msg.image)

    def _depth_run(self, inputs: list[Any]) -> list[Any]:
        images, ready = _unready(inputs)
        if ready is not None:
            return list(self.backend.run_prepared(ready))  # images of equal size share a forward pass
        return list(self.backend.disparity(images))  # images of equal size share a forward pass

    def _depth_pack(self, msg: stages_pb2.DepthItem, disparity: Any) -> Message:
        return stages_pb2.DepthResult(disparity=adapter.depth_to_proto(disparity, msg.encoding))
