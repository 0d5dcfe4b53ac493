"""SigLIP 2 backend: gray-filled crops, text prompts, caching, and a tiny open_clip model built offline."""

from __future__ import annotations

import json

import numpy as np
import pytest

from negt2i.stages.common import GRAY_FILL, box_to_pixels, masked_crop
from negt2i.stages.siglip_backend import crops, text_prompt

torch = pytest.importorskip("torch")
open_clip = pytest.importorskip("open_clip")

from negt2i.stages.base import AttributeScorer, ModelInfo  # noqa: E402
from negt2i.stages.siglip_backend import SigLIPScorer  # noqa: E402

TINY = {
    # the SigLIP 2 layout (sigmoid logit bias, no causal mask, last-token pooling) at toy sizes; no
    # hf_tokenizer_name and no "siglip" in the name, so open_clip's bundled tokenizer is used (no download)
    "embed_dim": 32,
    "init_logit_bias": -10,
    "custom_text": True,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
    "text_cfg": {
        "context_length": 16,
        "vocab_size": 49408,
        "width": 32,
        "heads": 2,
        "layers": 2,
        "no_causal_mask": True,
        "proj_bias": True,
        "pool_type": "last",
    },
}


def test_masked_crop_fills_outside_the_mask_with_gray():
    image = np.arange(6 * 8 * 3, dtype=np.uint8).reshape(6, 8, 3)
    mask = np.zeros((6, 8), bool)
    mask[2, 3] = mask[3, 4] = True
    crop = masked_crop(image, (2.5, 1.2, 5.0, 4.0), mask)
    assert crop.shape == (3, 3, 3)  # rows 1..3, cols 2..4 (box edges rounded outward)
    np.testing.assert_array_equal(crop[1, 1], image[2, 3])
    np.testing.assert_array_equal(crop[2, 2], image[3, 4])
    keep = np.zeros((3, 3), bool)
    keep[1, 1] = keep[2, 2] = True
    assert (crop[~keep] == np.array(GRAY_FILL, np.uint8)).all()
    assert GRAY_FILL == (0x99, 0x99, 0x99)


def test_box_to_pixels_clips_and_never_empties():
    assert box_to_pixels((-3.0, -1.0, 100.0, 4.2), (10, 20)) == (0, 0, 20, 5)
    assert box_to_pixels((5.0, 5.0, 5.0, 5.0), (10, 20)) == (5, 5, 6, 6)
    assert box_to_pixels((19.5, 9.5, 30.0, 30.0), (10, 20)) == (19, 9, 20, 10)


def test_crops_cut_to_the_mask_box():
    image = np.full((10, 12, 3), 7, np.uint8)
    masks = np.zeros((2, 10, 12), bool)
    masks[0, 2:5, 3:9] = True
    out = crops(image, masks)  # second mask is empty: the whole image, all gray
    assert out[0].shape == (3, 6, 3) and (out[0] == 7).all()
    assert out[1].shape == (10, 12, 3) and (out[1] == 0x99).all()


def test_text_prompts():
    assert text_prompt("red", "cup") == "a photo of a red cup."
    assert text_prompt("orange", "tv remote") == "a photo of an orange tv remote."
    assert text_prompt("wooden", "chair") == "a photo of a wooden chair."


@pytest.fixture(scope="module")
def scorer(tmp_path_factory) -> SigLIPScorer:
    path = tmp_path_factory.mktemp("cfg") / "negt2i-tiny-sl2.json"
    path.write_text(json.dumps(TINY))
    open_clip.add_model_config(path)
    torch.manual_seed(0)
    model, _, preprocess = open_clip.create_model_and_transforms("negt2i-tiny-sl2", pretrained=None)
    tokenizer = open_clip.get_tokenizer("negt2i-tiny-sl2")
    info = ModelInfo(stage="attributes", backend="siglip2-so400m-378", model="tiny-random")
    return SigLIPScorer(model, preprocess, tokenizer, info, batch_size=2)


def test_scores_are_100_cosine_of_gray_filled_crops(scorer):
    from PIL import Image

    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
    masks = np.zeros((3, 48, 64), bool)
    masks[0, 5:20, 5:30] = True
    masks[1, 20:40, 30:60] = True
    masks[2, 0:48, 0:10] = True
    answers = ("red", "blue", "gray")
    assert isinstance(scorer, AttributeScorer)
    scores = scorer.score(image, masks, ["cup", "cup", "bowl"], answers)
    assert scores.shape == (3, 3) and scores.dtype == np.float32
    assert (np.abs(scores) <= 100.0 + 1e-3).all()
    with torch.inference_mode():
        for k, (crop, name) in enumerate(zip(crops(image, masks), ["cup", "cup", "bowl"], strict=True)):
            img = scorer.model.encode_image(scorer.preprocess(Image.fromarray(crop))[None])
            txt = scorer.model.encode_text(scorer.tokenizer([text_prompt(a, name) for a in answers]))
            cos = torch.nn.functional.cosine_similarity(img, txt)
            np.testing.assert_allclose(scores[k], 100 * cos.numpy(), rtol=1e-4, atol=1e-3)


def test_text_embeddings_are_cached_per_class(scorer):
    calls = []
    real = scorer.tokenizer
    scorer.tokenizer = lambda texts: calls.append(list(texts)) or real(texts)
    try:
        image = np.zeros((16, 16, 3), np.uint8)
        masks = np.ones((2, 16, 16), bool)
        scorer.score(image, masks, ["vase", "vase"], ("glass", "metal"))
        scorer.score(image, masks, ["vase", "vase"], ("glass", "metal"))
    finally:
        scorer.tokenizer = real
    assert calls == [["a photo of a glass vase.", "a photo of a metal vase."]]


def test_no_instances(scorer):
    out = scorer.score(np.zeros((8, 8, 3), np.uint8), np.zeros((0, 8, 8), bool), [], ("red",))
    assert out.shape == (0, 1)


def test_score_batch_scores_crops_of_many_images_together(scorer):
    """Crops of several images share forward passes (batch_size 2 here: passes mix images), with every
    image's scores as when it is scored alone."""
    rng = np.random.default_rng(3)
    items = []
    for hw, n in (((48, 64), 3), ((32, 32), 0), ((40, 56), 2)):
        image = rng.integers(0, 255, (*hw, 3), dtype=np.uint8)
        masks = rng.random((n, *hw)) < 0.3
        items.append((image, masks, ["cup", "bowl", "cup"][:n], ("red", "blue")))
    calls = []
    real = scorer.model.encode_image
    scorer.model.encode_image = lambda batch: calls.append(len(batch)) or real(batch)
    try:
        batched = scorer.score_batch(items)
    finally:
        scorer.model.encode_image = real
    assert calls == [2, 2, 1]  # 5 crops from two images, 2 per forward pass
    for (image, masks, names, answers), out in zip(items, batched, strict=True):
        assert out.shape == (len(names), 2)
        np.testing.assert_allclose(out, scorer.score(image, masks, names, answers), rtol=1e-5, atol=1e-4)


class PerImage:
    """An attribute scorer with only the per-image method: the pipeline calls it once per image."""

    def __init__(self, inner):
        self.inner, self.info = inner, inner.info

    def score(self, image, masks, class_names, answers):
        return self.inner.score(image, masks, class_names, answers)


def test_pipeline_scores_crops_of_all_images_in_one_call(scorer):
    """The pipeline hands every image's instances to ``score_batch`` in one call; the verdicts equal those of
    one ``score`` per image and the scores agree to float32 round-off (forward passes mix images)."""
    from negt2i.core.spec import parse_prompt
    from negt2i.pipeline import Pipeline, Stages
    from negt2i.stages.synthetic import SceneObject, SyntheticDetector, render_scene

    def prompt(category, value, polarity):
        statement = {"kind": "attribute", "object": 0, "value": value, "polarity": polarity}
        return parse_prompt({"id": value, "category": category, "prompt": value, "include": [{"class": "cup"}],
                             "statements": [statement]})  # fmt: skip

    def image(value):
        return render_scene([SceneObject("cup", (4, 4, 30, 30), value=value)], (48, 48))

    prompts = [prompt("color", "red", "positive"), prompt("color", "blue", "negated"),
               prompt("material", "wooden", "positive"), prompt("color", "green", "positive"),
               prompt("material", "metal", "negated")]  # fmt: skip
    images = [image("red"), image("green"), image("wooden"), image("blue"), image("metal")]
    calls = []
    real = scorer.model.encode_image
    scorer.model.encode_image = lambda batch: calls.append(len(batch)) or real(batch)
    try:
        together = Pipeline(Stages(SyntheticDetector(), attributes=scorer)).run(prompts, images)
    finally:
        scorer.model.encode_image = real
    assert calls == [2, 2, 1]  # one instance in each of five images, batch_size 2: passes mix images
    alone = Pipeline(Stages(SyntheticDetector(), attributes=PerImage(scorer))).run(prompts, images)
    assert all(r.ok for r in together), [r.error for r in together]
    assert [r.verdict.correct for r in together] == [r.verdict.correct for r in alone]
    assert [[s.cause for s in r.verdict.statements] for r in together] == [
        [s.cause for s in r.verdict.statements] for r in alone
    ]
    for a, b in zip(alone, together, strict=True):
        sa, sb = a.perception.attributes.scores, b.perception.attributes.scores
        assert sa.keys() == sb.keys()
        for k in sa:
            np.testing.assert_allclose(list(sb[k].values()), list(sa[k].values()), rtol=1e-5, atol=1e-4)


def test_the_attributes_stage_handler_scores_merged_items_in_one_batch_call(scorer):
    """The attributes service's handler runs the items of merged requests through ``score_batch`` (crops of
    several images per forward pass), with every item's scores as when it is sent alone."""
    from negt2i.wire import adapter
    from negt2i.wire.stage_handlers import StageHandler, StageSettings

    handler = StageHandler(StageSettings.from_env("attributes", {}), backend=scorer)
    rng = np.random.default_rng(5)
    items = []
    for hw, n in (((48, 64), 3), ((40, 56), 2)):
        image = rng.integers(0, 255, (*hw, 3), dtype=np.uint8)
        masks = rng.random((n, *hw)) < 0.3
        items.append(adapter.attributes_item(adapter.encode_png(image), masks, ["cup", "bowl", "cup"][:n], ["red"]))
    calls = []
    real = scorer.model.encode_image
    scorer.model.encode_image = lambda batch: calls.append(len(batch)) or real(batch)
    try:
        merged = handler.handle_messages(items)
    finally:
        scorer.model.encode_image = real
    assert calls == [2, 2, 1]  # one score_batch call: 5 crops of two items, 2 per forward pass
    for item, got in zip(items, merged, strict=True):
        alone = handler.handle_messages([item])[0]
        assert not got.HasField("error") and len(got.instances) == len(item.masks)
        for a, b in zip(got.instances, alone.instances, strict=True):
            np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-4)


def test_prepared_crops_are_the_previous_in_call_tensors_and_scores(scorer):
    """``prepare`` (one request, off the model thread) gives exactly the crop tensors the evaluation transform
    made inside the previous ``score_batch`` call, and the scores from them are the same bit for bit."""
    import torch.nn.functional as F
    from PIL import Image as PILImage

    rng = np.random.default_rng(4)
    items = []
    for hw, k in (((40, 48), 2), ((36, 30), 1), ((20, 20), 0)):
        image = rng.integers(0, 255, (*hw, 3), dtype=np.uint8)
        masks = np.zeros((k, *hw), bool)
        for j in range(k):
            masks[j, 2 + 3 * j : 18 + 2 * j, 4 : 15 + 4 * j] = True
        items.append((image, masks, ["cup", "dog"][:k], ["red", "blue", "green"]))
    prepared = [scorer.prepare(item) for item in items]
    previous = [scorer.preprocess(PILImage.fromarray(c)) for image, masks, _, _ in items for c in crops(image, masks)]
    ours = [x for p in prepared for x in p.pixels]
    assert len(ours) == len(previous) == 3
    assert all(torch.equal(a, b) for a, b in zip(ours, previous, strict=True))
    got = scorer.run_prepared(prepared)
    with torch.inference_mode():  # the previous call's arithmetic: batches of batch_size crops across images
        feats = torch.cat([F.normalize(scorer.model.encode_image(torch.stack(previous[s : s + 2])).float(), dim=-1)
                           for s in range(0, 3, 2)])  # fmt: skip
    owners = [(0, 0), (0, 1), (1, 0)]
    for j, (i, k) in enumerate(owners):
        text = scorer.text_embeddings(items[i][2][k], items[i][3])
        np.testing.assert_array_equal(got[i][k], (100.0 * feats[j] @ text.T).cpu().numpy())
    assert got[2].shape == (0, 3)
    with pytest.raises(ValueError, match="masks have shape"):
        scorer.prepare((items[0][0], items[0][1][:1], ["cup", "dog"], ["red"]))


def test_geneval_template_ensemble_averages_normalised_prompt_embeddings(scorer):
    """``attributes.text_templates = geneval``: a colour's text embedding is the mean of its three GenEval
    prompts' normalised embeddings, normalised again (clip_benchmark's zero_shot_classifier); a material keeps
    the single template; the default set is unchanged; embeddings are cached per template set."""
    import torch.nn.functional as F

    from negt2i.core.config import CURRENT, AttributeConfig, RuleConfig
    from negt2i.stages.siglip_backend import text_prompts

    assert text_prompts("orange", "cup", "geneval") == [
        "a photo of a orange cup", "a photo of a orange-colored cup", "a photo of a orange object"]  # fmt: skip
    assert text_prompts("wooden", "chair", "geneval") == ["a photo of a wooden chair."]
    assert text_prompts("orange", "cup") == ["a photo of an orange cup."]
    single = scorer.text_embeddings("cup", ["red", "wooden"])
    ensemble_config = RuleConfig(name="t", attributes=AttributeConfig(text_templates="geneval"))
    scorer.config = ensemble_config
    try:
        ens = scorer.text_embeddings("cup", ["red", "wooden"])
        rng = np.random.default_rng(5)
        image = rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)
        masks = np.ones((1, 24, 24), bool)
        ens_scores = scorer.score(image, masks, ["cup"], ["red", "wooden"])
    finally:
        scorer.config = CURRENT
    with torch.inference_mode():
        each = F.normalize(scorer.model.encode_text(scorer.tokenizer(text_prompts("red", "cup", "geneval"))).float(),
                           dim=-1)  # fmt: skip
        red = F.normalize(each.mean(dim=0), dim=-1)
        wooden = F.normalize(scorer.model.encode_text(scorer.tokenizer(["a photo of a wooden cup."])).float(), dim=-1)
    torch.testing.assert_close(ens[0], red, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ens[1], wooden[0], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ens[0], single[0])
    assert torch.equal(scorer.text_embeddings("cup", ["red", "wooden"]), single)  # default: cached, unchanged
    assert ens_scores.shape == (1, 2)
    assert not np.allclose(ens_scores, scorer.score(image, masks, ["cup"], ["red", "wooden"]))
