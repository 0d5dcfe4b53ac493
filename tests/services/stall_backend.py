"""A test-only detector, registered in a service through ``NEGT2I_BACKEND_MODULES``: ``stall-test``.

The synthetic detector, except on two marked images (by their top-left pixel): a *slow* image (0, 0, 255)
makes its model call take ``NEGT2I_TEST_STALL_S`` seconds (default 3), and a *fatal* image (1, 2, 3) raises
``SystemExit`` inside the model call, an error that ends the service's model thread. Tests use it to see a
request cancelled by BentoML's timeout while its batch runs, and a dead model thread turning ``/livez`` 503.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from negt2i.stages.registry import register
from negt2i.stages.synthetic import SyntheticDetector

SLOW = (0, 0, 255)
"""Top-left pixel of an image whose model call takes ``NEGT2I_TEST_STALL_S`` seconds."""
FATAL = (1, 2, 3)
"""Top-left pixel of an image whose model call ends the model thread (``SystemExit``)."""


class StallTestDetector(SyntheticDetector):
    """``SyntheticDetector`` that stalls on slow images and ends the model thread on fatal ones."""

    def detect(self, images: Sequence[Any], classes: Any = None, *, max_per_class: int = 0) -> list[Any]:
        marks = {tuple(int(v) for v in np.asarray(image)[0, 0]) for image in images}
        if FATAL in marks:
            raise SystemExit("injected: the model thread ends")
        if SLOW in marks:
            time.sleep(float(os.environ.get("NEGT2I_TEST_STALL_S", "3")))
        return super().detect(images, classes, max_per_class=max_per_class)


register("detector", "stall-test", StallTestDetector, replace=True)
