"""The per-image flow over stage objects, shared by ``negt2i evaluate`` and the orchestrator.

For each image (``docs/architecture.md``):

1. ``detections = detector.detect(images)`` (batched over images);
2. ``plan = plan_perception(prompt, detections, config)``;
3. refined masks for ``plan.refine`` (segmenter: boxes + detector masks),
   attribute scores for ``plan.attributes`` against ``plan.answers`` (detector
   masks, Table 15), disparity if ``plan.depth`` (batched over the images that
   need it);
4. ``verdict = judge(prompt, ImagePerception(...), config)``.

Stages are anything implementing the protocols of ``negt2i.stages.base``: the
in-process backends, or clients of remote stage services. Only the stages a
prompt needs are called, so a stage may be ``None`` when no prompt needs it.

A failure in one image (a stage raising, perception the judge cannot use) is
returned as that image's ``error`` and never stops the others: a failing batch
call is retried image by image to find the culprit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from negt2i.config import CURRENT, RuleConfig
from negt2i.perception import AttributeScores, Detections, DisparityMap, ImagePerception, RefinedMasks
from negt2i.plan import PerceptionPlan, plan_perception
from negt2i.spec import Prompt
from negt2i.stages.base import AttributeScorer, DepthEstimator, Detector, Image, Segmenter
from negt2i.stages.registry import DEFAULT_BACKENDS, STAGES, create
from negt2i.verdict import PerceptionError, Verdict, judge

T = TypeVar("T")


class StageError(RuntimeError):
    """A stage failed (or returned something unusable) for one image."""

    def __init__(self, stage: str, message: str) -> None:
        self.stage = stage
        self.message = message
        super().__init__(f"{stage}: {message}")


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
        built = {stage: create(stage, names[stage], **options, **per_stage.get(stage, {})) for stage in STAGES}
        return cls(built["detector"], built["segmenter"], built["attributes"], built["depth"])

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
    """The outcome for one image: a verdict, or an error saying which stage / rule failed."""

    verdict: Verdict | None = None
    error: str | None = None
    perception: ImagePerception | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.verdict is not None


def _hw(image: Image) -> tuple[int, int]:
    return (int(image.shape[0]), int(image.shape[1]))


def _batched(stage: str, fn: Callable[[list[Image]], list[T]], images: list[Image]) -> list[T | StageError]:
    """``fn`` over the whole batch; if it fails, image by image so that one bad image fails alone."""
    results: list[T | StageError] = []
    for group in [images] if len(images) == 1 else [images, *([image] for image in images)]:
        try:
            out = fn(group)
            if len(out) != len(group):
                raise StageError(stage, f"returned {len(out)} results for {len(group)} images")
        except Exception as exc:
            if len(group) == 1:
                results.append(
                    exc if isinstance(exc, StageError) else StageError(stage, f"{type(exc).__name__}: {exc}")
                )
            continue
        if group is images:
            return list(out)
        results.extend(out)
    return results


def refine_planned(
    image: Image, detections: Detections, plan: PerceptionPlan, segmenter: Segmenter | None
) -> RefinedMasks | None:
    """Refined masks for ``plan.refine`` (None when the plan needs none)."""
    if not plan.refine:
        return None
    if segmenter is None:
        raise StageError("segmenter", "this prompt needs refined masks, but no segmenter is configured")
    idx = np.asarray(plan.refine, dtype=np.intp)
    try:
        masks = np.asarray(segmenter.refine(image, detections.xyxy[idx], detections.masks[idx]), dtype=bool)
    except Exception as exc:
        raise StageError("segmenter", f"{type(exc).__name__}: {exc}") from exc
    if masks.shape != (len(idx), *detections.shape_hw):
        raise StageError(
            "segmenter", f"returned masks of shape {masks.shape}, expected {(len(idx), *detections.shape_hw)}"
        )
    return RefinedMasks({int(i): masks[k] for k, i in enumerate(idx)}, detections.shape_hw)


def score_planned(
    image: Image, detections: Detections, plan: PerceptionPlan, scorer: AttributeScorer | None
) -> AttributeScores | None:
    """Attribute scores for ``plan.attributes`` against ``plan.answers`` on detector masks (None if none)."""
    if not plan.attributes:
        return None
    if scorer is None:
        raise StageError("attributes", "this prompt needs attribute scores, but no attribute scorer is configured")
    idx = np.asarray(plan.attributes, dtype=np.intp)
    names = [detections.class_names[i] for i in idx]
    try:
        scores = np.asarray(scorer.score(image, detections.masks[idx], names, plan.answers), dtype=np.float32)
    except Exception as exc:
        raise StageError("attributes", f"{type(exc).__name__}: {exc}") from exc
    if scores.shape != (len(idx), len(plan.answers)):
        raise StageError(
            "attributes", f"returned scores of shape {scores.shape}, expected {(len(idx), len(plan.answers))}"
        )
    try:
        return AttributeScores(
            {int(i): dict(zip(plan.answers, map(float, scores[k]), strict=True)) for k, i in enumerate(idx)},
            plan.answers,
        )
    except ValueError as exc:
        raise StageError("attributes", str(exc)) from exc


def to_disparity(values: NDArray[np.float32], shape_hw: tuple[int, int]) -> DisparityMap:
    """Validate a depth stage's output for an image of ``shape_hw``."""
    arr = np.asarray(values, dtype=np.float32)
    if arr.shape != shape_hw:
        raise StageError("depth", f"returned a map of shape {arr.shape}, expected (H, W) = {shape_hw}")
    try:
        return DisparityMap(arr, shape_hw)
    except ValueError as exc:
        raise StageError("depth", str(exc)) from exc


class Pipeline:
    """Runs detect -> plan -> refine / attributes / depth -> judge for batches of images."""

    def __init__(self, stages: Stages, config: RuleConfig = CURRENT) -> None:
        self.stages = stages
        self.config = config

    def run(self, prompts: Sequence[Prompt], images: Sequence[Image]) -> list[ImageResult]:
        """One ``ImageResult`` per (prompt, image) pair, in order."""
        if len(prompts) != len(images):
            raise ValueError(f"got {len(prompts)} prompts for {len(images)} images")
        if not images:
            return []
        batch = list(images)
        detected = _batched("detector", self.stages.detector.detect, batch)
        errors: list[str | None] = [None] * len(batch)
        plans: list[PerceptionPlan | None] = [None] * len(batch)
        partial: list[dict[str, Any]] = [{} for _ in batch]
        for i, (prompt, image, det) in enumerate(zip(prompts, batch, detected, strict=True)):
            if isinstance(det, StageError):
                errors[i] = str(det)
                continue
            try:
                if not isinstance(det, Detections) or det.shape_hw != _hw(image):
                    got = det.shape_hw if isinstance(det, Detections) else type(det).__name__
                    raise StageError("detector", f"returned detections for {got}, expected {_hw(image)}")
                plan = plan_perception(prompt, det, self.config)
                plans[i] = plan
                partial[i]["refined"] = refine_planned(image, det, plan, self.stages.segmenter)
                partial[i]["attributes"] = score_planned(image, det, plan, self.stages.attributes)
            except StageError as exc:
                errors[i] = str(exc)
        need_depth = [i for i, p in enumerate(plans) if p is not None and p.depth and errors[i] is None]
        if need_depth:
            depth = self.stages.depth
            if depth is None:
                for i in need_depth:
                    errors[i] = str(
                        StageError("depth", "this prompt needs depth, but no depth estimator is configured")
                    )
            else:
                maps = _batched("depth", depth.disparity, [batch[i] for i in need_depth])
                for i, disp in zip(need_depth, maps, strict=True):
                    try:
                        if isinstance(disp, StageError):
                            raise disp
                        partial[i]["disparity"] = to_disparity(disp, _hw(batch[i]))
                    except StageError as exc:
                        errors[i] = str(exc)
        results: list[ImageResult] = []
        for i, prompt in enumerate(prompts):
            det = detected[i]
            if errors[i] is not None or not isinstance(det, Detections):
                results.append(ImageResult(error=errors[i]))
                continue
            try:
                perception = ImagePerception(det, **partial[i])
                verdict = judge(prompt, perception, self.config)
            except (PerceptionError, ValueError) as exc:
                results.append(ImageResult(error=f"judge: {exc}"))
                continue
            results.append(ImageResult(verdict=verdict, perception=perception))
        return results

    def run_one(self, prompt: Prompt, image: Image) -> ImageResult:
        """``run`` for a single image."""
        return self.run([prompt], [image])[0]
