"""The stage vocabulary the core speaks: the stage names, the image type and what produced a stage's output.

Pure (numpy / pydantic only). The core (the image decoder, the flow, the metrics), the wire adapter,
the orchestrator and the stage backends all take these names from here; ``negt2i.stages.base`` and
``negt2i.stages.registry`` re-export them, so plug-in backends written against those modules keep
working.

- ``STAGES``: the four stages in pipeline order (``detector``, ``segmenter``, ``attributes``, ``depth``);
- ``Image``: an RGB ``uint8`` array (H, W, 3);
- ``OperatingPoint``: what a detector's scores mean;
- ``ModelInfo``: the model, weights, library, device and rule constants behind a stage's answers,
  recorded in every results line; ``applied`` fills in the rule constants a stage applies itself.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict

from negt2i.core.config import RuleConfig, stage_rules

STAGES: Final[tuple[str, ...]] = ("detector", "segmenter", "attributes", "depth")
"""The perception stages, in pipeline order."""

Image = NDArray[np.uint8]
"""An RGB ``uint8`` image (H, W, 3)."""


class OperatingPoint(BaseModel):
    """What a detector's scores mean (``docs/stage-contract.md``, "Operating point").

    The presence / counting thresholds of the rule config (0.03 / 0.5) are RF-DETR's
    operating point at floor 0.005 without suppression; a detector with another
    operating point needs its own thresholds in the rules file.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    prediction_floor: float
    """Detections scoring below this are never returned."""
    suppression: str = "none"
    """The detector's own overlap suppression: ``none`` (RF-DETR) or e.g. ``nms:0.5`` (Mask R-CNN)."""
    input_size: int = 0
    """The side in pixels the model resizes images to (0: native resolution)."""


class ModelInfo(BaseModel):
    """What produced a stage's output; recorded in every results line."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    stage: str
    """``detector``, ``segmenter``, ``attributes`` or ``depth``."""
    backend: str
    """Registry name of the backend, e.g. ``rfdetr-seg-xl``."""
    model: str
    """Model identifier, e.g. ``RFDETRSegXLarge`` or ``facebook/sam2.1-hiera-small``."""
    revision: str = ""
    """Weights revision or file name."""
    sha256: str = ""
    """Hash of the weights actually loaded (empty for random test weights)."""
    library: str = ""
    """Backend library and version, e.g. ``rfdetr 1.11.2``."""
    device: str = "cpu"
    dtype: str = "float32"
    operating_point: OperatingPoint | None = None
    """The detector's operating point (None for the other stages)."""
    rules: dict[str, float] = {}
    """Rule constants the stage applies itself, by config path (``negt2i.core.config.stage_rules``)."""

    def digest(self) -> str:
        """A short, stable hash of everything above: a replaced model gives another digest."""
        import hashlib
        import json

        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def applied(info: ModelInfo, config: RuleConfig, operating_point: OperatingPoint | None = None) -> ModelInfo:
    """``info`` stating the rule constants of ``config`` the stage applies (and a detector's operating point)."""
    return info.model_copy(update={"rules": stage_rules(config, info.stage), "operating_point": operating_point})
