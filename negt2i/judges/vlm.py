"""VQA judges through ``transformers``: Qwen2.5-VL-7B, Qwen3-VL-8B, InternVL3.5-8B (Section 4, Table 2).

Each question is asked as one user turn (the image, then ``QUESTION Please answer yes or no.``) through the
model's own chat template, with the assistant turn opened; one forward pass gives the distribution of the
first answer token. ``p_yes`` is the probability of the "yes" tokens (``Yes``, ``yes`` and their
space-prefixed forms that are single tokens in the vocabulary), ``p_no`` that of the "no" tokens: the
probability of the answer token, as the paper scores judges (Appendix B.2); nothing is generated.
Batches are left-padded, so a batch gives each question the probabilities it gets alone (up to float
rounding; ``tests/judges`` checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from negt2i.judges.base import JudgeInfo
from negt2i.judges.registry import JudgeBackend, register

if TYPE_CHECKING:
    from PIL import Image as PILImage

SUFFIX: Final = " Please answer yes or no."
"""Appended to every question (the wording VQAScore and the paper's judges use)."""
YES_WORDS: Final = ("Yes", "yes", " Yes", " yes")
NO_WORDS: Final = ("No", "no", " No", " no")


def answer_token_ids(tokenizer: Any, words: Sequence[str]) -> list[int]:
    """Ids of the words that are one token in the vocabulary (at least one must be)."""
    out: list[int] = []
    for w in words:
        ids = tokenizer.encode(w, add_special_tokens=False)
        if len(ids) == 1 and ids[0] not in out:
            out.append(int(ids[0]))
    if not out:
        raise ValueError(f"none of {', '.join(repr(w) for w in words)} is a single token of this tokenizer")
    return out


class TransformersJudge:
    """A ``transformers`` image-text-to-text model and its processor, asked yes / no questions."""

    def __init__(self, model: Any, processor: Any, info: JudgeInfo) -> None:
        import torch

        self.model = model.eval()
        self.processor = processor
        self.processor.tokenizer.padding_side = "left"
        self.info = info
        self.device = next(model.parameters()).device
        tok = processor.tokenizer
        self.yes = torch.tensor(answer_token_ids(tok, YES_WORDS), device=self.device)
        self.no = torch.tensor(answer_token_ids(tok, NO_WORDS), device=self.device)

    def prompt(self, question: str) -> str:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question + SUFFIX}]}]
        text: str = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return text

    def answer_batch(self, items: Sequence[tuple[PILImage.Image, str]]) -> list[tuple[float, float]]:
        import torch

        if not items:
            return []
        texts = [self.prompt(q) for _, q in items]
        inputs = self.processor(text=texts, images=[im for im, _ in items], return_tensors="pt", padding=True)
        inputs = inputs.to(self.device)
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(self.model.dtype)
        with torch.inference_mode():
            logits = self.model(**inputs).logits[:, -1, :].float()
        probs = torch.softmax(logits, dim=-1)
        p_yes = probs[:, self.yes].sum(dim=-1).tolist()
        p_no = probs[:, self.no].sum(dim=-1).tolist()
        return [(float(y), float(n)) for y, n in zip(p_yes, p_no, strict=True)]


def _factory(name: str, tiny: Callable[[], tuple[Any, Any]]) -> Callable[..., TransformersJudge]:
    def build(
        *, device: str = "auto", weights_dir: str | Path | None = None, dtype: str = "auto", random_init: bool = False
    ) -> TransformersJudge:
        from negt2i.judges._torch import loaded_info, resolve

        row = ROWS[name]
        dev, torch_dtype = resolve(device, dtype)
        if random_init:
            model, processor = tiny()
            revision, sha = "random-init", ""
        else:
            from transformers import AutoModelForImageTextToText, AutoProcessor

            from negt2i import weights

            verified = weights.verify(name, weights_dir)
            processor = AutoProcessor.from_pretrained(verified.folder, local_files_only=True)  # type: ignore[no-untyped-call]
            model = AutoModelForImageTextToText.from_pretrained(
                verified.folder, dtype=torch_dtype, local_files_only=True
            )
            revision, sha = verified.revision, verified.sha256
        model = model.to(device=dev, dtype=torch_dtype)
        info = loaded_info(
            row.label,
            kind="vqa",
            model_name=row.model,
            random_init=random_init,
            revision=revision,
            sha256=sha,
            dist="transformers",
            device=dev,
            dtype=torch_dtype,
            model=model,
        )
        return TransformersJudge(model, processor, info)

    return build


def _tiny(family: str) -> Callable[[], tuple[Any, Any]]:
    def build() -> tuple[Any, Any]:
        from negt2i.judges import tiny

        return {"qwen2.5-vl": tiny.tiny_qwen2_5_vl, "qwen3-vl": tiny.tiny_qwen3_vl, "internvl": tiny.tiny_internvl}[
            family
        ]()

    return build


ROWS: Final[dict[str, JudgeBackend]] = {}
for _name, _label, _params, _repo, _family in (
    ("qwen2.5-vl-7b", "Qwen2.5-VL-7B", "7B", "Qwen/Qwen2.5-VL-7B-Instruct", "qwen2.5-vl"),
    ("qwen3-vl-8b", "Qwen3-VL-8B", "8B", "Qwen/Qwen3-VL-8B-Instruct", "qwen3-vl"),
    ("internvl3.5-8b", "InternVL3.5-8B", "8B", "OpenGVLab/InternVL3_5-8B-HF", "internvl"),
    # the paper's other transformers judges: same model classes, so the same code and tiny test models
    ("internvl3-8b", "InternVL3-8B", "8B", "OpenGVLab/InternVL3-8B-hf", "internvl"),
    ("qwen3-vl-32b", "Qwen3-VL-32B", "32B", "Qwen/Qwen3-VL-32B-Instruct", "qwen3-vl"),
    ("internvl3.5-38b", "InternVL3.5-38B", "38B", "OpenGVLab/InternVL3_5-38B-HF", "internvl"),
):
    ROWS[_name] = JudgeBackend(
        _name, "vqa", _factory(_name, _tiny(_family)), label=_label, params=_params, weights=_name, model=_repo
    )
    register(ROWS[_name])

__all__ = ["ROWS", "SUFFIX", "TransformersJudge", "answer_token_ids"]
