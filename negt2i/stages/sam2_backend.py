"""SAM 2.1 hiera-small segmenter (``sam2.1-hiera-small``): detector boxes as box prompts.

Appendix C.1 / Table 15: detector boxes go to SAM as box prompts, 50 per call;
SAM returns three candidates per box (``multimask_output=True``) and the one that
overlaps the detector's own mask most is kept (SAM's confidence is ignored), then
closed with a radius-5 disk and stripped of components under 5% of the largest
(``negt2i.stages.common.refine_with_candidates``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from negt2i.config import CURRENT, RuleConfig
from negt2i.stages.base import Image, ModelInfo, applied
from negt2i.stages.common import check_boxes, check_image, refine_with_candidates
from negt2i.stages.registry import register

BACKEND: Final = "sam2.1-hiera-small"
MODEL: Final = "facebook/sam2.1-hiera-small"
CONFIG_FILE: Final = "configs/sam2.1/sam2.1_hiera_s.yaml"
"""The ``sam2`` package's Hydra config of SAM 2.1 hiera-small."""


def build_model(checkpoint: str | Path | None, device: Any, image_size: int | None = None) -> Any:
    """SAM 2.1 hiera-small from the package's Hydra config; random weights when ``checkpoint`` is None.
    ``image_size`` overrides the 1024 px input (tests use small inputs)."""
    from sam2.build_sam import build_sam2

    overrides = [f"++model.image_size={image_size}"] if image_size else []
    return build_sam2(CONFIG_FILE, None if checkpoint is None else str(checkpoint), device=str(device),
                      hydra_overrides_extra=overrides)  # fmt: skip


def make_predictor(model: Any) -> Any:
    """A ``SAM2ImagePredictor`` whose backbone feature sizes follow the model's input size."""
    from sam2.sam2_image_predictor import SAM2ImagePredictor

    predictor = SAM2ImagePredictor(model)
    s = int(model.image_size)
    predictor._bb_feat_sizes = [(s // 4, s // 4), (s // 8, s // 8), (s // 16, s // 16)]
    return predictor


class SAM2Segmenter:
    """Wraps a ``SAM2ImagePredictor`` (which holds the current image: calls are serialised by a lock)."""

    def __init__(self, predictor: Any, info: ModelInfo, *, config: RuleConfig = CURRENT) -> None:
        self.predictor = predictor
        self.info = info
        self.config = config
        self._lock = threading.Lock()

    @classmethod
    def from_weights(
        cls,
        *,
        device: str = "auto",
        weights_dir: str | Path | None = None,
        config: RuleConfig = CURRENT,
        **_: Any,
    ) -> SAM2Segmenter:
        """Load SAM 2.1 hiera-small from the weights cache (``negt2i weights fetch``)."""
        from negt2i import weights
        from negt2i.stages._torch import model_info, resolve_device

        verified = weights.verify(BACKEND, weights_dir)
        dev = resolve_device(device)
        model = build_model(verified.path("sam2.1_hiera_small.pt"), dev)
        return cls(
            make_predictor(model),
            applied(model_info("segmenter", BACKEND, MODEL, dist="sam2", device=dev, weights=verified), config),
            config=config,
        )

    def candidates(self, boxes: NDArray[np.float32], shape_hw: tuple[int, int]) -> NDArray[np.bool_]:
        """SAM's three candidate masks (k, 3, H, W) per box, for the image last set on the predictor."""
        import torch

        with torch.inference_mode():
            masks, _, _ = self.predictor.predict(box=np.asarray(boxes, np.float32), multimask_output=True)
        return np.asarray(masks > 0.5).reshape(len(boxes), -1, *shape_hw)

    def refine(self, image: Image, boxes: NDArray[np.float32], reference_masks: NDArray[np.bool_]) -> NDArray[np.bool_]:
        """Refined masks (K, H, W); see the module docstring."""
        import torch

        hw = check_image(image)
        boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
        refs = np.asarray(reference_masks, dtype=bool)
        check_boxes(boxes, refs, hw)
        if boxes.shape[0] == 0:
            return np.zeros((0, *hw), dtype=bool)
        with self._lock:
            with torch.inference_mode():
                self.predictor.set_image(np.ascontiguousarray(image))
            try:
                return refine_with_candidates(hw, boxes, refs, lambda chunk: self.candidates(chunk, hw), self.config)
            finally:
                self.predictor.reset_predictor()


register("segmenter", BACKEND, SAM2Segmenter.from_weights, model=MODEL, weights=BACKEND)
