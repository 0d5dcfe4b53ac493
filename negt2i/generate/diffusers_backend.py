"""The ``diffusers`` generator: any diffusers text-to-image pipeline, loaded once, run in batches.

Each sample gets its own CPU ``torch.Generator`` seeded with its seed, so its
initial noise is the same on every device and in every batch. Weights load with
``local_files_only`` unless ``--allow-download``: a missing model is one error
that says how to fetch it. Quantised presets load the listed components in
4-bit NF4 through diffusers' ``PipelineQuantizationConfig`` (bitsandbytes).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
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


def _is_local(source: str) -> bool:
    return source.startswith(("/", ".", "~")) or Path(source).expanduser().exists()


def _visible_files(folder: Path) -> list[Path]:
    found = (p for p in folder.rglob("*") if p.is_file())
    return sorted(p for p in found if not any(part.startswith(".") for part in p.relative_to(folder).parts))


def loaded_files(folder: Path) -> list[Path]:
    """The files of a local model folder that loading reads: for a diffusers folder, ``model_index.json`` and
    every file under the component sub-folders it names; otherwise (a transformers folder, a component)
    every file. Hidden files and folders (``.cache``, ``.git``) are left out."""
    index = folder / "model_index.json"
    if not index.is_file():
        return _visible_files(folder)
    try:
        names = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GenerateError(f"{index}: cannot be read ({exc})") from None
    files = [index]
    for name, value in sorted(names.items()) if isinstance(names, dict) else ():
        sub = folder / name
        if isinstance(value, list) and any(v is not None for v in value) and sub.is_dir():
            files.extend(_visible_files(sub))
    return files


def folder_digest(folder: Path) -> str:
    """SHA-256 (hex) of a local model: each loaded file's relative path, size and SHA-256, in path order."""
    from negt2i.weights import file_digest

    h = hashlib.sha256()
    for path in loaded_files(folder):
        rel = path.relative_to(folder).as_posix()
        h.update(f"{rel}\t{path.stat().st_size}\t{file_digest(path)}\n".encode())
    return h.hexdigest()


def cached_commit(repo: str, revision: str | None) -> str | None:
    """The commit of ``repo`` at ``revision`` (default ``main``) in the Hugging Face cache, or ``None`` when
    that snapshot is not there. Reads the cache layout only (``refs/`` and ``snapshots/``): no network."""
    from huggingface_hub import constants

    base = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
    rev = revision or "main"
    if len(rev) == 40 and all(c in "0123456789abcdef" for c in rev):
        commit = rev
    else:
        try:
            commit = (base / "refs" / rev).read_text(encoding="utf-8").strip()
        except OSError:
            return None
    return commit if (base / "snapshots" / commit).is_dir() else None


def weights_identity(spec: ModelSpec, *, allow_download: bool = False, strict: bool = True) -> dict[str, Any]:
    """What identifies the weights of ``spec``, per source (``model`` and each separately loaded component):
    ``{"source": folder, "sha256": folder_digest}`` for a local folder, ``{"source": repo, "revision": commit}``
    for a Hugging Face repository in the cache. Fast and offline: with ``strict`` (the default), weights
    that are not there raise one ``GenerateError`` saying how to fetch them, before anything is created or
    loaded; a repository that ``allow_download`` will fetch is recorded with the revision asked for."""
    sources = [("model", spec.model, spec.revision)]
    sources += [(f"component:{c.name}", c.resolved_source(), None) for c in spec.components]
    out: dict[str, Any] = {}
    for name, source, revision in sources:
        if not source:
            if strict:
                comp = name.split(":", 1)[1]
                env = next(c.source[1:] for c in spec.components if c.name == comp)
                raise GenerateError(
                    f"{spec.name}: component {comp} needs a folder: set {env} "
                    "(see the preset's notes: negt2i generate --list-models)"
                )
            continue
        if _is_local(source):
            folder = Path(source).expanduser()
            if not folder.is_dir() or not any(folder.iterdir()):
                if strict:
                    raise GenerateError(fetch_hint(source, revision))
                continue
            out[name] = {"source": str(folder.resolve()), "sha256": folder_digest(folder)}
            continue
        commit = cached_commit(source, revision)
        if commit is None and strict and not allow_download:
            raise GenerateError(fetch_hint(source, revision))
        if commit is not None or allow_download:
            out[name] = {"source": source, "revision": commit or revision or "main"}
    return out


def pipeline_defaults(pipe: Any, guidance_arg: str) -> dict[str, Any]:
    """The pipeline call's own defaults of the settings a spec may leave to it (``steps``, ``guidance``)."""
    try:
        params = inspect.signature(pipe.__call__).parameters
    except (TypeError, ValueError):
        return {}
    out: dict[str, Any] = {}
    for key, arg in (("steps", "num_inference_steps"), ("guidance", guidance_arg)):
        param = params.get(arg)
        if param is not None and param.default is not inspect.Parameter.empty and param.default is not None:
            out[key] = param.default
    return out


class DiffusersGenerator:
    """A diffusers pipeline for ``spec`` on ``device`` in ``dtype``."""

    preflight = staticmethod(weights_identity)
    """Checked by the runner before it creates anything (``negt2i.generate.registry.preflight``)."""

    def __init__(self, spec: ModelSpec, *, device: str, dtype: str, allow_download: bool = False) -> None:
        try:
            import diffusers
            import torch
        except ImportError:
            raise GenerateError(
                "negt2i generate needs diffusers: from the repository root, pip install '.[generate]' "
                "(diffusers, accelerate; or make setup)"
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
        """Pipeline and scheduler classes, the resolved revision, the separately loaded components, and the
        pipeline's own defaults of the settings the spec leaves to it (``defaults``)."""
        scheduler = getattr(self.pipe, "scheduler", None)
        return {
            "pipeline": type(self.pipe).__name__,
            "scheduler": type(scheduler).__name__ if scheduler is not None else None,
            "revision": self._revision,
            "components": {c.name: c.resolved_source() for c in self.spec.components},
            "defaults": pipeline_defaults(self.pipe, self.spec.guidance_arg),
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
