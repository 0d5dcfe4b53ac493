"""The one image decoder: every path that turns encoded bytes into pixels goes through ``decode_image``.

``negt2i evaluate`` (files on disk), ``negt2i submit`` (checks each file before
sending it), the orchestrator (``EvaluateRequest.image``) and the four stage
services (``Image.data`` of every item) all call it, so an image is judged the
same way whichever path it takes. Rules, in order:

1. **Formats**: PNG, JPEG and WebP only (``ACCEPTED_FORMATS``; a JPEG with an MPO
   extension is a JPEG). Pillow is asked to try only these formats, so TIFF,
   BMP, GIF, EPS (which would reach Ghostscript) and the rest never reach a
   decoder; they are refused with a message naming the accepted formats.
2. **Pixel limit from the header**: width x height as declared in the file's
   header (``header_size`` reads it without Pillow; Pillow's parsed header is
   checked again) must be at most ``max_pixels`` (default ``DEFAULT_MAX_PIXELS`` =
   4096 x 4096); the check happens before any pixel data is decoded, so a
   small file that declares 40000 x 40000 pixels (a decompression bomb) costs
   a header read, whatever Pillow's global ``MAX_IMAGE_PIXELS`` (some model
   libraries switch Pillow's own check off). A JPEG with more than
   ``MAX_JPEG_SEGMENTS`` marker segments before its image data is refused in
   the same walk (a valid file padded with millions of empty segments would
   otherwise cost seconds per MiB in Pillow's parser). Likewise a PNG with more than
   ``MAX_PNG_ANCILLARY_CHUNKS`` ancillary chunks (``tEXt``, ``zTXt``, ``iTXt``, ``eXIf``, ...:
   any chunk whose type begins with a lower-case letter) or more than ``MAX_PNG_CHUNKS``
   chunks in all is refused by a walk over its chunk headers before Pillow sees it (a valid
   PNG padded with a million ``tEXt`` chunks cost 49 s of Pillow's parsing).
3. **EXIF orientation** (tag 274) is applied, as GenEval does
   (``ImageOps.exif_transpose``): a JPEG that a viewer shows upright is judged
   upright. Boxes, masks and disparity maps are in the coordinates of the
   oriented image (its height and width may be swapped relative to the header).
   Only that tag is read (``_orientation``); an EXIF block that cannot be parsed
   counts as no orientation (the image is judged as stored, as a viewer shows it),
   and the rest of the block is never re-serialised.
4. **Colour**: the result is RGB ``uint8`` (H, W, 3); grayscale, palette and alpha
   images are converted (alpha dropped, not composited).

Every failure raises ``ImageError`` (a ``ValueError``) with a one-line reason, whatever exception
Pillow raised inside (its plugins raise ``struct.error``, ``TypeError``, ``IndexError`` ... on crafted
files; ``tests/core/test_images_fuzz.py`` mutates EXIF-bearing PNG, JPEG and WebP files to hold this); callers
turn it into a per-image error: an ``unreadable_image`` results line, gRPC
``INVALID_ARGUMENT``, a stage item with status 400. A run never stops on one image.
"""

from __future__ import annotations

import io
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np

from negt2i.core.stage_types import Image

if TYPE_CHECKING:
    from PIL import Image as PILImage

ACCEPTED_FORMATS: Final[tuple[str, ...]] = ("PNG", "JPEG", "WEBP")
"""Pillow format names that are decoded; everything else is refused."""

DEFAULT_MAX_PIXELS: Final = 4096 * 4096
"""Largest image (width x height, from the header) accepted by default."""

MAX_JPEG_SEGMENTS: Final = 1024
"""Most marker segments (fill bytes included) a JPEG may have before its first scan. Real files have a few
dozen (an ICC profile split in its maximum 255 APP2 chunks stays far below); a valid JPEG padded with millions
of empty segments would otherwise cost seconds per MiB to walk, here and in Pillow's parser."""

MAX_PNG_ANCILLARY_CHUNKS: Final = 1024
"""Most ancillary chunks (type beginning with a lower-case letter: text, EXIF, ICC, time, physical size ...) a
PNG may have. Real files have a handful; Pillow parses each one (a million ``tEXt`` chunks: 49 s)."""

MAX_PNG_CHUNKS: Final = 65536
"""Most chunks of any kind a PNG may have. Encoders split the pixel data into ``IDAT`` chunks of 8 KiB (libpng)
to 1 MiB: a 4096 x 4096 RGBA image that does not compress at all needs about 8,200 chunks of 8 KiB."""

_ACCEPTED_TEXT: Final = "PNG, JPEG or WebP"


class ImageError(ValueError):
    """An image cannot be decoded (empty, not PNG/JPEG/WebP, above the pixel limit, truncated or corrupt)."""


def decode_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image:
    """RGB ``uint8`` (H, W, 3) pixels of encoded image bytes; see the module docstring for the rules.

    Raises ``ImageError`` saying why the bytes cannot be used.
    """
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    if not data:
        raise ImageError("empty file")
    declared = _jpeg_frame(data) if data[:2] == b"\xff\xd8" else header_size(data)
    if data[:8] == _PNG_SIGNATURE:
        _check_png_chunks(data)
    if declared is not None:
        _check_pixels(*declared, max_pixels)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)
            img = PILImage.open(io.BytesIO(data), formats=list(ACCEPTED_FORMATS))
    except PILImage.DecompressionBombError as exc:
        found = re.search(r"\((\d+) pixels\)", str(exc))
        count = found.group(1) if found else "too many"
        raise ImageError(f"image declares {count} pixels, above the limit of {max_pixels}") from None
    except UnidentifiedImageError:
        raise ImageError(f"not a {_ACCEPTED_TEXT} image{_sniff(data)}") from None
    except Exception as exc:  # OSError, ValueError, SyntaxError, struct.error ...: a header Pillow cannot parse
        raise ImageError(f"corrupt image header ({_why(exc)})") from None
    with img:
        width, height = img.size
        if width <= 0 or height <= 0:
            raise ImageError(f"image declares {width} x {height} pixels")
        if width * height > max_pixels:
            raise ImageError(f"image is {width} x {height} = {width * height} pixels, above the limit of {max_pixels}")
        try:
            img.load()
            method = _ORIENTATION.get(_orientation(img))
            oriented = img if method is None else img.transpose(PILImage.Transpose(method))
            rgb = oriented.convert("RGB")
        except Exception as exc:  # truncated or corrupt pixel data; Pillow's plugins raise many kinds on bad input
            raise ImageError(f"corrupt or truncated {img.format} data ({_why(exc)})") from None
    array = np.asarray(rgb, dtype=np.uint8)
    if array.ndim != 3 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ImageError(f"image decodes to shape {array.shape}")
    return np.ascontiguousarray(array)


_ORIENTATION: Final[dict[int, int]] = {
    2: 0,  # Transpose.FLIP_LEFT_RIGHT
    3: 3,  # Transpose.ROTATE_180
    4: 1,  # Transpose.FLIP_TOP_BOTTOM
    5: 5,  # Transpose.TRANSPOSE
    6: 4,  # Transpose.ROTATE_270
    7: 6,  # Transpose.TRANSVERSE
    8: 2,  # Transpose.ROTATE_90
}
"""EXIF orientation (tag 274) -> the ``PIL.Image.Transpose`` that shows the image upright (as
``ImageOps.exif_transpose``); 1 (and anything else) leaves the pixels as stored."""


def _orientation(img: PILImage.Image) -> int:
    """The image's EXIF orientation (tag 274, or XMP ``tiff:Orientation``, as Pillow's ``getexif`` reads them);
    1 when there is none or the EXIF block cannot be parsed.

    Only this one tag is read: ``ImageOps.exif_transpose`` also re-serialises the whole EXIF block into the
    rotated image, and a malformed block (a tag of the wrong type, an offset out of range) made it raise
    ``struct.error`` / ``TypeError`` on images whose pixels are fine. A viewer ignores EXIF it cannot parse,
    and so does the decoder: such an image is judged as stored."""
    try:
        value = img.getexif().get(_ORIENTATION_TAG, 1)
    except Exception:  # a malformed EXIF / XMP block: no usable orientation
        return 1
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


_ORIENTATION_TAG: Final = 0x0112


def orientation(data: bytes) -> int:
    """The EXIF orientation of encoded image bytes as ``decode_image`` reads it (1: upright as stored, also for
    bytes it cannot read); only the header and the EXIF block are parsed, never the pixels."""
    from PIL import Image as PILImage

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)
            with PILImage.open(io.BytesIO(data), formats=list(ACCEPTED_FORMATS)) as img:
                return _orientation(img) if _orientation(img) in _ORIENTATION else 1
    except Exception:  # not an image decode_image accepts: it reports why
        return 1


def _why(exc: BaseException) -> str:
    """``str(exc)`` cut to one short line, or the exception's type when it has no text."""
    text = " ".join(str(exc).split())[:200]
    return text or type(exc).__name__


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width <= 0 or height <= 0:
        raise ImageError(f"image declares {width} x {height} pixels")
    if width * height > max_pixels:
        raise ImageError(f"image is {width} x {height} = {width * height} pixels, above the limit of {max_pixels}")


def header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) as declared by a PNG, JPEG or WebP header, read without Pillow (so the limit holds
    whatever Pillow's global ``MAX_IMAGE_PIXELS`` is); ``None`` when the header cannot be read this way.

    PNG: the IHDR chunk (bytes 16-23). WebP: the VP8X canvas, or the VP8L / VP8 frame header. JPEG: the
    first start-of-frame marker, found by walking the marker segments (``_jpeg_frame``; ``None`` for a JPEG
    with more than ``MAX_JPEG_SEGMENTS`` segments before its scan, which ``decode_image`` refuses).
    """
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        kind = data[12:16]
        if kind == b"VP8X":
            return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
        if kind == b"VP8L" and data[20:21] == b"\x2f":
            bits = int.from_bytes(data[21:25], "little")
            return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
        if kind == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
            return int.from_bytes(data[26:28], "little") & 0x3FFF, int.from_bytes(data[28:30], "little") & 0x3FFF
        return None
    if data[:2] == b"\xff\xd8":
        try:
            return _jpeg_frame(data)
        except ImageError:
            return None  # too many segments: the decoder refuses it, saying so
    return None


def _jpeg_frame(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a JPEG's first start-of-frame marker (SOF0-SOF15 except DHT C4, JPG C8, DAC CC),
    found by walking the marker segments from SOI to the first scan (SOS, ``FF DA``); ``None`` when no frame
    header comes before the scan, the end, or a byte that is not a marker.

    Raises ``ImageError`` when more than ``MAX_JPEG_SEGMENTS`` markers (fill bytes count) come before the scan:
    the walk, and Pillow's, would otherwise take seconds per MiB of empty segments."""
    size: tuple[int, int] | None = None
    i, steps = 2, 0
    while i + 4 <= len(data):
        steps += 1
        if steps > MAX_JPEG_SEGMENTS:
            raise ImageError(f"JPEG has more than {MAX_JPEG_SEGMENTS} marker segments before its image data")
        if data[i] != 0xFF:
            break
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            i += 2
            continue
        if marker == 0xDA:  # start of scan: entropy-coded data follows
            break
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if size is None and 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 9 > len(data):
                break
            size = int.from_bytes(data[i + 7 : i + 9], "big"), int.from_bytes(data[i + 5 : i + 7], "big")
        i += 2 + length
    return size


_PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"


def _check_png_chunks(data: bytes) -> None:
    """Walk a PNG's chunk headers (length, type; the data and CRC are skipped) up to ``IEND``, the end, or a
    truncated header, and raise ``ImageError`` when it has more than ``MAX_PNG_ANCILLARY_CHUNKS`` ancillary
    chunks or more than ``MAX_PNG_CHUNKS`` chunks. The walk stops at the first count over its limit, so it costs
    at most ``MAX_PNG_CHUNKS`` steps whatever the file's size; corrupt chunks are left to Pillow."""
    i, chunks, ancillary = 8, 0, 0
    while i + 8 <= len(data):
        kind = data[i + 4 : i + 8]
        chunks += 1
        if chunks > MAX_PNG_CHUNKS:
            raise ImageError(f"PNG has more than {MAX_PNG_CHUNKS} chunks")
        if kind[:1].islower():  # bit 5 of the first byte: ancillary
            ancillary += 1
            if ancillary > MAX_PNG_ANCILLARY_CHUNKS:
                raise ImageError(
                    f"PNG has more than {MAX_PNG_ANCILLARY_CHUNKS} ancillary chunks (text, metadata: "
                    f"{kind.decode('latin-1')!r} ...)"
                )
        if kind == b"IEND":
            return
        i += 12 + int.from_bytes(data[i : i + 4], "big")


def load_image(path: str | Path, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image:
    """``decode_image`` of a file's bytes; an unreadable file raises ``ImageError`` too."""
    from negt2i.core.files import read_regular

    try:
        data = read_regular(path)  # never blocks on a FIFO, never opens a device
    except OSError as exc:
        raise ImageError(f"cannot read the file ({exc.strerror or exc})") from None
    return decode_image(data, max_pixels=max_pixels)


_SIGNATURES: Final[tuple[tuple[bytes, str], ...]] = (
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"BM", "BMP"),
    (b"GIF8", "GIF"),
    (b"%!PS", "EPS"),
    (b"\xc5\xd0\xd3\xc6", "EPS"),
    (b"%PDF", "PDF"),
    (b"\x00\x00\x00\x0cjP", "JPEG 2000"),
    (b"\x00\x00\x01\x00", "ICO"),
)


def _sniff(data: bytes) -> str:
    """`` (the file is TIFF)`` when the leading bytes name a known other format, else ``""``."""
    for magic, name in _SIGNATURES:
        if data.startswith(magic):
            return f" (the file is {name})"
    if data[4:12] in (b"ftypavif", b"ftypheic", b"ftypmif1"):
        return " (the file is AVIF/HEIF)"
    return ""
