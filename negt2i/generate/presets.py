"""Model settings for ``negt2i generate``: the paper's eleven configurations (Appendix E.1, Table 18).

Protocol (Appendix E.1): four samples per prompt with seeds 42, 43, 44, 45; each
pipeline's *native* generation settings (steps and resolution of Table 18, the
guidance its model card registers); no prompt engineering; the CFG
negative-prompt field unused (``negt2i generate`` never passes one with content).

Our reading of "unused" for pipelines whose CFG is switched on only by a negative
prompt (diffusers' Qwen-Image: ``true_cfg_scale > 1 and negative_prompt is not
None``): the field carries no content, but the native configuration still runs CFG,
so such a preset passes the model card's content-free unconditional text
(``cfg_unconditional``, Qwen-Image: ``" "``) -- the same empty unconditional branch
every other CFG pipeline builds by itself. ``ModelSpec.guidance_record`` states the
guidance that is in effect; it is written into each run's provenance.

A ``ModelSpec`` is everything that decides the pixels besides the prompt and the
seed; its ``digest()`` identifies a run, and an output folder never mixes two
digests. Device and batch size are recorded beside each sample but are not part
of the digest (initial noise comes from a per-sample CPU ``torch.Generator``, so
it is the same on every device and in every batch).

What could not be checked here (no network, no weights): repository ids and
pipeline classes were looked up in the diffusers documentation and the model
cards; the guidance values of FLUX.2-klein-9B, FLUX.2-dev and the HiDream 4-bit
quantisation recipe follow the model cards, not the paper (which lists only
steps and resolution); the NegationCLIP text encoder has no Hugging Face id we
could confirm, so that preset needs a local folder (``NEGT2I_NEGATIONCLIP``).
See docs/generate.md for the full table.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

DEFAULT_SEEDS: Final[tuple[int, ...]] = (42, 43, 44, 45)
"""Appendix E.1: four samples per prompt, seeds 42..45 (sample k uses seed 42 + k)."""

NEGATIONCLIP_ENV: Final = "NEGT2I_NEGATIONCLIP"
"""Local folder of the NegationCLIP text encoder (transformers ``CLIPTextModel`` format)."""


@dataclass(frozen=True)
class Component:
    """A pipeline component loaded from its own repository (e.g. HiDream's Llama text encoder)."""

    name: str
    """The pipeline's argument name (``text_encoder_4``, ``tokenizer_4``, ``text_encoder``)."""
    loader: str
    """``module.Class`` whose ``from_pretrained`` loads it (``transformers.LlamaForCausalLM``)."""
    source: str
    """Repository id or local folder; ``$ENV`` takes it from that environment variable."""
    subfolder: str | None = None
    options: tuple[tuple[str, Any], ...] = ()
    """Extra ``from_pretrained`` keyword arguments (e.g. ``output_hidden_states``)."""

    def resolved_source(self) -> str:
        """``source`` with a leading ``$NAME`` replaced by that environment variable ('' when unset)."""
        if self.source.startswith("$"):
            return os.environ.get(self.source[1:], "")
        return self.source


@dataclass(frozen=True)
class ModelSpec:
    """A text-to-image configuration: which weights, which pipeline, which settings."""

    name: str
    """Preset name (``sd1.5``) or ``custom``."""
    label: str
    """The paper's name (Table 18) or the model path."""
    model: str
    """Hugging Face repository id or a local folder."""
    generator: str = "diffusers"
    """Generator backend in the registry (``negt2i.generate.registry``)."""
    pipeline: str | None = None
    """diffusers pipeline class (``None``: the class named in the folder's ``model_index.json``)."""
    revision: str | None = None
    """Repository revision (branch, tag or commit); ``None``: the default branch."""
    steps: int | None = None
    """Denoising steps (``None``: not applicable, e.g. autoregressive)."""
    guidance: float | None = None
    """Guidance scale passed as ``guidance_arg`` (``None``: the pipeline's own default)."""
    guidance_arg: str = "guidance_scale"
    width: int = 1024
    height: int = 1024
    dtype: str = "bfloat16"
    """Weights dtype on a GPU (``float32`` on CPU unless ``--dtype`` says otherwise)."""
    quantize: tuple[str, ...] = ()
    """Components loaded in 4-bit NF4 (bitsandbytes, through diffusers' quantisation config)."""
    components: tuple[Component, ...] = ()
    options: tuple[tuple[str, Any], ...] = ()
    """Extra keyword arguments of the pipeline call (never a negative prompt)."""
    cfg_unconditional: str | None = None
    """Content-free text passed as ``negative_prompt`` to a pipeline that runs CFG only when one is
    given (``guidance_arg == "true_cfg_scale"``; Qwen-Image: ``" "``, its model card's value when there
    is no concept to remove). ``None``: no negative prompt is passed at all."""
    notes: str = ""
    """What is known and what could not be checked about these settings."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def record(self) -> dict[str, Any]:
        """The settings as JSON (``notes`` and ``extra`` left out; ``label`` kept for readers)."""
        data = asdict(self)
        data.pop("notes")
        data.pop("extra")
        if data["cfg_unconditional"] is None:  # absent unless set: the other presets' digests stay as they were
            data.pop("cfg_unconditional")
        record: dict[str, Any] = json.loads(json.dumps(data))  # tuples -> lists, as read back from disk
        return record

    def digest(self) -> str:
        """SHA-256 (16 hex digits) of the canonical settings JSON: what decides the pixels."""
        data = self.record()
        data.pop("label")
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def guidance_record(self) -> dict[str, Any]:
        """The guidance in effect, as provenance: argument, scale, unconditional text and whether CFG runs.

        ``cfg`` follows diffusers' own switch: ``true_cfg_scale`` runs CFG iff scale > 1 and a negative
        prompt is passed; ``guidance_scale`` pipelines decide by themselves (``None`` here: distilled
        models embed the scale instead of running two branches).
        """
        cfg: bool | None = None
        if self.guidance_arg == "true_cfg_scale":
            cfg = self.guidance is not None and self.guidance > 1 and self.cfg_unconditional is not None
        return {
            "argument": self.guidance_arg,
            "scale": self.guidance,
            "negative_prompt": self.cfg_unconditional,
            "cfg": cfg,
        }

    def with_overrides(self, **changes: Any) -> ModelSpec:
        """A copy with the given fields replaced (``None`` values ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


_BNB = "4-bit NF4 via bitsandbytes (diffusers PipelineQuantizationConfig)"

PRESETS: Final[dict[str, ModelSpec]] = {
    p.name: p
    for p in (
        ModelSpec(
            "flux2-klein-9b", "FLUX.2-klein-9B", "black-forest-labs/FLUX.2-klein-9B",
            pipeline="Flux2KleinPipeline", steps=4, guidance=1.0,
            notes="Step- and guidance-distilled; guidance 1.0 from the model card (not in the paper).",
        ),
        ModelSpec(
            "hunyuanimage-2.1-distilled", "HunyuanImage-2.1 (distilled)",
            "hunyuanvideo-community/HunyuanImage-2.1-Distilled-Diffusers",
            pipeline="HunyuanImagePipeline", steps=8, guidance=None,
            notes="Guidance lives in the pipeline's guider component (no guidance_scale argument); "
            "1024^2 per Table 18 (the model's native size is 2048^2).",
        ),
        ModelSpec(
            "z-image-turbo", "Z-Image-Turbo", "Tongyi-MAI/Z-Image-Turbo",
            pipeline="ZImagePipeline", steps=9, guidance=0.0,
            notes="Guidance 0 for the Turbo model (diffusers example).",
        ),
        ModelSpec(
            "flux2-dev-4bit", "FLUX.2-dev (4-bit)", "black-forest-labs/FLUX.2-dev",
            pipeline="Flux2Pipeline", steps=28, guidance=4.0, quantize=("transformer", "text_encoder"),
            notes=f"Transformer and Mistral text encoder in {_BNB}; guidance 4.0 from the model card. "
            "The paper's exact quantisation recipe is not stated.",
        ),
        ModelSpec(
            "sd3.5-large", "SD 3.5 Large", "stabilityai/stable-diffusion-3.5-large",
            pipeline="StableDiffusion3Pipeline", steps=28, guidance=3.5,
            notes="Guidance 3.5 from the model card.",
        ),
        ModelSpec(
            "blip3o-next-sft-3b", "BLIP3-o NEXT SFT 3B", "BLIP3o/BLIP3o-NEXT-SFT-3B",
            generator="blip3o-next", steps=30, guidance=None,
            notes="Not a diffusers pipeline: needs the BLIP3o repository's code registered as generator "
            "'blip3o-next' (docs/generate.md, 'Adding a model').",
        ),
        ModelSpec(
            "hidream-i1-4bit", "HiDream-I1 (4-bit)", "HiDream-ai/HiDream-I1-Full",
            pipeline="HiDreamImagePipeline", steps=50, guidance=5.0, quantize=("transformer", "text_encoder_4"),
            components=(
                Component("tokenizer_4", "transformers.AutoTokenizer", "meta-llama/Meta-Llama-3.1-8B-Instruct"),
                Component(
                    "text_encoder_4", "transformers.LlamaForCausalLM", "meta-llama/Meta-Llama-3.1-8B-Instruct",
                    options=(("output_hidden_states", True), ("output_attentions", True)),
                ),
            ),
            notes=f"HiDream-I1-Full (50 steps, guidance 5.0, its model card); transformer and Llama 3.1 8B "
            f"text encoder in {_BNB}. The paper's exact quantisation recipe is not stated.",
        ),
        ModelSpec(
            "qwen-image", "Qwen-Image", "Qwen/Qwen-Image",
            pipeline="QwenImagePipeline", steps=50, guidance=4.0, guidance_arg="true_cfg_scale",
            cfg_unconditional=" ",
            notes="true_cfg_scale 4.0 with negative_prompt ' ', as the model card runs it: diffusers applies "
            "true CFG only when a negative prompt is given, and ' ' is the card's content-free value. We read "
            "the paper's 'negative-prompt field unused' as 'no content' and its 'native configuration' as "
            "CFG on (the paper does not say which it ran).",
        ),
        ModelSpec(
            "sd1.5", "SD 1.5", "stable-diffusion-v1-5/stable-diffusion-v1-5",
            pipeline="StableDiffusionPipeline", steps=50, guidance=9.0, width=512, height=512, dtype="float16",
            notes="Guidance 9.0 as registered in the paper (Appendix E.1).",
        ),
        ModelSpec(
            "sd1.5-negationclip", "SD 1.5 + NegationCLIP", "stable-diffusion-v1-5/stable-diffusion-v1-5",
            pipeline="StableDiffusionPipeline", steps=50, guidance=7.5, width=512, height=512, dtype="float16",
            components=(Component("text_encoder", "transformers.CLIPTextModel", f"${NEGATIONCLIP_ENV}"),),
            notes=f"Guidance 7.5 (Appendix E.1). The NegationCLIP text encoder (github.com/parkquasar/NegationCLIP) "
            f"has no Hugging Face id we could confirm: convert its ViT-L/14 text tower to a transformers "
            f"CLIPTextModel folder and set {NEGATIONCLIP_ENV}.",
        ),
        ModelSpec(
            "janus-pro-7b", "Janus-Pro-7B", "deepseek-ai/Janus-Pro-7B",
            generator="janus-pro", steps=None, guidance=5.0, width=384, height=384,
            options=(("temperature", 1.0),),
            notes="Autoregressive (576 image tokens, CFG weight 5, temperature 1, as in the official example); "
            "needs the `janus` package from github.com/deepseek-ai/Janus.",
        ),
    )
}  # fmt: skip
"""The paper's eleven configurations (Table 18), by preset name."""


def preset(name: str) -> ModelSpec:
    """The preset ``name``; the error lists the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}") from None


def parse_seeds(text: str) -> tuple[int, ...]:
    """``42-45`` or ``42,43,44,45`` (or a mix) -> (42, 43, 44, 45); duplicates are an error."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                a, b = int(lo), int(hi)
                if b < a:
                    raise ValueError
                seeds.extend(range(a, b + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise ValueError(f"seeds: cannot read {part!r} (expected e.g. 42-45 or 42,43)") from None
    if not seeds:
        raise ValueError("seeds: none given")
    if len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"seeds must be distinct non-negative integers, got {seeds}")
    return tuple(seeds)
