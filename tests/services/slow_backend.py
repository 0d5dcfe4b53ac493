"""Test-only detector backends, registered in a service through ``NEGT2I_BACKEND_MODULES``:
``slow-synthetic`` takes ``NEGT2I_TEST_LOAD_S`` seconds to load; ``failing`` never loads."""

from __future__ import annotations

import os
import time
from typing import Any

from negt2i.stages.registry import register
from negt2i.stages.synthetic import SyntheticDetector


def _slow(**options: Any) -> SyntheticDetector:
    time.sleep(float(os.environ.get("NEGT2I_TEST_LOAD_S", "3")))
    return SyntheticDetector(**options)


def _failing(**_: Any) -> SyntheticDetector:
    raise FileNotFoundError("weights not found in /nowhere; run negt2i weights fetch")


register("detector", "slow-synthetic", _slow, replace=True)
register("detector", "failing", _failing, replace=True)
