"""In-process stage objects driving the one per-image flow (``negt2i.flow``) for batches of images.

For a batch of (prompt, image) pairs:

1. ``detections = detector.detect(images, classes=, max_per_class=)`` (batched over images; each
   image's prompt classes and the per-class cap, ``flow.detector_request``; a detector without
   the keywords is called with the images alone and filtered after, ``detect_requested``);
2. ``flow.begin`` per image validates them and plans the other stages' requests;
3. refined masks (segmenter) and attribute scores per image, disparity batched
   over the images that need it;
4. ``flow.finish`` per image validates the answers and judges.

Stages are anything implementing the protocols of ``negt2i.stages.base``: the
in-process backends, or clients of remote stage services. Only the stages a
prompt needs are called, so a stage may be ``None`` when no prompt needs it.

A failure in one image (a stage raising, an answer outside the contract,
perception the judge cannot use) is that image's ``failure`` (a
``negt2i.failures.Failure``) and never stops the others: a failing batch call
is retried image by image to find the culprit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from negt2i import flow
from negt2i.config import CURRENT, RuleConfig
from negt2i.failures import Failure, StageError
from negt2i.perception import Detections, ImagePerception
from negt2i.spec import Prompt
from negt2i.stages.base import AttributeScorer, DepthEstimator, Detector, Image, Segmenter
from negt2i.stages.common import detect_requested
from negt2i.stages.registry import DEFAULT_BACKENDS, STAGES, create
from negt2i.verdict import Verdict

T = TypeVar("T")
U = TypeVar("U")


@dataclass
class Stages:
    """The four stage objects; those no prompt needs may be ``None``."""

    detector: Detector
    segmenter: Segmenter | None = None
    attributes: AttributeScorer | None = None
    depth: DepthEstimator | None = None

    @classmethod
    def create(
        cls,
        backends: Mapping[str, str] | None = None,
        stage_options: Mapping[str, Mapping[str, Any]] | None = None,
        **options: Any,
    ) -> Stages:
        """Build every stage from the registry: ``backends`` maps stage -> backend name (missing stages use
        ``DEFAULT_BACKENDS``); ``options`` (``device``, ``weights_dir``, ``config``) go to every factory,
        ``stage_options`` (e.g. ``{"segmenter": {"dtype": "bf16"}}``) to one stage's."""
        names = {**DEFAULT_BACKENDS, **dict(backends or {})}
        unknown = sorted((set(names) | set(stage_options or {})) - set(STAGES))
        if unknown:
            raise ValueError(f"unknown stages {unknown}; stages: {', '.join(STAGES)}")
        per_stage = dict(stage_options or {})
        return cls(
            create("detector", names["detector"], **options, **per_stage.get("detector", {})),
            create("segmenter", names["segmenter"], **options, **per_stage.get("segmenter", {})),
            create("attributes", names["attributes"], **options, **per_stage.get("attributes", {})),
            create("depth", names["depth"], **options, **per_stage.get("depth", {})),
        )

    def models(self) -> dict[str, dict[str, Any]]:
        """Stage -> ``ModelInfo`` as JSON, for the stages present (recorded in every results line)."""
        out: dict[str, dict[str, Any]] = {}
        for stage in STAGES:
            obj = getattr(self, stage)
            if obj is not None:
                out[stage] = obj.info.model_dump(mode="json")
        return out


@dataclass(frozen=True)
class ImageResult:
    """The outcome for one image: a verdict, or the ``Failure`` saying which stage / rule failed."""

    verdict: Verdict | None = None
    failure: Failure | None = None
    perception: ImagePerception | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.verdict is not None

    @property
    def error(self) -> str | None:
        """The failure's details (``stage: [rule] message``), or None."""
        return None if self.failure is None else self.failure.details()


def _hw(image: Image) -> tuple[int, int]:
    return (int(image.shape[0]), int(image.shape[1]))


def _as_failure(stage: str, exc: BaseException) -> Failure:
    return exc if isinstance(exc, Failure) else StageError(stage, f"{type(exc).__name__}: {exc}")


def _batched(stage: str, fn: Callable[[list[U]], list[T]], images: list[U]) -> list[T | Failure]:
    """``fn`` over the whole batch; if it fails, image by image so that one bad image fails alone."""
    results: list[T | Failure] = []
    for group in [images] if len(images) == 1 else [images, *([image] for image in images)]:
        try:
            out = fn(group)
            if len(out) != len(group):
                raise StageError(stage, f"returned {len(out)} results for {len(group)} images", rule="result-count")
        except Exception as exc:
            if len(group) == 1:
                results.append(_as_failure(stage, exc))
            continue
        if group is images:
            return list(out)
        results.extend(out)
    return results


_MISSING = {
    "segmenter": "this prompt needs refined masks, but no segmenter is configured",
    "attributes": "this prompt needs attribute scores, but no attribute scorer is configured",
    "depth": "this prompt needs depth, but no depth estimator is configured",
}


def _call(stage: str, obj: Any, method: str, *args: Any) -> Any:
    if obj is None:
        raise StageError(stage, _MISSING[stage])
    try:
        return getattr(obj, method)(*args)
    except Failure:
        raise
    except Exception as exc:
        raise _as_failure(stage, exc) from exc


class Pipeline:
    """Runs the per-image flow (``negt2i.flow``) over in-process stage objects, for batches of images."""

    def __init__(self, stages: Stages, config: RuleConfig = CURRENT) -> None:
        self.stages = stages
        self.config = config

    def _detect(self, items: list[tuple[Image, flow.DetectRequest]]) -> list[Detections]:
        """The detector on images with their requests (one cap per call: one rule config)."""
        cap = max((r.max_per_class for _, r in items), default=0)
        return detect_requested(self.stages.detector, [im for im, _ in items], [r.classes for _, r in items], cap)

    def run(self, prompts: Sequence[Prompt], images: Sequence[Image]) -> list[ImageResult]:
        """One ``ImageResult`` per (prompt, image) pair, in order."""
        if len(prompts) != len(images):
            raise ValueError(f"got {len(prompts)} prompts for {len(images)} images")
        if not images:
            return []
        batch = list(images)
        detected = _batched("detector", self._detect, [(image, flow.detector_request(p, self.config))
                                                        for image, p in zip(batch, prompts, strict=True)])  # fmt: skip
        failures: list[Failure | None] = [None] * len(batch)
        requests: list[flow.StageRequests | None] = [None] * len(batch)
        answers: list[dict[str, Any]] = [{} for _ in batch]
        for i, (prompt, image, det) in enumerate(zip(prompts, batch, detected, strict=True)):
            try:
                if isinstance(det, Failure):
                    raise det
                req = requests[i] = flow.begin(prompt, det, _hw(image), self.config)
                if req.refine is not None:
                    r = req.refine
                    answers[i]["refined"] = _call("segmenter", self.stages.segmenter, "refine", image, r.boxes,
                                                  r.reference_masks)  # fmt: skip
                if req.attributes is not None:
                    a = req.attributes
                    answers[i]["scores"] = _call("attributes", self.stages.attributes, "score", image, a.masks,
                                                 list(a.class_names), a.answers)  # fmt: skip
            except Failure as exc:
                failures[i] = exc
        need_depth = [i for i, r in enumerate(requests) if r is not None and r.depth and failures[i] is None]
        if need_depth:
            depth = self.stages.depth
            if depth is None:
                for i in need_depth:
                    failures[i] = StageError("depth", _MISSING["depth"])
            else:
                maps = _batched("depth", depth.disparity, [batch[i] for i in need_depth])
                for i, disp in zip(need_depth, maps, strict=True):
                    if isinstance(disp, Failure):
                        failures[i] = disp
                    else:
                        answers[i]["disparity"] = np.asarray(disp)
        results: list[ImageResult] = []
        for i, prompt in enumerate(prompts):
            planned = requests[i]
            failure = failures[i]
            if failure is None and planned is not None:
                try:
                    verdict, perception = flow.finish(prompt, planned, config=self.config, **answers[i])
                except Failure as exc:
                    failure = exc
                else:
                    results.append(ImageResult(verdict=verdict, perception=perception))
                    continue
            results.append(ImageResult(failure=failure))
        return results

    def run_one(self, prompt: Prompt, image: Image) -> ImageResult:
        """``run`` for a single image."""
        return self.run([prompt], [image])[0]
