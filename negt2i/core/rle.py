"""COCO run-length encoding of bool masks (the wire format for masks).

The layout is pycocotools' (implemented here in vectorised numpy, no per-run Python
loop; pycocotools is the reference in the tests): runs over the mask flattened in
column-major (Fortran) order, starting with a run of zeros (possibly empty). ``counts`` is
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


def _runs_array(mask: NDArray[np.bool_]) -> NDArray[np.int64]:
    """Column-major run lengths without a column-major copy of the mask: a change between rows
    i - 1 and i of column j is at flat position j * H + i, one between the last row of column
    j - 1 and the first of column j at j * H."""
    if mask.ndim != 2:
        raise ValueError(f"mask must be 2-D (H, W), got shape {mask.shape}")
    arr = np.ascontiguousarray(mask, dtype=bool)
    h, w = arr.shape
    if arr.size == 0:
        return np.zeros(1, dtype=np.int64)
    within = np.flatnonzero(arr[1:] != arr[:-1])  # C-order positions in the (H - 1, W) difference
    across = np.flatnonzero(arr[0, 1:] != arr[-1, :-1])
    changes = np.concatenate(((within % w) * h + within // w + 1, (across + 1) * h))
    changes.sort()
    bounds = np.concatenate(([0], changes, [arr.size])).astype(np.int64)
    runs = np.diff(bounds)
    if arr[0, 0]:
        runs = np.concatenate((np.zeros(1, dtype=np.int64), runs))
    return runs


def mask_to_runs(mask: NDArray[np.bool_]) -> list[int]:
    """Run lengths of a (H, W) bool mask in column-major order, starting with zeros."""
    runs: list[int] = _runs_array(mask).tolist()
    return runs


MAX_CHARS_PER_RUN = 12
"""Longest encoding of one run in a compressed string (12 x 5 = 60 bits, within int64)."""


def max_compressed_chars(height: int, width: int) -> int:
    """An upper bound on the length of a valid compressed ``counts`` string of a ``height x width`` mask:
    ``2 x H x W + 16`` (every run but the first covers at least one pixel and, difference-coded, takes at
    most one character per pixel it covers plus one). Longer strings are refused before decoding."""
    return 2 * max(0, height) * max(0, width) + 16


def _compress(runs: NDArray[np.int64]) -> str:
    """pycocotools' ``rleToString``, vectorised: value i is ``runs[i] - runs[i - 2]`` for i > 2, written
    as little-endian 5-bit groups (two's complement), each + 48, bit 5 set on all but the last group;
    a value takes the fewest groups k with -2^(5k-1) <= x < 2^(5k-1)."""
    x = runs.astype(np.int64, copy=True)
    if x.size > 3:
        x[3:] = runs[3:] - runs[1:-2]
    n = np.ones(x.size, dtype=np.int64)
    for k in range(1, MAX_CHARS_PER_RUN):
        n += ((x >> (5 * k - 1)) != 0) & ((x >> (5 * k - 1)) != -1)
    owner = np.repeat(np.arange(x.size), n)
    first = np.cumsum(n) - n
    j = np.arange(owner.size) - first[owner]
    c = (x[owner] >> (5 * j)) & 0x1F
    c |= np.where(j < n[owner] - 1, 0x20, 0)
    text: str = (c + 48).astype(np.uint8).tobytes().decode("ascii")
    return text


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
    runs = _runs_array(mask)
    h, w = mask.shape
    return {"size": [int(h), int(w)], "counts": _compress(runs) if compressed else runs.tolist()}


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
    return _paint(runs, h, w)


def _paint(runs: NDArray[np.int64], h: int, w: int) -> NDArray[np.bool_]:
    """The (H, W) mask of column-major ``runs``, in C order. Only the columns between the first and
    the last foreground pixel are expanded and transposed (the leading and trailing zero runs are
    skipped), so the cost follows the object's width, not the image's."""
    out = np.zeros((h, w), dtype=bool)
    ends = np.cumsum(runs)
    fg = np.flatnonzero(runs[1::2] > 0) * 2 + 1  # indices of non-empty foreground runs
    if fg.size == 0:
        return out
    first = int(ends[fg[0]] - runs[fg[0]])
    last = int(ends[fg[-1]])  # one past the last foreground pixel
    c0, c1 = first // h, (last - 1) // h + 1
    values = np.zeros(runs.size, dtype=bool)
    values[1::2] = True
    starts = ends - runs
    # Runs clipped to the flat window [c0 * H, c1 * H) of the columns that hold foreground.
    lo, hi = c0 * h, c1 * h
    lengths = np.clip(ends, lo, hi) - np.clip(starts, lo, hi)
    window = np.repeat(values, lengths)
    out[:, c0:c1] = window.reshape(c1 - c0, h).T
    return out


def area(rle: RLE | dict[str, Any]) -> int:
    """Foreground pixel count of an RLE record without decoding it."""
    counts = rle["counts"]
    runs = _decompress(counts) if isinstance(counts, str) else np.array([int(c) for c in counts], dtype=np.int64)
    return int(runs[1::2].sum())
