"""The bad-input catalogue: every kind of malformed or abusive input the orchestrator's gRPC API and the
stage services' HTTP API get, with the status each must answer (``docs/stage-contract.md``,
``docs/services.md``). Pure data: ``test_catalogue.py`` sends each entry to real processes.

gRPC entries: ``request`` is an ``EvaluateRequest`` in the proto3 JSON mapping (``$name`` strings are
replaced by the images below, ``{"$str": [c, n]}`` by ``c * n``, ``{"$list": [x, n]}`` by ``[x] * n``,
``{"$nest": n}`` by a JSON text nested ``n`` deep), or ``raw`` bytes sent as the message; ``expect`` is the
status code, ``field`` a text the status details must contain.

HTTP entries: ``stage`` and one ``item`` (proto3 JSON of the stage's item message) posted as
``{"items": [item]}``, or a ``body`` sent as is; ``http`` is the expected HTTP status and ``item`` the
expected per-item ``error.status`` (None: the item must succeed), ``field`` a text of the error's field or
message.
"""

from __future__ import annotations

from typing import Any

GOOD_PROMPT: dict[str, Any] = {
    "id": "depth-x",
    "prompt": "a photo of a dog not behind a horse",
    "category": "CATEGORY_DEPTH",
    "objects": [{"class_name": "dog", "count": 1}, {"class_name": "horse", "count": 1}],
    "statements": [{"polarity": "POLARITY_NEGATED", "relation": {"subject": 0, "target": 1, "predicate": "behind"}}],
}
COLOR_PROMPT: dict[str, Any] = {
    "id": "color-x",
    "prompt": "a photo of a non-red cup",
    "category": "CATEGORY_COLOR",
    "objects": [{"class_name": "cup", "count": 1}],
    "statements": [{"polarity": "POLARITY_NEGATED", "attribute": {"object": 0, "value": "red"}}],
}


DOG, HORSE = {"class_name": "dog", "count": 1}, {"class_name": "horse", "count": 1}


def _p(**changes: Any) -> dict[str, Any]:
    """The good prompt with top-level fields changed (None removes one)."""
    out = {**GOOD_PROMPT, **changes}
    return {k: v for k, v in out.items() if v is not None}


def _st(polarity: Any = "POLARITY_NEGATED", **relation: Any) -> dict[str, Any]:
    rel = {"subject": 0, "target": 1, "predicate": "behind", **relation}
    return {"polarity": polarity, "relation": rel}


def _g(kind: str, prompt: Any = None, *, expect: str = "INVALID_ARGUMENT", field: str = "",
       image: str = "$png", **request: Any) -> dict[str, Any]:  # fmt: skip
    req: dict[str, Any] = {"request_id": kind, "image": {"data": image}, **request}
    if prompt is not None:
        req["prompt"] = prompt
    return {"kind": kind, "via": "grpc", "request": req, "expect": expect, "field": field}


# fmt: off
GRPC: list[dict[str, Any]] = [
    # the message itself
    {"kind": "corrupt protobuf", "via": "grpc", "raw": b"\xff\xff\xff\xff\x0f\x01", "expect": "INVALID_ARGUMENT",
     "field": "request"},
    {"kind": "invalid UTF-8 in request_id", "via": "grpc", "raw": b"\x0a\x02\xff\xfe", "expect": "INVALID_ARGUMENT",
     "field": "request"},
    {"kind": "truncated length-delimited field", "via": "grpc", "raw": b"\x22\x40\x0a", "expect": "INVALID_ARGUMENT",
     "field": "request"},
    {"kind": "unknown varint field only", "via": "grpc", "raw": b"\x78\x05", "expect": "INVALID_ARGUMENT",
     "field": "prompt_source"},
    {"kind": "invalid UTF-8 in prompt id", "via": "grpc", "raw": b"\x12\x03\x0a\x01\xc3", "expect": "INVALID_ARGUMENT",
     "field": "request"},
    {"kind": "empty message", "via": "grpc", "raw": b"", "expect": "INVALID_ARGUMENT", "field": "prompt_source"},
    _g("request_id of 300 characters", GOOD_PROMPT, request_id={"$str": ["r", 300]}, field="request_id"),
    _g("request_id with CR LF (a forged log line)", GOOD_PROMPT, request_id="a\r\n2026-01-01 INFO forged",
       field="request_id: control character U+000D"),
    _g("request_id with NUL", GOOD_PROMPT, request_id="a\x00b", field="request_id: control character U+0000"),
    _g("request_id with ESC (a terminal sequence)", GOOD_PROMPT, request_id="\x1b[31mred",
       field="request_id: control character U+001B"),
    _g("request_id with a line separator", GOOD_PROMPT, request_id="a\u2028b", field="request_id"),
    _g("message above the gRPC size limit", GOOD_PROMPT, image="$oversize_message", expect="RESOURCE_EXHAUSTED",
       field="image.data: message of"),
    # the prompt source
    _g("neither prompt nor prompt_id", None, field="prompt_source"),
    _g("unknown prompt_id", None, prompt_id="no-such-prompt", expect="NOT_FOUND", field="prompt_id"),
    _g("unknown prompt_id of 1 MiB", None, prompt_id={"$str": ["x", 1 << 20]}, expect="NOT_FOUND",
       field="prompt_id"),
    # the image
    _g("empty image", GOOD_PROMPT, image="", field="image.data"),
    _g("text instead of an image", GOOD_PROMPT, image="$text", field="image.data"),
    _g("random bytes", GOOD_PROMPT, image="$garbage", field="image.data"),
    _g("truncated PNG", GOOD_PROMPT, image="$truncated", field="image.data"),
    _g("PNG signature only", GOOD_PROMPT, image="$png_signature", field="image.data"),
    _g("truncated JPEG", GOOD_PROMPT, image="$jpeg_truncated", field="image.data"),
    _g("PNG header claiming 20000 x 20000", GOOD_PROMPT, image="$png_bomb", field="image.data"),
    _g("image above the pixel limit", GOOD_PROMPT, image="$too_many_pixels", field="image.data"),
    _g("image above the byte limit", GOOD_PROMPT, image="$too_many_bytes", field="image.data"),
    # the prompt
    _g("prompt without id", _p(id=None), field="prompt.id"),
    _g("prompt without text", _p(prompt=None), field="prompt"),
    _g("prompt without objects", _p(objects=None, statements=None), field="prompt"),
    _g("unknown class", _p(objects=[{"class_name": "unicorn", "count": 1}, HORSE]), field="objects[0]"),
    _g("class named twice", _p(objects=[DOG, DOG]), field="objects[1]"),
    _g("exclude that is not the over-count rule", _p(exclude=[{"class_name": "dog", "count": 5}]),
       field="prompt.exclude[0]"),
    _g("negative count", _p(objects=[{"class_name": "dog", "count": -3}, HORSE]), field="prompt"),
    _g("count 2 on an object a statement uses",
       _p(objects=[{"class_name": "dog", "count": 2}, HORSE]), field="count"),
    _g("unknown category value", _p(category=99), field="prompt.category"),
    _g("statements without category", _p(category=None), field="category"),
    _g("polarity unspecified", _p(statements=[_st("POLARITY_UNSPECIFIED")]), field="polarity"),
    _g("unknown polarity value", _p(statements=[_st(42)]), field="polarity"),
    _g("statement with neither kind", _p(statements=[{"polarity": "POLARITY_POSITIVE"}]), field="statements[0]"),
    _g("subject out of range", _p(statements=[_st(subject=7)]), field="statements[0]"),
    _g("target out of range", _p(statements=[_st(target=2)]), field="statements[0]"),
    _g("subject equals target", _p(statements=[_st(target=0)]), field="statements[0]"),
    _g("unknown predicate", _p(statements=[_st(predicate="inside")]), field="predicate"),
    _g("predicate of another category", _p(statements=[_st(predicate="left of")]), field="predicate"),
    _g("attribute statement in a depth prompt",
       _p(statements=[{"polarity": "POLARITY_POSITIVE", "attribute": {"object": 0, "value": "red"}}]), field="kind"),
    _g("relation statement in a color prompt", {**COLOR_PROMPT, "objects": [{"class_name": "cup", "count": 1},
       {"class_name": "dog", "count": 1}], "statements": [_st()]}, field="kind"),
    _g("unknown color value", {**COLOR_PROMPT, "statements": [{"polarity": "POLARITY_NEGATED",
       "attribute": {"object": 0, "value": "ultraviolet"}}]}, field="value"),
    _g("the same statement twice", _p(statements=[_st(), _st("POLARITY_POSITIVE")]), field="statements[1]"),
    _g("65 statements", _p(statements={"$list": [_st(), 65]}), field="statements"),
    _g("25,280 statements", _p(statements={"$list": [_st(), 25280]}), field="statements"),
    _g("17 objects", _p(objects={"$list": [{"class_name": "dog", "count": 1}, 17]}, statements=None), field="objects"),
    _g("prompt id of 5000 characters", _p(id={"$str": ["i", 5000]}), field="id"),
    _g("prompt text of 5000 characters", _p(prompt={"$str": ["a", 5000]}), field="prompt"),
    _g("tag of 5000 characters", _p(tag={"$str": ["t", 5000]}), field="tag"),
    _g("class name of 5000 characters", _p(objects=[{"class_name": {"$str": ["d", 5000]}, "count": 1},
       HORSE]), field="objects[0]"),
    _g("predicate of 5000 characters", _p(statements=[_st(predicate={"$str": ["p", 5000]})]), field="predicate"),
    _g("attribute value of 5000 characters", {**COLOR_PROMPT, "statements": [{"polarity": "POLARITY_NEGATED",
       "attribute": {"object": 0, "value": {"$str": ["v", 5000]}}}]}, field="value"),
    _g("extra_json not JSON", _p(extra_json="{not json"), field="extra_json"),
    _g("extra_json not an object", _p(extra_json="[1, 2]"), field="extra_json"),
    _g("extra_json nested 100,000 deep", _p(extra_json={"$nest": 100_000}), field="extra_json"),
    _g("extra_json nested 40 deep", _p(extra_json={"$nest": 40}), field="extra_json"),
    _g("extra_json of 100 KB", _p(extra_json={"$extra_bytes": 100_000}), field="extra_json"),
    _g("extra_json with a number of 5,000 digits", _p(extra_json='{"n": ' + "7" * 5000 + "}"),
       field="more than 4300 digits"),
    _g("extra_json restating a wrong setting", _p(extra_json='{"setting": "pos3_neg0"}'), field="setting"),
    _g("setting that disagrees with the statements", _p(setting="pos3_neg0"), field="prompt.setting"),
    _g("extra_json naming a key that has a field", _p(extra_json='{"category": "color"}'), field="extra_json"),
]
# fmt: on


def _h(kind: str, stage: str, item: Any = None, *, http: int = 200, status: int | None = 400, field: str = "",
       body: Any = None) -> dict[str, Any]:  # fmt: skip
    return {"kind": kind, "via": "http", "stage": stage, "item": item, "body": body, "http": http,
            "item_status": status, "field": field}  # fmt: skip


BOX = {"x0": 8, "y0": 8, "x1": 40, "y1": 40}
MASK = "$mask"  # a valid 64 x 64 Mask message
SEG = {"image": {"data": "$png"}, "boxes": [BOX], "reference_masks": [MASK]}
ATTR = {"image": {"data": "$png"}, "masks": [MASK], "class_names": ["cup"], "answers": ["red", "gray"]}

# fmt: off
HTTP: list[dict[str, Any]] = [
    # the request as a whole
    _h("body not JSON", "detector", body=b"{not json", http=400, status=None),
    _h("body a JSON array", "detector", body=b"[1, 2]", http=400, status=None),
    _h("items not a list", "detector", body=b'{"items": 5}', http=400, status=None),
    _h("no items key", "segmenter", body=b'{"things": []}', http=400, status=None),
    _h("body above the size limit", "depth", body="$big_body", http=413, status=None),
    _h("Content-Length not a number", "attributes", body="$bad_length", http=400, status=None),
    _h("no Content-Length", "detector", body="$no_length", http=411, status=None),
    _h("body slower than the read timeout", "segmenter", body="$slow_body", http=408, status=None),
    _h("request head never finished (closed after the header timeout)", "detector", body="$stalled_head", http=0,
       status=None),
    _h("connection that sends nothing (closed after the header timeout)", "depth", body="$silent", http=0,
       status=None),
    _h("more items than the stage's queue, JSON (413, not 503 forever)", "attributes", body="$queue_json", http=413,
       status=None),
    _h("more items than the stage's queue, binary (413, not 503 forever)", "depth", body="$queue_binary", http=413,
       status=None),
    # detector items
    _h("item not an object", "detector", 5, http=400, status=None),
    _h("unknown field", "detector", {"image": {"data": "$png"}, "colour": 1}, field="items[0]"),
    _h("image not base64 (decodes to nothing)", "detector", {"image": {"data": "%%%"}}, field="image"),
    _h("empty image", "detector", {"image": {}}, field="image"),
    _h("random bytes as image", "detector", {"image": {"data": "$garbage"}}, field="image"),
    _h("truncated PNG", "detector", {"image": {"data": "$truncated"}}, field="image"),
    _h("PNG header claiming 20000 x 20000", "detector", {"image": {"data": "$png_bomb"}}, field="image"),
    _h("image above the pixel limit", "depth", {"image": {"data": "$too_many_pixels"}}, field="image"),
    # segmenter items
    _h("NaN box coordinate", "segmenter", {**SEG, "boxes": [{**BOX, "x0": "NaN"}]}, field="boxes[0]"),
    _h("infinite box coordinate", "segmenter", {**SEG, "boxes": [{**BOX, "y1": "Infinity"}]}, field="boxes[0]"),
    _h("negative infinite box coordinate", "segmenter", {**SEG, "boxes": [{**BOX, "x0": "-Infinity"}]},
       field="boxes[0]"),
    _h("box with x1 < x0", "segmenter", {**SEG, "boxes": [{**BOX, "x0": 50, "x1": 10}]}, field="boxes[0]"),
    _h("box coordinate not a number", "segmenter", {**SEG, "boxes": [{**BOX, "x0": "left"}]}, field="items[0]"),
    _h("9 boxes (limit 8)", "segmenter", {**SEG, "boxes": [BOX] * 9, "reference_masks": [MASK] * 9},
       field="boxes"),
    _h("100 empty masks", "segmenter", {**SEG, "boxes": [BOX] * 100, "reference_masks": ["$empty_mask"] * 100},
       field="boxes"),
    _h("5 masks above the mask-pixel limit", "segmenter", {**SEG, "boxes": [BOX] * 5, "reference_masks": [MASK] * 5},
       field="reference_masks"),
    _h("fewer masks than boxes", "segmenter", {**SEG, "boxes": [BOX, BOX]}, field="reference_masks"),
    _h("mask of another size", "segmenter", {**SEG, "reference_masks": [{"height": 32, "width": 32,
       "counts": "0"}]}, field="reference_masks"),
    _h("RLE string longer than 2 x H x W", "segmenter", {**SEG, "reference_masks": [{"height": 64, "width": 64,
       "counts": {"$str": ["1", 9000]}}]}, field="counts"),
    _h("RLE string of 6 MiB", "segmenter", {**SEG, "reference_masks": [{"height": 64, "width": 64,
       "counts": {"$str": ["1", 6 << 20]}}]}, field="counts"),
    _h("RLE string of 16 MiB", "segmenter", {**SEG, "reference_masks": [{"height": 64, "width": 64,
       "counts": {"$str": ["1", 16 << 20]}}]}, http=413, status=None),
    _h("RLE with characters out of range", "segmenter", {**SEG, "reference_masks": [{"height": 64, "width": 64,
       "counts": "~~~~"}]}, field="reference_masks"),
    _h("RLE truncated mid-run", "segmenter", {**SEG, "reference_masks": [{"height": 64, "width": 64,
       "counts": "0P"}]}, field="reference_masks"),
    _h("RLE covering the wrong pixel count", "segmenter", {**SEG, "reference_masks": [{"height": 64, "width": 64,
       "counts": "05"}]}, field="reference_masks"),
    _h("RLE with non-ASCII characters", "segmenter", {**SEG, "reference_masks": [{"height": 64, "width": 64,
       "counts": "\u00e9\u00e9"}]}, field="reference_masks"),
    _h("mask of negative height", "segmenter", {**SEG, "reference_masks": [{"height": -64, "width": 64,
       "counts": "0"}]}, field="reference_masks"),
    # attributes items
    _h("no answers", "attributes", {**ATTR, "answers": []}, field="answers"),
    _h("17 answers (limit 16)", "attributes", {**ATTR, "answers": ["red"] * 17}, field="answers"),
    _h("answer of 65 characters", "attributes", {**ATTR, "answers": ["r" * 65]}, field="answers[0]"),
    _h("class name of 65 characters", "attributes", {**ATTR, "class_names": ["c" * 65]}, field="class_names[0]"),
    _h("more class names than masks", "attributes", {**ATTR, "class_names": ["cup", "dog"]}, field="class_names"),
    _h("9 masks (limit 8)", "attributes", {**ATTR, "masks": [MASK] * 9, "class_names": ["cup"] * 9}, field="masks"),
    _h("bad RLE in a mask", "attributes", {**ATTR, "masks": [{"height": 64, "width": 64, "counts": "05"}]},
       field="masks"),
    _h("answers not strings", "attributes", {**ATTR, "answers": [1, 2]}, field="items[0]"),
    # depth items
    _h("unknown depth encoding value", "depth", {"image": {"data": "$png"}, "encoding": 99}, field="encoding"),
    _h("unknown depth encoding name", "depth", {"image": {"data": "$png"}, "encoding": "BOGUS"}, field="items[0]"),
    _h("depth item with a string image", "depth", {"image": "abc"}, field="items[0]"),
    # and what must still work
    _h("PNG with odd EXIF (issue 31)", "detector", {"image": {"data": "$odd_exif_png"}}, status=None),
    _h("JPEG with odd EXIF (issue 31)", "segmenter", {**SEG, "image": {"data": "$odd_exif_jpeg"}}, status=None),
    _h("WebP with odd EXIF (issue 31)", "depth", {"image": {"data": "$odd_exif_webp"}}, status=None),
    _h("good segmenter item", "segmenter", SEG, status=None),
    _h("good depth item with float32", "depth", {"image": {"data": "$png"}, "encoding": "DEPTH_ENCODING_FLOAT32"},
       status=None),
]
# fmt: on

CATALOGUE: list[dict[str, Any]] = GRPC + HTTP
