"""Mask R-CNN R50-FPN detector (``maskrcnn-r50``): the paper's ablation detector (Appendix D).

torchvision's ``maskrcnn_resnet50_fpn`` with ``MaskRCNN_ResNet50_FPN_Weights.COCO_V1``
(the classic Mask R-CNN: 37.9 box / 34.6 mask AP on COCO val2017), in place of
RF-DETR-Seg-XL. It is called like RF-DETR:

- the prediction floor (``detection.prediction_floor`` of the rule config, 0.005) is
  the model's own ``box_score_thresh``, and up to 300 detections per image are kept
  (``box_detections_per_img``, RF-DETR-Seg-XL's ``num_select``); the rules apply
  presence, counting and the per-class cap;
- no suppression beyond the model's own (per-class NMS at IoU 0.5 inside its box head);
- the soft masks torchvision pastes into the image are thresholded at 0.5
  (``mask >= 0.5``, as torchvision documents);
- labels are indices into torchvision's 91-entry COCO list (``__background__`` at 0,
  then COCO *category ids* 1-90 with ``N/A`` for the unused ids), the same ids RF-DETR
  uses; ``N/A`` ids are dropped and COCO's names are respelled as GenEval spells them
  (``mouse`` -> ``computer mouse``, ``remote`` -> ``tv remote``, ``keyboard`` ->
  ``computer keyboard``).

Images are resized by the model's own transform (shorter side 800, longer at most 1333).

The class filter (``detect(images, classes=, max_per_class=)``, ``docs/stage-contract.md``) acts
before the model's transform pastes the 28 x 28 mask predictions into the full image
(``_FilteredPostprocess``), so only the kept detections get full-resolution masks.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
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
    chunks,
    clip_boxes,
    detection_order,
    select_detections,
    select_requested,
)
from negt2i.stages.registry import register
from negt2i.stages.rfdetr_backend import GENEVAL_SPELLING

BACKEND: Final = "maskrcnn-r50"
MODEL: Final = "maskrcnn_resnet50_fpn"
NUM_CLASSES: Final = 91
"""torchvision's COCO head: ``__background__`` + category ids 1-90 (unused ids are ``N/A``)."""
DETECTIONS_PER_IMAGE: Final = 300
MASK_THRESHOLD: Final = 0.5
_UNUSED: Final = frozenset({"__background__", "N/A"})


def class_names_by_id(categories: Sequence[str] | None = None) -> dict[int, str]:
    """Label -> benchmark class name, from torchvision's COCO category list (or ``categories``)."""
    if categories is None:
        from torchvision.models.detection import MaskRCNN_ResNet50_FPN_Weights  # type: ignore[import-untyped]

        categories = list(MaskRCNN_ResNet50_FPN_Weights.COCO_V1.meta["categories"])
    if len(categories) != NUM_CLASSES or categories[0] != "__background__":
        raise ValueError(f"expected {NUM_CLASSES} COCO categories starting with __background__, got {len(categories)}")
    out = {i: GENEVAL_SPELLING.get(c, c) for i, c in enumerate(categories) if c not in _UNUSED}
    unknown = sorted(set(out.values()) - set(COCO_CLASSES))
    if unknown:
        raise ValueError(f"torchvision class names {unknown} have no benchmark spelling")
    return out


def build_model(
    *,
    floor: float = CURRENT.detection.prediction_floor,
    detections_per_img: int = DETECTIONS_PER_IMAGE,
    min_size: int = 800,
    max_size: int = 1333,
    proposals: int = 1000,
) -> Any:
    """The Mask R-CNN R50-FPN architecture of ``MaskRCNN_ResNet50_FPN_Weights.COCO_V1`` (91 classes),
    untrained and downloading nothing, set to keep every detection scoring at least ``floor`` (up to
    ``detections_per_img``); in eval mode.

    This is what ``maskrcnn_resnet50_fpn(weights=COCO_V1)`` builds before loading: a ResNet-50
    with frozen batch norm (``weights=None`` alone would give trainable ``BatchNorm2d``, whose
    state dict and parameter count differ from the published file's) and an FPN on it.
    torchvision keeps scores strictly above ``box_score_thresh``, so the threshold is the
    largest float32 below ``floor`` and ``to_detections`` applies ``>= floor`` exactly.
    ``min_size`` / ``max_size`` (the model's resize) and ``proposals`` (RPN proposals kept
    per image) are the published settings; tests lower them.
    """
    from torchvision.models.detection import MaskRCNN
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone  # type: ignore[import-untyped]
    from torchvision.ops.misc import FrozenBatchNorm2d  # type: ignore[import-untyped]

    backbone = resnet_fpn_backbone(
        backbone_name="resnet50", weights=None, norm_layer=FrozenBatchNorm2d, trainable_layers=3
    )
    model = MaskRCNN(
        backbone,
        num_classes=NUM_CLASSES,
        min_size=min_size,
        max_size=max_size,
        rpn_pre_nms_top_n_test=max(proposals, 1000),
        rpn_post_nms_top_n_test=proposals,
        box_score_thresh=float(np.nextafter(np.float32(floor), np.float32(-1.0))),
        box_detections_per_img=detections_per_img,
    )
    return model.eval()


def to_detections(
    labels: NDArray[Any],
    scores: NDArray[Any],
    boxes: NDArray[Any],
    soft_masks: NDArray[Any],
    shape_hw: tuple[int, int],
    *,
    names: dict[int, str],
    floor: float,
    class_counts: Mapping[str, int] | None = None,
) -> Detections:
    """Our ``Detections`` from one image's torchvision output (as numpy): ``N/A`` / background labels and
    scores below ``floor`` dropped, masks (N, 1, H, W) in [0, 1] thresholded at 0.5, boxes clipped, in
    ``detection_order`` (torchvision's own order among equal scores is its unstable sort's);
    ``class_counts`` from the class filter."""
    n = len(labels)
    idx, classes, conf, xyxy = select_detections(labels, scores, boxes, shape_hw, names=names, floor=floor)
    h, w = shape_hw
    soft = np.asarray(soft_masks)
    if soft.ndim == 4 and soft.shape[1] == 1:
        soft = soft[:, 0]
    if soft.shape != (n, h, w):
        raise ValueError(f"Mask R-CNN masks have shape {np.asarray(soft_masks).shape}, expected ({n}, 1, {h}, {w})")
    masks = soft[idx] >= MASK_THRESHOLD if soft.dtype != np.bool_ else soft[idx]
    return Detections(classes, conf, xyxy, masks, shape_hw, class_counts or None)


class _FilteredPostprocess:
    """The model transform's ``postprocess`` (box rescaling, mask pasting) after the class filter.

    Per image with a request: the rows ``to_detections`` would keep (a benchmark class, float32 score
    clipped to [0, 1] at least the floor) reduced by ``select_requested`` (ties between equal scores broken
    in ``detection_order`` on the boxes the wrapped method returns, the order ``to_detections`` gives its
    rows); the others never reach ``paste_masks_in_image``. ``request`` None: the wrapped method unchanged.
    """

    def __init__(self, inner: Any, names: dict[int, str], floor: float) -> None:
        self.inner = inner
        self.names = names
        self.floor = floor
        self.request: list[tuple[Collection[str] | None, int]] | None = None
        self.counts: list[dict[str, int]] = []

    def __call__(self, result: list[dict[str, Any]], image_shapes: Any, original_image_sizes: Any) -> Any:
        from torchvision.models.detection.transform import resize_boxes  # type: ignore[import-untyped]

        request = self.request
        self.counts = [{} for _ in result]
        if request is not None:
            kept = []
            for i, r in enumerate(result):
                conf = np.clip(r["scores"].float().cpu().numpy(), 0.0, 1.0)
                ids = r["labels"].cpu().numpy()
                names = [self.names.get(int(c)) if s >= self.floor else None for c, s in zip(ids, conf, strict=True)]
                hw = (int(original_image_sizes[i][0]), int(original_image_sizes[i][1]))
                boxes = resize_boxes(r["boxes"], image_shapes[i], original_image_sizes[i])  # as the wrapped method
                order = detection_order(names, conf, clip_boxes(boxes.float().cpu().numpy(), hw))
                chosen, self.counts[i] = select_requested([names[k] for k in order], conf[order], *request[i])
                keep = np.sort(order[chosen])
                sel = r["scores"].new_tensor(keep, dtype=r["labels"].dtype)
                kept.append({k: v.index_select(0, sel) for k, v in r.items()})
            result = kept
        return self.inner(result, image_shapes, original_image_sizes)


class MaskRCNNDetector:
    """Wraps a torchvision ``MaskRCNN`` (``maskrcnn_resnet50_fpn`` with COCO weights for the ablation)."""

    features: tuple[str, ...] = (DETECT_CLASSES,)
    """It honours the class filter and reports ``class_counts`` (``negt2i.stages.common.accepts_classes``)."""

    def __init__(
        self,
        model: Any,
        info: ModelInfo,
        *,
        floor: float = CURRENT.detection.prediction_floor,
        batch_size: int = 8,
        dtype: str = "fp32",
    ) -> None:
        """``model`` is in eval mode with ``box_score_thresh`` at most ``floor`` (``build_model``)."""
        from negt2i.stages.torch_support import DTYPES, check_dtype

        if float(model.roi_heads.score_thresh) > floor:
            raise ValueError(f"the model's box_score_thresh {model.roi_heads.score_thresh} is above the floor {floor}")
        self.model = model.eval()
        self.dtype = check_dtype(dtype)
        self.info = info.model_copy(update={"dtype": DTYPES[self.dtype]})
        self.floor = floor
        self.batch_size = batch_size
        self.device = next(model.parameters()).device
        self.names = class_names_by_id()
        inner = model.transform.postprocess
        inner = inner.inner if isinstance(inner, _FilteredPostprocess) else inner
        self._post = _FilteredPostprocess(inner, self.names, floor)
        model.transform.postprocess = self._post
        self._lock = threading.Lock()

    @classmethod
    def from_weights(
        cls,
        *,
        device: str = "auto",
        weights_dir: str | Path | None = None,
        config: RuleConfig = CURRENT,
        batch_size: int = 8,
        dtype: str = "fp32",
        **_: Any,
    ) -> MaskRCNNDetector:
        """Load Mask R-CNN R50-FPN (COCO_V1) from the weights cache (``negt2i weights fetch maskrcnn-r50``)."""
        import torch

        from negt2i import weights
        from negt2i.stages.torch_support import model_info, resolve_device

        e = weights.entry(BACKEND)
        verified = weights.verify(BACKEND, weights_dir)
        dev = resolve_device(device)
        floor = config.detection.prediction_floor
        model = build_model(floor=floor)
        state = torch.load(verified.path(e.main_file), map_location="cpu", weights_only=True)
        model.load_state_dict(state)
        model.to(dev)
        info = model_info("detector", BACKEND, MODEL, dist="torchvision", device=dev, weights=verified, dtype=dtype)
        nms = float(model.roi_heads.nms_thresh)
        point = OperatingPoint(
            prediction_floor=floor, suppression=f"nms:{nms:g}", input_size=int(model.transform.min_size[0])
        )
        return cls(model, applied(info, config, point), floor=floor, batch_size=batch_size, dtype=dtype)

    def detect(
        self, images: Sequence[Image], classes: ClassLists | None = None, *, max_per_class: int = 0
    ) -> list[Detections]:
        """One ``Detections`` per image: every detection scoring at least the floor, benchmark spelling;
        with ``classes`` (per image; None / empty: every class) or ``max_per_class`` > 0, only those
        (see the module docstring)."""
        import torch

        from negt2i.stages.torch_support import precision

        shapes = [check_image(im) for im in images]
        wanted = list(classes) if classes is not None else [None] * len(images)
        if len(wanted) != len(images):
            raise ValueError(f"{len(wanted)} class lists for {len(images)} images")
        filtered = any(wanted) or max_per_class > 0
        out: list[Detections] = []
        for part in chunks(len(images), self.batch_size):
            tensors = [
                torch.from_numpy(np.ascontiguousarray(im)).to(self.device).permute(2, 0, 1).float().div_(255.0)
                for im in images[part]
            ]
            with self._lock:
                self._post.request = [(w, max_per_class) for w in wanted[part]] if filtered else None
                try:
                    with precision(self.device, self.dtype):
                        preds = self.model(tensors)
                    counts = list(self._post.counts)
                finally:
                    self._post.request = None
            for p, hw, c in zip(preds, shapes[part], counts, strict=True):
                masks = p["masks"] >= MASK_THRESHOLD  # threshold on the device: bool, not float, comes back
                out.append(
                    to_detections(
                        p["labels"].cpu().numpy(),
                        p["scores"].float().cpu().numpy(),
                        p["boxes"].float().cpu().numpy(),
                        masks.cpu().numpy(),
                        hw,
                        names=self.names,
                        floor=self.floor,
                        class_counts=c,
                    )
                )
        return out


register("detector", BACKEND, MaskRCNNDetector.from_weights, model=MODEL, weights=BACKEND)
