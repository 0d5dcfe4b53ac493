"""Per-item limits of the stage contract (``docs/stage-contract.md``, ``GET /info`` ``limits``).

A stage checks each item against these before it decodes anything large, and an item over a limit fails
alone with status 400 (``WireError``), never the batch and never with a 500:

- ``max_masks_per_item`` boxes / reference masks (segmenter) or masks (attributes);
- ``max_mask_pixels``: masks x H x W per item (what decoding them allocates, one byte per pixel);
- ``max_answers`` answers per attributes item, ``max_text_chars`` per class name / answer;
- every compressed RLE string at most ``min(max_rle_chars, 2 x H x W + 16)`` characters
  (``negt2i.core.rle.max_compressed_chars``), checked before it is decoded;
- box coordinates finite (no NaN / infinity) with ``x0 <= x1`` and ``y0 <= y1``;
- enum values known (``DepthItem.encoding``).

The HTTP side adds the request size limit (413) and ``body_timeout_s`` (408: a client that does not send
its whole body in time is dropped; ``services.common.StageHttpMiddleware``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from negt2i.core import rle
from negt2i.wire.adapter import WireError
from negt2i.wire.v1 import common_pb2

DEFAULT_MAX_MASKS: Final = 64
DEFAULT_MAX_MASK_PIXELS: Final = 256 * 1024 * 1024
DEFAULT_MAX_ANSWERS: Final = 32
DEFAULT_MAX_TEXT_CHARS: Final = 256
DEFAULT_MAX_RLE_CHARS: Final = 16 * 1024 * 1024
DEFAULT_BODY_TIMEOUT_S: Final = 30.0
KNOWN_DEPTH_ENCODINGS: Final = frozenset(
    {common_pb2.DEPTH_ENCODING_UNSPECIFIED, common_pb2.DEPTH_ENCODING_FLOAT16, common_pb2.DEPTH_ENCODING_FLOAT32}
)


@dataclass(frozen=True)
class ItemLimits:
    """The per-item limits of a stage service (see the module docstring)."""

    max_masks_per_item: int = DEFAULT_MAX_MASKS
    max_mask_pixels: int = DEFAULT_MAX_MASK_PIXELS
    max_answers: int = DEFAULT_MAX_ANSWERS
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    max_rle_chars: int = DEFAULT_MAX_RLE_CHARS
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ItemLimits:
        """``NEGT2I_MAX_MASKS``, ``NEGT2I_MAX_MASK_PIXELS``, ``NEGT2I_MAX_ANSWERS``, ``NEGT2I_MAX_TEXT_CHARS``,
        ``NEGT2I_MAX_RLE_CHARS``, ``NEGT2I_BODY_TIMEOUT_S``."""
        e = dict(os.environ if env is None else env)
        d = cls()
        return cls(
            max_masks_per_item=int(e.get("NEGT2I_MAX_MASKS", d.max_masks_per_item)),
            max_mask_pixels=int(e.get("NEGT2I_MAX_MASK_PIXELS", d.max_mask_pixels)),
            max_answers=int(e.get("NEGT2I_MAX_ANSWERS", d.max_answers)),
            max_text_chars=int(e.get("NEGT2I_MAX_TEXT_CHARS", d.max_text_chars)),
            max_rle_chars=int(e.get("NEGT2I_MAX_RLE_CHARS", d.max_rle_chars)),
            body_timeout_s=float(e.get("NEGT2I_BODY_TIMEOUT_S", d.body_timeout_s)),
        )

    def check_masks(self, masks: Sequence[common_pb2.Mask], hw: tuple[int, int], field: str) -> None:
        """Count, total pixels and RLE string lengths of an item's masks (before any is decoded)."""
        n = len(masks)
        if n > self.max_masks_per_item:
            raise WireError(f"{n} masks, above the limit of {self.max_masks_per_item} per item", field=field)
        if n * hw[0] * hw[1] > self.max_mask_pixels:
            raise WireError(
                f"{n} masks of {hw[0]} x {hw[1]} = {n * hw[0] * hw[1]} mask pixels, above the limit of "
                f"{self.max_mask_pixels} per item",
                field=field,
            )
        longest = min(self.max_rle_chars, rle.max_compressed_chars(*hw))
        for k, m in enumerate(masks):
            if len(m.counts) > longest:
                raise WireError(
                    f"RLE string of {len(m.counts)} characters, above {longest} for a {hw[0]} x {hw[1]} mask",
                    field=f"{field}[{k}].counts",
                )

    def check_boxes(self, boxes: Sequence[common_pb2.Box], field: str = "boxes") -> None:
        """Count and finiteness (and order) of box coordinates."""
        if len(boxes) > self.max_masks_per_item:
            raise WireError(f"{len(boxes)} boxes, above the limit of {self.max_masks_per_item} per item", field=field)
        for k, b in enumerate(boxes):
            values = (b.x0, b.y0, b.x1, b.y1)
            if not all(math.isfinite(v) for v in values):
                raise WireError(f"coordinates {values} must be finite numbers", field=f"{field}[{k}]")
            if b.x1 < b.x0 or b.y1 < b.y0:
                raise WireError(f"box {values} needs x0 <= x1 and y0 <= y1", field=f"{field}[{k}]")

    def check_texts(self, values: Sequence[str], field: str, *, most: int | None = None) -> None:
        """Count (at most ``most``) and length of text values."""
        if most is not None and len(values) > most:
            raise WireError(f"{len(values)} values, above the limit of {most}", field=field)
        for k, v in enumerate(values):
            if len(v) > self.max_text_chars:
                raise WireError(f"{len(v)} characters, above the limit of {self.max_text_chars}", field=f"{field}[{k}]")

    @staticmethod
    def check_depth_encoding(encoding: int, field: str = "encoding") -> None:
        """A known ``DepthEncoding`` value."""
        if encoding not in KNOWN_DEPTH_ENCODINGS:
            raise WireError(f"unknown depth encoding {encoding} (expected FLOAT16 or FLOAT32)", field=field)
