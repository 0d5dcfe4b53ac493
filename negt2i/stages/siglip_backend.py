"""SigLIP 2 attribute scorer (``siglip2-so400m-378``): colour and material of instance crops.

Appendix C.1 / Table 15: ``ViT-SO400M-14-SigLIP2-378`` (pretrained ``webli``,
through ``open_clip``). Each instance is cropped to its mask's box with the
pixels outside the detector mask filled with gray ``#999`` (no SAM), and scored
against one text embedding per answer as 100 x the cosine similarity of the image
and text embeddings. The text embedding of an answer comes from the rule config's
template set (``attributes.text_templates``, ``negt2i.core.config.TEXT_TEMPLATES``): one
prompt (``single``, the default), or GenEval's three colour templates whose normalised
embeddings are averaged and normalised again (``geneval``). Text embeddings are cached
per (template set, class, answers).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from negt2i.core.config import CURRENT, TEXT_TEMPLATES, RuleConfig
from negt2i.core.perception import mask_to_xyxy
from negt2i.core.vocab import MATERIALS
from negt2i.stages.base import Image, ModelInfo, ScoreItem, applied
from negt2i.stages.common import check_image, check_instance_masks, masked_crop
from negt2i.stages.registry import register

BACKEND: Final = "siglip2-so400m-378"
MODEL: Final = "ViT-SO400M-14-SigLIP2-378/webli"

TEMPLATE: Final = TEXT_TEMPLATES["single"][0]
"""Text prompt per answer, e.g. ``a photo of an orange cup.`` or ``a photo of a wooden chair.``."""


def text_prompt(value: str, class_name: str) -> str:
    """The text prompt for one answer of one class (the ``single`` template set)."""
    article = "an" if value[:1].lower() in "aeiou" else "a"
    return TEMPLATE.format(article=article, value=value, class_name=class_name)


def text_prompts(value: str, class_name: str, templates: str = "single") -> list[str]:
    """The prompts whose embeddings make one answer's text embedding under a template set
    (``negt2i.core.config.TEXT_TEMPLATES``): GenEval's three for a colour under ``geneval``, else the single one."""
    if templates == "single" or value in MATERIALS:
        return [text_prompt(value, class_name)]
    return [t.format(value=value, class_name=class_name) for t in TEXT_TEMPLATES[templates]]


def crops(image: Image, masks: NDArray[np.bool_]) -> list[Image]:
    """One gray-filled crop per mask, cut to the mask's tight box (the whole image for an empty mask)."""
    hw = check_image(image)
    out = []
    for mask in masks:
        box = mask_to_xyxy(mask)
        if box[2] <= box[0]:
            box = (0.0, 0.0, float(hw[1]), float(hw[0]))
        out.append(masked_crop(image, box, mask))
    return out


@dataclass(frozen=True)
class PreparedCrops:
    """One attribute request prepared for the model: its class names and answers, and one preprocessed crop
    tensor (3, 378, 378) per instance (none when there is nothing to score)."""

    class_names: tuple[str, ...]
    answers: tuple[str, ...]
    pixels: list[Any]


class SigLIPScorer:
    """Wraps an ``open_clip`` model, its evaluation transform and tokenizer."""

    def __init__(
        self,
        model: Any,
        preprocess: Callable[[Any], Any],
        tokenizer: Callable[[list[str]], Any],
        info: ModelInfo,
        *,
        batch_size: int = 16,
        dtype: str = "fp32",
        config: RuleConfig = CURRENT,
    ) -> None:
        """``config``: the rule config whose ``attributes.text_templates`` the text embeddings use."""
        import torch

        from negt2i.stages.torch_support import DTYPES, check_dtype

        self.config = config
        self.model = model.eval()
        self.preprocess = preprocess
        self.tokenizer = tokenizer
        self.dtype = check_dtype(dtype)
        self.info = info.model_copy(update={"dtype": DTYPES[self.dtype]})
        self.device = next(model.parameters()).device
        self.batch_size = batch_size
        self._text_cache: dict[tuple[str, str, tuple[str, ...]], torch.Tensor] = {}

    @classmethod
    def from_weights(
        cls,
        *,
        device: str = "auto",
        weights_dir: str | Path | None = None,
        config: RuleConfig = CURRENT,
        dtype: str = "fp32",
        **_: Any,
    ) -> SigLIPScorer:
        """Load SigLIP 2 SO400M/14 at 378 px from the weights cache (``negt2i weights fetch``)."""
        import open_clip

        from negt2i import weights
        from negt2i.stages.torch_support import model_info, resolve_device

        verified = weights.verify(BACKEND, weights_dir)
        dev = resolve_device(device)
        source = f"local-dir:{verified.folder}"
        model, _, preprocess = open_clip.create_model_and_transforms(source, device=dev)
        tokenizer = open_clip.get_tokenizer(source)
        info = model_info("attributes", BACKEND, MODEL, dist="open_clip_torch", device=dev, weights=verified,
                          dtype=dtype)  # fmt: skip
        return cls(model, preprocess, tokenizer, applied(info, config), dtype=dtype, config=config)

    def text_embeddings(self, class_name: str, answers: Sequence[str]) -> Any:
        """Unit-norm text embeddings (len(answers), D) for one class under the config's template set, cached:
        one prompt's embedding per answer, or (several templates) the mean of the answer's normalised prompt
        embeddings, normalised again (``clip_benchmark``'s ``zero_shot_classifier``, as GenEval)."""
        import torch
        import torch.nn.functional as F

        from negt2i.stages.torch_support import precision

        templates = self.config.attributes.text_templates
        key = (templates, class_name, tuple(answers))
        if key not in self._text_cache:
            prompts = [text_prompts(a, class_name, templates) for a in answers]
            if all(len(p) == 1 for p in prompts):
                tokens = self.tokenizer([p[0] for p in prompts]).to(self.device)
                with precision(self.device, self.dtype):
                    self._text_cache[key] = F.normalize(self.model.encode_text(tokens).float(), dim=-1)
            else:
                tokens = self.tokenizer([t for p in prompts for t in p]).to(self.device)
                with precision(self.device, self.dtype):
                    each = F.normalize(self.model.encode_text(tokens).float(), dim=-1)
                    ends = np.cumsum([0, *(len(p) for p in prompts)])
                    means = [each[a:b].mean(dim=0) for a, b in itertools.pairwise(ends)]
                    self._text_cache[key] = F.normalize(torch.stack(means), dim=-1)
        return self._text_cache[key]

    def score(
        self,
        image: Image,
        masks: NDArray[np.bool_],
        class_names: Sequence[str],
        answers: Sequence[str],
    ) -> NDArray[np.float32]:
        """Scores (K, len(answers)): 100 x cosine(crop, prompt) per instance and answer."""
        return self.score_batch([(image, masks, class_names, answers)])[0]

    def score_batch(self, items: Sequence[ScoreItem]) -> list[NDArray[np.float32]]:
        """``score`` for many images: the crops of all images go through the image tower together,
        ``batch_size`` crops per forward pass. Same scores as ``score`` per image."""
        return self.run_prepared([self.prepare(item) for item in items])

    def prepare(self, request: ScoreItem) -> PreparedCrops:
        """The request checked, its gray-filled crops through the evaluation transform (``preprocess``: PIL
        resize and normalisation), on the calling thread (``negt2i.stages.base.PreparesInputs``)."""
        from PIL import Image as PILImage

        image, masks, class_names, answers = request
        hw = check_image(image)
        checked = check_instance_masks(masks, hw, len(class_names))
        pixels: list[Any] = []
        if len(class_names) and answers:
            pixels = [self.preprocess(PILImage.fromarray(crop)) for crop in crops(image, checked)]
        return PreparedCrops(tuple(class_names), tuple(answers), pixels)

    def run_prepared(self, prepared: Sequence[PreparedCrops], /, **_: Any) -> list[NDArray[np.float32]]:
        """Scores per prepared request: the crops of all requests through the image tower together,
        ``batch_size`` crops per forward pass."""
        import torch
        import torch.nn.functional as F

        from negt2i.stages.torch_support import precision

        outs = [np.zeros((len(p.class_names), len(p.answers)), dtype=np.float32) for p in prepared]
        owners = [(i, k) for i, p in enumerate(prepared) for k in range(len(p.pixels))]  # of every crop, in order
        pixels = [x for p in prepared for x in p.pixels]
        for start in range(0, len(pixels), self.batch_size):
            batch = torch.stack(pixels[start : start + self.batch_size]).to(self.device)
            with precision(self.device, self.dtype):
                feats = F.normalize(self.model.encode_image(batch).float(), dim=-1)
            for j in range(feats.shape[0]):
                i, k = owners[start + j]
                p = prepared[i]
                text = self.text_embeddings(p.class_names[k], p.answers)
                outs[i][k] = (100.0 * feats[j] @ text.T).cpu().numpy()
        return outs


register("attributes", BACKEND, SigLIPScorer.from_weights, model=MODEL, weights=BACKEND)
