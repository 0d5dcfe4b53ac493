"""The one per-image flow, free of I/O: ``negt2i.pipeline.Pipeline`` and the orchestrator both drive it.

For one (prompt, image) pair (``docs/architecture.md``):

1. the detector is asked for the prompt's classes, at most what the rules can use per class
   (``detector_request``: the per-class cap, ``detection.per_class_cap`` = 16, unless overlap
   suppression is on); a detector that honours the request returns, and builds masks for, only
   those, and the callers apply the same filter to whatever comes back
   (``negt2i.stages.common.filter_detections``), so every detector gives ``begin`` the same
   detections;
2. ``begin(prompt, detections, shape_hw, config)`` validates the detector's answer
   against the contract and plans what else the prompt needs (``StageRequests``:
   the box prompts for the segmenter, the masks / class names / answers for the
   attribute scorer, whether depth is needed);
3. the caller runs those requests however it reaches its stages (stage objects
   in-process, HTTP services in the orchestrator), concurrently or batched;
4. ``finish(prompt, requests, refined=, scores=, disparity=, config=)`` validates each
   answer against the contract, assembles the ``ImagePerception`` and judges it.

Every violation raises ``negt2i.failures.StageError`` naming the stage and the
contract rule (``RULES``); a perception the judge cannot use raises one with
``stage == "judge"``. No partial perception ever reaches the judge.

Contract rules checked on every answer (``docs/stage-contract.md``):

- ``image-size``: detections are for the image's (H, W);
- ``class-vocabulary``: class names are COCO classes in the benchmark's spelling
  (``negt2i.vocab.COCO_CLASSES``; ``Person`` or ``unicorn`` are violations);
- ``score-range``: scores are finite and in [prediction floor, 1];
- ``box-inside-image``: boxes are finite ``xyxy`` pixel edges with
  0 <= x0 <= x1 <= W and 0 <= y0 <= y1 <= H (stages clip to the image);
- ``mask-size``: every mask is (H, W) at the image's resolution, one per instance;
- ``result-count``: one answer per requested instance (segmenter masks, attribute rows);
- ``score-finite``: attribute scores are finite; ``depth-finite``: disparity is finite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from negt2i.config import CURRENT, RuleConfig
from negt2i.failures import StageError
from negt2i.perception import AttributeScores, BoolMask, Detections, DisparityMap, ImagePerception, RefinedMasks
from negt2i.plan import PerceptionPlan, plan_perception
from negt2i.spec import Prompt
from negt2i.verdict import PerceptionError, Verdict, judge
from negt2i.vocab import COCO_CLASSES

RULES: Final[dict[str, str]] = {
    "image-size": "detections are for the image's (H, W)",
    "class-vocabulary": "class names are COCO classes in the benchmark's spelling",
    "score-range": "detection scores are finite and in [prediction floor, 1]",
    "box-inside-image": "boxes are finite xyxy pixel edges inside [0, W] x [0, H] with x0 <= x1, y0 <= y1",
    "mask-size": "masks are (H, W) at the image's resolution, one per instance",
    "result-count": "one answer per requested instance",
    "score-finite": "attribute scores are finite",
    "depth-finite": "disparity is finite, (H, W) at the image's resolution",
}
"""The contract rules a stage answer is checked against (name -> what it requires)."""

_VOCAB: Final = frozenset(COCO_CLASSES)


@dataclass(frozen=True)
class DetectRequest:
    """What the detector is asked for one image (``DetectItem.classes`` / ``max_per_class``)."""

    classes: tuple[str, ...]
    """The classes the prompt names; the rules read no other class's detections."""
    max_per_class: int = 0
    """At most this many detections per class (highest scores first); 0: no cap."""


@dataclass(frozen=True, eq=False)
class RefineRequest:
    """Box prompts for the segmenter: detections ``indices``, their boxes and detector masks."""

    indices: tuple[int, ...]
    boxes: NDArray[np.float32]
    reference_masks: BoolMask


@dataclass(frozen=True, eq=False)
class AttributesRequest:
    """Instances for the attribute scorer: detections ``indices``, their masks and class names, the answers."""

    indices: tuple[int, ...]
    masks: BoolMask
    class_names: tuple[str, ...]
    answers: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class StageRequests:
    """What one image needs after detection (``None`` / ``False``: not needed)."""

    detections: Detections
    plan: PerceptionPlan
    refine: RefineRequest | None
    attributes: AttributesRequest | None
    depth: bool

    @property
    def shape_hw(self) -> tuple[int, int]:
        return self.detections.shape_hw

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages this image needs after the detector, in stage order."""
        need = (("segmenter", self.refine), ("attributes", self.attributes), ("depth", self.depth))
        return tuple(name for name, wanted in need if wanted)


def detector_request(prompt: Prompt, config: RuleConfig = CURRENT) -> DetectRequest:
    """The detector request of a prompt: its classes, in prompt order, without repeats, and the cap.

    What the rules read (``negt2i.rules.select_instances``, ``negt2i.verdict.judge``): per object of
    the prompt, the detections of its own class only (presence, counting, the fallback to the top
    detection, over- and under-count, then the statements and probes on the counted instances), the
    top ``per_class_cap`` by score, ties to the earlier detection. So a detector may drop every other
    class and all but the top ``per_class_cap`` of each class without changing a verdict. With overlap
    suppression on (``overlap_iou`` < 1) the cap is taken after suppression, so the request has none.
    """
    cfg = config.detection
    cap = cfg.per_class_cap if cfg.overlap_iou >= 1.0 else 0
    return DetectRequest(tuple(dict.fromkeys(o.class_name for o in prompt.objects)), cap)


def check_detections(detections: Any, shape_hw: tuple[int, int], config: RuleConfig = CURRENT) -> Detections:
    """``detections`` if it satisfies the detector's contract rules for an image of ``shape_hw``."""
    if not isinstance(detections, Detections):
        raise StageError("detector", f"returned {type(detections).__name__}, not Detections", rule="result-count")
    det = detections
    if det.shape_hw != tuple(shape_hw):
        raise StageError("detector", f"detections are for {det.shape_hw}, the image is {tuple(shape_hw)}",
                         rule="image-size")  # fmt: skip
    unknown = sorted({c for c in det.class_names if c not in _VOCAB})
    if unknown:
        raise StageError("detector", f"class names {unknown} are not in the benchmark vocabulary",
                         rule="class-vocabulary")  # fmt: skip
    if len(det):
        floor = config.detection.prediction_floor
        low = float(det.scores.min())
        if not np.isfinite(det.scores).all() or low < floor or float(det.scores.max()) > 1.0:
            raise StageError("detector", f"scores must be in [{floor}, 1] (the prediction floor), got min {low:.6g}",
                             rule="score-range")  # fmt: skip
        h, w = det.shape_hw
        b = det.xyxy
        inside = (b[:, 0] >= 0) & (b[:, 1] >= 0) & (b[:, 2] <= w) & (b[:, 3] <= h)
        if not np.isfinite(b).all() or not inside.all():
            i = int(np.flatnonzero(~inside)[0]) if not inside.all() else 0
            raise StageError("detector", f"box {i} {b[i].tolist()} is not inside the image [0, {w}] x [0, {h}]",
                             rule="box-inside-image")  # fmt: skip
    return det


def begin(
    prompt: Prompt, detections: Any, shape_hw: tuple[int, int], config: RuleConfig = CURRENT, *, complete: bool = False
) -> StageRequests:
    """Validate the detector's answer and plan the other stages' requests (see the module docstring);
    ``complete``: plan for re-judging with other thresholds (``negt2i.plan.plan_perception``)."""
    det = check_detections(detections, shape_hw, config)
    plan = plan_perception(prompt, det, config, complete=complete)
    refine = None
    if plan.refine:
        idx = np.asarray(plan.refine, dtype=np.intp)
        refine = RefineRequest(plan.refine, det.xyxy[idx], det.masks[idx])
    attributes = None
    if plan.attributes:
        idx = np.asarray(plan.attributes, dtype=np.intp)
        names = tuple(det.class_names[i] for i in idx)
        attributes = AttributesRequest(plan.attributes, det.masks[idx], names, plan.answers)
    return StageRequests(det, plan, refine, attributes, plan.depth)


def _refined(requests: StageRequests, masks: Any) -> RefinedMasks | None:
    req = requests.refine
    if req is None:
        return None
    if masks is None:
        raise StageError("segmenter", "this prompt needs refined masks, but no segmenter answered", rule="result-count")
    arr = np.asarray(masks)
    want = (len(req.indices), *requests.shape_hw)
    if arr.shape != want:
        rule = "result-count" if arr.ndim == 3 and arr.shape[1:] == want[1:] else "mask-size"
        raise StageError("segmenter", f"returned masks of shape {arr.shape}, expected {want}", rule=rule)
    try:
        return RefinedMasks({i: arr[k] for k, i in enumerate(req.indices)}, requests.shape_hw)
    except ValueError as exc:
        raise StageError("segmenter", str(exc), rule="mask-size") from None


def _scores(requests: StageRequests, scores: Any) -> AttributeScores | None:
    req = requests.attributes
    if req is None:
        return None
    if scores is None:
        raise StageError("attributes", "this prompt needs attribute scores, but no scorer answered",
                         rule="result-count")  # fmt: skip
    arr = np.asarray(scores, dtype=np.float32)
    want = (len(req.indices), len(req.answers))
    if arr.shape != want:
        raise StageError("attributes", f"returned scores of shape {arr.shape}, expected {want}", rule="result-count")
    if not np.isfinite(arr).all():
        raise StageError("attributes", "returned scores that are not finite", rule="score-finite")
    return AttributeScores(
        {i: dict(zip(req.answers, map(float, arr[k]), strict=True)) for k, i in enumerate(req.indices)}, req.answers
    )


def _disparity(requests: StageRequests, values: Any) -> DisparityMap | None:
    if not requests.depth:
        return None
    if values is None:
        raise StageError("depth", "this prompt needs depth, but no depth estimator answered", rule="result-count")
    arr = np.asarray(values, dtype=np.float32)
    if arr.shape != requests.shape_hw:
        raise StageError("depth", f"returned a map of shape {arr.shape}, expected (H, W) = {requests.shape_hw}",
                         rule="mask-size")  # fmt: skip
    if not np.isfinite(arr).all():
        raise StageError("depth", "disparity must be finite everywhere", rule="depth-finite")
    return DisparityMap(arr, requests.shape_hw)


def finish(
    prompt: Prompt,
    requests: StageRequests,
    *,
    refined: Any = None,
    scores: Any = None,
    disparity: Any = None,
    config: RuleConfig = CURRENT,
) -> tuple[Verdict, ImagePerception]:
    """Validate the answers to ``requests``, assemble the perception and judge it."""
    perception = ImagePerception(
        requests.detections,
        refined=_refined(requests, refined),
        attributes=_scores(requests, scores),
        disparity=_disparity(requests, disparity),
    )
    try:
        return judge(prompt, perception, config), perception
    except (PerceptionError, ValueError) as exc:
        raise StageError("judge", str(exc)) from None
