"""COCO run-length encoding of bool masks (the wire format for masks).

The layout is pycocotools': runs over the mask flattened in column-major
(Fortran) order, starting with a run of zeros (possibly empty). ``counts`` is
either the list of run lengths (uncompressed RLE) or pycocotools' compressed
string (LEB128-like, 5 bits per character with an offset of 48, each run after the
second stored as the difference to the run two before).
"""

from __future__ import annotations

from typing import Any, TypedDict

import numpy as np
from numpy.typing import NDArray


class RLE(TypedDict):
    """A COCO RLE record: ``size`` is ``[height, width]``."""

    size: list[int]
    counts: str | list[int]


def mask_to_runs(mask: NDArray[np.bool_]) -> list[int]:
    """Run lengths of a (H, W) bool mask in column-major order, starting with zeros."""
    if mask.ndim != 2:
        raise ValueError(f"mask must be 2-D (H, W), got shape {mask.shape}")
    flat = np.asarray(mask, dtype=bool).ravel(order="F")
    if flat.size == 0:
        return [0]
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate(([0], change, [flat.size]))
    runs: list[int] = [int(r) for r in np.diff(bounds)]
    if flat[0]:
        runs.insert(0, 0)
    return runs


def _compress(runs: list[int]) -> str:
    out: list[str] = []
    for i, run in enumerate(runs):
        x = run - runs[i - 2] if i > 2 else run
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = not ((c & 0x10) == 0 and x == 0) if x >= 0 else not ((c & 0x10) != 0 and x == -1)
            if more:
                c |= 0x20
            out.append(chr(c + 48))
    return "".join(out)


MAX_CHARS_PER_RUN = 12
"""Longest encoding of one run in a compressed string (12 x 5 = 60 bits, within int64)."""


def max_compressed_chars(height: int, width: int) -> int:
    """An upper bound on the length of a valid compressed ``counts`` string of a ``height x width`` mask:
    ``2 x H x W + 16`` (every run but the first covers at least one pixel and, difference-coded, takes at
    most one character per pixel it covers plus one). Longer strings are refused before decoding."""
    return 2 * max(0, height) * max(0, width) + 16


def _decompress(counts: str) -> NDArray[np.int64]:
    """Run lengths of a compressed string, vectorized (linear time, no per-character Python loop)."""
    try:
        data = np.frombuffer(counts.encode("ascii"), dtype=np.uint8).astype(np.int64) - 48
    except UnicodeEncodeError:
        raise ValueError("a compressed RLE string is ASCII") from None
    if data.size == 0:
        return np.zeros(0, dtype=np.int64)
    if data.min() < 0 or data.max() > 63:
        raise ValueError("not a compressed RLE string (characters outside '0'..'o')")
    more = (data & 0x20) != 0
    if more[-1]:
        raise ValueError("truncated compressed RLE string")
    ends = np.flatnonzero(~more)
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if lengths.max() > MAX_CHARS_PER_RUN:
        raise ValueError(f"a run takes more than {MAX_CHARS_PER_RUN} characters")
    shift = 5 * (np.arange(data.size) - np.repeat(starts, lengths))
    x = np.add.reduceat((data & 0x1F) << shift, starts)
    negative = (data[ends] & 0x10) != 0
    x[negative] -= np.left_shift(1, 5 * lengths[negative])  # sign extension: x | (-1 << 5k)
    runs = x.copy()
    runs[1::2] = np.cumsum(x[1::2])  # each run after the second is stored as the difference to the run two before
    runs[2::2] = np.cumsum(x[2::2])
    return runs


def encode(mask: NDArray[np.bool_], *, compressed: bool = True) -> RLE:
    """Encode a (H, W) bool mask as COCO RLE (compressed string by default)."""
    runs = mask_to_runs(mask)
    h, w = mask.shape
    return {"size": [int(h), int(w)], "counts": _compress(runs) if compressed else runs}


def decode(rle: RLE | dict[str, Any]) -> NDArray[np.bool_]:
    """Decode a COCO RLE record (string or list ``counts``) into a (H, W) bool mask."""
    try:
        h, w = (int(v) for v in rle["size"])
        counts = rle["counts"]
    except (KeyError, TypeError, ValueError):
        raise ValueError("an RLE record needs 'size': [height, width] and 'counts'") from None
    if isinstance(counts, bytes):
        counts = counts.decode("ascii")
    if h < 0 or w < 0:
        raise ValueError(f"RLE size {h} x {w} is negative")
    if isinstance(counts, str) and len(counts) > max_compressed_chars(h, w):
        raise ValueError(f"{len(counts)} characters is too long for a {h} x {w} mask")
    runs = _decompress(counts) if isinstance(counts, str) else np.array([int(c) for c in counts], dtype=np.int64)
    if runs.size and runs.min() < 0:
        raise ValueError("RLE has a negative run length")
    total = int(runs.sum())
    if total != h * w:
        raise ValueError(f"RLE runs cover {total} pixels, expected {h} x {w} = {h * w}")
    values = np.zeros(len(runs), dtype=bool)
    values[1::2] = True
    flat = np.repeat(values, runs)
    return flat.reshape((w, h)).T.copy()


def area(rle: RLE | dict[str, Any]) -> int:
    """Foreground pixel count of an RLE record without decoding it."""
    counts = rle["counts"]
    runs = _decompress(counts) if isinstance(counts, str) else np.array([int(c) for c in counts], dtype=np.int64)
    return int(runs[1::2].sum())
