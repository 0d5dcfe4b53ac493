"""Size limits of prompt metadata (``negt2i.core.spec``), of the wire's ``extra_json`` and of stage items
(``negt2i.wire.limits``); the RLE decoder's input checks; no symlinks out of an image folder."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from negt2i.core import rle, spec
from negt2i.core.spec import SpecError, parse_prompt
from negt2i.run.jobs import geneval_jobs
from negt2i.stages.synthetic import SceneObject, render_scene
from negt2i.wire import adapter
from negt2i.wire.limits import ItemLimits
from negt2i.wire.v1 import common_pb2, evaluator_pb2

BASE = {
    "id": "p",
    "category": "directional",
    "prompt": "a dog left of a horse",
    "include": [{"class": "dog"}, {"class": "horse"}],
    "statements": [{"kind": "relation", "subject": 0, "target": 1, "predicate": "left of", "polarity": "positive"}],
}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"statements": [BASE["statements"][0]] * (spec.MAX_STATEMENTS + 1)}, "statements"),
        ({"statements": [BASE["statements"][0]] * 25_280}, "statements"),
        ({"include": [{"class": "dog"}] * (spec.MAX_OBJECTS + 1), "statements": []}, "include"),
        ({"prompt": "a" * (spec.MAX_TEXT_CHARS + 1)}, "prompt"),
        ({"id": "i" * (spec.MAX_TEXT_CHARS + 1)}, "id"),
        ({"include": [{"class": "d" * 5000}, {"class": "horse"}]}, "include[0].class"),
        ({"note": json.loads("[" * 20 + "]" * 20)}, "extra"),
        ({"note": "x" * (spec.MAX_EXTRA_BYTES + 1)}, "extra"),
    ],
)
def test_prompt_limits(change: dict, field: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_prompt({**BASE, **change})
    assert info.value.field == field


def test_duplicate_statements_are_found_in_linear_time() -> None:
    st = BASE["statements"][0]
    with pytest.raises(SpecError, match="twice") as info:
        parse_prompt({**BASE, "statements": [st, {**st, "polarity": "negated"}]})
    assert info.value.field == "statements[1]"
    # at the limit, distinct statements: accepted
    objs = [{"class": c} for c in ("dog", "horse", "cat", "cup", "bench", "car", "bowl", "vase", "clock")]
    many = [{"kind": "relation", "subject": i, "target": j, "predicate": p, "polarity": "positive"}
            for i in range(9) for j in range(9) if i != j for p in ("left of",)][: spec.MAX_STATEMENTS]  # fmt: skip
    assert len(parse_prompt({**BASE, "include": objs, "statements": many}).statements) == spec.MAX_STATEMENTS


def test_extra_json_depth_and_size_on_the_wire() -> None:
    msg = adapter.prompt_to_proto(parse_prompt(BASE))
    msg.extra_json = '{"a":' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(adapter.WireError) as info:
        adapter.prompt_from_proto(msg)  # RecursionError inside json: a client mistake, not a crash
    assert info.value.field == "prompt.extra_json"
    msg.extra_json = '{"a":' + "[" * 30 + "]" * 30 + "}"
    with pytest.raises(adapter.WireError, match="deeper") as info:
        adapter.prompt_from_proto(msg)
    assert info.value.field == "prompt.extra_json"
    msg.extra_json = json.dumps({"a": "x" * 70_000})
    with pytest.raises(adapter.WireError, match="limit"):
        adapter.prompt_from_proto(msg)
    msg.extra_json = '{"note": [1, {"b": 2}]}'
    assert adapter.prompt_from_proto(msg).extra == {"note": [1, {"b": 2}]}
    too_many = evaluator_pb2.PromptSpec(id="x", prompt="x")
    too_many.statements.extend([evaluator_pb2.Statement()] * (spec.MAX_STATEMENTS + 1))
    with pytest.raises(adapter.WireError, match="statements"):
        adapter.prompt_from_proto(too_many)


def _mask(hw: tuple[int, int] = (64, 64)) -> common_pb2.Mask:
    m = np.zeros(hw, bool)
    m[4:20, 4:30] = True
    return adapter.mask_to_proto(m)


def test_item_limits() -> None:
    limits = ItemLimits(max_masks_per_item=3, max_mask_pixels=3 * 64 * 64, max_answers=2, max_text_chars=8)
    limits.check_masks([_mask()] * 3, (64, 64), "masks")
    with pytest.raises(adapter.WireError, match="above the limit of 3"):
        limits.check_masks([_mask()] * 4, (64, 64), "masks")
    with pytest.raises(adapter.WireError, match="mask pixels"):
        ItemLimits(max_mask_pixels=100).check_masks([_mask()], (64, 64), "masks")
    long = common_pb2.Mask(height=64, width=64, counts="1" * (rle.max_compressed_chars(64, 64) + 1))
    with pytest.raises(adapter.WireError, match="RLE string") as info:
        limits.check_masks([long], (64, 64), "masks")
    assert info.value.field == "masks[0].counts"
    limits.check_boxes([common_pb2.Box(x0=0, y0=0, x1=5, y1=5)])
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(adapter.WireError, match="finite") as info:
            limits.check_boxes([common_pb2.Box(x0=bad, y0=0, x1=5, y1=5)])
        assert info.value.field == "boxes[0]"
    with pytest.raises(adapter.WireError, match="x0 <= x1"):
        limits.check_boxes([common_pb2.Box(x0=9, y0=0, x1=5, y1=5)])
    with pytest.raises(adapter.WireError, match="values"):
        limits.check_texts(["a", "b", "c"], "answers", most=2)
    with pytest.raises(adapter.WireError) as info:
        limits.check_texts(["red", "x" * 9], "answers", most=2)
    assert info.value.field == "answers[1]"
    ItemLimits.check_depth_encoding(common_pb2.DEPTH_ENCODING_FLOAT32)
    with pytest.raises(adapter.WireError, match="unknown depth encoding 99"):
        ItemLimits.check_depth_encoding(99)
    env = ItemLimits.from_env({"NEGT2I_MAX_MASKS": "5", "NEGT2I_BODY_TIMEOUT_S": "2.5"})
    assert env.max_masks_per_item == 5 and env.body_timeout_s == 2.5


@pytest.mark.parametrize(
    ("counts", "match"),
    [("0P", "truncated"), ("~~", "outside"), ("\u00e9", "ASCII"), ("05", "cover"), ("o" * 13 + "0", "more than")],
)
def test_rle_decoder_rejects_bad_strings(counts: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        rle.decode({"size": [8, 8], "counts": counts})


def test_rle_length_is_checked_before_decoding() -> None:
    with pytest.raises(ValueError, match="too long"):
        rle.decode({"size": [4, 4], "counts": "1" * 100})


def test_symlinks_out_of_the_image_folder_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "samples").mkdir(parents=True)
    png = adapter.encode_png(render_scene([SceneObject("dog", (2, 2, 20, 20))], (32, 32)))
    (outside / "samples" / "0000.png").write_bytes(png)
    (outside / "metadata.jsonl").write_text(json.dumps({**BASE, "id": "secret"}) + "\n")
    root = tmp_path / "images"
    inside = root / "00000"
    (inside / "samples").mkdir(parents=True)
    (inside / "samples" / "0000.png").write_bytes(png)
    (inside / "samples" / "0001.png").symlink_to(outside / "samples" / "0000.png")  # a file out of the root
    (inside / "samples" / "0002.png").symlink_to(inside / "samples" / "0000.png")  # a link inside: fine
    (inside / "metadata.jsonl").symlink_to(outside / "metadata.jsonl")
    (root / "00001").symlink_to(outside)  # a whole prompt folder out of the root
    warnings: list[str] = []
    jobs = geneval_jobs(root, warn=warnings.append)
    assert [j.filename for j in jobs] == ["00000/samples/0000.png", "00000/samples/0002.png"]
    assert all(j.prompt is None and j.error and "link out" in j.error.message for j in jobs)
    assert all(j.error is not None and j.error.kind == "missing_metadata" for j in jobs)
    assert len(warnings) == 2 and all("link" in w for w in warnings)


def test_an_image_less_tree_is_said_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """What an interrupted generate leaves (prompt folders, no images): one error line, not one per folder;
    a tree with some images: one warning line naming how many folders are empty."""
    from negt2i.cli import main

    root = tmp_path / "gen"
    for i in range(300):
        (root / f"{i:05d}").mkdir(parents=True)
        (root / f"{i:05d}" / "metadata.jsonl").write_text("{}\n")
    assert main(["evaluate", str(root), "--out", str(tmp_path / "r.jsonl"), "--backend", "synthetic"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "none of its 300 prompt folders has images under samples/" in err
    assert not (tmp_path / "r.jsonl").exists()
    (tmp_path / "empty").mkdir()
    assert main(["evaluate", str(tmp_path / "empty"), "--out", str(tmp_path / "r.jsonl")]) == 2
    assert "no prompt folders" in capsys.readouterr().err
    (root / "00007" / "samples").mkdir()
    (root / "00007" / "samples" / "0000.png").write_bytes(b"not a png")
    warnings: list[str] = []
    jobs = geneval_jobs(root, warn=warnings.append)
    assert [j.filename for j in jobs] == ["00007/samples/0000.png"]
    assert warnings == [f"{root}: 299 of 300 prompt folders have no images under samples/ (00000, 00001, 00002 ...)"]
