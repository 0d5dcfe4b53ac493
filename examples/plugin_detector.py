"""A minimal plug-in detector backend (``docs/stage-contract.md``, "Plug-in backends").

Load it with ``NEGT2I_BACKEND_MODULES=examples.plugin_detector`` and pick it by name, in process or
as a stage service:

    NEGT2I_BACKEND_MODULES=examples.plugin_detector negt2i evaluate IMAGES --out r.jsonl \\
        --backend synthetic --detector example-colour
    NEGT2I_BACKEND_MODULES=examples.plugin_detector NEGT2I_DETECTOR_BACKEND=example-colour \\
        bentoml serve services.detector.service:Detector

What a detector backend must do (the stage contract, in process):

- ``info``: a ``ModelInfo`` naming the model, stating the rule constants it applies
  (``applied(info, config, operating_point)``: here the prediction floor) and its operating point;
- ``detect(images)``: one ``Detections`` per RGB ``uint8`` (H, W, 3) image: class names in the
  benchmark's spelling (``negt2i.core.vocab.COCO_CLASSES``), every detection scoring at least the floor,
  no overlap suppression, boxes ``xyxy`` in pixel edges clipped to the image, one (H, W) bool mask each.

This one stands in for a real model with the synthetic colour palette (``render_scene`` images): swap
``_find`` for your model's inference and keep the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.perception import Detections, mask_to_xyxy
from negt2i.stages.base import Image, ModelInfo, OperatingPoint, applied
from negt2i.stages.registry import register
from negt2i.stages.synthetic import find_objects

NAME = "example-colour"


class ColourDetector:
    """Finds palette-coloured objects; each detection scores ``score``."""

    def __init__(self, *, config: RuleConfig = CURRENT, score: float = 0.8) -> None:
        self.floor = config.detection.prediction_floor
        self.score = score
        info = ModelInfo(stage="detector", backend=NAME, model="colour-palette-example", library="numpy")
        self.info = applied(info, config, OperatingPoint(prediction_floor=self.floor, suppression="none"))

    def _find(self, image: Image) -> list[tuple[str, np.ndarray, float]]:
        return [(name, mask, self.score) for name, mask in find_objects(image)]

    def detect(self, images: Sequence[Image]) -> list[Detections]:
        out: list[Detections] = []
        for image in images:
            hw = (int(image.shape[0]), int(image.shape[1]))
            found = [f for f in self._find(image) if f[2] >= self.floor]  # the floor is the backend's to apply
            if not found:
                out.append(Detections.empty(hw))
                continue
            masks = np.stack([m for _, m, _ in found])
            boxes = np.array([mask_to_xyxy(m) for m in masks], dtype=np.float32)
            scores = np.array([s for _, _, s in found], dtype=np.float32)
            out.append(Detections(tuple(n for n, _, _ in found), scores, boxes, masks, hw))
        return out


def create(
    *, config: RuleConfig = CURRENT, device: str = "cpu", weights_dir: Any = None, dtype: str | None = None
) -> ColourDetector:
    """The factory: explicit keyword options (``device``, ``weights_dir`` and ``dtype`` are not needed here)."""
    return ColourDetector(config=config)


register("detector", NAME, create, model="colour-palette-example")
