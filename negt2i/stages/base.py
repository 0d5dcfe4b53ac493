"""The four stage interfaces. Backends (in-process models, or remote services) implement them.

Images are RGB ``uint8`` arrays (H, W, 3). Every method is batched over images or
instances; a backend may split batches further. Backends are deterministic: the
same inputs give the same outputs.

The segmenter and the attribute scorer answer one image per call; a backend that can
do better across images (SAM 2's batched image encoder, SigLIP 2 crops of many images
in one forward pass) also implements ``refine_batch`` / ``score_batch``
(``BatchSegmenter``, ``BatchAttributeScorer``). Callers go through ``refine_batch`` and
``score_batch`` below, which fall back to one call per image for backends without them,
so a backend implementing only the per-image method keeps working.

A backend may also split its own input preprocessing (image transforms, crops) from its model call
(``PreparesInputs``): ``prepare`` one request on any thread, ``run_prepared`` many prepared requests on
the thread that runs the model. Its ordinary methods stay ``run_prepared`` of ``prepare``, so both give
the same tensors; the pipelined in-process path (``negt2i.pipeline``) and the stage services
(``negt2i.wire.stage_handlers``) call ``prepare`` on worker threads.

``Image``, ``ModelInfo``, ``OperatingPoint`` and ``applied`` live in the core (``negt2i.core.stage_types``)
and are re-exported here for backends that import them from this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from negt2i.core.perception import Detections
from negt2i.core.stage_types import Image, ModelInfo, OperatingPoint, applied

__all__ = [  # the core's stage types are re-exported: plug-in backends import them from here
    "AttributeScorer",
    "BatchAttributeScorer",
    "BatchSegmenter",
    "DepthEstimator",
    "Detector",
    "Image",
    "ModelInfo",
    "OperatingPoint",
    "PreparesInputs",
    "RefineItem",
    "ScoreItem",
    "Segmenter",
    "applied",
    "refine_batch",
    "score_batch",
]

RefineItem: TypeAlias = tuple[Image, NDArray[np.float32], NDArray[np.bool_]]
"""One image's segmenter request: ``(image, boxes (K, 4) xyxy, reference masks (K, H, W))``."""
ScoreItem: TypeAlias = tuple[Image, NDArray[np.bool_], Sequence[str], Sequence[str]]
"""One image's attribute request: ``(image, masks (K, H, W), K class names, answers)``."""


@runtime_checkable
class Detector(Protocol):
    """Detects COCO objects with instance masks."""

    info: ModelInfo

    def detect(self, images: Sequence[Image]) -> list[Detections]:
        """One ``Detections`` per image, class names in benchmark spelling, scores >= the prediction floor."""
        ...


@runtime_checkable
class Segmenter(Protocol):
    """Refines detector masks with box prompts (SAM 2.1)."""

    info: ModelInfo

    def refine(self, image: Image, boxes: NDArray[np.float32], reference_masks: NDArray[np.bool_]) -> NDArray[np.bool_]:
        """Refined masks (K, H, W) for K ``xyxy`` boxes, each candidate chosen by overlap with its
        reference (detector) mask and post-processed (closing, small components dropped)."""
        ...


@runtime_checkable
class BatchSegmenter(Segmenter, Protocol):
    """A segmenter that refines the boxes of many images in one call (e.g. SAM 2's batched image encoder)."""

    def refine_batch(self, items: Sequence[RefineItem]) -> list[NDArray[np.bool_]]:
        """``refine(*item)`` for every item, in order, with the same output as per-image calls."""
        ...


@runtime_checkable
class AttributeScorer(Protocol):
    """Scores instance crops against attribute values (SigLIP 2)."""

    info: ModelInfo

    def score(
        self,
        image: Image,
        masks: NDArray[np.bool_],
        class_names: Sequence[str],
        answers: Sequence[str],
    ) -> NDArray[np.float32]:
        """Scores (K, len(answers)) as 100 x cosine similarity, for K instances given by their
        detector masks (pixels outside the mask filled with gray #999 inside the box crop)."""
        ...


@runtime_checkable
class DepthEstimator(Protocol):
    """Estimates relative disparity (Depth-Anything V2)."""

    info: ModelInfo

    def disparity(self, images: Sequence[Image]) -> list[NDArray[np.float32]]:
        """One (H, W) disparity map per image, resized to the image; larger = closer."""
        ...


@runtime_checkable
class BatchAttributeScorer(AttributeScorer, Protocol):
    """An attribute scorer that scores the instances of many images in one call (SigLIP 2 crops together)."""

    def score_batch(self, items: Sequence[ScoreItem]) -> list[NDArray[np.float32]]:
        """``score(*item)`` for every item, in order, with the same output as per-image calls."""
        ...


def refine_batch(segmenter: Segmenter, items: Sequence[RefineItem]) -> list[NDArray[np.bool_]]:
    """Refined masks for every item: one ``refine_batch`` call when the backend has it, else ``refine`` per item."""
    if isinstance(segmenter, BatchSegmenter):
        return list(segmenter.refine_batch(items))
    return [segmenter.refine(image, boxes, refs) for image, boxes, refs in items]


def score_batch(scorer: AttributeScorer, items: Sequence[ScoreItem]) -> list[NDArray[np.float32]]:
    """Scores for every item: one ``score_batch`` call when the backend has it, else ``score`` per item."""
    if isinstance(scorer, BatchAttributeScorer):
        return list(scorer.score_batch(items))
    return [scorer.score(image, masks, names, answers) for image, masks, names, answers in items]


@runtime_checkable
class PreparesInputs(Protocol):
    """A backend whose own preprocessing can run apart from its model call, on another thread.

    The request ``prepare`` takes is the stage's per-image request: the image (detector, depth estimator), a
    ``RefineItem`` (segmenter) or a ``ScoreItem`` (attribute scorer); it checks it (raising as the ordinary
    method would) and returns the model's inputs for it. ``prepare`` must be safe to call from several
    threads at once while the model runs. ``run_prepared`` takes prepared requests (the detector also
    ``classes=`` and ``max_per_class=`` as in ``detect``) and returns one answer per request, exactly what the
    ordinary method returns for the same requests (which is ``run_prepared`` of ``prepare``).
    """

    def prepare(self, request: Any) -> Any:
        """The model's inputs for one request (CPU work; no model call)."""
        ...

    def run_prepared(self, prepared: Sequence[Any], /, **options: Any) -> list[Any]:
        """One answer per prepared request, in order."""
        ...
