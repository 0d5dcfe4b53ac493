"""The one per-image flow, free of I/O: ``negt2i.pipeline.Pipeline`` and the orchestrator both drive it.

For one (prompt, image) pair (``docs/architecture.md``):

1. the detector is asked for the prompt's classes, at most what the rules can use per class
   (``detector_request``: the per-class cap, ``detection.per_class_cap`` = 16, unless overlap
   suppression is on); a detector that honours the request returns, and builds masks for, only
   those;
2. ``begin(prompt, detections, shape_hw, config)`` validates the detector's whole answer against
   the contract (``check_detections``, the run's rule config), applies the class filter to it
   (``filter_detections``: the one place the filter runs for the rules, so a detector that ignores
   the request changes nothing) and plans what else the prompt needs (``StageRequests``: the box
   prompts for the segmenter, the masks / class names / answers for the attribute scorer, whether
   depth is needed);
3. the caller runs those requests however it reaches its stages (stage objects
   in-process, HTTP services in the orchestrator), concurrently or batched;
4. ``finish(prompt, requests, StageAnswers(refined=, scores=, disparity=), config=)`` validates
   each answer against the contract, assembles the ``ImagePerception`` and judges it.

Every violation raises ``negt2i.core.failures.StageError`` naming the stage and the
contract rule (``negt2i.core.failures.ContractRule``); a perception the judge cannot use raises
one with ``stage == "judge"``. No partial perception ever reaches the judge.

Contract rules checked here on every answer (``docs/stage-contract.md``; the orchestrator's
stage client adds ``detect-result``, ``result-schema`` and ``stage-info`` for what travels):

- ``image-size``: detections are for the image's (H, W);
- ``class-vocabulary``: class names are COCO classes in the benchmark's spelling
  (``negt2i.core.vocab.COCO_CLASSES``; ``Person`` or ``unicorn`` are violations);
- ``score-range``: scores are finite and in [prediction floor, 1];
- ``box-inside-image``: boxes are finite ``xyxy`` pixel edges with
  0 <= x0 <= x1 <= W and 0 <= y0 <= y1 <= H (stages clip to the image);
- ``mask-size``: every mask is (H, W) at the image's resolution, one per instance;
- ``result-count``: one answer per requested instance (segmenter masks, attribute rows);
- ``score-finite``: attribute scores are finite; ``depth-finite``: disparity is finite.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.failures import ContractRule, StageError
from negt2i.core.perception import AttributeScores, BoolMask, Detections, DisparityMap, ImagePerception, RefinedMasks
from negt2i.core.plan import PerceptionPlan, plan_perception
from negt2i.core.spec import Prompt
from negt2i.core.verdict import PerceptionError, Verdict, judge
from negt2i.core.vocab import COCO_CLASSES

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


@dataclass(frozen=True, eq=False)
class StageAnswers:
    """What the stages answered to one image's ``StageRequests`` (``None``: that stage was not asked or did
    not answer); ``finish`` checks each against the contract before anything is judged."""

    refined: NDArray[np.bool_] | None = None
    """The segmenter's masks (K, H, W), one per ``RefineRequest.indices``."""
    scores: NDArray[np.float32] | None = None
    """The attribute scorer's scores (K, A), one row per ``AttributesRequest.indices``, one column per answer."""
    disparity: NDArray[np.float32] | None = None
    """The depth estimator's disparity map (H, W)."""


def detector_request(prompt: Prompt, config: RuleConfig = CURRENT) -> DetectRequest:
    """The detector request of a prompt: its classes, in prompt order, without repeats, and the cap.

    What the rules read (``negt2i.core.rules.select_instances``, ``negt2i.core.verdict.judge``): per object of
    the prompt, the detections of its own class only (presence, counting, the fallback to the top
    detection, over- and under-count, then the statements and probes on the counted instances), the
    top ``per_class_cap`` by score, ties to the earlier detection. So a detector may drop every other
    class and all but the top ``per_class_cap`` of each class without changing a verdict. With overlap
    suppression on (``overlap_iou`` < 1) the cap is taken after suppression, so the request has none.
    """
    cfg = config.detection
    cap = cfg.per_class_cap if cfg.overlap_iou >= 1.0 else 0
    return DetectRequest(tuple(dict.fromkeys(o.class_name for o in prompt.objects)), cap)


def select_requested(
    class_names: Sequence[str | None],
    scores: NDArray[Any],
    classes: Collection[str] | None = None,
    max_per_class: int = 0,
) -> tuple[NDArray[np.intp], dict[str, int]]:
    """Which detections a class-filtered detector returns, and the per-class counts of the capped classes.

    ``class_names[i]`` is detection i's benchmark class (``None``: a label without one, never kept) and
    ``scores[i]`` its score, in the detector's order, already at or above the prediction floor. Kept:
    detections of ``classes`` (``None`` / empty: every class); when ``max_per_class`` > 0, per class
    only the ``max_per_class`` highest scores, ties to the earlier detection, exactly the order
    ``Detections.indices_of`` and ``negt2i.core.rules.select_instances`` use (scores compared as float32, as
    ``Detections`` stores them). Returns the kept indices in ascending (the detector's) order and, for
    each class that lost detections to the cap, how many it had before the cap
    (``Detections.class_counts``).
    """
    if max_per_class < 0:
        raise ValueError(f"max_per_class must be >= 0, got {max_per_class}")
    n = len(class_names)
    wanted = frozenset(classes) if classes else None
    rows: dict[str, list[int]] = {}
    for i, name in enumerate(class_names):
        if name is not None and (wanted is None or name in wanted):
            rows.setdefault(name, []).append(i)
    if max_per_class <= 0:
        keep = sorted(i for idx in rows.values() for i in idx)
        return np.asarray(keep, dtype=np.intp), {}
    s = np.asarray(scores, dtype=np.float32).reshape(n)
    kept: list[int] = []
    counts: dict[str, int] = {}
    for name, idx in rows.items():
        if len(idx) > max_per_class:
            arr = np.asarray(idx, dtype=np.intp)
            top = arr[np.argsort(-s[arr], kind="stable")[:max_per_class]]
            kept.extend(int(i) for i in top)
            counts[name] = len(idx)
        else:
            kept.extend(idx)
    return np.asarray(sorted(kept), dtype=np.intp), counts


def filter_detections(
    detections: Detections, classes: Collection[str] | None = None, max_per_class: int = 0
) -> tuple[Detections, NDArray[np.intp]]:
    """``detections`` reduced to what a class-filtered detector returns (``select_requested``), and the
    original index of each kept detection. Nothing to drop: the same object. Counts a detector already
    reported (``class_counts``) are kept. No contract check: ``begin`` checks the whole answer first."""
    idx, counts = select_requested(detections.class_names, detections.scores, classes, max_per_class)
    if len(idx) == len(detections):
        return detections, idx
    before = dict(detections.class_counts or {})
    names = tuple(detections.class_names[i] for i in idx)
    merged = {c: k for c, k in before.items() if c in set(names)}
    merged.update({c: before.get(c, k) for c, k in counts.items()})
    d = detections
    return Detections(names, d.scores[idx], d.xyxy[idx], d.masks[idx], d.shape_hw, merged or None), idx


def check_detections(detections: Any, shape_hw: tuple[int, int], config: RuleConfig = CURRENT) -> Detections:
    """``detections`` if it satisfies the detector's contract rules for an image of ``shape_hw``."""
    if not isinstance(detections, Detections):
        raise StageError(
            "detector", f"returned {type(detections).__name__}, not Detections", rule=ContractRule.RESULT_COUNT
        )
    det = detections
    if det.shape_hw != tuple(shape_hw):
        raise StageError("detector", f"detections are for {det.shape_hw}, the image is {tuple(shape_hw)}",
                         rule=ContractRule.IMAGE_SIZE)  # fmt: skip
    unknown = sorted({c for c in det.class_names if c not in _VOCAB})
    if unknown:
        raise StageError("detector", f"class names {unknown} are not in the benchmark vocabulary",
                         rule=ContractRule.CLASS_VOCABULARY)  # fmt: skip
    if len(det):
        floor = config.detection.prediction_floor
        low = float(det.scores.min())
        if not np.isfinite(det.scores).all() or low < floor or float(det.scores.max()) > 1.0:
            raise StageError("detector", f"scores must be in [{floor}, 1] (the prediction floor), got min {low:.6g}",
                             rule=ContractRule.SCORE_RANGE)  # fmt: skip
        h, w = det.shape_hw
        b = det.xyxy
        inside = (b[:, 0] >= 0) & (b[:, 1] >= 0) & (b[:, 2] <= w) & (b[:, 3] <= h)
        if not np.isfinite(b).all() or not inside.all():
            i = int(np.flatnonzero(~inside)[0]) if not inside.all() else 0
            raise StageError("detector", f"box {i} {b[i].tolist()} is not inside the image [0, {w}] x [0, {h}]",
                             rule=ContractRule.BOX_INSIDE_IMAGE)  # fmt: skip
    return det


def begin(
    prompt: Prompt, detections: Any, shape_hw: tuple[int, int], config: RuleConfig = CURRENT, *, complete: bool = False
) -> StageRequests:
    """Validate the detector's whole answer against the contract (``config``: the run's rules), reduce it to
    the prompt's request (``detector_request``, ``filter_detections``) and plan the other stages' requests
    (``plan_requests``; see the module docstring). The check comes before the filter, so a broken row of a
    class the prompt does not name is reported (its rule named), never filtered away."""
    request = detector_request(prompt, config)
    det = filter_detections(check_detections(detections, shape_hw, config), request.classes, request.max_per_class)[0]
    return plan_requests(prompt, det, config, complete=complete)


def plan_requests(
    prompt: Prompt, detections: Detections, config: RuleConfig = CURRENT, *, complete: bool = False
) -> StageRequests:
    """The other stages' requests for ``detections`` taken as they are (``begin`` checks and filters them
    first; only a caller that means to judge an unfiltered answer, a test of the filter, calls this alone);
    ``complete``: plan for re-judging with other thresholds (``negt2i.core.plan.plan_perception``)."""
    det = detections
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
        raise StageError(
            "segmenter", "this prompt needs refined masks, but no segmenter answered", rule=ContractRule.RESULT_COUNT
        )
    arr = np.asarray(masks)
    want = (len(req.indices), *requests.shape_hw)
    if arr.shape != want:
        rule = ContractRule.RESULT_COUNT if arr.ndim == 3 and arr.shape[1:] == want[1:] else ContractRule.MASK_SIZE
        raise StageError("segmenter", f"returned masks of shape {arr.shape}, expected {want}", rule=rule)
    try:
        return RefinedMasks({i: arr[k] for k, i in enumerate(req.indices)}, requests.shape_hw)
    except ValueError as exc:
        raise StageError("segmenter", str(exc), rule=ContractRule.MASK_SIZE) from None


def _scores(requests: StageRequests, scores: Any) -> AttributeScores | None:
    req = requests.attributes
    if req is None:
        return None
    if scores is None:
        raise StageError("attributes", "this prompt needs attribute scores, but no scorer answered",
                         rule=ContractRule.RESULT_COUNT)  # fmt: skip
    arr = np.asarray(scores, dtype=np.float32)
    want = (len(req.indices), len(req.answers))
    if arr.shape != want:
        raise StageError(
            "attributes", f"returned scores of shape {arr.shape}, expected {want}", rule=ContractRule.RESULT_COUNT
        )
    if not np.isfinite(arr).all():
        raise StageError("attributes", "returned scores that are not finite", rule=ContractRule.SCORE_FINITE)
    return AttributeScores(
        {i: dict(zip(req.answers, map(float, arr[k]), strict=True)) for k, i in enumerate(req.indices)}, req.answers
    )


def _disparity(requests: StageRequests, values: Any) -> DisparityMap | None:
    if not requests.depth:
        return None
    if values is None:
        raise StageError(
            "depth", "this prompt needs depth, but no depth estimator answered", rule=ContractRule.RESULT_COUNT
        )
    arr = np.asarray(values, dtype=np.float32)
    if arr.shape != requests.shape_hw:
        raise StageError("depth", f"returned a map of shape {arr.shape}, expected (H, W) = {requests.shape_hw}",
                         rule=ContractRule.MASK_SIZE)  # fmt: skip
    if not np.isfinite(arr).all():
        raise StageError("depth", "disparity must be finite everywhere", rule=ContractRule.DEPTH_FINITE)
    return DisparityMap(arr, requests.shape_hw)


def finish(
    prompt: Prompt, requests: StageRequests, answers: StageAnswers, *, config: RuleConfig = CURRENT
) -> tuple[Verdict, ImagePerception]:
    """Validate the ``answers`` to ``requests``, assemble the perception and judge it."""
    perception = ImagePerception(
        requests.detections,
        refined=_refined(requests, answers.refined),
        attributes=_scores(requests, answers.scores),
        disparity=_disparity(requests, answers.disparity),
    )
    try:
        return judge(prompt, perception, config), perception
    except (PerceptionError, ValueError) as exc:
        raise StageError("judge", str(exc)) from None
