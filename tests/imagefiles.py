"""Image files made in the tests: decompression bombs, other formats, JPEGs rotated by EXIF orientation."""

from __future__ import annotations

import functools
import io
import struct
import zlib

import numpy as np
from PIL import Image as PILImage


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


@functools.cache
def bomb_png(width: int = 40000, height: int = 40000, rows: int = 400) -> bytes:
    """A valid PNG header declaring ``width`` x ``height`` RGB pixels, with ``rows`` rows of zero pixel data
    (deflate shrinks them ~1000x: the default is a ~50 KB file that would decode to 4.8 GB)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * ((1 + 3 * width) * rows), 9)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def encoded(pixels: np.ndarray, fmt: str, **options: object) -> bytes:
    """``pixels`` (H, W, 3) encoded by Pillow as ``fmt`` (TIFF, BMP, GIF, EPS, PNG, JPEG, WEBP ...)."""
    buf = io.BytesIO()
    PILImage.fromarray(pixels).save(buf, format=fmt, **options)  # type: ignore[arg-type]
    return buf.getvalue()


def exif_rotated_jpeg(upright: np.ndarray) -> bytes:
    """A JPEG whose stored pixels are ``upright`` turned 90 degrees counter-clockwise, with EXIF
    orientation 6 ("rotate 90 CW to display"): a viewer, and the decoder, show ``upright``."""
    stored = PILImage.fromarray(upright).transpose(PILImage.Transpose.ROTATE_90)
    exif = PILImage.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    stored.save(buf, format="JPEG", quality=100, subsampling=0, exif=exif)
    return buf.getvalue()
