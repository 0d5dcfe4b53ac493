"""In-process stage objects driving the one per-image flow (``negt2i.core.flow``) for batches of images.

For a batch of (prompt, image) pairs:

1. ``detections = detector.detect(images, classes=, max_per_class=)`` (batched over images; each
   image's prompt classes and the per-class cap, ``flow.detector_request``; a detector without
   the keywords is called with the images alone, ``ask_detector``);
2. ``flow.begin`` per image validates them, applies the class filter and plans the other stages' requests;
3. refined masks (segmenter), attribute scores and disparity, each stage called
   once for the images of the batch that need it (``refine_batch`` /
   ``score_batch`` of ``negt2i.stages.base``: per image for a backend without
   the batched method);
4. ``flow.finish`` per image validates the answers and judges.

The steps are ``Pipeline.detect`` (1), ``plan`` (2), ``answer`` (3) and ``judge``
(4); ``perceive`` is 1-3. ``plan`` and ``judge`` call no model: ``negt2i evaluate
--workers N`` runs them on worker threads while the models run on other batches.

A backend that splits its own preprocessing from its model call (``PreparesInputs`` of
``negt2i.stages.base``: RF-DETR's, SAM 2's and Depth-Anything's image transforms, SigLIP's
crops) has it done off the models' thread: the detector's by ``prepare_image`` (called where
the image is decoded: a worker, in ``negt2i evaluate``), the other stages' in ``plan``; the
models' thread then runs ``run_prepared`` only. The tensors are the same as in the backend's
ordinary call (which is ``run_prepared`` of ``prepare``).

Stages are anything implementing the protocols of ``negt2i.stages.base``: the
in-process backends, or clients of remote stage services. Only the stages a
prompt needs are called, so a stage may be ``None`` when no prompt needs it.

A failure in one image (a stage raising, an answer outside the contract,
perception the judge cannot use) is that image's ``failure`` (a
``negt2i.core.failures.Failure``) and never stops the others: a failing batch call
is retried image by image to find the culprit.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import numpy as np
from numpy.typing import NDArray

from negt2i.core import flow
from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.failures import ContractRule, Failure, StageError
from negt2i.core.perception import Detections, ImagePerception
from negt2i.core.spec import Prompt
from negt2i.core.stage_identity import check_model_info, strict_from_env
from negt2i.core.stage_types import STAGES, Image, ModelInfo
from negt2i.core.verdict import Verdict
from negt2i.stages.base import (
    AttributeScorer,
    BatchAttributeScorer,
    BatchSegmenter,
    DepthEstimator,
    Detector,
    PreparesInputs,
    RefineItem,
    ScoreItem,
    Segmenter,
    refine_batch,
    score_batch,
)
from negt2i.stages.common import ask_detector
from negt2i.stages.registry import DEFAULT_BACKENDS, create

T = TypeVar("T")
A = TypeVar("A")


@dataclass
class Stages:
    """The four stage objects; those no prompt needs may be ``None``."""

    detector: Detector
    segmenter: Segmenter | None = None
    attributes: AttributeScorer | None = None
    depth: DepthEstimator | None = None
    warnings: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Stage -> what ``check`` assumed about it (recorded with its model in every results line)."""

    @classmethod
    def create(
        cls,
        backends: Mapping[str, str] | None = None,
        stage_options: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        strict: bool | None = None,
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
        stages = cls(
            create("detector", names["detector"], **options, **per_stage.get("detector", {})),
            create("segmenter", names["segmenter"], **options, **per_stage.get("segmenter", {})),
            create("attributes", names["attributes"], **options, **per_stage.get("attributes", {})),
            create("depth", names["depth"], **options, **per_stage.get("depth", {})),
        )
        stages.check(options.get("config") or CURRENT, strict=strict)
        return stages

    def check(self, config: RuleConfig, *, strict: bool | None = None) -> None:
        """The one stage check of both paths (``negt2i.core.stage_identity.check_model_info``, as the orchestrator
        runs on a served stage's ``/info``) on every stage present: ``StageRefused`` naming the stage and why,
        or its warnings kept in ``warnings`` (and printed to stderr, as ``negt2i submit`` does). ``strict``
        None: ``NEGT2I_STRICT_STAGES``."""
        strict = strict_from_env() if strict is None else strict
        for stage in STAGES:
            obj = getattr(self, stage)
            if obj is None:
                continue
            info = getattr(obj, "info", None)
            name = getattr(info, "backend", type(obj).__name__)
            if not isinstance(info, ModelInfo):
                raise StageRefused(f"the {stage} ({name}) is refused: its info is not a ModelInfo")
            result = check_model_info(stage, info, config, strict=strict)
            if result.problem:
                raise StageRefused(f"the {stage} ({name}) is refused: {result.problem}")
            self.warnings[stage] = result.warnings
            for warning in result.warnings:
                print(f"warning: the {stage} ({name}) {warning}", file=sys.stderr)

    def models(self) -> dict[str, dict[str, Any]]:
        """Stage -> ``ModelInfo`` as JSON, for the stages present (recorded in every results line)."""
        out: dict[str, dict[str, Any]] = {}
        for stage in STAGES:
            obj = getattr(self, stage)
            if obj is not None:
                out[stage] = obj.info.model_dump(mode="json")
                if self.warnings.get(stage):
                    out[stage]["warnings"] = list(self.warnings[stage])
        return out


class StageRefused(ValueError):
    """An in-process stage that the stage check refuses (``Stages.check``)."""


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


def _batched(stage: str, fn: Callable[[list[A]], Sequence[T]], items: list[A]) -> list[T | Failure]:
    """``fn`` over the whole batch (images, or per-image requests); if it fails, item by item so that one bad
    image fails alone."""
    results: list[T | Failure] = []
    for group in [items] if len(items) == 1 else [items, *([item] for item in items)]:
        try:
            out = fn(group)
            if len(out) != len(group):
                raise StageError(
                    stage, f"returned {len(out)} results for {len(group)} images", rule=ContractRule.RESULT_COUNT
                )
        except Exception as exc:
            if len(group) == 1:
                results.append(_as_failure(stage, exc))
            continue
        if group is items:
            return list(out)
        results.extend(out)
    return results


_MISSING = {
    "segmenter": "this prompt needs refined masks, but no segmenter is configured",
    "attributes": "this prompt needs attribute scores, but no attribute scorer is configured",
    "depth": "this prompt needs depth, but no depth estimator is configured",
}


@dataclass(eq=False)
class Perceived:
    """One batch on its way through the flow (``Pipeline.perceive`` = ``detect``, ``plan``, ``answer``): per
    image, the detector's answer, the flow's planned requests, the other stages' answers, or the failure that
    ends the image. ``Pipeline.plan`` and ``Pipeline.judge`` call no stage, so they can run on worker
    threads while the models run on another batch."""

    prompts: list[Prompt]
    images: list[Image]
    detected: list[Any]
    """The detector's answer per image (checked by ``plan``), or its ``Failure``."""
    requests: list[flow.StageRequests | None]
    answers: list[dict[str, Any]]
    failures: list[Failure | None]
    prepared: dict[str, dict[int, Any]] = field(default_factory=dict)
    """Stage -> image -> that stage's backend ``prepare`` of the image's request (or the ``Failure`` it raised),
    made by ``Pipeline.plan`` for backends that prepare their inputs (``PreparesInputs``)."""

    def __len__(self) -> int:
        return len(self.prompts)


def _refine(segmenter: Any, items: list[RefineItem]) -> list[NDArray[np.bool_]]:
    return refine_batch(segmenter, items)


def _score(scorer: Any, items: list[ScoreItem]) -> list[NDArray[np.float32]]:
    return score_batch(scorer, items)


def _disparity(depth: Any, images: list[Image]) -> list[NDArray[np.float32]]:
    return list(depth.disparity(images))


def _run_prepared(backend: Any, prepared: list[Any]) -> list[Any]:
    for p in prepared:
        if isinstance(p, Failure):  # its ``prepare`` failed: this image's failure (``_batched`` finds it alone)
            raise p
    return list(backend.run_prepared(prepared))


def _prepare(stage: str, backend: Any, request: Any) -> Any:
    """``backend.prepare(request)``, or the ``Failure`` it raised (kept for the model's turn, so that an image's
    failure stays the first stage's that failed for it)."""
    try:
        return backend.prepare(request)
    except Exception as exc:
        return _as_failure(stage, exc)


_CALLS: Final[dict[str, Callable[[Any, list[Any]], Sequence[Any]]]] = {
    "segmenter": _refine,
    "attributes": _score,
    "depth": _disparity,
}
_KEYS: Final = {"segmenter": "refined", "attributes": "scores", "depth": "disparity"}


class Pipeline:
    """Runs the per-image flow (``negt2i.core.flow``) over in-process stage objects, for batches of images.

    Every stage is called once per batch with the images that need it (the detector and the depth
    estimator take lists of images; the segmenter and the attribute scorer through ``refine_batch`` /
    ``score_batch`` of ``negt2i.stages.base``, one call for the batch when the backend implements the
    batched method, else one call per image). The verdicts are the same as with one image per call.
    """

    def __init__(self, stages: Stages, config: RuleConfig = CURRENT, *, complete: bool = False) -> None:
        self.stages = stages
        self.config = config
        self.complete = complete
        """Plan the perception for re-judging with other thresholds (``--save-perception``; ``flow.begin``)."""

    def run(self, prompts: Sequence[Prompt], images: Sequence[Image]) -> list[ImageResult]:
        """One ``ImageResult`` per (prompt, image) pair, in order: ``perceive`` then ``judge`` per image."""
        perceived = self.perceive(prompts, images)
        return [self.judge(perceived, i) for i in range(len(perceived))]

    def run_one(self, prompt: Prompt, image: Image) -> ImageResult:
        """``run`` for a single image."""
        return self.run([prompt], [image])[0]

    def perceive(self, prompts: Sequence[Prompt], images: Sequence[Image]) -> Perceived:
        """The models' part of ``run``: ``detect``, ``plan``, ``answer``."""
        perceived = self.detect(prompts, images)
        self.plan(perceived)
        self.answer(perceived)
        return perceived

    def prepare_image(self, image: Image) -> Any:
        """The detector's preprocessing of one image (its ``prepare``), for ``detect(..., prepared=)``: None when
        the detector does not prepare its inputs, the ``Failure`` when preparing raised. Calls no model: made
        on the thread that decodes the image (a worker in ``negt2i evaluate``)."""
        detector = self.stages.detector
        return _prepare("detector", detector, image) if isinstance(detector, PreparesInputs) else None

    def detect(
        self, prompts: Sequence[Prompt], images: Sequence[Image], prepared: Sequence[Any] | None = None
    ) -> Perceived:
        """The detector over the batch, each image asked for its prompt's classes (one call; a failing call is
        retried image by image). ``prepared``: ``prepare_image`` of each image, made before (the detector then
        runs its model only); without it the detector's ordinary call prepares them."""
        if len(prompts) != len(images):
            raise ValueError(f"got {len(prompts)} prompts for {len(images)} images")
        batch = list(images)
        n = len(batch)
        out = Perceived(list(prompts), batch, [None] * n, [None] * n, [{} for _ in batch], [None] * n)
        if not batch:
            return out
        if prepared is not None and len(prepared) != n:
            raise ValueError(f"got {len(prepared)} prepared inputs for {n} images")
        ready = prepared is not None and all(p is not None for p in prepared)
        asked = [
            (image, flow.detector_request(p, self.config), prepared[i] if ready and prepared is not None else None)
            for i, (image, p) in enumerate(zip(batch, out.prompts, strict=True))
        ]
        detected = _batched("detector", self._detect, asked)
        out.detected = list(detected)
        return out

    def _detect(self, items: list[tuple[Image, flow.DetectRequest, Any]]) -> list[Detections]:
        """The detector on images with their requests (one cap per call: one rule config)."""
        cap = max((r.max_per_class for _, r, _ in items), default=0)
        ready = [p for _, _, p in items if p is not None]
        for p in ready:
            if isinstance(p, Failure):
                raise p
        images, classes = [im for im, _, _ in items], [r.classes for _, r, _ in items]
        prepared = ready if ready and len(ready) == len(items) else None
        return ask_detector(self.stages.detector, images, classes, cap, prepared=prepared)

    def plan(self, perceived: Perceived) -> None:
        """``flow.begin`` per image: the detector's answer checked against the contract, the other stages'
        requests planned (or the image's failure); then, for backends that prepare their inputs, their
        preprocessing of the planned requests (``Perceived.prepared``). Calls no model: safe on a worker
        thread."""
        out = perceived
        for i, (prompt, image, det) in enumerate(zip(out.prompts, out.images, out.detected, strict=True)):
            try:
                if isinstance(det, Failure):
                    raise det
                out.requests[i] = flow.begin(prompt, det, _hw(image), self.config, complete=self.complete)
            except Failure as exc:
                out.failures[i] = exc
        for stage, items in self._stage_items(out).items():
            backend = getattr(self.stages, stage)
            if isinstance(backend, PreparesInputs):
                out.prepared[stage] = {
                    i: _prepare(stage, backend, item) for i, item in items.items() if out.failures[i] is None
                }

    @staticmethod
    def _stage_items(out: Perceived) -> dict[str, dict[int, Any]]:
        """Stage -> image -> its request to that stage (``RefineItem``, ``ScoreItem``, the image for depth),
        for the images whose plan asks for it."""
        batch = out.images
        refine: dict[int, RefineItem] = {}
        scores: dict[int, ScoreItem] = {}
        depth: dict[int, Image] = {}
        for i, req in enumerate(out.requests):
            if req is None:
                continue
            if req.refine is not None:
                refine[i] = (batch[i], req.refine.boxes, req.refine.reference_masks)
            if req.attributes is not None:
                a = req.attributes
                scores[i] = (batch[i], a.masks, list(a.class_names), a.answers)
            if req.depth:
                depth[i] = batch[i]
        return {"segmenter": refine, "attributes": scores, "depth": depth}

    def answer(self, perceived: Perceived) -> None:
        """The segmenter, the attribute scorer and the depth estimator, each called once for the images of
        the batch that need it and have not failed yet (in that order, so an image's failure is the first
        stage's that failed for it); a backend whose inputs ``plan`` prepared runs its model on them only."""
        out = perceived
        s = self.stages
        together = {
            "segmenter": isinstance(s.segmenter, BatchSegmenter),
            "attributes": isinstance(s.attributes, BatchAttributeScorer),
            "depth": True,
        }
        for stage, items in self._stage_items(out).items():
            backend = getattr(s, stage)
            ready = out.prepared.get(stage)
            if ready is not None and all(i in ready for i in items if out.failures[i] is None):
                self._ask(stage, backend, _run_prepared, ready, key=_KEYS[stage], out=out, together=True,
                          only=items)  # fmt: skip
            else:
                call = _CALLS[stage]
                self._ask(stage, backend, call, items, key=_KEYS[stage], out=out, together=together[stage])

    @staticmethod
    def _ask(
        stage: str,
        obj: Any,
        call: Callable[[Any, list[A]], Sequence[Any]],
        items: Mapping[int, A],
        *,
        key: str,
        out: Perceived,
        together: bool,
        only: Mapping[int, Any] | None = None,
    ) -> None:
        """Ask ``stage`` for the ``items`` of the images that have not failed (of those in ``only``, when
        given), in one call when ``together`` (else one call per image); each image's answer goes to
        ``out.answers[i][key]``, a failing call is that image's failure (``_batched``)."""
        todo = [i for i in (items if only is None else only) if out.failures[i] is None]
        if not todo:
            return
        if obj is None:
            for i in todo:
                out.failures[i] = StageError(stage, _MISSING[stage])
            return
        asked = [items[i] for i in todo]

        def fn(group: list[A]) -> Sequence[Any]:
            return call(obj, group)

        got = _batched(stage, fn, asked) if together else [_batched(stage, fn, [item])[0] for item in asked]
        for i, answer in zip(todo, got, strict=True):
            if isinstance(answer, Failure):
                out.failures[i] = answer
            else:
                out.answers[i][key] = answer

    def judge(self, perceived: Perceived, i: int) -> ImageResult:
        """The rules' part of ``run`` for image ``i``: ``flow.finish`` (answers checked against the contract,
        the perception judged). Calls no stage: safe on a worker thread."""
        planned, failure = perceived.requests[i], perceived.failures[i]
        if failure is None and planned is not None:
            try:
                answers = flow.StageAnswers(**perceived.answers[i])
                verdict, perception = flow.finish(perceived.prompts[i], planned, answers, config=self.config)
            except Failure as exc:
                failure = exc
            else:
                return ImageResult(verdict=verdict, perception=perception)
        return ImageResult(failure=failure)
