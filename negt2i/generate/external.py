"""Generators for the paper's models that diffusers does not cover: Janus-Pro-7B and BLIP3-o NEXT.

Both need their authors' code, which is not on PyPI; these entries give one clear
message saying what to install, and where a user registers their own generator
instead (``NEGT2I_GENERATOR_MODULES``, docs/generate.md). Janus-Pro is
implemented after the official example (``generation_inference.py`` of
github.com/deepseek-ai/Janus: 576 image tokens, CFG weight 5, temperature 1,
384^2); it could not be run here (no ``janus`` package, no weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from negt2i.generate.registry import GenerateError, register_generator

if TYPE_CHECKING:
    from PIL import Image as PILImage

    from negt2i.generate.presets import ModelSpec


class JanusProGenerator:  # pragma: no cover - needs the janus package and 15 GB of weights
    """Janus-Pro text-to-image with the official sampling loop (one torch.Generator per sample)."""

    IMAGE_TOKENS = 576
    PATCH = 16

    def __init__(self, spec: ModelSpec, *, device: str, dtype: str, allow_download: bool = False) -> None:
        try:
            from janus.models import MultiModalityCausalLM, VLChatProcessor
        except ImportError:
            raise GenerateError(
                "janus-pro-7b needs the `janus` package: pip install git+https://github.com/deepseek-ai/Janus "
                "(then fetch the weights: hf download deepseek-ai/Janus-Pro-7B)"
            ) from None
        import torch

        from negt2i.generate.diffusers_backend import load_or_explain, torch_dtype

        self.spec = spec
        self.device = device
        self.dtype = torch_dtype(dtype)
        kwargs: dict[str, Any] = {"local_files_only": not allow_download, "revision": spec.revision}
        self.processor = load_or_explain(VLChatProcessor.from_pretrained, spec.model, kwargs)
        model = load_or_explain(MultiModalityCausalLM.from_pretrained, spec.model, kwargs)
        self.model = model.to(self.dtype).to(device).eval()
        self._torch = torch

    def info(self) -> dict[str, Any]:
        return {"pipeline": "janus.MultiModalityCausalLM", "scheduler": None, "image_tokens": self.IMAGE_TOKENS}

    def generate(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[PILImage.Image]:
        return [self._one(p, s) for p, s in zip(prompts, seeds, strict=True)]

    def _one(self, prompt: str, seed: int) -> PILImage.Image:
        import numpy as np
        from PIL import Image

        torch = self._torch
        cfg = float(self.spec.guidance or 5.0)
        temperature = float(dict(self.spec.options).get("temperature", 1.0))
        conversation = [{"role": "<|User|>", "content": prompt}, {"role": "<|Assistant|>", "content": ""}]
        template = self.processor.apply_sft_template_for_multi_turn_prompts(
            conversations=conversation, sft_format=self.processor.sft_format, system_prompt=""
        )
        text = template + self.processor.image_start_tag
        ids = torch.LongTensor(self.processor.tokenizer.encode(text)).to(self.device)
        tokens = ids.repeat(2, 1)
        tokens[1, 1:-1] = self.processor.pad_id  # the unconditional row
        embeds = self.model.language_model.get_input_embeddings()(tokens)
        generator = torch.Generator(self.device).manual_seed(seed)
        out = torch.zeros((1, self.IMAGE_TOKENS), dtype=torch.int, device=self.device)
        past = None
        with torch.inference_mode():
            for i in range(self.IMAGE_TOKENS):
                o = self.model.language_model.model(inputs_embeds=embeds, use_cache=True, past_key_values=past)
                past = o.past_key_values
                logits = self.model.gen_head(o.last_hidden_state[:, -1, :])
                logits = logits[1:] + cfg * (logits[:1] - logits[1:])
                probs = torch.softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(probs, num_samples=1, generator=generator)
                out[:, i] = nxt.squeeze(-1)
                nxt2 = torch.cat([nxt, nxt], dim=1).view(-1)
                embeds = self.model.prepare_gen_img_embeds(nxt2).unsqueeze(1)
            side = self.spec.width // self.PATCH
            dec = self.model.gen_vision_model.decode_code(out, shape=[1, 8, side, side])
        arr = dec.to(torch.float32).cpu().numpy().transpose(0, 2, 3, 1)
        arr = np.clip((arr + 1) / 2 * 255, 0, 255).astype(np.uint8)
        return Image.fromarray(arr[0])


def _blip3o(spec: ModelSpec, **_: Any) -> Any:
    raise GenerateError(
        f"{spec.label} is not a diffusers pipeline and its code (github.com/JiuhaiChen/BLIP3o, BLIP3o-NEXT) is not "
        "packaged: register a generator named 'blip3o-next' in a module listed in NEGT2I_GENERATOR_MODULES "
        "(docs/generate.md, 'Adding a model'); weights: hf download BLIP3o/BLIP3o-NEXT-SFT-3B"
    )


register_generator("janus-pro", JanusProGenerator)
register_generator("blip3o-next", _blip3o)
