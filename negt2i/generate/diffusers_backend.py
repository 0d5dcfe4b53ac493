"""The ``diffusers`` generator: any diffusers text-to-image pipeline, loaded once, run in batches.

Each sample gets its own CPU ``torch.Generator`` seeded with its seed, so its
initial noise is the same on every device and in every batch. Weights load with
``local_files_only`` unless ``--allow-download``: a missing model is one error
that says how to fetch it. Quantised presets load the listed components in
4-bit NF4 through diffusers' ``PipelineQuantizationConfig`` (bitsandbytes).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from negt2i.generate.registry import GenerateError, register_generator

if TYPE_CHECKING:
    from PIL import Image as PILImage

    from negt2i.generate.presets import ModelSpec

DTYPES: Final[tuple[str, ...]] = ("float32", "float16", "bfloat16")


def torch_dtype(name: str) -> Any:
    """The torch dtype named ``name`` (one of ``DTYPES``)."""
    import torch

    if name not in DTYPES:
        raise GenerateError(f"unknown dtype {name!r}; one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def fetch_hint(source: str, revision: str | None = None) -> str:
    """How to get the weights of ``source`` (a repository id or a local folder)."""
    if source.startswith(("/", ".", "~")) or Path(source).exists():
        return f"{source}: no such model folder (a diffusers folder holds model_index.json)"
    rev = f" --revision {revision}" if revision else ""
    home = os.environ.get("HF_HOME", "~/.cache/huggingface")
    return (
        f"the weights of {source} are not in the Hugging Face cache ({home}); fetch them once with "
        f"`hf download {source}{rev}` (accept the model's licence on huggingface.co/{source} first if it is gated), "
        "or run with --allow-download"
    )


def load_or_explain(load: Callable[..., Any], source: str, kwargs: dict[str, Any]) -> Any:
    """``load(source, **kwargs)``; a missing repository or folder becomes one ``GenerateError`` saying how to
    fetch it."""
    try:
        return load(source, **kwargs)
    except (OSError, ValueError) as exc:
        missing = isinstance(exc, OSError) or "neither a valid local path nor a valid repo id" in str(exc)
        if not missing:
            raise
        raise GenerateError(f"{fetch_hint(source, kwargs.get('revision'))} ({type(exc).__name__})") from None


def resolved_revision(source: str, revision: str | None) -> str | None:
    """The commit of a cached Hugging Face snapshot (``None`` for a local folder or when unknown)."""
    if Path(source).exists():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - comes with diffusers
        return revision
    found = try_to_load_from_cache(source, "model_index.json", revision=revision)
    return Path(found).parent.name if isinstance(found, str) else revision


class DiffusersGenerator:
    """A diffusers pipeline for ``spec`` on ``device`` in ``dtype``."""

    def __init__(self, spec: ModelSpec, *, device: str, dtype: str, allow_download: bool = False) -> None:
        try:
            import diffusers
            import torch
        except ImportError:
            raise GenerateError(
                "negt2i generate needs diffusers: pip install 'negt2ibench[generate]' (diffusers, accelerate)"
            ) from None
        self.spec = spec
        self.device = device
        self.dtype = dtype
        self._torch = torch
        dt = torch_dtype(dtype)
        cls: Any = diffusers.DiffusionPipeline
        if spec.pipeline:
            cls = getattr(diffusers, spec.pipeline, None)
            if cls is None:
                raise GenerateError(
                    f"diffusers {diffusers.__version__} has no pipeline class {spec.pipeline!r}; upgrade diffusers"
                )
        kwargs: dict[str, Any] = {"dtype": dt, "local_files_only": not allow_download}
        if spec.revision:
            kwargs["revision"] = spec.revision
        own = {c.name for c in spec.components}
        for comp in spec.components:
            kwargs[comp.name] = self._component(comp, dt, allow_download)
        in_pipeline = [c for c in spec.quantize if c not in own]
        if in_pipeline:
            kwargs["quantization_config"] = diffusers.PipelineQuantizationConfig(  # type: ignore[attr-defined]
                quant_backend="bitsandbytes_4bit",
                quant_kwargs={"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": dt},
                components_to_quantize=in_pipeline,
            )
        pipe = load_or_explain(cls.from_pretrained, spec.model, kwargs)
        pipe.to(device)
        pipe.set_progress_bar_config(disable=True)
        self.pipe = pipe
        self._revision = resolved_revision(spec.model, spec.revision)

    def _component(self, comp: Any, dt: Any, allow_download: bool) -> Any:
        source = comp.resolved_source()
        if not source:
            raise GenerateError(
                f"{self.spec.name}: component {comp.name} needs a folder: set {comp.source[1:]} "
                f"(see the preset's notes: negt2i generate --list-models)"
            )
        module, _, name = comp.loader.rpartition(".")
        loader = getattr(importlib.import_module(module), name)
        kwargs: dict[str, Any] = {"local_files_only": not allow_download, **dict(comp.options)}
        if comp.subfolder:
            kwargs["subfolder"] = comp.subfolder
        if "Tokenizer" not in name:
            kwargs["dtype"] = dt
            if comp.name in self.spec.quantize:
                from transformers import BitsAndBytesConfig

                kwargs["quantization_config"] = BitsAndBytesConfig(  # type: ignore[no-untyped-call]
                    load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dt
                )
        return load_or_explain(loader.from_pretrained, source, kwargs)

    def info(self) -> dict[str, Any]:
        """Pipeline and scheduler classes, the resolved revision, and the separately loaded components."""
        scheduler = getattr(self.pipe, "scheduler", None)
        return {
            "pipeline": type(self.pipe).__name__,
            "scheduler": type(scheduler).__name__ if scheduler is not None else None,
            "revision": self._revision,
            "components": {c.name: c.resolved_source() for c in self.spec.components},
            "guidance": self.spec.guidance_record(),
        }

    def generate(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[PILImage.Image]:
        """One image per (prompt, seed), in one pipeline call (a batch on the device)."""
        torch = self._torch
        spec = self.spec
        call: dict[str, Any] = {
            "prompt": list(prompts),
            "generator": [torch.Generator("cpu").manual_seed(int(s)) for s in seeds],
            "width": spec.width,
            "height": spec.height,
            "output_type": "pil",
        }
        if spec.steps is not None:
            call["num_inference_steps"] = spec.steps
        if spec.guidance is not None:
            call[spec.guidance_arg] = spec.guidance
        if spec.cfg_unconditional is not None:  # content-free: switches CFG on where only a negative prompt does
            call["negative_prompt"] = [spec.cfg_unconditional] * len(prompts)
        call.update(dict(spec.options))
        with torch.inference_mode():
            images = list(self.pipe(**call).images)
        if len(images) != len(prompts):
            raise GenerateError(f"the pipeline returned {len(images)} images for {len(prompts)} prompts")
        return images


register_generator("diffusers", DiffusersGenerator)
