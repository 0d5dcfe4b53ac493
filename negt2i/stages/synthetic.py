"""Deterministic synthetic backends for tests and development (registry name ``synthetic``).

NOT models: they read scenes drawn by ``render_scene`` (solid shapes on a plain
background, lossless PNG) and give exact, hand-checkable answers, so the
pipeline, ``negt2i evaluate``, the stage services and the orchestrator can be
tested end to end without weights, the network or a GPU.

The encoding:

- **class**: each of the 80 COCO classes has one exact fill colour
  (``CLASS_COLORS``); the detector finds each class's pixels, splits them into
  8-connected components, fills their holes and reports every component of at
  least ``min_area`` pixels with a fixed score (0.9 unless told otherwise).
- **attribute**: an object may carry a *swatch*, an inner rectangle (half the
  object's size, centred) in the value's reference colour (``COLOR_REFERENCE``
  for colours incl. gray, ``MATERIAL_REFERENCE`` for materials). The scorer
  takes the mean colour of the mask's non-class-colour pixels (all mask
  pixels when there is no swatch) and scores each answer as
  ``100 * (1 - distance / max_distance)`` in RGB, so the drawn value scores 100.
- **depth**: the ground-contact cue. Each detected object gets disparity
  ``(bottom_row + 1) / H`` (lower in the image = closer), the background 0;
  where objects overlap the closer one wins.
- **segmenter**: candidates per box are the box rectangle, the reference mask
  clipped to the box and the reference mask dilated by one pixel; the core's
  ``select_by_overlap`` picks one (the clipped reference) and
  ``postprocess_mask`` cleans it, in chunks like SAM.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
from numpy.typing import NDArray
from scipy import ndimage

from negt2i import __version__
from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.perception import Detections, mask_to_xyxy
from negt2i.core.stage_types import Image, ModelInfo, OperatingPoint, applied
from negt2i.core.vocab import COCO_CLASSES
from negt2i.stages.base import RefineItem, ScoreItem
from negt2i.stages.common import (
    DETECT_CLASSES,
    ClassLists,
    check_boxes,
    check_image,
    check_instance_masks,
    refine_with_candidates,
    select_requested,
)
from negt2i.stages.registry import register

BACKEND: Final = "synthetic"
MODEL: Final = "synthetic-palette-v1"
LIBRARY: Final = f"negt2i {__version__}"

BACKGROUND: Final[tuple[int, int, int]] = (250, 250, 250)
"""Background colour of synthetic scenes (not a class colour)."""

_LEVELS = (15, 65, 115, 165, 215)


def _class_color(index: int) -> tuple[int, int, int]:
    d0, d1, d2 = index // 25, (index // 5) % 5, index % 5
    return (_LEVELS[d0], _LEVELS[d1], _LEVELS[d2])


CLASS_COLORS: Final[dict[str, tuple[int, int, int]]] = {c: _class_color(i) for i, c in enumerate(COCO_CLASSES)}
"""Exact fill colour of each COCO class (channels from a 5-level lattice)."""

COLOR_REFERENCE: Final[dict[str, tuple[int, int, int]]] = {
    "red": (220, 20, 30),
    "orange": (245, 140, 10),
    "yellow": (245, 225, 20),
    "green": (30, 170, 50),
    "blue": (30, 60, 220),
    "purple": (130, 40, 170),
    "pink": (245, 150, 190),
    "brown": (120, 70, 30),
    "black": (5, 5, 5),
    "white": (252, 252, 252),
    "gray": (128, 128, 128),
}
"""Swatch colour of each colour answer (the ten colours and gray)."""

MATERIAL_REFERENCE: Final[dict[str, tuple[int, int, int]]] = {
    "wooden": (150, 100, 50),
    "metal": (175, 180, 190),
    "plastic": (240, 60, 200),
    "glass": (170, 225, 240),
}
"""Swatch colour that stands for each material."""

_MAX_DISTANCE = float(np.sqrt(3 * 255.0**2))


def _code(rgb: NDArray[np.uint8]) -> NDArray[np.int64]:
    arr = rgb.astype(np.int64)
    return (arr[..., 0] << 16) | (arr[..., 1] << 8) | arr[..., 2]


def _code_of(color: tuple[int, int, int]) -> int:
    return (color[0] << 16) | (color[1] << 8) | color[2]


_CLASS_OF_CODE: Final[dict[int, str]] = {_code_of(c): name for name, c in CLASS_COLORS.items()}
_CLASS_CODES: Final[NDArray[np.int64]] = np.array(sorted(_CLASS_OF_CODE), dtype=np.int64)


def _info(stage: str) -> ModelInfo:
    return ModelInfo(stage=stage, backend=BACKEND, model=MODEL, library=LIBRARY, device="cpu")


# --------------------------------------------------------------------------- scenes


@dataclass(frozen=True)
class SceneObject:
    """One shape of a synthetic scene: its class, pixel box ``xyxy`` (exclusive ends), shape and
    optional attribute value drawn as a swatch (a colour, ``gray`` or a material)."""

    class_name: str
    box: tuple[int, int, int, int]
    shape: Literal["rect", "ellipse"] = "rect"
    value: str | None = None

    def __post_init__(self) -> None:
        if self.class_name not in CLASS_COLORS:
            raise ValueError(f"unknown class {self.class_name!r}")
        x0, y0, x1, y1 = self.box
        if x1 <= x0 or y1 <= y0:
            raise ValueError(f"box {self.box} must have x0 < x1 and y0 < y1")
        if self.value is not None and self.value not in COLOR_REFERENCE and self.value not in MATERIAL_REFERENCE:
            raise ValueError(f"unknown attribute value {self.value!r}")


def shape_mask(obj: SceneObject, shape_hw: tuple[int, int]) -> NDArray[np.bool_]:
    """The pixels a scene object covers (before later objects are drawn over it)."""
    h, w = shape_hw
    x0, y0, x1, y1 = obj.box
    mask = np.zeros((h, w), dtype=bool)
    if obj.shape == "rect":
        mask[max(y0, 0) : max(min(y1, h), 0), max(x0, 0) : max(min(x1, w), 0)] = True
        return mask
    rows, cols = np.mgrid[0:h, 0:w]
    cy, cx = (y0 + y1 - 1) / 2, (x0 + x1 - 1) / 2
    ry, rx = max((y1 - y0) / 2, 0.5), max((x1 - x0) / 2, 0.5)
    inside: NDArray[np.bool_] = ((rows - cy) / ry) ** 2 + ((cols - cx) / rx) ** 2 <= 1.0
    return inside


def render_scene(
    objects: Sequence[SceneObject],
    shape_hw: tuple[int, int] = (128, 128),
    background: tuple[int, int, int] = BACKGROUND,
) -> Image:
    """Draw the objects in order (later ones on top) on a plain background; RGB ``uint8``."""
    h, w = shape_hw
    image = np.empty((h, w, 3), dtype=np.uint8)
    image[:] = np.asarray(background, dtype=np.uint8)
    for obj in objects:
        image[shape_mask(obj, shape_hw)] = CLASS_COLORS[obj.class_name]
        if obj.value is not None:
            x0, y0, x1, y1 = obj.box
            bw, bh = x1 - x0, y1 - y0
            sx0, sy0 = x0 + bw // 4, y0 + bh // 4
            sx1, sy1 = sx0 + max(bw // 2, 1), sy0 + max(bh // 2, 1)
            color = COLOR_REFERENCE.get(obj.value) or MATERIAL_REFERENCE[obj.value]
            image[max(sy0, 0) : max(min(sy1, h), 0), max(sx0, 0) : max(min(sx1, w), 0)] = color
    return image


def write_geneval_layout(root: str | Path, entries: Sequence[tuple[Mapping[str, Any], Sequence[Image]]]) -> list[Path]:
    """Write GenEval's folder layout: ``root/NNNNN/metadata.jsonl`` (one prompt record) and
    ``root/NNNNN/samples/0000.png ...``; returns the image paths in order."""
    from PIL import Image as PILImage

    root = Path(root)
    paths: list[Path] = []
    for index, (record, images) in enumerate(entries):
        folder = root / f"{index:05d}"
        (folder / "samples").mkdir(parents=True, exist_ok=True)
        (folder / "metadata.jsonl").write_text(json.dumps(dict(record)) + "\n", encoding="utf-8")
        for k, image in enumerate(images):
            path = folder / "samples" / f"{k:04d}.png"
            PILImage.fromarray(image).save(path)
            paths.append(path)
    return paths


# --------------------------------------------------------------------------- backends


def find_objects(
    image: Image, min_area: int = 4, classes: Collection[str] | None = None
) -> list[tuple[str, NDArray[np.bool_]]]:
    """``(class name, filled mask)`` for every connected component of a class colour (of ``classes``
    only, when given and not empty), classes in COCO order and components in scan order."""
    check_image(image)
    codes = _code(image)
    present = np.intersect1d(np.unique(codes), _CLASS_CODES)
    if classes:
        wanted = np.array([_code_of(CLASS_COLORS[c]) for c in set(classes) if c in CLASS_COLORS], dtype=np.int64)
        present = np.intersect1d(present, wanted)
    order = sorted(present.tolist(), key=lambda c: COCO_CLASSES.index(_CLASS_OF_CODE[c]))
    found: list[tuple[str, NDArray[np.bool_]]] = []
    eight = np.ones((3, 3), dtype=bool)
    for code in order:
        labels, n = ndimage.label(codes == code, structure=eight)
        for sl, k in zip(ndimage.find_objects(labels), range(1, n + 1), strict=True):
            if sl is None:
                continue
            part = ndimage.binary_fill_holes(labels[sl] == k)
            if int(part.sum()) < min_area:
                continue
            mask = np.zeros(codes.shape, dtype=bool)
            mask[sl] = part
            found.append((_CLASS_OF_CODE[code], mask))
    return found


class SyntheticDetector:
    """Finds ``render_scene`` objects by their class colour; every detection scores ``score`` (none when
    ``score`` is below the config's prediction floor, which the detector applies)."""

    features: tuple[str, ...] = (DETECT_CLASSES,)
    """It honours the class filter and reports ``class_counts`` (``negt2i.stages.common.accepts_classes``)."""

    def __init__(self, *, score: float = 0.9, min_area: int = 4, config: RuleConfig = CURRENT, **_: Any) -> None:
        if not 0.0 <= score <= 1.0:
            raise ValueError(f"score must be in [0, 1], got {score}")
        self.score = score
        self.min_area = min_area
        self.floor = config.detection.prediction_floor
        self.info = applied(_info("detector"), config, OperatingPoint(prediction_floor=self.floor))

    def detect(
        self, images: Sequence[Image], classes: ClassLists | None = None, *, max_per_class: int = 0
    ) -> list[Detections]:
        """One ``Detections`` per image (see the module docstring); ``classes`` (per image) and
        ``max_per_class``: the class filter (``negt2i.stages.common.select_requested``), applied before
        any other class's components are labelled or any mask is stacked."""
        out: list[Detections] = []
        wanted = list(classes) if classes is not None else [None] * len(images)
        if len(wanted) != len(images):
            raise ValueError(f"{len(wanted)} class lists for {len(images)} images")
        for image, want in zip(images, wanted, strict=True):
            hw = check_image(image)
            found = find_objects(image, self.min_area, want) if self.score >= self.floor else []
            scores = np.full(len(found), self.score, np.float32)
            keep, counts = select_requested([name for name, _ in found], scores, want, max_per_class)
            if not len(keep):
                out.append(Detections.empty(hw))
                continue
            names = [found[i][0] for i in keep]
            masks = np.stack([found[i][1] for i in keep])
            boxes = np.array([mask_to_xyxy(m) for m in masks], dtype=np.float32)
            out.append(Detections(tuple(names), scores[keep], boxes, masks, hw, counts or None))
        return out


NOISY_BACKEND: Final = "synthetic-noisy"
NOISY_MODEL: Final = "synthetic-noisy-palette-v1"


class NoisySyntheticDetector(SyntheticDetector):
    """``synthetic`` with a score a threshold can be fitted to (the calibration walk-through in
    ``docs/stage-contract.md``): an object scores 0.2 + 0.75 * min(1, area / (4% of the image)), so small or
    mostly hidden objects score low; and every requested class also gets one *ghost*, a 6x6 detection at a
    place and score (0.01 to 0.25) drawn from the image's bytes, which a presence threshold must reject and a
    counting threshold must not count. Deterministic: the same image gives the same detections."""

    def __init__(self, *, config: RuleConfig = CURRENT, min_area: int = 4, **_: Any) -> None:
        super().__init__(config=config, min_area=min_area)
        self.info = applied(
            ModelInfo(stage="detector", backend=NOISY_BACKEND, model=NOISY_MODEL, library=LIBRARY, device="cpu"),
            config,
            OperatingPoint(prediction_floor=self.floor),
        )

    def detect(
        self, images: Sequence[Image], classes: ClassLists | None = None, *, max_per_class: int = 0
    ) -> list[Detections]:
        """One ``Detections`` per image (see the class docstring)."""
        import hashlib

        out: list[Detections] = []
        wanted = list(classes) if classes is not None else [None] * len(images)
        if len(wanted) != len(images):
            raise ValueError(f"{len(wanted)} class lists for {len(images)} images")
        for image, want in zip(images, wanted, strict=True):
            hw = check_image(image)
            h, w = hw
            found = find_objects(image, self.min_area, want)
            names = [name for name, _ in found]
            masks = [m for _, m in found]
            scores = [0.2 + 0.75 * min(1.0, float(m.sum()) / (0.04 * h * w)) for m in masks]
            seed = int.from_bytes(hashlib.sha256(np.ascontiguousarray(image).tobytes()).digest()[:8], "little")
            rng = np.random.default_rng(seed)
            for name in sorted(set(want or ())):
                score = float(rng.uniform(0.01, 0.25))
                r0, c0 = int(rng.integers(0, max(h - 6, 1))), int(rng.integers(0, max(w - 6, 1)))
                ghost = np.zeros(hw, dtype=bool)
                ghost[r0 : r0 + 6, c0 : c0 + 6] = True
                names.append(name)
                masks.append(ghost)
                scores.append(score)
            arr = np.asarray(scores, np.float32)
            keep_floor = [i for i in range(len(names)) if arr[i] >= self.floor]
            names = [names[i] for i in keep_floor]
            masks = [masks[i] for i in keep_floor]
            arr = arr[keep_floor]
            keep, counts = select_requested(names, arr, want, max_per_class)
            if not len(keep):
                out.append(Detections.empty(hw))
                continue
            stack = np.stack([masks[i] for i in keep])
            boxes = np.array([mask_to_xyxy(m) for m in stack], dtype=np.float32)
            out.append(Detections(tuple(names[i] for i in keep), arr[keep], boxes, stack, hw, counts or None))
        return out


class SyntheticSegmenter:
    """Returns each reference mask (clipped to its box) through the core candidate choice and
    post-processing, in chunks of ``config.masks.box_chunk_size`` like SAM."""

    def __init__(self, *, config: RuleConfig = CURRENT, **_: Any) -> None:
        self.config = config
        self.info = applied(_info("segmenter"), config)
        self.calls = 0
        """How many candidate batches were computed (tests check the chunking)."""

    def refine(self, image: Image, boxes: NDArray[np.float32], reference_masks: NDArray[np.bool_]) -> NDArray[np.bool_]:
        """Refined masks (K, H, W); see the class docstring."""
        hw = check_image(image)
        refs = np.asarray(reference_masks, dtype=bool)
        boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
        check_boxes(boxes, refs, hw)
        start = 0

        def candidates(chunk: NDArray[np.float32]) -> NDArray[np.bool_]:
            nonlocal start
            self.calls += 1
            cands = np.zeros((chunk.shape[0], 3, *hw), dtype=bool)
            for j, box in enumerate(chunk):
                x0, y0 = int(np.floor(box[0])), int(np.floor(box[1]))
                x1, y1 = int(np.ceil(box[2])), int(np.ceil(box[3]))
                cands[j, 0, max(y0, 0) : y1, max(x0, 0) : x1] = True
                cands[j, 1] = refs[start + j] & cands[j, 0]
                cands[j, 2] = ndimage.binary_dilation(refs[start + j])
            start += chunk.shape[0]
            return cands

        return refine_with_candidates(hw, boxes, refs, candidates, self.config)

    def refine_batch(self, items: Sequence[RefineItem]) -> list[NDArray[np.bool_]]:
        """``refine`` per item (``negt2i.stages.base.BatchSegmenter``: the pipeline's batched path)."""
        return [self.refine(image, boxes, refs) for image, boxes, refs in items]


def reference_colors(answers: Sequence[str]) -> NDArray[np.float64]:
    """Reference RGB (len(answers), 3) of colour / material answers; unknown answers raise."""
    out = []
    for a in answers:
        color = COLOR_REFERENCE.get(a) or MATERIAL_REFERENCE.get(a)
        if color is None:
            raise ValueError(f"the synthetic scorer knows no answer {a!r}")
        out.append(color)
    return np.asarray(out, dtype=np.float64).reshape(-1, 3)


class SyntheticAttributeScorer:
    """Scores the mean swatch colour inside each mask against the answers' reference colours."""

    def __init__(self, *, config: RuleConfig = CURRENT, **_: Any) -> None:
        self.info = applied(_info("attributes"), config)  # a template set states as applied: it reads no text

    def score(
        self,
        image: Image,
        masks: NDArray[np.bool_],
        class_names: Sequence[str],
        answers: Sequence[str],
    ) -> NDArray[np.float32]:
        """Scores (K, len(answers)) in [0, 100]; the drawn value scores 100."""
        hw = check_image(image)
        masks = check_instance_masks(masks, hw, len(class_names))
        refs = reference_colors(answers)
        codes = _code(image)
        swatch = ~np.isin(codes, _CLASS_CODES)
        out = np.zeros((masks.shape[0], len(answers)), dtype=np.float32)
        for k, mask in enumerate(masks):
            pixels = image[mask & swatch]
            if pixels.shape[0] == 0:
                pixels = image[mask]
            if pixels.shape[0] == 0:
                continue  # an empty mask scores 0 for every answer
            mean = pixels.astype(np.float64).mean(axis=0)
            dist = np.linalg.norm(refs - mean, axis=1)
            out[k] = 100.0 * (1.0 - dist / _MAX_DISTANCE)
        return out

    def score_batch(self, items: Sequence[ScoreItem]) -> list[NDArray[np.float32]]:
        """``score`` per item (``negt2i.stages.base.BatchAttributeScorer``: the pipeline's batched path)."""
        return [self.score(image, masks, names, answers) for image, masks, names, answers in items]


class SyntheticDepthEstimator:
    """Disparity from the ground-contact cue: each object ``(bottom_row + 1) / H``, background 0."""

    def __init__(self, *, min_area: int = 4, **_: Any) -> None:
        self.min_area = min_area
        self.info = _info("depth")

    def disparity(self, images: Sequence[Image]) -> list[NDArray[np.float32]]:
        """One (H, W) map per image; larger = closer."""
        out: list[NDArray[np.float32]] = []
        for image in images:
            h, w = check_image(image)
            disp = np.zeros((h, w), dtype=np.float32)
            layers = []
            for _, mask in find_objects(image, self.min_area):
                rows = np.flatnonzero(mask.any(axis=1))
                layers.append(((rows[-1] + 1) / h, mask))
            for value, mask in sorted(layers, key=lambda t: t[0]):
                disp[mask] = value
            out.append(disp)
        return out


register("detector", BACKEND, SyntheticDetector, model=MODEL)
register("detector", NOISY_BACKEND, NoisySyntheticDetector, model=NOISY_MODEL)
register("segmenter", BACKEND, SyntheticSegmenter, model=MODEL)
register("attributes", BACKEND, SyntheticAttributeScorer, model=MODEL)
register("depth", BACKEND, SyntheticDepthEstimator, model=MODEL)
