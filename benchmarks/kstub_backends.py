"""A detector stub with K raw detections per image, registered as ``kstub``, so that the embedded path and the
stage services see the same realistic detection count in ``benchmarks/bench_services.py --k 300``.

It returns the synthetic detector's detections of the scene's drawn objects (so verdicts are meaningful)
plus filler detections up to ``NEGT2I_BENCH_K`` in all (default 300: RF-DETR's query count, which a
detector returns when every query scores above the 0.005 floor): random COCO classes, full-size
rectangular masks in random boxes (20-400 px a side), scores uniform in [0.005, 0.03), i.e. above the
floor and below the presence threshold, as most of a trained detector's queries score. Fillers are
seeded by the image's content, so both paths get the same ones. Masks nobody reads still cost what they
cost a real detector's output: they are built, copied, and (in the services) RLE-encoded and decoded.

Stage services load it through ``NEGT2I_BACKEND_MODULES=benchmarks.kstub_backends``.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.perception import Detections
from negt2i.core.vocab import COCO_CLASSES
from negt2i.stages.base import Image
from negt2i.stages.registry import register
from negt2i.stages.synthetic import SyntheticDetector

NAME = "kstub"


class KStubDetector(SyntheticDetector):
    """The synthetic detections plus fillers up to K per image (see the module docstring)."""

    def __init__(self, *, config: RuleConfig = CURRENT, k: int | None = None, **options: Any) -> None:
        super().__init__(config=config, **options)
        self.k = int(os.environ.get("NEGT2I_BENCH_K", "300")) if k is None else k
        self.info = self.info.model_copy(update={"backend": NAME, "model": f"kstub-{self.k}"})

    def detect(self, images: Sequence[Image], classes: Sequence[str] | None = None) -> list[Detections]:
        """One ``Detections`` per image; with ``classes``, only detections of those classes."""
        out = []
        for image, det in zip(images, super().detect(images), strict=True):
            h, w = det.shape_hw
            n = max(self.k - len(det.class_names), 0)
            rng = np.random.default_rng(zlib.crc32(np.ascontiguousarray(image).data))
            names = [COCO_CLASSES[i] for i in rng.integers(0, len(COCO_CLASSES), size=n)]
            sizes = rng.integers(20, 401, size=(n, 2))
            x0 = rng.integers(0, np.maximum(w - sizes[:, 0], 1))
            y0 = rng.integers(0, np.maximum(h - sizes[:, 1], 1))
            boxes = np.stack([x0, y0, np.minimum(x0 + sizes[:, 0], w), np.minimum(y0 + sizes[:, 1], h)], 1)
            scores = rng.uniform(self.floor, 0.03, size=n).astype(np.float32)
            all_names = [*det.class_names, *names]
            keep = [i for i, c in enumerate(all_names) if classes is None or c in classes]
            masks = np.zeros((len(keep), h, w), dtype=bool)
            xyxy = np.zeros((len(keep), 4), dtype=np.float32)
            score = np.zeros(len(keep), dtype=np.float32)
            m = len(det.class_names)
            for j, i in enumerate(keep):
                if i < m:
                    masks[j], xyxy[j], score[j] = det.masks[i], det.xyxy[i], det.scores[i]
                else:
                    bx0, by0, bx1, by1 = (int(v) for v in boxes[i - m])
                    masks[j, by0:by1, bx0:bx1] = True
                    xyxy[j], score[j] = (bx0, by0, bx1, by1), scores[i - m]
            out.append(Detections(tuple(all_names[i] for i in keep), score, xyxy, masks, (h, w)))
        return out


register("detector", NAME, KStubDetector, model="kstub", replace=True)
