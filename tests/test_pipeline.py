"""The shared per-image flow over stage objects (synthetic backends and failing fakes)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from negt2i.core.config import CURRENT
from negt2i.core.perception import Detections
from negt2i.core.spec import parse_prompt
from negt2i.pipeline import Pipeline, Stages
from negt2i.stages.synthetic import (
    SceneObject,
    SyntheticAttributeScorer,
    SyntheticDepthEstimator,
    SyntheticDetector,
    SyntheticSegmenter,
    render_scene,
)


def _prompt(pid, category, include, statements):
    return parse_prompt(
        {
            "id": pid,
            "category": category,
            "prompt": pid,
            "include": [{"class": c} for c in include],
            "statements": statements,
        }
    )


def _rel(predicate, polarity="positive"):
    return [{"kind": "relation", "subject": 0, "target": 1, "predicate": predicate, "polarity": polarity}]


def _attr(value, polarity="positive"):
    return [{"kind": "attribute", "object": 0, "value": value, "polarity": polarity}]


class Counting:
    """Wraps a backend and counts the calls of its stage method."""

    def __init__(self, inner, method):
        self.inner, self.method, self.calls = inner, method, 0
        self.info = inner.info
        setattr(self, method, self._call)

    def _call(self, *args, **kwargs):
        self.calls += 1
        return getattr(self.inner, self.method)(*args, **kwargs)


def _stages():
    return Stages(
        Counting(SyntheticDetector(), "detect"),
        Counting(SyntheticSegmenter(), "refine"),
        Counting(SyntheticAttributeScorer(), "score"),
        Counting(SyntheticDepthEstimator(), "disparity"),
    )


SCENE = render_scene(
    [
        SceneObject("cup", (8, 40, 30, 60), value="blue"),
        SceneObject("dog", (80, 30, 120, 90), shape="ellipse"),
        SceneObject("horse", (40, 5, 70, 25)),
    ],
    (128, 128),
)


def test_verdicts_and_only_needed_stages_are_called():
    stages = _stages()
    prompts = [
        _prompt("c1", "color", ["cup"], _attr("red", "negated")),  # blue cup: not red -> pass
        _prompt("c2", "color", ["cup"], _attr("blue")),  # pass
        _prompt("d1", "directional", ["cup", "dog"], _rel("left of")),  # pass
        _prompt("d2", "directional", ["cup", "dog"], _rel("left of", "negated")),  # fail
        _prompt("z1", "depth", ["dog", "horse"], _rel("in front of")),  # dog lower -> closer: pass
        _prompt("m1", "material", ["cat"], _attr("wooden")),  # no cat: undetected
    ]
    results = Pipeline(stages).run(prompts, [SCENE] * len(prompts))
    assert [r.ok for r in results] == [True] * 6
    assert [r.verdict.correct for r in results] == [True, True, True, False, True, False]
    assert results[3].verdict.statements[0].cause == "negated_violated"
    assert results[5].verdict.statements[0].cause == "undetected_object"
    assert stages.detector.calls == 1  # one batched call
    assert stages.depth.calls == 1 and stages.segmenter.calls == 3  # d1, d2, z1
    assert stages.attributes.calls == 2  # c1, c2 (m1 has nothing to score)
    assert results[0].perception.attributes is not None and results[0].perception.refined is None


def test_missing_stage_is_an_error_for_the_images_that_need_it():
    pipeline = Pipeline(Stages(SyntheticDetector()))
    results = pipeline.run(
        [
            _prompt("c", "color", ["cup"], _attr("blue")),
            _prompt("p", "proximity", ["cup", "dog"], _rel("near")),
            _prompt("z", "depth", ["dog", "horse"], _rel("behind")),
        ],
        [SCENE] * 3,
    )
    assert [r.error for r in results] == [
        "attributes: this prompt needs attribute scores, but no attribute scorer is configured",
        "segmenter: this prompt needs refined masks, but no segmenter is configured",
        "segmenter: this prompt needs refined masks, but no segmenter is configured",
    ]


class FlakyDetector:
    """Fails on any batch containing an all-black image."""

    info = SyntheticDetector().info

    def detect(self, images: Sequence[np.ndarray]) -> list[Detections]:
        if any(int(im.max()) == 0 for im in images):
            raise RuntimeError("cannot read black images")
        return SyntheticDetector().detect(images)


def test_one_failing_image_does_not_sink_the_batch():
    black = np.zeros((16, 16, 3), np.uint8)
    prompt = _prompt("c", "color", ["cup"], _attr("blue"))
    results = Pipeline(Stages(FlakyDetector(), attributes=SyntheticAttributeScorer())).run(
        [prompt] * 3, [SCENE, black, SCENE]
    )
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].error == "detector: RuntimeError: cannot read black images"


class BadShapeDepth:
    info = SyntheticDepthEstimator().info

    def disparity(self, images):
        return [np.zeros((3, 3), np.float32) for _ in images]


def test_wrong_shaped_stage_output_is_an_error():
    stages = Stages(SyntheticDetector(), SyntheticSegmenter(), depth=BadShapeDepth())
    result = Pipeline(stages).run_one(_prompt("z", "depth", ["dog", "horse"], _rel("behind")), SCENE)
    assert result.error == "depth: [mask-size] returned a map of shape (3, 3), expected (H, W) = (128, 128)"
    assert result.failure is not None and (result.failure.stage, result.failure.rule) == ("depth", "mask-size")
    assert result.failure.kind == "stage_error"


def test_stages_create_and_models():
    stages = Stages.create(dict.fromkeys(("detector", "segmenter", "attributes", "depth"), "synthetic"), config=CURRENT)
    assert set(stages.models()) == {"detector", "segmenter", "attributes", "depth"}
    with pytest.raises(ValueError, match="unknown stages"):
        Stages.create({"detektor": "synthetic"})
    with pytest.raises(ValueError, match="unknown detector backend 'nope'"):
        Stages.create({"detector": "nope"})


def test_prompt_image_count_mismatch():
    with pytest.raises(ValueError, match="2 prompts for 1 images"):
        Pipeline(Stages(SyntheticDetector())).run([_prompt("c", "color", ["cup"], _attr("blue"))] * 2, [SCENE])


def _scene(a_box, b_box, a_value=None):
    return render_scene([SceneObject("cup", a_box, value=a_value), SceneObject("dog", b_box)], (96, 96))


# one row per category and polarity: (category, statement, scene, expected correct)
ALL_CATEGORIES = [
    ("color", _attr("green"), _scene((10, 10, 40, 40), (60, 60, 80, 80), "green"), True),
    ("color", _attr("green", "negated"), _scene((10, 10, 40, 40), (60, 60, 80, 80), "green"), False),
    ("material", _attr("wooden"), _scene((10, 10, 40, 40), (60, 60, 80, 80), "wooden"), True),
    ("material", _attr("metal", "negated"), _scene((10, 10, 40, 40), (60, 60, 80, 80), "wooden"), True),
    ("directional", _rel("above"), _scene((40, 5, 60, 25), (40, 60, 60, 80)), True),
    ("directional", _rel("below", "negated"), _scene((40, 5, 60, 25), (40, 60, 60, 80)), True),
    ("directional", _rel("left of"), _scene((40, 5, 60, 25), (40, 60, 60, 80)), False),  # straight above
    ("proximity", _rel("near"), _scene((10, 40, 26, 56), (28, 40, 44, 56)), True),  # 2 px apart
    ("proximity", _rel("far from", "negated"), _scene((10, 40, 26, 56), (28, 40, 44, 56)), True),
    ("proximity", _rel("near"), _scene((2, 40, 18, 56), (70, 40, 86, 56)), False),
    ("comparative", _rel("bigger than"), _scene((5, 5, 45, 45), (60, 60, 75, 75)), True),
    ("comparative", _rel("shorter than", "negated"), _scene((5, 5, 45, 45), (60, 60, 75, 75)), True),
    ("comparative", _rel("bigger than"), _scene((5, 5, 20, 20), (60, 60, 75, 75)), False),  # same size: dead zone
    ("depth", _rel("in front of"), _scene((10, 60, 30, 90), (60, 10, 80, 30)), True),  # stands lower: closer
    ("depth", _rel("behind", "negated"), _scene((10, 60, 30, 90), (60, 10, 80, 30)), True),
    ("depth", _rel("behind"), _scene((10, 60, 30, 90), (60, 10, 80, 30)), False),
]


@pytest.mark.parametrize(("category", "statements", "image", "correct"), ALL_CATEGORIES)
def test_every_category_end_to_end_on_synthetic_scenes(category, statements, image, correct):
    include = ["cup"] if category in {"color", "material"} else ["cup", "dog"]
    prompt = _prompt("p", category, include, statements)
    stages = Stages.create(dict.fromkeys(("detector", "segmenter", "attributes", "depth"), "synthetic"))
    result = Pipeline(stages).run_one(prompt, image)
    assert result.ok, result.error
    assert result.verdict.correct is correct, result.verdict.reason


# --------------------------------------------------------------------------- batched segmenter / attribute calls


class BatchingSegmenter:
    """The synthetic segmenter with ``refine_batch``; records every batch's size and fails a batch that holds
    an image with the ``POISON`` pixel (so a failing image sits inside a batched call)."""

    def __init__(self):
        self.inner = SyntheticSegmenter()
        self.info = self.inner.info
        self.batches: list[int] = []

    def refine(self, image, boxes, reference_masks):
        raise AssertionError("the pipeline must use refine_batch")

    def refine_batch(self, items):
        self.batches.append(len(items))
        if any(_poisoned(image) for image, _, _ in items):
            raise RuntimeError("poisoned image")
        return [self.inner.refine(*item) for item in items]


class BatchingScorer:
    """The synthetic attribute scorer with ``score_batch``, recording batch sizes, failing on ``POISON``."""

    def __init__(self):
        self.inner = SyntheticAttributeScorer()
        self.info = self.inner.info
        self.batches: list[int] = []

    def score(self, image, masks, class_names, answers):
        raise AssertionError("the pipeline must use score_batch")

    def score_batch(self, items):
        self.batches.append(len(items))
        if any(_poisoned(image) for image, *_ in items):
            raise RuntimeError("poisoned image")
        return [self.inner.score(*item) for item in items]


POISON = (1, 2, 3)  # one corner pixel of this colour: no class colour, invisible to the synthetic detector


def _poisoned(image):
    return tuple(int(v) for v in image[0, 0]) == POISON


def _poison(image):
    out = image.copy()
    out[0, 0] = POISON
    return out


def _all_category_batch():
    prompts, images = [], []
    for category, statements, image, _ in ALL_CATEGORIES:
        include = ["cup"] if category in {"color", "material"} else ["cup", "dog"]
        prompts.append(_prompt(f"p{len(prompts)}", category, include, statements))
        images.append(image)
    prompts.append(_prompt("m", "material", ["cat"], _attr("wooden")))  # undetected: nothing to refine / score
    images.append(SCENE)
    return prompts, images


def _json(results):
    return [r.verdict.to_json() if r.ok else r.error for r in results]


def test_batched_segmenter_and_scorer_calls_give_the_per_image_verdicts():
    prompts, images = _all_category_batch()
    per_image = _stages()  # Counting wrappers: refine / score only, so the pipeline falls back to one call each
    alone = Pipeline(per_image).run(prompts, images)
    batched = Stages(SyntheticDetector(), BatchingSegmenter(), BatchingScorer(), SyntheticDepthEstimator())
    together = Pipeline(batched).run(prompts, images)
    assert all(r.ok for r in alone)
    assert _json(together) == _json(alone)
    assert [r.verdict.correct for r in together[:-1]] == [row[3] for row in ALL_CATEGORIES]
    n_refine, n_score = per_image.segmenter.calls, per_image.attributes.calls
    assert (n_refine, n_score) == (12, 4)  # every relation prompt refines, every attribute prompt scores
    assert batched.segmenter.batches == [n_refine] and batched.attributes.batches == [n_score]  # one call each
    for a, b in zip(alone, together, strict=True):
        ra, rb = a.perception.refined, b.perception.refined
        assert (ra is None) == (rb is None)
        if ra is not None:
            assert ra.masks.keys() == rb.masks.keys()
            for k in ra.masks:
                np.testing.assert_array_equal(ra.masks[k], rb.masks[k])
    # one image per run: the same verdicts again
    assert _json([Pipeline(batched).run_one(p, im) for p, im in zip(prompts, images, strict=True)]) == _json(alone)


@pytest.mark.parametrize("stage", ["segmenter", "attributes"])
def test_a_failing_image_inside_a_batched_call_fails_alone(stage):
    prompts, images = _all_category_batch()
    # poison the second image that needs this stage (color/material prompts score, the relations refine)
    needs = [i for i, p in enumerate(prompts) if (p.category.value in {"color", "material"}) == (stage == "attributes")]
    bad = needs[1]
    images = [_poison(im) if i == bad else im for i, im in enumerate(images)]
    reference = _stages()
    expected = _json(Pipeline(reference).run(prompts, images))  # per image: the poison does not matter
    n = getattr(reference, stage).calls  # images asked of this stage
    batched = Stages(SyntheticDetector(), BatchingSegmenter(), BatchingScorer(), SyntheticDepthEstimator())
    results = Pipeline(batched).run(prompts, images)
    assert [r.ok for r in results] == [i != bad for i in range(len(prompts))]
    assert results[bad].error == f"{stage}: RuntimeError: poisoned image"
    assert results[bad].failure.kind == "stage_error"
    assert [v for i, v in enumerate(_json(results)) if i != bad] == [v for i, v in enumerate(expected) if i != bad]
    asked = getattr(batched, stage).batches
    assert asked[0] == n and asked[1:] == [1] * n  # the whole batch failed, then one call per image
    other = batched.attributes if stage == "segmenter" else batched.segmenter
    assert len(other.batches) == 1  # the other stage's batch is unaffected


class Preparing:
    """A backend that prepares its inputs (``PreparesInputs``) around a synthetic one: ``prepare`` checks the
    request and records its thread (failing on a ``POISON`` image), ``run_prepared`` records its thread and
    answers with the synthetic backend's ordinary method. Its own ordinary method is ``run_prepared`` of
    ``prepare``, as the protocol asks."""

    def __init__(self, inner, method, *, poison=False):
        self.inner, self.method, self.poison = inner, method, poison
        self.info = inner.info
        self.prepared_on: list[str] = []
        self.run_on: list[str] = []
        if method in {"detect", "disparity"}:
            setattr(self, method, lambda images, **kw: self.run_prepared([self.prepare(im) for im in images], **kw))
        else:
            setattr(self, method, lambda *request: self.run_prepared([self.prepare(request)])[0])

    def prepare(self, request):
        import threading

        self.prepared_on.append(threading.current_thread().name)
        image = request if self.method in {"detect", "disparity"} else request[0]
        if self.poison and _poisoned(image):
            raise RuntimeError("poisoned image")
        return ("prepared", request)

    def run_prepared(self, prepared, **options):
        import threading

        self.run_on.append(threading.current_thread().name)
        assert all(tag == "prepared" for tag, _ in prepared)
        requests = [r for _, r in prepared]
        if self.method in {"detect", "disparity"}:
            return list(getattr(self.inner, self.method)(requests, **options))
        return [getattr(self.inner, self.method)(*r) for r in requests]


def _preparing(poison=()):
    return Stages(
        Preparing(SyntheticDetector(), "detect", poison="detector" in poison),
        Preparing(SyntheticSegmenter(), "refine", poison="segmenter" in poison),
        Preparing(SyntheticAttributeScorer(), "score", poison="attributes" in poison),
        Preparing(SyntheticDepthEstimator(), "disparity", poison="depth" in poison),
    )


def test_backends_that_prepare_their_inputs_have_it_done_on_the_worker_side():
    """The detector's preprocessing where the image is prepared (``prepare_image``), the other stages' in
    ``plan``, both on a worker thread; the thread that runs the models calls ``run_prepared`` only, once per
    stage for the batch; verdicts as with the ordinary per-image calls."""
    from concurrent.futures import ThreadPoolExecutor

    from negt2i.stages.base import PreparesInputs

    prompts, images = _all_category_batch()
    expected = _json(Pipeline(_stages()).run(prompts, images))
    stages = _preparing()
    assert all(isinstance(getattr(stages, s), PreparesInputs) for s in ("detector", "segmenter", "attributes", "depth"))
    pipeline = Pipeline(stages)
    with ThreadPoolExecutor(1, thread_name_prefix="worker") as pool:
        prepared = list(pool.map(pipeline.prepare_image, images))
        perceived = pipeline.detect(prompts, images, prepared)
        pool.submit(pipeline.plan, perceived).result()
        pipeline.answer(perceived)
        results = list(pool.map(lambda i: pipeline.judge(perceived, i), range(len(prompts))))
    assert _json(results) == expected
    objs = [stages.detector, stages.segmenter, stages.attributes, stages.depth]
    assert [len(o.prepared_on) for o in objs] == [len(images), 12, 4, 3]
    assert all(name.startswith("worker") for o in objs for name in o.prepared_on)
    assert [o.run_on for o in objs] == [["MainThread"]] * 4
    # without prepared inputs (e.g. Pipeline.run): prepared in the call, same verdicts
    assert _json(Pipeline(_preparing()).run(prompts, images)) == expected


@pytest.mark.parametrize("stage", ["detector", "segmenter", "attributes", "depth"])
def test_a_failing_prepare_fails_its_image_alone(stage):
    prompts, images = _all_category_batch()
    needs = {
        "detector": list(range(len(prompts))),
        "segmenter": [i for i, p in enumerate(prompts) if p.category.value not in {"color", "material"}],
        "attributes": [i for i, p in enumerate(prompts) if p.category.value in {"color", "material"}],
        "depth": [i for i, p in enumerate(prompts) if p.category.value == "depth"],
    }[stage]
    bad = needs[1]
    images = [_poison(im) if i == bad else im for i, im in enumerate(images)]
    expected = _json(Pipeline(_stages()).run(prompts, images))
    pipeline = Pipeline(_preparing(poison={stage}))
    perceived = pipeline.detect(prompts, images, [pipeline.prepare_image(im) for im in images])
    pipeline.plan(perceived)
    pipeline.answer(perceived)
    results = [pipeline.judge(perceived, i) for i in range(len(prompts))]
    assert [r.ok for r in results] == [i != bad for i in range(len(prompts))]
    assert results[bad].error == f"{stage}: RuntimeError: poisoned image"
    assert [v for i, v in enumerate(_json(results)) if i != bad] == [v for i, v in enumerate(expected) if i != bad]


def test_evaluate_prepares_on_worker_threads_with_the_same_results_file(tmp_path):
    from negt2i.evaluate import evaluate
    from negt2i.run.jobs import discover
    from negt2i.stages.demo_data import write_demo

    write_demo(tmp_path / "images", prompts=8, samples=2, seed=1, size=96)
    jobs = discover(tmp_path / "images")
    evaluate(jobs, tmp_path / "plain.jsonl", Stages.create(dict.fromkeys(("detector", "segmenter", "attributes",
             "depth"), "synthetic")), batch_size=4, workers=0, progress=False)  # fmt: skip
    stages = _preparing()
    evaluate(jobs, tmp_path / "prepared.jsonl", stages, batch_size=4, workers=2, progress=False)
    ours = (tmp_path / "prepared.jsonl").read_bytes()
    assert ours == (tmp_path / "plain.jsonl").read_bytes() and len(ours.splitlines()) == len(jobs)
    objs = [stages.detector, stages.segmenter, stages.attributes, stages.depth]
    assert all(o.prepared_on for o in objs)
    assert all(name.startswith("negt2i-worker") for o in objs for name in o.prepared_on)
    assert all(name == "MainThread" for o in objs for name in o.run_on)
