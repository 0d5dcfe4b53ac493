"""The one image decoder (negt2i.core.images): formats, the pixel limit from the header, EXIF orientation."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PIL import Image as PILImage

from negt2i.core.images import DEFAULT_MAX_PIXELS, ImageError, decode_image, header_size, load_image
from negt2i.wire import adapter
from tests.imagefiles import bomb_png, encoded, exif_rotated_jpeg

PIXELS = np.arange(12 * 20 * 3, dtype=np.uint8).reshape(12, 20, 3)


@pytest.mark.parametrize(("fmt", "options"), [("PNG", {}), ("WEBP", {"lossless": True}), ("JPEG", {"quality": 95})])
def test_png_jpeg_webp_are_decoded_to_rgb(fmt: str, options: dict):
    img = decode_image(encoded(PIXELS, fmt, **options))
    assert img.shape == (12, 20, 3) and img.dtype == np.uint8 and img.flags.c_contiguous
    if fmt != "JPEG":
        assert (img == PIXELS).all()


@pytest.mark.parametrize("fmt", ["TIFF", "BMP", "GIF", "EPS", "ICO", "PPM"])
def test_other_formats_are_refused_naming_the_accepted_ones(fmt: str):
    data = encoded(np.zeros((16, 16, 3), np.uint8), fmt)
    assert PILImage.open(__import__("io").BytesIO(data)).format  # Pillow itself would open it
    with pytest.raises(ImageError, match="not a PNG, JPEG or WebP image"):
        decode_image(data)


def test_a_decompression_bomb_is_refused_from_its_header_at_once():
    data = bomb_png(40000, 40000)
    assert len(data) < 100_000
    start = time.perf_counter()
    with pytest.raises(ImageError, match=r"is 40000 x 40000 = 1600000000 pixels, above the limit of 16777216"):
        decode_image(data)
    assert time.perf_counter() - start < 1.0  # a header read, not 4.8 GB of pixels


def test_the_limit_holds_whatever_pillows_own_bomb_limit_is(monkeypatch):
    # some model libraries switch Pillow's check off globally (Image.MAX_IMAGE_PIXELS = None)
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", None)
    with pytest.raises(ImageError, match=r"40000 x 40000 = 1600000000 pixels, above the limit"):
        decode_image(bomb_png(40000, 40000))


@pytest.mark.parametrize(
    ("fmt", "options"),
    [
        ("PNG", {}),
        ("JPEG", {}),
        ("JPEG", {"progressive": True}),
        ("WEBP", {"lossless": True}),
        ("WEBP", {"quality": 80}),
        ("WEBP", {"exif": PILImage.Exif().tobytes()}),
    ],
)
@pytest.mark.parametrize("wh", [(1, 1), (37, 19), (1000, 3), (3, 1000)])
def test_header_size_matches_pillow(fmt: str, options: dict, wh: tuple[int, int]):
    data = encoded(np.zeros((wh[1], wh[0], 3), np.uint8), fmt, **options)
    assert header_size(data) == wh == PILImage.open(__import__("io").BytesIO(data)).size


def test_the_pixel_limit_is_checked_before_decoding():
    # 5000 x 5000 is below Pillow's own bomb limit: our header check refuses it, with only 10 rows present
    # (decoding would fail differently, as truncated data)
    with pytest.raises(ImageError, match=r"5000 x 5000 = 25000000 pixels, above the limit of 16777216"):
        decode_image(bomb_png(5000, 5000, rows=10))
    assert decode_image(encoded(PIXELS, "PNG"), max_pixels=240).shape == (12, 20, 3)
    with pytest.raises(ImageError, match="above the limit of 239"):
        decode_image(encoded(PIXELS, "PNG"), max_pixels=239)
    assert DEFAULT_MAX_PIXELS == 4096 * 4096


def test_exif_orientation_is_applied():
    upright = np.zeros((20, 40, 3), np.uint8)
    upright[:, :10] = (255, 0, 0)  # red band on the left
    data = exif_rotated_jpeg(upright)
    with PILImage.open(__import__("io").BytesIO(data)) as raw:
        assert raw.size == (20, 40)  # stored sideways (W x H)
    img = decode_image(data)
    assert img.shape == (20, 40, 3)
    assert img[:, :10, 0].min() > 240 and img[:, 10:, 0].max() < 15


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"", "empty file"),
        (b"\x89PNG\r\n\x1a\n" + b"garbage" * 20, "corrupt"),
        (encoded(PIXELS, "PNG")[:60], "truncated"),
        (b"hello", "not a PNG, JPEG or WebP image"),
    ],
)
def test_corrupt_data_is_an_image_error(data: bytes, needle: str):
    with pytest.raises(ImageError, match=needle):
        decode_image(data)


def test_the_wire_adapter_and_files_use_the_same_decoder(tmp_path):
    path = tmp_path / "a.tif"
    path.write_bytes(encoded(PIXELS, "TIFF"))
    with pytest.raises(ImageError, match="the file is TIFF"):
        load_image(path)
    with pytest.raises(adapter.WireError, match=r"^image\.data: not a PNG, JPEG or WebP image") as err:
        adapter.decode_image(path.read_bytes(), field="image.data")
    assert err.value.field == "image.data"
    with pytest.raises(ImageError, match="cannot read the file"):
        load_image(tmp_path / "absent.png")


ISSUE_31_EXIF = bytes.fromhex(
    "4d4d002a000000080003010000020000000463616d0001120003000000010006000001320002000000140000003200000000"
    "323032343a30313a30312030303a30303a303000"
)


def test_issue_31_the_small_png_with_odd_exif_decodes():
    """The issue's minimal repro: ``ImageOps.exif_transpose`` raised ``struct.error`` re-serialising this block
    (an ImageWidth tag of type ASCII); its orientation (6) is still applied."""
    buf = __import__("io").BytesIO()
    PILImage.new("RGB", (48, 32)).save(buf, format="PNG", exif=ISSUE_31_EXIF)
    assert decode_image(buf.getvalue()).shape == (48, 32, 3)  # 48 x 32 stored, shown turned: 32 wide, 48 high


@pytest.mark.parametrize("fmt", ["JPEG", "WEBP"])
def test_odd_exif_in_jpeg_and_webp_decodes(fmt: str):
    data = encoded(np.zeros((32, 48, 3), np.uint8), fmt, exif=b"Exif\x00\x00" + ISSUE_31_EXIF)
    assert decode_image(data).shape == (48, 32, 3)


def test_an_exif_block_that_cannot_be_parsed_leaves_the_image_as_stored():
    # orientation 6 in a block whose first IFD offset points past its end: no usable orientation
    broken = b"MM\x00*\x00\x00\xff\xff" + ISSUE_31_EXIF[8:]
    data = encoded(PIXELS, "PNG", exif=broken)
    img = decode_image(data)
    assert img.shape == (12, 20, 3) and (img == PIXELS).all()


def _padded_jpeg(segments: int, *, after_frame: bool = False, fill: bool = False) -> bytes:
    """A valid JPEG with ``segments`` empty APP1 segments (or fill bytes) inserted right after SOI, or right
    after its frame header (between SOF and the scan, where Pillow's header parser still walks)."""
    data = encoded(PIXELS, "JPEG", quality=90)
    pad = b"\xff" * segments if fill else b"\xff\xe1\x00\x02" * segments
    if not after_frame:
        return data[:2] + pad + data[2:]
    sof = data.index(b"\xff\xc0")
    end = sof + 2 + int.from_bytes(data[sof + 2 : sof + 4], "big")
    return data[:end] + pad + data[end:]


@pytest.mark.parametrize("where", [{}, {"after_frame": True}, {"fill": True}])
def test_a_jpeg_padded_with_empty_segments_is_refused_at_the_limit(where: dict):
    from negt2i.core.images import MAX_JPEG_SEGMENTS

    few = MAX_JPEG_SEGMENTS - 40  # the file's own ~10 segments before its scan stay under the limit
    assert decode_image(_padded_jpeg(few, **where)).shape == (12, 20, 3)  # below: a normal image
    assert header_size(_padded_jpeg(few, **where)) == (20, 12)
    with pytest.raises(ImageError, match=f"more than {MAX_JPEG_SEGMENTS} marker segments before its image data"):
        decode_image(_padded_jpeg(MAX_JPEG_SEGMENTS + 1, **where))
    # millions of them (a 24 MiB file): refused by the same walk after MAX_JPEG_SEGMENTS steps, whatever the size
    huge = _padded_jpeg(6 * 1024 * 1024, **where)
    with pytest.raises(ImageError, match="marker segments"):
        decode_image(huge)
    assert header_size(huge) is None  # admission: no size, only the bytes are charged


def _chunk(kind: bytes, payload: bytes) -> bytes:
    import zlib

    return len(payload).to_bytes(4, "big") + kind + payload + zlib.crc32(kind + payload).to_bytes(4, "big")


def _padded_png(text_chunks: int, *, after_pixels: bool = False, idat_split: int = 0) -> bytes:
    """A valid PNG with ``text_chunks`` ``tEXt`` chunks inserted after IHDR (or after the pixel data), and its
    pixel data split into ``idat_split`` ``IDAT`` chunks when given."""
    data = encoded(PIXELS, "PNG")
    ihdr_end = 8 + 12 + int.from_bytes(data[8:12], "big")
    idat = data.index(b"IDAT") - 4
    iend = data.index(b"IEND") - 4
    pixels = data[idat:iend]
    if idat_split:
        stream = b"".join(pixels[j + 8 : j + 8 + int.from_bytes(pixels[j : j + 4], "big")]
                          for j in _chunk_offsets(pixels))  # fmt: skip
        step = max(1, -(-len(stream) // idat_split))
        pieces = [stream[k : k + step] for k in range(0, len(stream), step)]
        pieces += [b""] * (idat_split - len(pieces))  # empty IDAT chunks are valid
        pixels = b"".join(_chunk(b"IDAT", piece) for piece in pieces)
    text = _chunk(b"tEXt", b"Comment\x00x") * text_chunks
    head, tail = data[:ihdr_end], data[iend:]
    middle = data[ihdr_end:idat]
    if after_pixels:
        return head + middle + pixels + text + tail
    return head + text + middle + pixels + tail


def _chunk_offsets(chunks: bytes) -> list[int]:
    offsets, j = [], 0
    while j + 8 <= len(chunks):
        offsets.append(j)
        j += 12 + int.from_bytes(chunks[j : j + 4], "big")
    return offsets


@pytest.mark.parametrize("after_pixels", [False, True])
def test_a_png_padded_with_text_chunks_is_refused_at_the_limit(after_pixels: bool):
    from negt2i.core.images import MAX_PNG_ANCILLARY_CHUNKS

    at_limit = _padded_png(MAX_PNG_ANCILLARY_CHUNKS, after_pixels=after_pixels)
    assert (decode_image(at_limit) == PIXELS).all()  # the file has no other ancillary chunk
    with pytest.raises(ImageError, match=f"more than {MAX_PNG_ANCILLARY_CHUNKS} ancillary chunks .*'tEXt'"):
        decode_image(_padded_png(MAX_PNG_ANCILLARY_CHUNKS + 1, after_pixels=after_pixels))
    # a million of them (15 MB; 49 s of Pillow's parsing before): refused by the walk after the limit
    huge = _padded_png(1_000_000, after_pixels=after_pixels)
    assert len(huge) > 15_000_000
    with pytest.raises(ImageError, match="ancillary chunks"):
        decode_image(huge)


def test_pixel_data_in_many_idat_chunks_is_decoded_up_to_the_chunk_limit():
    from negt2i.core.images import MAX_PNG_CHUNKS

    many = _padded_png(0, idat_split=MAX_PNG_CHUNKS - 2)  # + IHDR + IEND: exactly the limit
    assert (decode_image(many) == PIXELS).all()
    with pytest.raises(ImageError, match=f"more than {MAX_PNG_CHUNKS} chunks"):
        decode_image(_padded_png(0, idat_split=MAX_PNG_CHUNKS - 1))
