"""A test-only segmenter, registered in a service through ``NEGT2I_BACKEND_MODULES``: ``batch-test``.

The synthetic segmenter with a batch method (``refine_batch``, as SAM 2's) that takes ``NEGT2I_TEST_CALL_S``
seconds per call (default 0.5) and raises on the whole batch when one of its images is *poisoned*: its
top-left pixel is magenta (255, 0, 255). While the file named by ``NEGT2I_TEST_HOLD_FILE`` exists, a call
does not end (at most ``HOLD_LIMIT_S``, so that a test that forgets the file cannot hang the service): a
test holds the model with it, to see what the service answers while every admitted item waits for the model.
Tests use it to see merged calls, overload refusal and a failing item failing alone.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from negt2i.stages.registry import register
from negt2i.stages.synthetic import SyntheticSegmenter

POISON = (255, 0, 255)
"""Top-left pixel of an image this backend fails on."""

HOLD_LIMIT_S = 120.0
"""The longest a call is held by ``NEGT2I_TEST_HOLD_FILE`` (a guard against a hang, not a test figure)."""


class BatchTestSegmenter(SyntheticSegmenter):
    """``SyntheticSegmenter`` with a slow ``refine_batch`` that fails on poisoned images."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.call_s = float(os.environ.get("NEGT2I_TEST_CALL_S", "0.5"))
        hold = os.environ.get("NEGT2I_TEST_HOLD_FILE")
        self.hold = Path(hold) if hold else None

    def refine_batch(self, items: Sequence[tuple[Any, Any, Any]]) -> list[Any]:
        time.sleep(self.call_s)
        end = time.monotonic() + HOLD_LIMIT_S
        while self.hold is not None and self.hold.exists() and time.monotonic() < end:
            time.sleep(0.01)
        if any(tuple(np.asarray(image)[0, 0]) == POISON for image, _, _ in items):
            raise RuntimeError("poisoned image in the batch")
        return [self.refine(image, boxes, refs) for image, boxes, refs in items]


register("segmenter", "batch-test", BatchTestSegmenter, replace=True)
