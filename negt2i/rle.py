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


def _decompress(counts: str) -> list[int]:
    runs: list[int] = []
    pos = 0
    data = counts.encode("ascii")
    while pos < len(data):
        x = 0
        k = 0
        more = True
        while more:
            if pos >= len(data):
                raise ValueError("truncated compressed RLE string")
            c = data[pos] - 48
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            pos += 1
            k += 1
            if not more and (c & 0x10):
                x |= -1 << (5 * k)
        if len(runs) > 2:
            x += runs[-2]
        runs.append(x)
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
    runs = _decompress(counts) if isinstance(counts, str) else [int(c) for c in counts]
    if any(r < 0 for r in runs):
        raise ValueError("RLE has a negative run length")
    total = sum(runs)
    if total != h * w:
        raise ValueError(f"RLE runs cover {total} pixels, expected {h} x {w} = {h * w}")
    values = np.zeros(len(runs), dtype=bool)
    values[1::2] = True
    flat = np.repeat(values, runs)
    return flat.reshape((w, h)).T.copy()


def area(rle: RLE | dict[str, Any]) -> int:
    """Foreground pixel count of an RLE record without decoding it."""
    counts = rle["counts"]
    runs = _decompress(counts) if isinstance(counts, str) else list(counts)
    return int(sum(runs[1::2]))
