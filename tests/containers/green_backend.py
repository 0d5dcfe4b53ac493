"""A detector plug-in for the container test's detector swaps (``make container-test``), mounted read-only
into a stage container and registered through ``NEGT2I_BACKEND_MODULES`` as an operator's plug-in would be:
``synthetic-green``, the synthetic detector under another model name (``synthetic-palette-green``), so the
verdicts stay those of ``negt2i evaluate --backend synthetic`` while the results must name the new model.
Standard library and the installed ``negt2i`` only (the image has no tests package)."""

from __future__ import annotations

from typing import Any

from negt2i.stages.registry import register
from negt2i.stages.synthetic import SyntheticDetector

BACKEND = "synthetic-green"
MODEL = "synthetic-palette-green"


class GreenDetector(SyntheticDetector):
    """``SyntheticDetector`` whose ``ModelInfo`` names ``synthetic-palette-green``."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.info = self.info.model_copy(update={"backend": BACKEND, "model": MODEL})


register("detector", BACKEND, GreenDetector, model=MODEL, replace=True)
