"""Score-only baselines through ``open_clip`` (Table 7, "Similarity and reward"): CLIPScore.

CLIPScore here is the cosine similarity of the image embedding and the embedding of the full prompt
(Appendix B.2), ViT-B/32 with OpenAI's weights (the CLIPScore paper's model), through ``open_clip`` from
the Hugging Face repository ``timm/vit_base_patch32_clip_224.openai``. Rank statistics are unchanged by
CLIPScore's rescaling ``2.5 * max(cos, 0)`` except for ties at 0, so the raw cosine is written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from negt2i.judges.base import JudgeInfo
from negt2i.judges.registry import JudgeBackend, register

if TYPE_CHECKING:
    from PIL import Image as PILImage

NAME = "clipscore-vit-b-32"


class OpenCLIPScore:
    """An ``open_clip`` model, its evaluation transform and tokenizer: cosine(image, prompt)."""

    def __init__(self, model: Any, preprocess: Callable[[Any], Any], tokenizer: Callable[[list[str]], Any],
                 info: JudgeInfo) -> None:  # fmt: skip
        self.model = model.eval()
        self.preprocess = preprocess
        self.tokenizer = tokenizer
        self.info = info
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype

    def score_batch(self, items: Sequence[tuple[PILImage.Image, str]]) -> list[float]:
        import torch
        import torch.nn.functional as F

        if not items:
            return []
        pixels = torch.stack([self.preprocess(im) for im, _ in items]).to(self.device, self.dtype)
        tokens = self.tokenizer([t for _, t in items]).to(self.device)
        with torch.inference_mode():
            img = F.normalize(self.model.encode_image(pixels).float(), dim=-1)
            txt = F.normalize(self.model.encode_text(tokens).float(), dim=-1)
        return [float(v) for v in (img * txt).sum(dim=-1).tolist()]


TINY_CFG: dict[str, Any] = {
    "embed_dim": 16,
    "vision_cfg": {"layers": 1, "width": 32, "head_width": 16, "patch_size": 8, "image_size": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
"""open_clip ``model_cfg`` of the tiny random CLIP (the form of an ``open_clip_config.json``)."""


def tiny_clip(seed: int = 0) -> tuple[Any, Callable[[Any], Any], Callable[[list[str]], Any]]:
    """A random CLIP of ~2M parameters (32 px, one layer per tower) with open_clip's packaged tokenizer."""
    import open_clip
    import torch
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    torch.manual_seed(seed)
    model = CLIP(
        embed_dim=TINY_CFG["embed_dim"],
        vision_cfg=CLIPVisionCfg(**TINY_CFG["vision_cfg"]),
        text_cfg=CLIPTextCfg(**TINY_CFG["text_cfg"]),
    )
    preprocess = open_clip.image_transform(32, is_train=False)
    return model, preprocess, open_clip.get_tokenizer("ViT-B-32")


def build(
    *, device: str = "auto", weights_dir: str | Path | None = None, dtype: str = "auto", random_init: bool = False
) -> OpenCLIPScore:
    from negt2i.judges._torch import loaded_info, resolve

    dev, torch_dtype = resolve(device, "fp32" if dtype == "auto" else dtype)
    if random_init:
        model, preprocess, tokenizer = tiny_clip()
        revision, sha = "random-init", ""
    else:
        import open_clip

        from negt2i import weights

        verified = weights.verify(NAME, weights_dir)
        source = f"local-dir:{verified.folder}"
        model, _, preprocess = open_clip.create_model_and_transforms(source)
        tokenizer = open_clip.get_tokenizer(source)
        revision, sha = verified.revision, verified.sha256
    model = model.to(device=dev, dtype=torch_dtype)
    info = loaded_info(
        "CLIPScore",
        kind="score",
        model_name="ViT-B-32/openai",
        random_init=random_init,
        revision=revision,
        sha256=sha,
        dist="open_clip_torch",
        device=dev,
        dtype=torch_dtype,
        model=model,
    )
    return OpenCLIPScore(model, preprocess, tokenizer, info)


register(JudgeBackend(NAME, "score", build, label="CLIPScore", params="151M", weights=NAME, model="ViT-B-32/openai"))
