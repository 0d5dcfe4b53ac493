"""Depth-Anything V2 Small depth estimator (``depth-anything-v2-small``): relative disparity.

Appendix C.1: ``depth-anything/Depth-Anything-V2-Small-hf`` through ``transformers``;
its output is a disparity (larger = closer), resized to the image with bicubic
interpolation (``align_corners=False``, as the processor's
``post_process_depth_estimation``). Images of equal size are batched together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from negt2i.core.config import CURRENT, RuleConfig
from negt2i.stages.base import Image, ModelInfo
from negt2i.stages.common import check_image
from negt2i.stages.registry import register

BACKEND: Final = "depth-anything-v2-small"
MODEL: Final = "depth-anything/Depth-Anything-V2-Small-hf"


def resize_disparity(predicted: Any, shape_hw: tuple[int, int]) -> NDArray[np.float32]:
    """Bicubic resize (``align_corners=False``) of model outputs (B, h, w) to (B, H, W), as float32 numpy."""
    import torch
    import torch.nn.functional as F

    with torch.inference_mode():
        resized = F.interpolate(predicted.float()[:, None], size=shape_hw, mode="bicubic", align_corners=False)
    return np.ascontiguousarray(resized[:, 0].cpu().numpy(), dtype=np.float32)


@dataclass(frozen=True)
class PreparedImage:
    """One image prepared for the model: its size and the image processor's tensors (batch of one)."""

    shape_hw: tuple[int, int]
    inputs: dict[str, Any]


class DepthAnythingEstimator:
    """Wraps a ``transformers`` depth model and its image processor."""

    def __init__(
        self, model: Any, processor: Any, info: ModelInfo, *, batch_size: int = 8, dtype: str = "fp32"
    ) -> None:
        from negt2i.stages.torch_support import DTYPES, check_dtype

        self.model = model.eval()
        self.processor = processor
        self.dtype = check_dtype(dtype)
        self.info = info.model_copy(update={"dtype": DTYPES[self.dtype]})
        self.device = next(model.parameters()).device
        self.batch_size = batch_size

    @classmethod
    def from_weights(
        cls,
        *,
        device: str = "auto",
        weights_dir: str | Path | None = None,
        config: RuleConfig = CURRENT,
        dtype: str = "fp32",
        **_: Any,
    ) -> DepthAnythingEstimator:
        """Load Depth-Anything-V2-Small from the weights cache (``negt2i weights fetch``)."""
        from transformers import AutoImageProcessor, DepthAnythingForDepthEstimation

        from negt2i import weights
        from negt2i.stages.torch_support import model_info, resolve_device

        verified = weights.verify(BACKEND, weights_dir)
        dev = resolve_device(device)
        processor = AutoImageProcessor.from_pretrained(verified.folder, local_files_only=True)  # type: ignore[no-untyped-call, unused-ignore]
        model = DepthAnythingForDepthEstimation.from_pretrained(verified.folder, local_files_only=True)
        model.to(dev)  # type: ignore[arg-type]  # transformers types .to() oddly
        info = model_info("depth", BACKEND, MODEL, dist="transformers", device=dev, weights=verified, dtype=dtype)
        return cls(model, processor, info, dtype=dtype)

    def disparity(self, images: Sequence[Image]) -> list[NDArray[np.float32]]:
        """One (H, W) disparity map per image, at the image's size."""
        return self.run_prepared([self.prepare(im) for im in images])

    def prepare(self, request: Image) -> PreparedImage:
        """The image checked and through the model's image processor (resize to a multiple of 14 near 518 px,
        normalisation), on the calling thread (``negt2i.stages.base.PreparesInputs``)."""
        hw = check_image(request)
        inputs = self.processor(images=[request], return_tensors="pt")
        return PreparedImage(hw, dict(inputs.items()))

    def run_prepared(self, prepared: Sequence[PreparedImage], /, **_: Any) -> list[NDArray[np.float32]]:
        """One disparity map per prepared image; images of equal size go through the model together,
        ``batch_size`` at a time."""
        import torch

        from negt2i.stages.torch_support import precision

        out: list[NDArray[np.float32] | None] = [None] * len(prepared)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, p in enumerate(prepared):
            groups.setdefault(p.shape_hw, []).append(i)
        for hw, members in groups.items():
            for start in range(0, len(members), self.batch_size):
                idx = members[start : start + self.batch_size]
                names = prepared[idx[0]].inputs
                inputs = {k: torch.cat([prepared[i].inputs[k] for i in idx]).to(self.device) for k in names}
                with precision(self.device, self.dtype):
                    predicted = self.model(**inputs).predicted_depth
                for i, disp in zip(idx, resize_disparity(predicted, hw), strict=True):
                    out[i] = disp
        return [d for d in out if d is not None]


register("depth", BACKEND, DepthAnythingEstimator.from_weights, model=MODEL, weights=BACKEND)
