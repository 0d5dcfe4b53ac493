"""A tiny random-weight Stable Diffusion pipeline, built offline and saved with ``save_pretrained``.

The real loading path (``DiffusionPipeline.from_pretrained`` on a folder) is what the
tests exercise; only the sizes are tiny: a 2-block UNet, a 2-block VAE (32 px images
have 16 px latents), a 2-layer CLIP text encoder and a character-level CLIP tokenizer
whose vocabulary the test writes itself.
"""

from __future__ import annotations

from pathlib import Path

CONTEXT = 32
"""Text tokens (and the text encoder's positions)."""


def tokenizer_vocab() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    vocab: dict[str, int] = {}
    for c in chars:
        vocab[c] = len(vocab)
    for c in chars:
        vocab[c + "</w>"] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return vocab


def text_encoder(seed: int):  # type: ignore[no-untyped-def]
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel

    vocab = tokenizer_vocab()
    torch.manual_seed(seed)
    config = CLIPTextConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
        max_position_embeddings=CONTEXT, bos_token_id=vocab["<|startoftext|>"], eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=vocab["<|endoftext|>"], projection_dim=32,
    )  # fmt: skip
    return CLIPTextModel(config).eval()


def build_pipeline(folder: Path, seed: int = 0) -> Path:
    """Save a random-weight StableDiffusionPipeline to ``folder``; returns it."""
    import torch
    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTokenizer

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=16, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, norm_num_groups=8, attention_head_dim=4,
    )  # fmt: skip
    vae = AutoencoderKL(
        block_out_channels=(8, 16), in_channels=3, out_channels=3, latent_channels=4, norm_num_groups=8,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, sample_size=32,
    )  # fmt: skip
    pipe = StableDiffusionPipeline(
        unet=unet, vae=vae, text_encoder=text_encoder(seed),
        scheduler=PNDMScheduler(skip_prk_steps=True, steps_offset=1),
        tokenizer=CLIPTokenizer(vocab=tokenizer_vocab(), merges=[], model_max_length=CONTEXT),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip
    pipe.save_pretrained(folder)
    return folder


def save_text_encoder(folder: Path, seed: int) -> Path:
    """A second text encoder (another seed), as a transformers folder: the NegationCLIP swap, in small."""
    text_encoder(seed).save_pretrained(folder)
    return folder
