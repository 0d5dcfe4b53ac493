"""negt2i.reward in-process (RewardJudge): the verdicts' scores, in input order, for every input form; explicit
failures, never a default reward; the real loading path's one message on missing weights."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

from negt2i.core.spec import parse_prompt
from negt2i.pipeline import Pipeline, Stages
from negt2i.reward import RewardDetails, RewardError, RewardFailure, RewardJudge, image_array, resolve_prompt
from negt2i.stages.demo_data import demo_entries
from negt2i.wire import adapter

SYNTH = dict.fromkeys(("detector", "segmenter", "attributes", "depth"), "synthetic")


@pytest.fixture(scope="module")
def batch() -> tuple[list[dict], list[np.ndarray]]:
    records, images = [], []
    for record, imgs in demo_entries(prompts=12, samples=2, seed=3, size=96):
        for img in imgs:
            records.append(record)
            images.append(img)
    return records, images


@pytest.fixture(scope="module")
def judge() -> RewardJudge:
    return RewardJudge("cpu", backends=SYNTH, batch_size=5)


def test_scores_are_the_verdicts_scores_in_input_order(judge: RewardJudge, batch) -> None:
    records, images = batch
    want = [r.verdict.score for r in Pipeline(Stages.create(SYNTH)).run([parse_prompt(x) for x in records], images)]
    order = list(reversed(range(len(images))))  # a different order gives the same rewards, permuted
    got = judge.score([images[i] for i in order], [records[i] for i in order])
    assert got == [want[i] for i in order] and all(isinstance(s, float) for s in got)
    assert 0 < sum(s == 1.0 for s in got) < len(got) and any(0 < s < 1 for s in got)  # partial credit exists


def test_every_input_form_gives_the_same_reward(judge: RewardJudge, batch, tmp_path: Path) -> None:
    records, images = batch
    record, image = records[0], images[0]
    prompt = parse_prompt(record)
    png = adapter.encode_png(image)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps(record) + "\n")
    by_id = RewardJudge("cpu", backends=SYNTH, corpus=corpus)
    forms = [
        judge.score([image], [prompt]),
        judge.score([png], [record]),  # encoded bytes, a corpus record
        judge.score([PILImage.open(io.BytesIO(png))], [adapter.prompt_to_proto(prompt)]),  # PIL, PromptSpec
        by_id.score([image], [prompt.id]),  # an id from the judge's corpus
    ]
    assert all(f == forms[0] for f in forms)


def test_details_list_every_element(judge: RewardJudge, batch) -> None:
    records, images = batch
    [d] = judge.score(images[:1], records[:1], details=True)
    assert isinstance(d, RewardDetails) and d.score == d.verdict.score and d.correct == d.verdict.correct
    assert len(d.elements) == len(d.verdict.objects) + len(d.verdict.statements)
    assert d.score == pytest.approx(sum(d.elements.values()) / len(d.elements))


def test_a_failed_image_is_never_a_default_reward(judge: RewardJudge, batch) -> None:
    records, images = batch
    bad = [images[0], b"not an image", images[1], np.zeros((4, 4), np.float32)]
    prompts = [records[0], records[1], records[1], records[0]]
    with pytest.raises(RewardError, match=r"2 of 4 images got no reward: image 1: INVALID_ARGUMENT") as err:
        judge.score(bad, prompts)
    assert [f.index for f in err.value.failures] == [1, 3]
    assert isinstance(err.value.results[0], float) and isinstance(err.value.results[1], RewardFailure)
    got = judge.score(bad, prompts, on_error="return")
    assert isinstance(got[1], RewardFailure) and "not a PNG, JPEG or WebP image" in got[1].message
    assert isinstance(got[3], RewardFailure) and "uint8" in got[3].message
    assert got[0] == judge.score(images[:1], records[:1])[0]
    unknown = judge.score(images[:1], ["no-such-id"], on_error="return")[0]
    assert isinstance(unknown, RewardFailure) and "unknown prompt id 'no-such-id'" in unknown.message


def test_bad_calls_are_refused(judge: RewardJudge, batch) -> None:
    records, images = batch
    with pytest.raises(ValueError, match="2 images but 1 prompts"):
        judge.score(images[:2], records[:1])
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'return'"):
        judge.score(images[:1], records[:1], on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        RewardJudge("cpu", backends=SYNTH, dtype="fp8")
    with pytest.raises(ValueError, match="must be PIL, a numpy array or encoded bytes"):
        image_array("x.png")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="invalid prompt record"):
        resolve_prompt({"prompt": "a cup", "include": [{"class": "unicorn"}]})


def test_the_paper_models_need_their_weights(tmp_path: Path) -> None:
    from negt2i.weights import WeightsMissingError

    with pytest.raises(WeightsMissingError, match=r"model weights missing in .*negt2i weights fetch"):
        RewardJudge("cpu", weights_dir=tmp_path)
