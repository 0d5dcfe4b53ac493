"""The detector's class filter (``DetectItem.classes`` / ``max_per_class``) never changes a verdict.

- ``select_requested``: the kept rows are what ``negt2i.core.rules.select_instances`` keeps (ties to the
  earlier detection, float32 scores), in the detector's order;
- every built-in detector backend (synthetic, RF-DETR-Seg-XL and Mask R-CNN with random weights)
  returns exactly ``filter_detections`` of its unfiltered output, masks included, and builds
  full-resolution masks only for the kept rows (RF-DETR's post-processing at K = 300, 1024 px);
- verdicts over one prompt of every category x polarity setting of the corpus (and the control
  prompts' probes) are identical with and without the filter, detection indices aside (they point
  into a shorter list: mapped back, the verdicts are equal field for field), under the paper's
  rules, rules tightened so that the presence fallback, over-counts and absences all occur, and
  rules with overlap suppression (no cap then);
- a third-party detector without the keywords still works (filtered after it answers), the
  in-process Pipeline passes each prompt's classes, and the stage handler honours the fields.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from negt2i.core import flow
from negt2i.core.config import CURRENT, DetectionConfig, RuleConfig
from negt2i.core.perception import Detections
from negt2i.core.spec import Prompt, parse_prompt
from negt2i.core.vocab import COCO_CLASSES, Category
from negt2i.pipeline import Pipeline, Stages
from negt2i.stages.base import ModelInfo
from negt2i.stages.common import detect_requested, filter_detections, select_requested
from negt2i.stages.synthetic import (
    COLOR_REFERENCE,
    MATERIAL_REFERENCE,
    SceneObject,
    SyntheticAttributeScorer,
    SyntheticDepthEstimator,
    SyntheticDetector,
    SyntheticSegmenter,
    render_scene,
)

REPO = Path(__file__).resolve().parents[2]
SIZE = 128  # disparities k / 128 travel exactly as the services' float16

# --------------------------------------------------------------------------- the selection itself


def test_select_requested_keeps_the_top_per_class_ties_to_the_earlier_in_the_detectors_order():
    names = ["cup", "dog", "cup", "cup", None, "cup", "dog", "cat"]
    scores = np.array([0.2, 0.9, 0.7, 0.2, 0.99, 0.7, 0.1, 0.5])
    keep, counts = select_requested(names, scores, ["cup", "dog"], 2)
    assert keep.tolist() == [1, 2, 5, 6]  # cups 2 and 5 (0.7, 0.7) beat 0 and 3 (0.2); the detector's order
    assert counts == {"cup": 4}  # only the capped class is counted
    keep, counts = select_requested(names, scores, ["cup"], 3)
    assert keep.tolist() == [0, 2, 5] and counts == {"cup": 4}  # the 0.2 tie goes to the earlier cup (0)
    keep, counts = select_requested(names, scores, None, 0)
    assert keep.tolist() == [0, 1, 2, 3, 5, 6, 7] and counts == {}  # no label: never kept
    keep, _ = select_requested(names, scores, [], 1)  # empty: every class
    assert keep.tolist() == [1, 2, 7]
    with pytest.raises(ValueError, match=">= 0"):
        select_requested(names, scores, None, -1)


def test_scores_that_tie_in_float32_tie_as_the_rules_see_them():
    a = 0.5
    b = float(np.nextafter(np.float64(a), 1.0))  # differs in float64, equal in float32 (as Detections stores it)
    keep, _ = select_requested(["cup", "cup"], np.array([a, b]), ["cup"], 1)
    det = Detections.from_masks(["cup", "cup"], [a, b], np.ones((2, 4, 4), bool), (4, 4))
    assert keep.tolist() == [int(det.indices_of("cup")[0])] == [0]


def test_filter_detections_keeps_masks_and_counts_and_returns_the_original_indices():
    rng = np.random.default_rng(0)
    masks = rng.random((6, 8, 8)) > 0.5
    det = Detections.from_masks(["cup", "dog", "cup", "cup", "cat", "dog"], [0.3, 0.8, 0.9, 0.3, 0.5, 0.7], masks,
                                (8, 8))  # fmt: skip
    out, idx = filter_detections(det, ("cup", "dog"), 2)
    assert idx.tolist() == [0, 1, 2, 5]
    assert out.class_names == ("cup", "dog", "cup", "dog") and dict(out.class_counts or {}) == {"cup": 3}
    np.testing.assert_array_equal(out.masks, masks[[0, 1, 2, 5]])
    assert out.candidates("cup") == 3 and out.candidates("dog") == 2 and out.candidates("cat") == 0
    again, idx2 = filter_detections(out, ("cup",), 1)  # a second, tighter filter keeps the first counts
    assert again.class_names == ("cup",) and dict(again.class_counts or {}) == {"cup": 3} and idx2.tolist() == [2]
    same, _ = filter_detections(det)
    assert same is det
    with pytest.raises(ValueError, match="before the cap"):
        Detections(("cup", "cup"), np.array([0.5, 0.5]), np.zeros((2, 4)), masks[:2], (8, 8), {"cup": 1})


@pytest.mark.parametrize("fault", ["unicorn", "below-floor", "box-off-image"])
def test_the_filter_never_hides_a_contract_violation_in_a_row_it_would_drop(fault: str):
    """A broken row of a class the prompt does not name must still reach the contract check, which names the
    rule: ``flow.begin`` checks the whole answer (against the run's rules) before it filters, so a broken
    detector never passes unnoticed; the same answer without the fault is filtered to the prompt's class."""
    masks = np.zeros((2, 8, 8), dtype=bool)
    masks[:, 2:5, 2:5] = True
    det = Detections.from_masks(["cup", "dog"], [0.9, 0.8], masks, (8, 8))
    names, scores, boxes = list(det.class_names), det.scores.copy(), det.xyxy.copy()
    if fault == "unicorn":
        names[1] = "unicorn"
    elif fault == "below-floor":
        scores[1] = CURRENT.detection.prediction_floor / 2
    else:
        boxes[1, 2] = 30.0
    broken = Detections(tuple(names), scores, boxes, masks, (8, 8))
    prompt = parse_prompt({"id": "cup", "prompt": "a photo of a cup", "include": [{"class": "cup"}]})
    rule = {"unicorn": "class-vocabulary", "below-floor": "score-range", "box-off-image": "box-inside-image"}[fault]
    with pytest.raises(flow.StageError) as err:
        flow.begin(prompt, broken, (8, 8), CURRENT)
    assert err.value.rule == rule
    assert flow.begin(prompt, det, (8, 8), CURRENT).detections.class_names == ("cup",)  # a sound answer: filtered


def test_the_filter_runs_against_the_runs_rules_not_the_defaults():
    """A score the default rules allow but the run's rules put below the floor fails ``begin`` even in a row
    the filter would drop: the run's config is the one the answer is checked against."""
    masks = np.zeros((2, 8, 8), dtype=bool)
    masks[:, 2:5, 2:5] = True
    det = Detections.from_masks(["cup", "dog"], [0.9, 0.05], masks, (8, 8))
    prompt = parse_prompt({"id": "cup", "prompt": "a photo of a cup", "include": [{"class": "cup"}]})
    assert flow.begin(prompt, det, (8, 8), CURRENT).detections.class_names == ("cup",)
    strict = CURRENT.model_copy(update={"detection": CURRENT.detection.model_copy(update={"prediction_floor": 0.1})})
    with pytest.raises(flow.StageError) as err:
        flow.begin(prompt, det, (8, 8), strict)
    assert err.value.rule == "score-range"


# --------------------------------------------------------------------------- prompts and scenes


def corpus_prompts() -> list[Prompt]:
    """One prompt per category x polarity setting of the corpus (48), and one control prompt with probes per
    category (6)."""
    seen: set[tuple[str, str]] = set()
    out: list[Prompt] = []
    for line in (REPO / "data" / "negt2ibench.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if (rec["category"], rec["setting"]) not in seen:
            seen.add((rec["category"], rec["setting"]))
            out.append(parse_prompt(rec))
    controls: set[str] = set()
    for line in (REPO / "data" / "negt2ibench-control.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["category"] not in controls:
            controls.add(rec["category"])
            out.append(parse_prompt(rec))
    assert len(seen) == 48 and len(controls) == 6
    return out


PROMPTS = corpus_prompts()


def with_classes(prompt: Prompt, classes: Sequence[str]) -> Prompt:
    """``prompt`` with its objects' classes replaced, in order, by ``classes`` (for random-weight detectors,
    whose detections concentrate on a few classes)."""
    rec = prompt.to_json()
    mapping = dict(zip(dict.fromkeys(o.class_name for o in prompt.objects), classes, strict=False))
    rec["include"] = [{**inc, "class": mapping[inc["class"]]} for inc in rec["include"]]
    return parse_prompt(rec)


def scene(prompt: Prompt, rng: np.random.Generator) -> np.ndarray:
    """The prompt's objects (sometimes one missing, doubled, or a crowd of 20 small copies: more than the
    per-class cap, all scoring alike) among objects of other classes."""
    names = [o.class_name for o in prompt.objects]
    others = [c for c in COCO_CLASSES if c not in names]
    objs = [SceneObject(str(c), _box(rng, 0.1, 0.25)) for c in rng.choice(others, size=4, replace=False)]
    roll = float(rng.random())
    category = prompt.category
    pool: list[str] = []
    if category is not None and category.is_attribute:
        pool = [*COLOR_REFERENCE] if category is Category.COLOR else [*MATERIAL_REFERENCE]
    for i, name in enumerate(names):
        if roll < 0.12 and i == len(names) - 1:
            continue
        value = str(rng.choice(pool)) if pool else None
        objs.append(SceneObject(name, _box(rng, 0.15, 0.35), shape="ellipse" if rng.random() < 0.4 else "rect",
                                value=value))  # fmt: skip
    if 0.12 <= roll < 0.3:
        objs.append(SceneObject(names[0], _box(rng, 0.1, 0.2)))
    if 0.3 <= roll < 0.5:
        objs += [SceneObject(names[-1], (2 + 5 * k, 2, 5 + 5 * k, 5)) for k in range(18)]  # 18 tiny copies
    return render_scene(objs, (SIZE, SIZE))


def _box(rng: np.random.Generator, lo: float, hi: float) -> tuple[int, int, int, int]:
    w, h = (int(rng.integers(int(SIZE * lo), int(SIZE * hi))) for _ in range(2))
    x0, y0 = int(rng.integers(1, SIZE - w - 1)), int(rng.integers(8, SIZE - h - 1))
    return (x0, y0, x0 + w, y0 + h)


class RawDetector:
    """K raw detections per image with quantised random scores (many ties) over the whole score range, half
    of them of the ``focus`` classes: a third-party detector written before the filter (``detect(images)``
    only), like RF-DETR's 300 queries with random weights."""

    def __init__(self, k: int = 300, seed: int = 0) -> None:
        self.k = k
        self.rng = np.random.default_rng(seed)
        self.focus: Sequence[str] = ()
        self.info = ModelInfo(stage="detector", backend="raw-stub", model="raw")

    def detect(self, images: Sequence[np.ndarray]) -> list[Detections]:
        out = []
        for image in images:
            h, w = image.shape[:2]
            rng = self.rng
            focus = float(rng.choice([0.0, 0.004, 0.03, 0.3]))  # none, about one, a few, many per class
            pick = [self.focus if self.focus and rng.random() < focus else COCO_CLASSES for _ in range(self.k)]
            names = [str(rng.choice(c)) for c in pick]
            scores = np.maximum(np.round(rng.random(self.k) ** rng.choice([1, 4, 12]), 2), 0.01)
            x0, y0 = rng.integers(0, w - 4, self.k), rng.integers(0, h - 4, self.k)
            x1, y1 = x0 + rng.integers(2, w // 2, self.k), y0 + rng.integers(2, h // 2, self.k)
            masks = np.zeros((self.k, h, w), bool)
            for i in range(self.k):
                masks[i, y0[i] : min(y1[i], h), x0[i] : min(x1[i], w)] = True
            out.append(Detections.from_masks(names, scores, masks, (h, w)))
        return out


SEGMENTER, SCORER, DEPTH = SyntheticSegmenter(), SyntheticAttributeScorer(), SyntheticDepthEstimator()


def judge(prompt: Prompt, image: np.ndarray, det: Detections, config: RuleConfig) -> dict[str, Any]:
    """The verdict on ``det`` as given (checked, not filtered: ``flow.plan_requests``) through the flow's
    finish (synthetic segmenter, scorer and depth), as JSON."""
    req = flow.plan_requests(prompt, flow.check_detections(det, image.shape[:2], config), config)
    refined = scores = disparity = None
    if req.refine is not None:
        refined = SEGMENTER.refine(image, req.refine.boxes, req.refine.reference_masks)
    if req.attributes is not None:
        a = req.attributes
        scores = SCORER.score(image, a.masks, list(a.class_names), a.answers)
    if req.depth:
        disparity = DEPTH.disparity([image])[0]
    verdict, _ = flow.finish(prompt, req, flow.StageAnswers(refined, scores, disparity), config=config)
    return verdict.to_json()


def remap(verdict: dict[str, Any], idx: np.ndarray) -> dict[str, Any]:
    """A verdict judged on filtered detections with its detection indices mapped back to the unfiltered list."""
    out = json.loads(json.dumps(verdict))
    for o in out["objects"]:
        o["detections"] = [int(idx[i]) for i in o["detections"]]
        o["measurements"]["kept"] = [[int(idx[i]), s] for i, s in o["measurements"]["kept"]]
    for st in [*out["statements"], *out.get("probes", [])]:
        m = st["measurements"]
        if "detection" in m:
            m["detection"] = int(idx[m["detection"]])
        if "detections" in m:
            m["detections"] = [int(idx[i]) for i in m["detections"]]
    return out


def tightened(scores: np.ndarray, cap: int = 3) -> RuleConfig:
    """Rules whose thresholds sit inside the detector's score range: absences, the presence fallback and
    over-counts all occur, and the cap bites."""
    pres, count = (float(np.quantile(scores, q)) for q in (0.55, 0.85))
    return RuleConfig(name="tight", detection=DetectionConfig(per_class_cap=cap, presence_threshold=pres,
                                                              count_threshold=count))  # fmt: skip


def suppressed() -> RuleConfig:
    return RuleConfig(name="nms", detection=DetectionConfig(overlap_iou=0.5, per_class_cap=2, count_threshold=0.3))


class Tally:
    """What the compared verdicts exercised (so the equivalence is not vacuous)."""

    def __init__(self) -> None:
        keys = ("fallback", "over_count", "absent", "capped", "evaluated", "unevaluated", "dropped", "verdicts")
        self.seen: dict[str, int] = dict.fromkeys(keys, 0)
        self.settings: set[tuple[str | None, str]] = set()

    def add(self, prompt: Prompt, verdict: dict[str, Any], full: Detections, filtered: Detections) -> None:
        s = self.seen
        s["verdicts"] += 1
        s["fallback"] += any(o["fallback"] for o in verdict["objects"])
        s["over_count"] += any(o["over_count"] for o in verdict["objects"])
        s["absent"] += any(not o["present"] for o in verdict["objects"])
        s["capped"] += bool(filtered.class_counts)
        s["dropped"] += len(filtered) < len(full)
        sts = [*verdict["statements"], *verdict.get("probes", [])]
        s["evaluated"] += any(st["evaluated"] for st in sts)
        s["unevaluated"] += any(not st["evaluated"] for st in sts)
        self.settings.add((prompt.category.value if prompt.category else None, prompt.setting))

    def check(self, *, over_count: bool = True) -> None:
        s = self.seen
        for key in ("fallback", "absent", "capped", "evaluated", "unevaluated", "dropped"):
            assert s[key] > 0, f"no verdict exercised {key}: {s}"
        if over_count:
            assert s["over_count"] > 0, s


def assert_same_verdicts(
    pairs: Sequence[tuple[Prompt, np.ndarray, Detections]],
    filtered: Callable[[Prompt, np.ndarray, Detections, flow.DetectRequest], Detections],
    configs: Sequence[RuleConfig],
    tally: Tally,
) -> None:
    """For each (prompt, image, unfiltered detections) and config: the verdict on the filtered detections,
    indices mapped back, equals the verdict on the unfiltered ones; the filtered detections are exactly
    ``filter_detections`` of the unfiltered ones."""
    for config in configs:
        for prompt, image, full in pairs:
            req = flow.detector_request(prompt, config)
            got = filtered(prompt, image, full, req)
            want, idx = filter_detections(full, req.classes, req.max_per_class)
            assert got.class_names == want.class_names
            np.testing.assert_array_equal(got.scores, want.scores)
            np.testing.assert_array_equal(got.xyxy, want.xyxy)
            np.testing.assert_array_equal(got.masks, want.masks)
            assert dict(got.class_counts or {}) == dict(want.class_counts or {})
            assert set(got.class_names) <= set(req.classes)
            verdict = judge(prompt, image, full, config)
            assert remap(judge(prompt, image, got, config), idx) == verdict, (prompt.id, config.name)
            tally.add(prompt, verdict, full, got)


# --------------------------------------------------------------------------- equivalence, per detector


def test_synthetic_detector_same_verdicts_over_every_category_and_setting():
    rng = np.random.default_rng(3)
    images = [(p, scene(p, rng)) for p in PROMPTS for _ in range(2)]
    tally = Tally()
    for score in (0.9, 0.2):  # 0.2: present but below the counting threshold, the fallback counts one
        detector = SyntheticDetector(score=score)
        full = detector.detect([im for _, im in images])
        pairs = [(p, im, d) for (p, im), d in zip(images, full, strict=True)]

        def filtered(_p: Prompt, im: np.ndarray, _d: Detections, req: flow.DetectRequest) -> Detections:
            return detector.detect([im], classes=[req.classes], max_per_class=req.max_per_class)[0]

        assert_same_verdicts(pairs, filtered, [CURRENT, suppressed()], tally)
    assert {(c.value, s) for c in Category for s in SETTINGS} <= tally.settings
    tally.check()


SETTINGS = ("pos1_neg0", "pos2_neg0", "pos0_neg1", "pos0_neg2", "pos1_neg1", "pos1_neg2", "pos2_neg1", "pos2_neg2")


def test_300_raw_detections_of_a_detector_without_the_filter_same_verdicts():
    """K = 300 raw detections per image from a detector that takes only ``images``: ``detect_requested``
    calls it without the keywords and filters what it returns; the verdicts are the unfiltered ones."""
    detector = RawDetector(k=300)
    rng = np.random.default_rng(5)
    pairs: list[tuple[Prompt, np.ndarray, Detections]] = []
    for p in PROMPTS:
        detector.focus = [o.class_name for o in p.objects]
        image = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
        pairs.append((p, image, detector.detect([image])[0]))
    assert all(len(d) == 300 for _, _, d in pairs)
    scores = np.concatenate([d.scores for _, _, d in pairs])

    def filtered(_p: Prompt, im: np.ndarray, full: Detections, req: flow.DetectRequest) -> Detections:
        class Replay(RawDetector):  # the same raw answer again, through the caller-side filter
            def detect(self, images: Sequence[np.ndarray]) -> list[Detections]:
                return [full]

        out = detect_requested(Replay(), [im], [req.classes], req.max_per_class)[0]
        assert len(out) <= len(req.classes) * (req.max_per_class or 300)
        return out

    tally = Tally()
    assert_same_verdicts(pairs, filtered, [CURRENT, tightened(scores), suppressed()], tally)
    tally.check()


@pytest.fixture(scope="module")
def rfdetr() -> Any:
    torch = pytest.importorskip("torch")
    from rfdetr import RFDETRSegXLarge

    from negt2i.stages.rfdetr_backend import RFDETRDetector

    torch.manual_seed(0)
    model = RFDETRSegXLarge(pretrain_weights=None, device="cpu")  # the XL architecture, nothing downloaded
    info = ModelInfo(stage="detector", backend="rfdetr-seg-xl", model="RFDETRSegXLarge", revision="random-init")
    return RFDETRDetector(model, info, shape=(96, 96))


@pytest.fixture(scope="module")
def maskrcnn() -> Any:
    torch = pytest.importorskip("torch")
    from negt2i.stages.maskrcnn_backend import MaskRCNNDetector, build_model

    torch.manual_seed(0)
    model = build_model(min_size=64, max_size=64, proposals=32, detections_per_img=40)
    return MaskRCNNDetector(model, ModelInfo(stage="detector", backend="maskrcnn-r50", model="maskrcnn_resnet50_fpn"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["rfdetr", "maskrcnn"])
def test_random_weight_architectures_filter_inside_and_give_the_same_verdicts(backend: str, request):
    """The real architectures with random weights: one batched call with a different request per image
    returns exactly ``filter_detections`` of the unfiltered call (masks included); then every category x
    setting prompt, its classes set to the classes the model detects, is judged on those detections with
    and without the filter."""
    detector = request.getfixturevalue(backend)
    rng = np.random.default_rng(11)
    images = [rng.integers(0, 255, (64, 64 + 16 * i, 3), dtype=np.uint8) for i in range(3)]
    full = detector.detect(images)
    assert all(len(d) > 20 for d in full)
    counts: dict[str, int] = {}
    for d in full:
        for name in d.class_names:
            counts[name] = counts.get(name, 0) + 1
    top = sorted(counts, key=lambda c: -counts[c])[:6]  # relation prompts name up to 5 classes
    requests: list[Sequence[str]] = [top[:3], top[:1], ()]
    for cap in (2, 0) if backend == "maskrcnn" else (2,):  # RF-DETR is the slower one on a CPU
        got = detector.detect(images, classes=requests, max_per_class=cap)
        for d, g, classes in zip(full, got, requests, strict=True):
            want, _ = filter_detections(d, classes, cap)
            assert g.class_names == want.class_names and dict(g.class_counts or {}) == dict(want.class_counts or {})
            np.testing.assert_array_equal(g.scores, want.scores)
            np.testing.assert_array_equal(g.xyxy, want.xyxy)
            np.testing.assert_array_equal(g.masks, want.masks)
    assert any(len(g) < len(d) for g, d in zip(got, full, strict=True))
    # the verdicts: every category x setting prompt on each image's detections
    pairs = [(with_classes(p, top[k % 6 :] + top[: k % 6]), images[k % 3], full[k % 3]) for k, p in enumerate(PROMPTS)]
    scores = np.concatenate([d.scores for d in full])

    def filtered(_p: Prompt, _im: np.ndarray, d: Detections, req: flow.DetectRequest) -> Detections:
        return filter_detections(d, req.classes, req.max_per_class)[0]  # the backend's own filter equals it (above)

    tally = Tally()
    assert_same_verdicts(pairs, filtered, [CURRENT, tightened(scores)], tally)
    tally.check()


def test_rfdetr_post_processing_at_300_queries_upsamples_only_the_kept_masks():
    """RF-DETR's own post-processing on 300 queries (91 class slots, 64 x 64 mask logits): the
    filtered post-processing gives the unfiltered rows it keeps, masks equal, and upsamples no other (512 px:
    the unfiltered reference upsamples all 300)."""
    torch = pytest.importorskip("torch")
    from rfdetr.models.postprocess import PostProcess

    from negt2i.stages.rfdetr_backend import _FilteredPostProcess, class_names_by_id

    gen = torch.Generator().manual_seed(0)
    outputs = {
        "pred_logits": torch.randn(1, 300, 91, generator=gen) - 2.0,
        "pred_boxes": torch.rand(1, 300, 4, generator=gen) * 0.5 + 0.25,
        "pred_masks": torch.randn(1, 300, 64, 64, generator=gen),
    }
    sizes = torch.tensor([[512, 512]])
    names = class_names_by_id()
    post = _FilteredPostProcess(PostProcess(num_select=300), names, 0.005)
    upsampled: list[int] = []
    real = torch.nn.functional.interpolate

    def counting(x: Any, *a: Any, **k: Any) -> Any:
        upsampled.append(int(x.shape[0]))
        return real(x, *a, **k)

    full = post(outputs, sizes, score_threshold=0.005)[0]
    labels = full["labels"].numpy()
    assert len(labels) == 300
    wanted = [names[int(c)] for c in labels[:40] if int(c) in names][:2]
    post.request = [(wanted, 3)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.functional, "interpolate", counting)
        got = post(outputs, sizes, score_threshold=0.005)[0]
    keep, counts = select_requested([names.get(int(c)) for c in labels], full["scores"].numpy(), wanted, 3)
    assert 0 < len(keep) <= 6 and sum(upsampled) == len(keep)  # masks built: the kept rows only
    for key in ("scores", "labels", "boxes", "masks"):
        assert torch.equal(got[key], full[key][torch.as_tensor(keep)]), key
    assert post.counts == [counts]


# --------------------------------------------------------------------------- callers


def test_pipeline_asks_the_detector_for_each_prompts_classes_and_the_cap():
    calls: list[tuple[list[Any], int]] = []

    class Spy(SyntheticDetector):
        def detect(self, images, classes=None, *, max_per_class=0):  # type: ignore[no-untyped-def]
            calls.append((list(classes or []), max_per_class))
            return super().detect(images, classes, max_per_class=max_per_class)

    rng = np.random.default_rng(1)
    prompts = PROMPTS[:3] + PROMPTS[-3:]
    images = [scene(p, rng) for p in prompts]
    stages = Stages(detector=Spy(), segmenter=SEGMENTER, attributes=SCORER, depth=DEPTH)
    results = Pipeline(stages).run(prompts, images)
    assert calls == [([tuple(dict.fromkeys(o.class_name for o in p.objects)) for p in prompts], 16)]
    for p, im, r in zip(prompts, images, results, strict=True):
        assert r.verdict is not None
        full = SyntheticDetector().detect([im])[0]
        _, idx = filter_detections(full, [o.class_name for o in p.objects], 16)
        assert remap(r.verdict.to_json(), idx) == judge(p, im, full, CURRENT)


def test_a_detector_without_the_keywords_still_works_in_the_pipeline():
    class Old:
        info = SyntheticDetector().info

        def detect(self, images):  # type: ignore[no-untyped-def]
            return SyntheticDetector().detect(images)

    rng = np.random.default_rng(2)
    prompts = PROMPTS[::9]
    images = [scene(p, rng) for p in prompts]
    new = Pipeline(Stages(detector=SyntheticDetector(), segmenter=SEGMENTER, attributes=SCORER, depth=DEPTH))
    old = Pipeline(Stages(detector=Old(), segmenter=SEGMENTER, attributes=SCORER, depth=DEPTH))  # type: ignore[arg-type]
    got, want = old.run(prompts, images), new.run(prompts, images)
    assert [r.verdict.to_json() for r in got if r.verdict] == [r.verdict.to_json() for r in want if r.verdict]
    assert all(r.verdict is not None for r in got)


def test_stage_handler_honours_the_fields_and_lists_the_feature():
    from negt2i.wire import adapter
    from negt2i.wire.stage_handlers import StageHandler, StageSettings

    handler = StageHandler(StageSettings.from_env("detector", {"NEGT2I_DETECTOR_BACKEND": "synthetic"}))
    assert adapter.FEATURE_DETECT_CLASSES in handler.info().features
    objs = [SceneObject("cup", (2 + 6 * k, 2, 6 + 6 * k, 6)) for k in range(5)] + [SceneObject("dog", (10, 40, 40, 70))]
    png = adapter.encode_png(render_scene(objs, (SIZE, SIZE)))
    image = {"image": {"data": __import__("base64").b64encode(png).decode()}}
    out = handler.handle([image, {**image, "classes": ["cup"], "max_per_class": 2}, {**image, "classes": ["dog"]},
                          {**image, "classes": ["unicorn"]}, {**image, "max_per_class": -1}])  # fmt: skip
    names = [[d["class_name"] for d in r.get("detections", [])] for r in out[:3]]
    assert names == [["dog"] + ["cup"] * 5, ["cup", "cup"], ["dog"]]  # COCO order: dog (17) before cup (41)
    assert out[1]["class_counts"] == {"cup": 5} and "class_counts" not in out[0]
    assert out[3]["error"]["status"] == 400 and out[3]["error"]["field"] == "classes[0]"
    assert out[4]["error"]["status"] == 400 and out[4]["error"]["field"] == "max_per_class"


def test_detector_request_names_the_prompts_classes_and_the_cap_unless_suppression_is_on():
    p = next(p for p in PROMPTS if len(p.objects) == 3)
    req = flow.detector_request(p)
    assert req.classes == tuple(o.class_name for o in p.objects) and req.max_per_class == 16
    assert flow.detector_request(p, suppressed()).max_per_class == 0
