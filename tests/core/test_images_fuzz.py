"""Fuzzing the one image decoder (issue 31): mutants of EXIF-bearing PNG, JPEG and WebP files each become an
image or one ``ImageError``, never another exception, never more than 1 s of CPU. The mutators are
``benchmarks/fuzz_decoder.py``'s (which runs 100,000 of them); here a few hundred, so the suite stays cheap."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fuzz_decoder import LIMIT_S, TAGS, decode_outcome, mutants, seeds, with_exif

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # Pillow warns on every corrupt EXIF block

MUTANTS = 360


def test_the_seeds_carry_exif_and_decode():
    pool = seeds()
    assert {s.fmt for s in pool} == {"PNG", "JPEG", "WEBP"}
    for seed in pool:
        assert seed.data[seed.start : seed.start + 4] in (b"MM\x00*", b"II*\x00"), seed.fmt  # the EXIF payload
        assert decode_outcome(seed.data)[0] == "image", seed.fmt
        # the container stays valid when the payload is replaced: what the mutants rely on
        assert decode_outcome(with_exif(seed, seed.data[seed.start : seed.end]))[0] == "image", seed.fmt


@pytest.mark.parametrize("chunk", range(3))
def test_mutants_become_an_image_or_one_image_error(chunk: int):
    rng = random.Random(31 + chunk)
    outcomes: dict[str, int] = {}
    for what, data in mutants(rng, MUTANTS // 3):
        outcome, seconds = decode_outcome(data)
        assert outcome in ("image", "ImageError"), f"{what}: {outcome} escaped the decoder"
        assert seconds < LIMIT_S, f"{what}: {seconds:.2f} s of CPU"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert set(outcomes) == {"image", "ImageError"}, outcomes  # the mutants reach both ends


_ENTRY = st.tuples(
    st.one_of(st.sampled_from(TAGS), st.integers(0, 0xFFFF)),
    st.integers(0, 15),  # TIFF field types 1-13 and invalid ones
    st.one_of(st.sampled_from([0, 1, 2, 4, 20]), st.integers(0, 0xFFFFFFFF)),
    st.one_of(st.sampled_from([0, 6, 8, 26, 38]), st.integers(0, 0xFFFFFFFF)),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    order=st.sampled_from("<>"),
    entries=st.lists(_ENTRY, min_size=1, max_size=6),
    tail=st.binary(max_size=40),
    fmt=st.sampled_from(["PNG", "JPEG", "WEBP"]),
)
def test_any_ifd_in_any_container_is_an_image_or_one_image_error(
    order: str, entries: list[tuple[int, int, int, int]], tail: bytes, fmt: str
):
    head = (b"II*\x00" if order == "<" else b"MM\x00*") + struct.pack(order + "I", 8)
    body = struct.pack(order + "H", len(entries)) + b"".join(struct.pack(order + "HHII", *e) for e in entries)
    payload = head + body + struct.pack(order + "I", 0) + tail
    seed = next(s for s in seeds() if s.fmt == fmt)
    outcome, seconds = decode_outcome(with_exif(seed, payload))
    assert outcome in ("image", "ImageError"), f"{fmt} {entries}: {outcome} escaped the decoder"
    assert seconds < LIMIT_S


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    count=st.integers(0, 1400),
    kind=st.sampled_from([b"tEXt", b"zTXt", b"iTXt", b"tIME", b"pHYs", b"zzZz"]),
    payload=st.binary(max_size=24),
    after_pixels=st.booleans(),
)
def test_any_ancillary_padding_of_a_png_is_an_image_or_one_image_error(
    count: int, kind: bytes, payload: bytes, after_pixels: bool
):
    """Ancillary chunks of any known or unknown type, with any payload (a zTXt that does not inflate, a tIME of
    the wrong length), before or after the pixel data: an image or one ImageError within the CPU limit, and a
    refusal by the chunk walk above MAX_PNG_ANCILLARY_CHUNKS whatever Pillow would have made of them."""
    import io
    import zlib

    import numpy as np
    from PIL import Image as PILImage

    from negt2i.core.images import MAX_PNG_ANCILLARY_CHUNKS, ImageError, decode_image

    buf = io.BytesIO()
    PILImage.fromarray(np.zeros((6, 9, 3), np.uint8)).save(buf, "PNG")
    data = buf.getvalue()
    chunk = struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))
    at = data.index(b"IEND") - 4 if after_pixels else 8 + 25  # before IEND, or right after IHDR
    padded = data[:at] + chunk * count + data[at:]
    outcome, seconds = decode_outcome(padded)
    assert outcome in ("image", "ImageError"), outcome
    assert seconds < LIMIT_S
    if count > MAX_PNG_ANCILLARY_CHUNKS:
        with pytest.raises(ImageError, match="ancillary chunks"):
            decode_image(padded)
