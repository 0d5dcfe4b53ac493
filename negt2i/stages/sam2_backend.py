"""SAM 2.1 hiera-small segmenter (``sam2.1-hiera-small``): detector boxes as box prompts.

Appendix C.1 / Table 15: detector boxes go to SAM as box prompts, 50 per call;
SAM returns three candidates per box (``multimask_output=True``) and the one that
overlaps the detector's own mask most is kept (SAM's confidence is ignored), then
closed with a radius-5 disk and stripped of components under 5% of the largest
(``negt2i.stages.common.refine_with_candidates``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from negt2i.core.config import CURRENT, RuleConfig
from negt2i.core.stage_types import Image, ModelInfo, applied
from negt2i.stages.base import RefineItem
from negt2i.stages.common import check_boxes, check_image, chunks, refine_with_candidates
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


@dataclass(frozen=True)
class PreparedBoxes:
    """One segmenter request prepared for the model: the image's size, its checked boxes and reference masks,
    and the transformed image (3, S, S) (None without boxes)."""

    shape_hw: tuple[int, int]
    boxes: NDArray[np.float32]
    reference_masks: NDArray[np.bool_]
    pixels: Any


class SAM2Segmenter:
    """Wraps a ``SAM2ImagePredictor`` (which holds the current images: calls are serialised by a lock).

    ``refine_batch`` encodes up to ``image_batch_size`` images in one backbone call; ``dtype`` (``fp32``,
    ``bf16``, ``fp16``) is the autocast precision of the model calls."""

    def __init__(
        self,
        predictor: Any,
        info: ModelInfo,
        *,
        config: RuleConfig = CURRENT,
        dtype: str = "fp32",
        image_batch_size: int = 8,
    ) -> None:
        from negt2i.stages.torch_support import DTYPES, check_dtype

        self.predictor = predictor
        self.dtype = check_dtype(dtype)
        self.info = info.model_copy(update={"dtype": DTYPES[self.dtype]})
        self.config = config
        self.image_batch_size = image_batch_size
        self._lock = threading.Lock()

    @classmethod
    def from_weights(
        cls,
        *,
        device: str = "auto",
        weights_dir: str | Path | None = None,
        config: RuleConfig = CURRENT,
        dtype: str = "fp32",
        **_: Any,
    ) -> SAM2Segmenter:
        """Load SAM 2.1 hiera-small from the weights cache (``negt2i weights fetch``)."""
        from negt2i import weights
        from negt2i.stages.torch_support import model_info, resolve_device

        verified = weights.verify(BACKEND, weights_dir)
        dev = resolve_device(device)
        model = build_model(verified.path("sam2.1_hiera_small.pt"), dev)
        return cls(
            make_predictor(model),
            applied(
                model_info("segmenter", BACKEND, MODEL, dist="sam2", device=dev, weights=verified, dtype=dtype), config
            ),
            config=config,
            dtype=dtype,
        )

    def candidates(self, boxes: NDArray[np.float32], shape_hw: tuple[int, int], img_idx: int = -1) -> NDArray[np.bool_]:
        """SAM's three candidate masks (k, 3, H, W) per box, for image ``img_idx`` of those last set on the
        predictor (``set_image`` or ``set_image_batch``)."""
        from negt2i.stages.torch_support import precision

        p = self.predictor
        with precision(p.device, self.dtype):
            mask_input, coords, labels, box = p._prep_prompts(
                None, None, np.asarray(boxes, np.float32), None, True, img_idx=img_idx
            )
            masks, _, _ = p._predict(coords, labels, box, mask_input, True, return_logits=False, img_idx=img_idx)
        return np.asarray(masks.cpu().numpy(), dtype=bool).reshape(len(boxes), -1, *shape_hw)

    def refine(self, image: Image, boxes: NDArray[np.float32], reference_masks: NDArray[np.bool_]) -> NDArray[np.bool_]:
        """Refined masks (K, H, W); see the module docstring."""
        return self.refine_batch([(image, boxes, reference_masks)])[0]

    def refine_batch(self, items: Sequence[RefineItem]) -> list[NDArray[np.bool_]]:
        """``refine`` for many images: the images with boxes are encoded ``image_batch_size`` at a time in one
        backbone call, then each image's boxes are prompted in chunks as in ``refine``. Same output as
        ``refine`` per image."""
        return self.run_prepared([self.prepare(item) for item in items])

    def prepare(self, request: RefineItem) -> PreparedBoxes:
        """The request checked and its image through SAM 2's transform (``SAM2Transforms``: tensor, resize to
        the model's input size, normalisation), on the calling thread (``negt2i.stages.base.PreparesInputs``);
        no transform for an image without boxes (nothing to refine)."""
        image, boxes, refs = request
        hw = check_image(image)
        b = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
        r = np.asarray(refs, dtype=bool)
        check_boxes(b, r, hw)
        pixels = None
        if b.shape[0]:
            from negt2i.stages.torch_support import precision

            t = self.predictor._transforms
            with precision(self.predictor.device, self.dtype):  # the context set_image_batch transforms in
                pixels = t.transforms(t.to_tensor(np.ascontiguousarray(image)))
        return PreparedBoxes(hw, b, r, pixels)

    def run_prepared(self, prepared: Sequence[PreparedBoxes], /, **_: Any) -> list[NDArray[np.bool_]]:
        """Refined masks per prepared request: the transformed images encoded ``image_batch_size`` at a time
        (as ``SAM2ImagePredictor.set_image_batch`` does with them), each image's boxes prompted in chunks."""
        from negt2i.stages.torch_support import precision

        out: list[NDArray[np.bool_]] = [np.zeros((0, *p.shape_hw), dtype=bool) for p in prepared]
        todo = [i for i, p in enumerate(prepared) if p.pixels is not None]
        with self._lock:
            for part in chunks(len(todo), self.image_batch_size):
                group = todo[part]
                with precision(self.predictor.device, self.dtype):
                    self._encode([prepared[i] for i in group])
                try:
                    for j, i in enumerate(group):
                        p = prepared[i]
                        out[i] = refine_with_candidates(
                            p.shape_hw, p.boxes, p.reference_masks,
                            partial(self.candidates, shape_hw=p.shape_hw, img_idx=j), self.config,
                        )  # fmt: skip
                finally:
                    self.predictor.reset_predictor()
        return out

    def _encode(self, prepared: Sequence[PreparedBoxes]) -> None:
        """``SAM2ImagePredictor.set_image_batch`` on images already through its transform: the image encoder
        over the batch, the features kept on the predictor for ``candidates``."""
        import torch

        p = self.predictor
        p.reset_predictor()
        p._orig_hw = [x.shape_hw for x in prepared]
        img_batch = torch.stack([x.pixels for x in prepared], dim=0).to(p.device)
        model = p.model
        backbone_out = model.forward_image(img_batch)
        _, vision_feats, _, _ = model._prepare_backbone_features(backbone_out)
        if model.directly_add_no_mem_embed:  # as set_image_batch: no_mem_embed on the lowest-resolution map
            vision_feats[-1] = vision_feats[-1] + model.no_mem_embed
        n = img_batch.shape[0]
        feats = [
            feat.permute(1, 2, 0).view(n, -1, *size)
            for feat, size in zip(vision_feats[::-1], p._bb_feat_sizes[::-1], strict=True)
        ][::-1]
        p._features = {"image_embed": feats[-1], "high_res_feats": feats[:-1]}
        p._is_image_set = True
        p._is_batch = True


register("segmenter", BACKEND, SAM2Segmenter.from_weights, model=MODEL, weights=BACKEND)
