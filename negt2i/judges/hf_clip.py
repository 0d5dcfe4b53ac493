"""Score-only baselines on ``transformers`` CLIP models (Table 7, "Similarity and reward"): PickScore and
NegationCLIP.

Both write ``score = logit_scale.exp() * cosine(image embedding, prompt embedding)``, exactly as PickScore's
model card computes it (``model.logit_scale.exp() * (text_embs @ image_embs.T)`` on L2-normalised
``get_image_features`` / ``get_text_features``); the prompt is tokenised with ``padding=True,
truncation=True, max_length=77``. Rank statistics are unchanged by the positive factor ``logit_scale.exp()``.

- ``pickscore-v1``: ``yuvalkirstain/PickScore_v1`` (CLIP ViT-H/14 fine-tuned on Pick-a-Pic), with the image
  processor and tokenizer of ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K`` as its model card loads them: two
  weights entries, ``pickscore-v1`` and ``pickscore-processor``.
- ``negationclip``: a CLIP whose text encoder is fine-tuned for negation (the paper's reference [47]). No
  repository is pinned here (none could be confirmed offline): the user places a ``transformers``
  ``CLIPModel`` checkpoint with its processor files in the cache folder ``negationclip/`` and records it
  (``negt2i weights record negationclip --revision REV``); see docs/weights.md.

``--random-init`` builds a tiny random ``CLIPModel`` (32 px, one layer per tower) with a real
``CLIPImageProcessor`` and an in-memory byte-level tokenizer that brackets every text with
``<|startoftext|>`` / ``<|endoftext|>`` as CLIP's does (the text tower pools at the end token), offline.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from negt2i.judges.base import JudgeInfo
from negt2i.judges.registry import JudgeBackend, register

if TYPE_CHECKING:
    from PIL import Image as PILImage

MAX_TOKENS: Final = 77
"""CLIP's text context: longer prompts are truncated (as the model card does)."""


class HFCLIPScore:
    """A ``transformers`` ``CLIPModel`` with its image processor and tokenizer: logit_scale * cosine."""

    def __init__(self, model: Any, image_processor: Any, tokenizer: Any, info: JudgeInfo) -> None:
        self.model = model.eval()
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "right"
        self.info = info
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype

    def score_batch(self, items: Sequence[tuple[PILImage.Image, str]]) -> list[float]:
        import torch
        import torch.nn.functional as F

        if not items:
            return []
        pixels = self.image_processor(images=[im.convert("RGB") for im, _ in items], return_tensors="pt")
        tokens = self.tokenizer([t for _, t in items], padding=True, truncation=True, max_length=MAX_TOKENS,
                                return_tensors="pt")  # fmt: skip
        with torch.inference_mode():
            img = self.model.get_image_features(pixel_values=pixels["pixel_values"].to(self.device, self.dtype))
            txt = self.model.get_text_features(
                input_ids=tokens["input_ids"].to(self.device), attention_mask=tokens["attention_mask"].to(self.device)
            )
            img, txt = _features(img), _features(txt)
            cos = (F.normalize(img.float(), dim=-1) * F.normalize(txt.float(), dim=-1)).sum(dim=-1)
            scores = self.model.logit_scale.exp().float() * cos
        return [float(v) for v in scores.tolist()]


def _features(out: Any) -> Any:
    """The embedding tensor (transformers 5 may return a model output whose ``pooler_output`` holds it)."""
    import torch

    return out if isinstance(out, torch.Tensor) else out.pooler_output


def tiny_clip(seed: int = 0) -> tuple[Any, Any, Any]:
    """A random ``CLIPModel`` of ~36k parameters, a 32 px ``CLIPImageProcessor`` and a byte-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|startoftext|>", "<|endoftext|>"])
    bos, eos = tok.token_to_id("<|startoftext|>"), tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>", special_tokens=[("<|startoftext|>", bos), ("<|endoftext|>", eos)]
    )
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call, unused-ignore]
        tokenizer_object=tok, bos_token="<|startoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        model_max_length=MAX_TOKENS,
    )  # fmt: skip
    config = CLIPConfig(
        text_config={"vocab_size": tok.get_vocab_size(), "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": MAX_TOKENS,
                     "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        projection_dim=16,
    )  # fmt: skip
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    torch.manual_seed(seed)
    return CLIPModel(config).eval(), image_processor, tokenizer  # type: ignore[no-untyped-call, unused-ignore]


def _build(name: str, processor_entry: str | None) -> Any:
    def build(
        *, device: str = "auto", weights_dir: str | Path | None = None, dtype: str = "auto", random_init: bool = False
    ) -> HFCLIPScore:
        from negt2i.judges._torch import loaded_info, resolve

        row = ROWS[name]
        dev, torch_dtype = resolve(device, "fp32" if dtype == "auto" else dtype)
        if random_init:
            model, image_processor, tokenizer = tiny_clip()
            revision, sha = "random-init", ""
        else:
            from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

            from negt2i import weights

            weights.require([name, *([processor_entry] if processor_entry else [])], weights_dir)
            verified = weights.verify(name, weights_dir)
            processor_folder = weights.verify(processor_entry, weights_dir).folder if processor_entry else None
            source = processor_folder or verified.folder
            image_processor = AutoImageProcessor.from_pretrained(source, local_files_only=True)  # type: ignore[no-untyped-call, unused-ignore]
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
            model = CLIPModel.from_pretrained(verified.folder, dtype=torch_dtype, local_files_only=True)
            revision, sha = verified.revision, verified.sha256
        model = model.to(device=dev, dtype=torch_dtype)
        info = loaded_info(
            row.label,
            kind="score",
            model_name=row.model,
            random_init=random_init,
            revision=revision,
            sha256=sha,
            dist="transformers",
            device=dev,
            dtype=torch_dtype,
            model=model,
        )
        return HFCLIPScore(model, image_processor, tokenizer, info)

    return build


# fmt: off
ROWS: Final[dict[str, JudgeBackend]] = {
    "pickscore-v1": JudgeBackend("pickscore-v1", "score", _build("pickscore-v1", "pickscore-processor"),
                                 label="PickScore", params="986M", weights="pickscore-v1",
                                 model="yuvalkirstain/PickScore_v1", extra_weights=("pickscore-processor",)),
    "negationclip": JudgeBackend("negationclip", "score", _build("negationclip", None), label="NegationCLIP",
                                 params="-", weights="negationclip", model="user-supplied CLIP checkpoint"),
}
# fmt: on
for _row in ROWS.values():
    register(_row)

__all__ = ["ROWS", "HFCLIPScore", "tiny_clip"]
