"""Pre- and post-processing shared by the stage backends (numpy only; no torch).

Everything here is a pure function so the real backends (SAM 2.1, SigLIP 2, ...)
and the synthetic test backends run the same code around their models:

- ``refine_with_candidates``: box prompts in chunks (Table 15: 50 per call), the
  candidate mask chosen by overlap with the detector's own mask
  (``negt2i.core.rules.select_by_overlap``) and post-processed
  (``negt2i.core.rules.postprocess_mask``: closing radius 5, components < 5% dropped);
- ``masked_crop``: the attribute crop, the box cut out of the image with pixels
  outside the instance mask filled with gray ``#999`` (Appendix C.1);
- ``box_to_pixels``: continuous ``xyxy`` boxes to integer pixel windows;
- ``ask_detector`` / ``detect_requested``: a detector called with the class filter
  (``DetectItem.classes`` and ``max_per_class`` in ``docs/stage-contract.md``) when it takes it;
  ``detect_requested`` (the detector service honouring a request) also applies the filter to what the
  backend returns. The filter itself (``select_requested`` / ``filter_detections``: only the requested
  classes, at most ``max_per_class`` per class, highest scores, ties to the earlier detection, in the
  detector's own order) is the core's, ``negt2i.core.flow``, re-exported here; for the rules it runs once,
  in ``negt2i.core.flow.begin``, after the whole answer was checked against the run's rules.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.flow import filter_detections, select_requested
from negt2i.core.perception import Detections
from negt2i.core.rules import postprocess_mask, select_by_overlap

__all__ = [  # select_requested / filter_detections: the core's class filter (negt2i.core.flow), re-exported
    "GRAY_FILL",
    "CandidateFn",
    "ClassLists",
    "accepts_classes",
    "ask_detector",
    "box_to_pixels",
    "check_boxes",
    "check_image",
    "check_instance_masks",
    "chunks",
    "clip_boxes",
    "detect_requested",
    "detection_order",
    "filter_detections",
    "masked_crop",
    "refine_with_candidates",
    "select_detections",
    "select_requested",
]

GRAY_FILL: Final[tuple[int, int, int]] = (0x99, 0x99, 0x99)
"""Fill colour for pixels outside the instance mask in attribute crops (``#999``)."""

CandidateFn = Callable[[NDArray[np.float32]], NDArray[np.bool_]]
"""Maps a chunk of boxes (k, 4) to candidate masks (k, C, H, W) for that chunk."""


def check_image(image: NDArray[np.uint8]) -> tuple[int, int]:
    """``(H, W)`` of an RGB ``uint8`` image; raises ``ValueError`` naming the shape / dtype."""
    if image.ndim != 3 or image.shape[2] != 3 or image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError(f"image must be (H, W, 3) RGB, got shape {image.shape}")
    if image.dtype != np.uint8:
        raise ValueError(f"image must be uint8, got dtype {image.dtype}")
    return (int(image.shape[0]), int(image.shape[1]))


def clip_boxes(xyxy: NDArray[Any], shape_hw: tuple[int, int]) -> NDArray[np.float32]:
    """``xyxy`` boxes (N, 4) as a float32 copy clipped to the image (x in [0, W], y in [0, H]), x1 >= x0 and
    y1 >= y0."""
    h, w = shape_hw
    boxes = np.array(xyxy, dtype=np.float32).reshape(-1, 4)
    boxes[:, [0, 2]] = np.clip(boxes[:, [0, 2]], 0, w)
    boxes[:, [1, 3]] = np.clip(boxes[:, [1, 3]], 0, h)
    boxes[:, 2] = np.maximum(boxes[:, 2], boxes[:, 0])
    boxes[:, 3] = np.maximum(boxes[:, 3], boxes[:, 1])
    return boxes


def detection_order(class_names: Sequence[str | None], scores: NDArray[Any], xyxy: NDArray[Any]) -> NDArray[np.intp]:
    """The order a detector backend returns its detections in: score (as float32, as ``Detections`` stores it)
    from high to low, then class name, then box (x0, y0, x1, y1) from low to high, then the model's own order.

    The rules break ties between equal scores by this order (the earlier detection wins:
    ``negt2i.core.flow.select_requested``, ``Detections.indices_of``), so it must not depend on the machine.
    A model's own order among equal scores may: torchvision's batched NMS (Mask R-CNN) sorts with an unstable
    sort, which leaves equal values in whatever order its kernel does (CPU and GPU kernels, and versions, need
    not agree). Here equal scores are ordered by what the detections are. (Scores that differ only by float32
    rounding between machines keep the order of their values there: no tie-break can order them alike.)
    """
    n = len(class_names)
    s = np.asarray(scores, dtype=np.float32).reshape(n)
    b = np.asarray(xyxy, dtype=np.float32).reshape(n, 4)
    names = np.array([c or "" for c in class_names], dtype=str)
    return np.lexsort((np.arange(n), b[:, 3], b[:, 2], b[:, 1], b[:, 0], names, -s)).astype(np.intp)


def select_detections(
    class_id: NDArray[Any],
    confidence: NDArray[Any],
    xyxy: NDArray[Any],
    shape_hw: tuple[int, int],
    *,
    names: Mapping[int, str],
    floor: float,
) -> tuple[NDArray[np.intp], tuple[str, ...], NDArray[np.float32], NDArray[np.float32]]:
    """Which raw detector outputs become ``Detections``, in which order: ids without a benchmark name and scores
    below ``floor`` dropped, scores clipped to [0, 1], boxes clipped to the image (``clip_boxes``), the rows in
    ``detection_order``.

    Returns the kept indices (in that order), their class names, scores and ``xyxy`` boxes.
    """
    n = len(class_id)
    ids = np.asarray(class_id, dtype=np.int64).reshape(n)
    scores = np.clip(np.asarray(confidence, dtype=np.float32).reshape(n), 0.0, 1.0)
    keep = np.array([int(i) in names for i in ids], dtype=bool) & (scores >= floor)
    idx = np.flatnonzero(keep)
    boxes = clip_boxes(np.asarray(xyxy, dtype=np.float32).reshape(n, 4)[idx], shape_hw)
    kept = [names[int(i)] for i in ids[idx]]
    order = detection_order(kept, scores[idx], boxes)
    return idx[order], tuple(kept[k] for k in order), scores[idx[order]], boxes[order]


ClassLists = Sequence[Collection[str] | None]
"""The classes wanted per image (``None`` or empty: every class), as ``Detector.detect`` takes them."""


DETECT_CLASSES: Final = "detect.classes"
"""The class filter feature, as a served detector lists it in ``StageInfo.features``."""


def accepts_classes(detector: Any) -> bool:
    """Whether ``detector`` is asked for the class filter: it lists ``detect.classes`` in its ``features``
    (as a served detector lists it in ``StageInfo.features``: then it also states ``class_counts`` for the
    classes its cap cut) and its ``detect`` takes the ``classes`` / ``max_per_class`` keywords. Any other
    detector (one written before the filter, or one that takes the keywords without stating the feature) is
    called with the images alone and filtered after (``ask_detector``, ``negt2i.core.flow.begin``), so the counts
    before the cap (``Detections.class_counts``, ``measurements.candidates``) are right whatever it does."""
    import inspect

    if DETECT_CLASSES not in tuple(getattr(detector, "features", ()) or ()):
        return False

    try:
        params = inspect.signature(detector.detect).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return "classes" in params and "max_per_class" in params


def ask_detector(
    detector: Any,
    images: Sequence[NDArray[np.uint8]],
    classes: ClassLists | None,
    max_per_class: int = 0,
    *,
    prepared: Sequence[Any] | None = None,
) -> list[Any]:
    """``detector.detect`` asked for ``classes`` (per image) and ``max_per_class`` when it takes the keywords
    (``accepts_classes``), else called with the images alone. What it returns is not filtered here: the
    caller's ``negt2i.core.flow.begin`` checks the whole answer and applies the filter. With ``prepared`` (the
    detector's ``prepare`` of each image, ``negt2i.stages.base.PreparesInputs``) its ``run_prepared`` is
    called instead, with the class filter."""
    per_image: list[Collection[str] | None] = list(classes) if classes is not None else [None] * len(images)
    if len(per_image) != len(images):
        raise ValueError(f"{len(per_image)} class lists for {len(images)} images")
    if prepared is not None:
        if len(prepared) != len(images):
            raise ValueError(f"{len(prepared)} prepared inputs for {len(images)} images")
        return list(detector.run_prepared(prepared, classes=per_image, max_per_class=max_per_class))
    if (any(per_image) or max_per_class > 0) and accepts_classes(detector):
        return list(detector.detect(images, classes=per_image, max_per_class=max_per_class))
    return list(detector.detect(images))


def detect_requested(
    detector: Any,
    images: Sequence[NDArray[np.uint8]],
    classes: ClassLists | None,
    max_per_class: int = 0,
    *,
    prepared: Sequence[Any] | None = None,
) -> list[Detections]:
    """A detector that honours the class filter whatever its backend does (the detector service's answer to
    a ``DetectItem`` with ``classes``): ``ask_detector``, then ``filter_detections`` applied to what the
    backend returned (a no-op for a backend that honoured it)."""
    found = ask_detector(detector, images, classes, max_per_class, prepared=prepared)
    per_image = list(classes) if classes is not None else [None] * len(images)
    if len(found) != len(images):
        return found  # the caller's contract check names what is wrong
    return [
        filter_detections(d, c, max_per_class)[0] if isinstance(d, Detections) else d
        for d, c in zip(found, per_image, strict=True)
    ]


def check_instance_masks(masks: NDArray[Any], shape_hw: tuple[int, int], count: int) -> NDArray[np.bool_]:
    """``masks`` as bool (K, H, W) with K = ``count``; raises naming expected and actual shapes."""
    out = np.asarray(masks, dtype=bool)
    if out.ndim != 3 or out.shape[1:] != shape_hw or out.shape[0] != count:
        raise ValueError(f"masks have shape {out.shape}, expected ({count}, {shape_hw[0]}, {shape_hw[1]})")
    return out


def chunks(n: int, size: int) -> Iterator[slice]:
    """Consecutive slices covering ``range(n)`` with at most ``size`` items each."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def check_boxes(boxes: NDArray[np.float32], reference_masks: NDArray[np.bool_], shape_hw: tuple[int, int]) -> None:
    """Raise ``ValueError`` unless boxes are (K, 4) and reference masks (K, H, W) at the image size."""
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"boxes must be (K, 4) xyxy, got shape {boxes.shape}")
    expected = (boxes.shape[0], *shape_hw)
    if reference_masks.shape != expected:
        raise ValueError(f"reference masks have shape {reference_masks.shape}, expected (K, H, W) = {expected}")


def refine_with_candidates(
    shape_hw: tuple[int, int],
    boxes: NDArray[np.float32],
    reference_masks: NDArray[np.bool_],
    candidates: CandidateFn,
    config: RuleConfig = CURRENT,
) -> NDArray[np.bool_]:
    """Refined masks (K, H, W): candidates per chunk of ``config.masks.box_chunk_size`` boxes, the
    one overlapping its reference mask most (IoU) chosen, then ``postprocess_mask``.

    ``candidates`` is called once per chunk, in order, with that chunk's boxes.
    """
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    refs = np.asarray(reference_masks, dtype=bool)
    check_boxes(boxes, refs, shape_hw)
    out = np.zeros((boxes.shape[0], *shape_hw), dtype=bool)
    for part in chunks(boxes.shape[0], config.masks.box_chunk_size):
        cands = np.asarray(candidates(boxes[part]), dtype=bool)
        k = part.stop - part.start
        if cands.ndim != 4 or cands.shape[0] != k or cands.shape[2:] != shape_hw:
            raise ValueError(
                f"candidate masks have shape {cands.shape}, expected ({k}, C, {shape_hw[0]}, {shape_hw[1]})"
            )
        for j, i in enumerate(range(part.start, part.stop)):
            best = select_by_overlap(cands[j], refs[i])
            out[i] = postprocess_mask(cands[j, best], config)
    return out


def box_to_pixels(box: NDArray[np.float32] | tuple[float, ...], shape_hw: tuple[int, int]) -> tuple[int, int, int, int]:
    """Integer window ``(x0, y0, x1, y1)`` (exclusive ends) covering a continuous ``xyxy`` box, clipped
    to the image and at least one pixel wide and tall."""
    h, w = shape_hw
    x0, y0, x1, y1 = (float(v) for v in box)
    c0 = min(max(int(np.floor(x0)), 0), w - 1)
    r0 = min(max(int(np.floor(y0)), 0), h - 1)
    c1 = max(min(int(np.ceil(x1)), w), c0 + 1)
    r1 = max(min(int(np.ceil(y1)), h), r0 + 1)
    return (c0, r0, c1, r1)


def masked_crop(
    image: NDArray[np.uint8],
    box: NDArray[np.float32] | tuple[float, ...],
    mask: NDArray[np.bool_],
    fill: tuple[int, int, int] = GRAY_FILL,
) -> NDArray[np.uint8]:
    """The box crop of ``image`` with pixels outside ``mask`` set to ``fill`` (gray ``#999``)."""
    hw = check_image(image)
    if mask.shape != hw:
        raise ValueError(f"mask has shape {mask.shape}, expected (H, W) = {hw}")
    c0, r0, c1, r1 = box_to_pixels(box, hw)
    crop = image[r0:r1, c0:c1].copy()
    crop[~mask[r0:r1, c0:c1]] = np.asarray(fill, dtype=np.uint8)
    return crop
