"""Tiny random versions of the VQA judges' architectures, built offline (no weights, no downloads).

Each builds the real ``transformers`` model class from a configuration a few hundred thousand parameters
big, and a processor with the real image processor and a byte-level tokenizer made in memory (every text
encodes; ``Yes`` / ``No`` are single tokens as in the real vocabularies). Tests and the worked example of
``docs/agreement.md`` use them through ``negt2i judges run --random-init``: the probabilities are
meaningless, the path from question to probability is the real one.
"""

from __future__ import annotations

from typing import Any, Final

QWEN_SPECIALS: Final = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
    "<|video_pad|>",
)  # fmt: skip
INTERNVL_SPECIALS: Final = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<img>",
    "</img>",
    "<IMG_CONTEXT>",
    "<video>",
)
ANSWER_WORDS: Final = ("Yes", "yes", "No", "no")

_QWEN_TEMPLATE: Final = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for c in message['content'] %}{% if c['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_INTERNVL_TEMPLATE: Final = _QWEN_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "<IMG_CONTEXT>\n")

_TEXT: Final[dict[str, Any]] = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2,
}  # fmt: skip


def byte_tokenizer(specials: tuple[str, ...], extra: dict[str, str] | None = None) -> Any:
    """A byte-level BPE tokenizer without merges (any text encodes), the special tokens and the answer words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials))
    tok.add_tokens(list(ANSWER_WORDS))
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|im_end|>", extra_special_tokens=extra or {}
    )
    fast.padding_side = "left"
    return fast


def _ids(tok: Any, names: tuple[str, ...]) -> dict[str, int]:
    return {n: int(tok.convert_tokens_to_ids(n)) for n in names}


def tiny_qwen2_5_vl(seed: int = 0) -> tuple[Any, Any]:
    import torch
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    tok = byte_tokenizer(QWEN_SPECIALS)
    ids = _ids(tok, QWEN_SPECIALS)
    image_processor = Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
    processor = Qwen2_5_VLProcessor(  # type: ignore[no-untyped-call]
        image_processor=image_processor, tokenizer=tok, video_processor=Qwen2VLVideoProcessor(),
        chat_template=_QWEN_TEMPLATE,
    )  # fmt: skip
    config = Qwen2_5_VLConfig(
        text_config={**_TEXT, "vocab_size": len(tok), "max_position_embeddings": 4096,
                     "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]},
                     "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"]},
        vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "out_hidden_size": 32,
                       "fullatt_block_indexes": [1], "window_size": 56, "patch_size": 14, "spatial_merge_size": 2,
                       "temporal_patch_size": 2},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )  # fmt: skip
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(config).eval(), processor  # type: ignore[no-untyped-call]


def tiny_qwen3_vl(seed: int = 0) -> tuple[Any, Any]:
    import torch
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    tok = byte_tokenizer(QWEN_SPECIALS)
    ids = _ids(tok, QWEN_SPECIALS)
    image_processor = Qwen2VLImageProcessor(
        patch_size=16, merge_size=2, min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 16
    )
    processor = Qwen3VLProcessor(  # type: ignore[no-untyped-call]
        image_processor=image_processor, tokenizer=tok, video_processor=Qwen3VLVideoProcessor(),
        chat_template=_QWEN_TEMPLATE,
    )  # fmt: skip
    config = Qwen3VLConfig(
        text_config={**_TEXT, "vocab_size": len(tok), "head_dim": 8,
                     "rope_scaling": {"rope_type": "default", "mrope_section": [2, 1, 1], "mrope_interleaved": True},
                     "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"]},
        vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "out_hidden_size": 32,
                       "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                       "num_position_embeddings": 64, "deepstack_visual_indexes": [0]},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )  # fmt: skip
    torch.manual_seed(seed)
    return Qwen3VLForConditionalGeneration(config).eval(), processor  # type: ignore[no-untyped-call]


def tiny_internvl(seed: int = 0) -> tuple[Any, Any]:
    import torch
    from transformers import (
        GotOcr2ImageProcessor,
        InternVLConfig,
        InternVLForConditionalGeneration,
        InternVLProcessor,
        InternVLVideoProcessor,
    )

    extra = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
             "video_token": "<video>"}  # fmt: skip
    tok = byte_tokenizer(INTERNVL_SPECIALS, extra)
    ids = _ids(tok, INTERNVL_SPECIALS)
    processor = InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(size={"height": 28, "width": 28}, crop_to_patches=False),
        tokenizer=tok, video_processor=InternVLVideoProcessor(), image_seq_length=4, chat_template=_INTERNVL_TEMPLATE,
    )  # fmt: skip
    config = InternVLConfig(
        text_config={**_TEXT, "model_type": "qwen3", "vocab_size": len(tok), "head_dim": 8,
                     "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"]},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "image_size": [28, 28], "patch_size": [7, 7]},
        image_token_id=ids["<IMG_CONTEXT>"], image_seq_length=4, downsample_ratio=0.5,
    )  # fmt: skip
    torch.manual_seed(seed)
    return InternVLForConditionalGeneration(config).eval(), processor  # type: ignore[no-untyped-call]
