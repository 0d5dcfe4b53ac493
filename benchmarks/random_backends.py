"""Random-weight real backends registered by name, so that the embedded path and the stage services run the
very same models in ``benchmarks/bench_services.py --backend random``.

The architectures are the paper's (built by ``benchmarks/bench_pipeline.py``: RF-DETR-Seg-XL, SAM 2.1
hiera-small, SigLIP 2 SO400M/14-378, Depth-Anything V2 Small), with random weights. As in that benchmark,
the detector really runs (and costs its time) but returns the synthetic scene's detections, so that the
downstream work (which instances get refined and scored) is fixed rather than driven by random outputs.

Stage services load this module through ``NEGT2I_BACKEND_MODULES=benchmarks.random_backends``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_pipeline

from negt2i.core.config import CURRENT, RuleConfig
from negt2i.stages.base import OperatingPoint, applied
from negt2i.stages.registry import register
from negt2i.stages.synthetic import SyntheticDetector

NAME = "random"


class FixedDetector:
    """RF-DETR-Seg-XL with random weights runs; the synthetic detections are returned."""

    def __init__(self, *, device: str = "cpu", config: RuleConfig = CURRENT, **_: Any) -> None:
        import torch

        torch.manual_seed(0)
        self.real = bench_pipeline.build_detector("cpu" if device == "auto" else device)
        point = OperatingPoint(prediction_floor=config.detection.prediction_floor, suppression="none")
        self.info = applied(self.real.info, config, point)  # the synthetic detections it returns apply the floor
        self.config = config

    def detect(self, images: Sequence[Any]) -> list[Any]:
        return self.run_prepared([self.prepare(im) for im in images])

    def prepare(self, image: Any) -> tuple[Any, Any]:
        """RF-DETR's own preprocessing (``RFDETRDetector.prepare``), and the image for the synthetic answer."""
        return self.real.prepare(image), image

    def run_prepared(self, prepared: Sequence[tuple[Any, Any]], /, **_: Any) -> list[Any]:
        """RF-DETR runs (unfiltered, as ``detect``); the synthetic detections of the images are returned."""
        self.real.run_prepared([p for p, _ in prepared])
        return SyntheticDetector(config=self.config).detect([im for _, im in prepared])


def _seeded(build: Any) -> Any:
    def factory(*, device: str = "cpu", config: RuleConfig = CURRENT, **_: Any) -> Any:
        import torch

        torch.manual_seed(0)
        built = build("cpu" if device == "auto" else device)
        built.info = applied(built.info, config)  # the rule constants it applies (the paper's, as built)
        if hasattr(built, "config"):
            built.config = config
        return built

    return factory


register("detector", NAME, FixedDetector, replace=True)
register("segmenter", NAME, _seeded(bench_pipeline.build_segmenter), replace=True)
register("attributes", NAME, _seeded(bench_pipeline.build_attributes), replace=True)
register("depth", NAME, _seeded(bench_pipeline.build_depth), replace=True)
