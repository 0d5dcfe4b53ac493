"""RF-DETR-Seg-XL detector (``rfdetr-seg-xl``): COCO detections with instance masks.

Table 15 / Appendix C.1: ``RFDETRSegXLarge`` called with an internal prediction floor
of 0.005; every detection above the floor is returned (the rules apply presence,
counting and the per-class cap). RF-DETR numbers classes by COCO *category id*
(1-90, sparse, as in ``rfdetr.assets.coco_classes.COCO_CLASSES``); ids that are not
one of the 80 classes are dropped, and COCO's names are respelled as GenEval
spells them (``mouse`` -> ``computer mouse``, ``remote`` -> ``tv remote``,
``keyboard`` -> ``computer keyboard``).

By default the model runs RF-DETR's inference-optimised graph (``model.inference(compile=False)``:
the exported forward without training-only branches, 158.7 vs 202.9 GFLOP per image at 624 px,
identical ``predict()`` output; ``tests/stages/test_rfdetr.py`` checks the parity), and in the
precision chosen with ``dtype`` (``fp32`` by default, ``negt2i.stages.torch_support.precision``).

The class filter (``detect(images, classes=, max_per_class=)``, ``docs/stage-contract.md``) acts inside
RF-DETR's post-processing (``_FilteredPostProcess``): of the top 300 query/class pairs, only those of
the requested classes above the floor, at most ``max_per_class`` per class, have their masks gathered
and upsampled to the image, so the cost of full-resolution masks follows what the rules read, not the
300 raw detections. The kept detections are exactly those the unfiltered call followed by
``negt2i.core.flow.filter_detections`` gives (``tests/stages/test_class_filter.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.perception import Detections
from negt2i.core.stage_types import Image, ModelInfo, OperatingPoint, applied
from negt2i.core.vocab import COCO_CLASSES
from negt2i.stages.common import (
    DETECT_CLASSES,
    ClassLists,
    check_image,
    clip_boxes,
    detection_order,
    select_detections,
    select_requested,
)
from negt2i.stages.registry import register

BACKEND: Final = "rfdetr-seg-xl"
MODEL: Final = "RFDETRSegXLarge"

GENEVAL_SPELLING: Final[dict[str, str]] = {
    "mouse": "computer mouse",
    "remote": "tv remote",
    "keyboard": "computer keyboard",
}
"""COCO names (as RF-DETR spells them) that GenEval and this benchmark spell differently."""


def class_names_by_id(coco_classes: Mapping[int, str] | None = None) -> dict[int, str]:
    """COCO category id -> benchmark class name, from RF-DETR's own table (or ``coco_classes``)."""
    table: Mapping[int, str]
    if coco_classes is None:
        from rfdetr.assets.coco_classes import COCO_CLASSES as table
    else:
        table = coco_classes
    out = {int(k): GENEVAL_SPELLING.get(v, v) for k, v in table.items()}
    unknown = sorted(set(out.values()) - set(COCO_CLASSES))
    if unknown:
        raise ValueError(f"RF-DETR class names {unknown} have no benchmark spelling")
    return out


def to_detections(
    class_id: NDArray[Any],
    confidence: NDArray[Any],
    xyxy: NDArray[Any],
    mask: NDArray[Any] | None,
    shape_hw: tuple[int, int],
    *,
    names: Mapping[int, str],
    floor: float,
    class_counts: Mapping[str, int] | None = None,
) -> Detections:
    """Our ``Detections`` from RF-DETR's arrays: unknown ids and scores below ``floor`` dropped, boxes
    clipped to the image, scores clipped to [0, 1], in ``detection_order``; ``class_counts`` from the class
    filter."""
    if len(class_id) and mask is None:
        raise ValueError("RF-DETR returned no masks; a segmentation model (RFDETRSeg*) is required")
    idx, classes, scores, boxes = select_detections(class_id, confidence, xyxy, shape_hw, names=names, floor=floor)
    h, w = shape_hw
    masks = np.zeros((0, h, w), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)[idx]
    if masks.shape != (len(idx), h, w):
        raise ValueError(f"RF-DETR masks have shape {masks.shape}, expected ({len(idx)}, {h}, {w})")
    return Detections(classes, scores, boxes, masks, shape_hw, class_counts or None)


class _FilteredPostProcess:
    """RF-DETR's ``PostProcess`` with the class filter applied before masks are gathered and upsampled.

    Unfiltered (``request`` None) it is the wrapped module. Filtered, per image: RF-DETR's own top-k
    selection and box scaling, then the rows ``predict`` and ``to_detections`` would keep (score above
    ``predict``'s threshold, a benchmark class, float32 score clipped to [0, 1] at least the floor)
    reduced by ``select_requested`` (ties between equal scores broken in ``detection_order``, the order
    ``to_detections`` gives its rows), and RF-DETR's own mask post-processing on those rows only.
    """

    def __init__(self, inner: Any, names: Mapping[int, str], floor: float) -> None:
        self.inner = inner
        self.names = names
        self.floor = floor
        self.request: list[tuple[Collection[str] | None, int]] | None = None
        self.counts: list[dict[str, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __call__(self, outputs: dict[str, Any], target_sizes: Any, score_threshold: float | None = None) -> Any:
        import torch

        inner = self.inner
        request = self.request
        masks = outputs.get("pred_masks")
        if request is None or masks is None or outputs.get("pred_keypoints") is not None:
            self.counts = [{} for _ in range(len(target_sizes))]
            return inner(outputs, target_sizes, score_threshold=score_threshold)
        logits = outputs["pred_logits"]
        inner._validate_outputs(logits, masks, None, target_sizes)
        scores, labels, topk = inner._select_topk(logits)
        boxes = inner._gather_and_scale_boxes(outputs["pred_boxes"], topk, target_sizes)
        results: list[dict[str, Any]] = []
        self.counts = []
        for i in range(logits.shape[0]):
            classes, cap = request[i]
            ok = np.ones(scores.shape[1], dtype=bool)
            if score_threshold is not None:
                ok = (scores[i] > score_threshold).cpu().numpy()
            conf = np.clip(scores[i].float().cpu().numpy(), 0.0, 1.0)
            ok &= conf >= self.floor
            ids = labels[i].cpu().numpy()
            names = [self.names.get(int(c)) if k else None for c, k in zip(ids, ok, strict=True)]
            h, w = (int(v) for v in target_sizes[i].tolist())
            order = detection_order(names, conf, clip_boxes(boxes[i].float().cpu().numpy(), (h, w)))
            chosen, counts = select_requested([names[k] for k in order], conf[order], classes, cap)
            keep = np.sort(order[chosen])  # the chosen rows, in RF-DETR's order
            self.counts.append(counts)
            sel = torch.as_tensor(keep, dtype=torch.long, device=scores.device)
            one = slice(i, i + 1)
            results.extend(
                inner._postprocess_masks(
                    masks[one],
                    scores[one][:, sel],
                    labels[one][:, sel],
                    boxes[one][:, sel],
                    topk[one][:, sel],
                    target_sizes[one],
                    inner.upsample_masks_to_image_size,
                    score_threshold=score_threshold,
                )
            )
        return results


@dataclass(frozen=True)
class PreparedImage:
    """One image prepared for RF-DETR: its size and the normalised (3, S, S) tensor on the model's device."""

    shape_hw: tuple[int, int]
    pixels: Any


class RFDETRDetector:
    """Wraps an ``rfdetr`` segmentation model (``RFDETRSegXLarge`` for the paper)."""

    features: tuple[str, ...] = (DETECT_CLASSES,)
    """It honours the class filter and reports ``class_counts`` (``negt2i.stages.common.accepts_classes``)."""

    def __init__(
        self,
        model: Any,
        info: ModelInfo,
        *,
        floor: float = CURRENT.detection.prediction_floor,
        shape: tuple[int, int] | None = None,
        optimize: bool = True,
        dtype: str = "fp32",
    ) -> None:
        """``model`` is an ``rfdetr.RFDETR`` instance; ``shape`` overrides its inference resolution (tests;
        square when ``optimize``); ``optimize`` builds the inference-optimised graph (a copy: the original
        module is kept); ``dtype`` is ``fp32``, ``bf16`` or ``fp16`` (autocast)."""
        from negt2i.stages.torch_support import DTYPES, check_dtype

        self.model = model
        self.dtype = check_dtype(dtype)
        self.info = info.model_copy(update={"dtype": DTYPES[self.dtype]})
        self.floor = floor
        self.shape = shape
        self.names = class_names_by_id()
        self.optimized = optimize
        if optimize:
            if shape is not None:
                if shape[0] != shape[1]:
                    raise ValueError(f"the optimised RF-DETR graph needs a square shape, got {shape}")
                model.model.resolution = int(shape[0])
            model.inference(compile=False)
        context = model.model
        inner = getattr(context, "postprocess", None)
        inner = inner.inner if isinstance(inner, _FilteredPostProcess) else inner
        self._post = _FilteredPostProcess(inner, self.names, floor)
        context.postprocess = self._post
        self._lock = threading.Lock()

    @classmethod
    def from_weights(
        cls,
        *,
        device: str = "auto",
        weights_dir: str | Path | None = None,
        config: RuleConfig = CURRENT,
        dtype: str = "fp32",
        optimize: bool = True,
        shape: tuple[int, int] | None = None,
        **_: Any,
    ) -> RFDETRDetector:
        """Load ``RFDETRSegXLarge`` from the weights cache (``negt2i weights fetch``); ``shape`` overrides the
        inference resolution (tests)."""
        from negt2i import weights
        from negt2i.stages.torch_support import model_info, resolve_device

        verified = weights.verify(BACKEND, weights_dir)
        dev = resolve_device(device)
        from rfdetr import RFDETRSegXLarge

        model = RFDETRSegXLarge(pretrain_weights=str(verified.path("rf-detr-seg-xlarge.pt")), device=str(dev))
        info = model_info("detector", BACKEND, MODEL, dist="rfdetr", device=dev, weights=verified, dtype=dtype)
        floor = config.detection.prediction_floor
        size = int(getattr(getattr(model, "model_config", None), "resolution", 0) or 0)
        info = applied(info, config, OperatingPoint(prediction_floor=floor, suppression="none", input_size=size))
        return cls(model, info, floor=floor, optimize=optimize, dtype=dtype, shape=shape)

    def detect(
        self, images: Sequence[Image], classes: ClassLists | None = None, *, max_per_class: int = 0
    ) -> list[Detections]:
        """One ``Detections`` per image: every detection scoring at least the floor, benchmark spelling;
        with ``classes`` (per image; None / empty: every class) or ``max_per_class`` > 0, only those
        (see the module docstring)."""
        return self.run_prepared([self.prepare(im) for im in images], classes, max_per_class=max_per_class)

    def _resize_to(self) -> list[int]:
        res = self.model.model.resolution
        return list(self.shape) if self.shape is not None else [res, res]

    def prepare(self, request: Image) -> PreparedImage:
        """The image checked and through RF-DETR's own ``predict`` transform, on the calling thread
        (``negt2i.stages.base.PreparesInputs``): the uint8 pixels to the model's device, widened to [0, 1],
        resized (bilinear, no antialias) to the inference resolution and normalised, exactly as
        ``RFDETR.predict`` does per image."""
        import torch
        import torchvision.transforms.functional as TF  # type: ignore[import-untyped]
        from rfdetr.detr import _uint8_chw_to_float, _uint8_image_to_chw_view

        from negt2i.stages.torch_support import precision

        hw = check_image(request)
        rf = self.model
        device = rf.model.device
        with precision(device, self.dtype):  # the context ``predict`` ran in
            chw = _uint8_image_to_chw_view(np.ascontiguousarray(request)).to(device)
            pixels = _uint8_chw_to_float(chw, torch.tensor(255, device=device, dtype=torch.get_default_dtype()))
            pixels = TF.normalize(TF.resize(pixels, self._resize_to(), antialias=False), rf.means, rf.stds)
        return PreparedImage(hw, pixels)

    def run_prepared(
        self, prepared: Sequence[PreparedImage], classes: ClassLists | None = None, *, max_per_class: int = 0
    ) -> list[Detections]:
        """``detect`` on prepared images: the rest of ``RFDETR.predict`` (the forward pass of the optimised or
        training graph, the post-processing with the class filter, the rows above the floor)."""
        import torch

        from negt2i.stages.torch_support import precision

        if not prepared:
            return []
        wanted = list(classes) if classes is not None else [None] * len(prepared)
        if len(wanted) != len(prepared):
            raise ValueError(f"{len(wanted)} class lists for {len(prepared)} images")
        filtered = any(wanted) or max_per_class > 0
        rf = self.model
        ctx = rf.model
        with self._lock:
            self._post.request = [(w, max_per_class) for w in wanted] if filtered else None
            self._post.counts = []
            try:
                with precision(ctx.device, self.dtype):
                    results = self._forward(torch.stack([p.pixels for p in prepared]), [p.shape_hw for p in prepared])
                counts = list(self._post.counts)
                if len(counts) != len(prepared):  # the hook did not run: unfiltered rows, the caller filters them
                    counts = [{} for _ in prepared]
            finally:
                self._post.request = None
        out = []
        for result, p, c in zip(results, prepared, counts, strict=True):
            keep = (result["scores"] > self.floor).nonzero(as_tuple=True)[0]  # predict's own threshold
            masks = result.get("masks")
            out.append(
                to_detections(
                    result["labels"][keep].cpu().numpy(),
                    result["scores"][keep].float().cpu().numpy(),
                    result["boxes"][keep].float().cpu().numpy(),
                    None if masks is None else masks[keep].squeeze(1).cpu().numpy(),
                    p.shape_hw,
                    names=self.names,
                    floor=self.floor,
                    class_counts=c,
                )
            )
        return out

    def _forward(self, batch: Any, sizes: list[tuple[int, int]]) -> list[dict[str, Any]]:
        """``RFDETR.predict``'s model call and post-processing on a batch it would have built."""
        import torch

        rf = self.model
        ctx = rf.model
        rf._ensure_eval_mode_for_unoptimized_inference()
        if rf._is_optimized_for_inference:
            if batch.shape[2] != rf._optimized_resolution or batch.shape[3] != rf._optimized_resolution:
                raise ValueError(
                    f"RF-DETR was optimised for {rf._optimized_resolution} px, got {tuple(batch.shape[2:])}"
                )
            predictions = ctx.inference_model(batch.to(dtype=rf._optimized_dtype))
        else:
            predictions = ctx.model(batch)
        if isinstance(predictions, tuple):
            named = {"pred_logits": predictions[1], "pred_boxes": predictions[0]}
            if len(predictions) == 3:
                named["pred_masks"] = predictions[2]
            predictions = named
        target_sizes = torch.tensor(sizes, device=ctx.device)
        return list(ctx.postprocess(predictions, target_sizes=target_sizes, score_threshold=self.floor))


register("detector", BACKEND, RFDETRDetector.from_weights, model=MODEL, weights=BACKEND)
