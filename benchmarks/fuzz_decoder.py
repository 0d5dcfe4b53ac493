"""Fuzz the one image decoder (``negt2i.core.images.decode_image``) with mutants of EXIF-bearing images.

Every input must become an image or one ``ImageError``: never another exception, never more than 1 s of
work. Seeds are small PNG, JPEG and WebP files carrying EXIF blocks (an orientation, text and rational
tags, an Exif sub-IFD, and the malformed block of issue 31); mutants are made three ways:

- **EXIF payload**: bytes of the EXIF block flipped, set to boundary values (00, 01, 7F, 80, FF), inserted
  or deleted, with the container kept valid (a PNG ``eXIf`` chunk gets its length and CRC recomputed, a
  JPEG APP1 segment and a WebP ``EXIF`` chunk their lengths), so that the bytes reach the EXIF parser;
- **EXIF structure**: a TIFF block built from random IFD entries (any tag among those Pillow interprets,
  any type 0-15, any count and offset) in either byte order;
- **whole file**: a few bytes of the file changed anywhere (headers, pixel data).

``tests/core/test_images_fuzz.py`` runs a few hundred mutants in the suite; this script runs many::

    .venv/bin/python benchmarks/fuzz_decoder.py --mutants 100000 --seed 1

and prints, after a ``machine:`` line (CPU model, core count, load average), the count of images,
``ImageError`` refusals and escapes (any other exception, or over 1 s), the slowest decode, and the rate::

    mutants: N (seed S) in T s, R per s

It exits 1 when anything escaped. ``--smoke``: 200 mutants (seconds).
"""

from __future__ import annotations

import argparse
import io
import random
import struct
import sys
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's negt2i, wherever it is run from

from benchmarks.machine import describe

LIMIT_S = 1.0
"""The most CPU time one decode may take."""

BOUNDARY = (0x00, 0x01, 0x7F, 0x80, 0xFF)
TAGS = (0x0100, 0x0101, 0x0112, 0x011A, 0x0128, 0x0132, 0x8769, 0x8825, 0xA005, 0x9286, 0x927C, 0x0201, 0x0202)
"""IFD tags Pillow interprets: sizes, orientation, resolution, date, the Exif / GPS / interop pointers,
user comment, maker note, the JPEG thumbnail offset and length."""

ISSUE_31_EXIF = bytes.fromhex(
    "4d4d002a000000080003010000020000000463616d0001120003000000010006000001320002000000140000003200000000"
    "323032343a30313a30312030303a30303a303000"
)
"""The 201-byte PNG of issue 31: ImageOps.exif_transpose raised struct.error re-serialising this block."""


@dataclass(frozen=True)
class Seed:
    """An encoded image and where its EXIF payload lies in it."""

    fmt: str
    data: bytes
    start: int
    end: int


def rich_exif() -> bytes:
    """A well-formed EXIF block (TIFF header onwards) with orientation 6, text, rational and sub-IFD tags."""
    from PIL import Image as PILImage

    exif = PILImage.Exif()
    exif[0x0112] = 6
    exif[0x010F] = "negt2i"
    exif[0x0132] = "2024:01:01 00:00:00"
    exif[0x011A] = 72.0
    exif.get_ifd(0x8769)[0x9286] = b"ASCII\x00\x00\x00comment"
    return exif.tobytes().removeprefix(b"Exif\x00\x00")


def _encode(fmt: str, exif: bytes) -> bytes:
    import numpy as np
    from PIL import Image as PILImage

    pixels = (np.arange(16 * 24 * 3, dtype=np.uint32).reshape(16, 24, 3) * 7 % 251).astype(np.uint8)
    buf = io.BytesIO()
    PILImage.fromarray(pixels).save(buf, format=fmt, exif=b"Exif\x00\x00" + exif)
    return buf.getvalue()


def _locate(fmt: str, data: bytes) -> tuple[int, int]:
    """(start, end) of the EXIF payload in ``data`` (the TIFF header onwards)."""
    if fmt == "PNG":
        at = data.index(b"eXIf")
        return at + 4, at + 4 + int.from_bytes(data[at - 4 : at], "big")
    if fmt == "JPEG":
        at = data.index(b"Exif\x00\x00")
        return at + 6, at - 2 + int.from_bytes(data[at - 2 : at], "big")
    at = data.index(b"EXIF")
    start = at + 8
    size = int.from_bytes(data[at + 4 : at + 8], "little")
    if data[start : start + 6] == b"Exif\x00\x00":
        start += 6
        size -= 6
    return start, start + size


def seeds() -> list[Seed]:
    """PNG, JPEG and WebP, each with the rich EXIF block and with issue 31's malformed one."""
    out = []
    for exif in (rich_exif(), ISSUE_31_EXIF):
        for fmt in ("PNG", "JPEG", "WEBP"):
            data = _encode(fmt, exif)
            out.append(Seed(fmt, data, *_locate(fmt, data)))
    return out


def _mutate_bytes(rng: random.Random, payload: bytes, edits: int) -> bytes:
    buf = bytearray(payload)
    for _ in range(edits):
        where = rng.randrange(len(buf) + 1)
        op = rng.random()
        if op < 0.35 and buf:
            buf[min(where, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif op < 0.7 and buf:
            buf[min(where, len(buf) - 1)] = rng.choice(BOUNDARY)
        elif op < 0.85:
            buf[where:where] = bytes(rng.choice(BOUNDARY) for _ in range(rng.randint(1, 4)))
        elif buf:
            del buf[where : where + rng.randint(1, 4)]
    return bytes(buf)


def random_tiff(rng: random.Random) -> bytes:
    """A TIFF (EXIF) block of random IFD entries: types, counts and offsets anything, values random bytes."""
    order = rng.choice("<>")
    entries = []
    for _ in range(rng.randint(1, 6)):
        tag = rng.choice(TAGS) if rng.random() < 0.85 else rng.randrange(1 << 16)
        kind = rng.randrange(16)
        count = rng.choice((0, 1, 2, 4, 20, rng.randrange(1 << 32)))
        value = rng.choice((0, 6, 8, 26, 38, rng.randrange(1 << 32)))
        entries.append(struct.pack(order + "HHII", tag, kind, count, value))
    body = struct.pack(order + "H", len(entries)) + b"".join(entries) + struct.pack(order + "I", 0)
    tail = bytes(rng.randrange(256) for _ in range(rng.randint(0, 40)))
    head = (b"II*\x00" if order == "<" else b"MM\x00*") + struct.pack(order + "I", 8)
    return head + body + tail


def with_exif(seed: Seed, payload: bytes) -> bytes:
    """``seed`` with its EXIF payload replaced by ``payload``, the container's lengths and CRC made valid."""
    data = seed.data
    if seed.fmt == "PNG":
        chunk_at = seed.start - 8
        body = b"eXIf" + payload
        chunk = struct.pack(">I", len(payload)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)
        return data[:chunk_at] + chunk + data[seed.end + 4 :]
    if seed.fmt == "JPEG":
        seg_at = seed.start - 10  # FF E1, length, "Exif\0\0"
        if len(payload) + 8 > 0xFFFF:
            payload = payload[: 0xFFFF - 8]
        segment = b"\xff\xe1" + struct.pack(">H", len(payload) + 8) + b"Exif\x00\x00" + payload
        return data[:seg_at] + segment + data[seed.end :]
    chunk_at = data.index(b"EXIF")
    old_size = int.from_bytes(data[chunk_at + 4 : chunk_at + 8], "little")
    prefix = data[chunk_at + 8 : seed.start]  # an "Exif\0\0" some writers put first
    body = prefix + payload
    pad = b"\x00" if len(body) % 2 else b""
    chunk = b"EXIF" + struct.pack("<I", len(body)) + body + pad
    out = data[:chunk_at] + chunk + data[chunk_at + 8 + old_size + old_size % 2 :]
    return out[:4] + struct.pack("<I", len(out) - 8) + out[8:]


def mutants(rng: random.Random, count: int) -> Iterator[tuple[str, bytes]]:
    """``count`` (description, bytes) mutants of ``seeds()``, reproducible from ``rng``'s seed."""
    pool = seeds()
    for n in range(count):
        seed = pool[n % len(pool)]
        way = rng.random()
        if way < 0.5:
            payload = seed.data[seed.start : seed.end]
            yield f"{seed.fmt} exif bytes", with_exif(seed, _mutate_bytes(rng, payload, rng.randint(1, 6)))
        elif way < 0.85:
            yield f"{seed.fmt} exif structure", with_exif(seed, random_tiff(rng))
        else:
            yield f"{seed.fmt} whole file", _mutate_bytes(rng, seed.data, rng.randint(1, 4))


def decode_outcome(data: bytes) -> tuple[str, float]:
    """(``image`` | ``ImageError`` | the escaping exception's type and text, CPU seconds of the decode)."""
    from negt2i.core.images import ImageError, decode_image

    start = time.thread_time()
    try:
        decode_image(data)
        outcome = "image"
    except ImageError:
        outcome = "ImageError"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    return outcome, time.thread_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=int, default=100_000, help="how many mutants (default 100000)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--smoke", action="store_true", help="200 mutants: seconds")
    args = parser.parse_args(argv)
    if args.smoke:
        args.mutants = 200
    print(describe())
    rng = random.Random(args.seed)
    counts: Counter[str] = Counter()
    escapes: Counter[str] = Counter()
    slowest = 0.0
    began = time.perf_counter()
    for what, data in mutants(rng, args.mutants):
        outcome, seconds = decode_outcome(data)
        slowest = max(slowest, seconds)
        if outcome not in ("image", "ImageError"):
            escapes[f"{what}: {outcome[:120]}"] += 1
            outcome = "escaped"
        elif seconds > LIMIT_S:
            escapes[f"{what}: {seconds:.2f} s"] += 1
            outcome = "escaped"
        counts[outcome] += 1
    wall = time.perf_counter() - began
    print(f"mutants: {args.mutants} (seed {args.seed}) in {wall:.1f} s, {args.mutants / wall:.0f} per s")
    print(f"images: {counts['image']}  ImageError: {counts['ImageError']}  escaped: {counts['escaped']}")
    print(f"slowest decode: {slowest * 1000:.1f} ms CPU (limit {LIMIT_S * 1000:.0f} ms)")
    for line, n in escapes.most_common(20):
        print(f"  {n} x {line}")
    return 1 if escapes else 0


if __name__ == "__main__":
    sys.exit(main())
