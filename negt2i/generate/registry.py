"""A registry of generator backends by name, like the stages' (``negt2i.stages.registry``).

A generator turns prompts and seeds into images::

    class MyGenerator:
        def info(self) -> dict[str, Any]: ...        # provenance: pipeline class, scheduler, revision, ...
        def generate(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[PIL.Image.Image]: ...

    register_generator("my-model", lambda spec, **options: MyGenerator(spec, **options))

A factory takes the ``ModelSpec`` and keyword options ``device`` (``cpu``,
``cuda``, ``cuda:N``), ``dtype`` (``float32``, ``float16``, ``bfloat16``) and
``allow_download`` (bool). ``generate`` must make image *i* depend only on
``prompts[i]`` and ``seeds[i]`` (one ``torch.Generator`` per sample).

Built-in generators register when their module is imported (``BUILTIN_MODULES``,
imported lazily so importing the registry never imports torch); modules named in
``NEGT2I_GENERATOR_MODULES`` (comma-separated) are imported too, so a user plugs
in a model without touching the runner.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from PIL import Image as PILImage

    from negt2i.generate.presets import ModelSpec

MODULES_ENV: Final = "NEGT2I_GENERATOR_MODULES"

BUILTIN_MODULES: Final[tuple[str, ...]] = (
    "negt2i.generate.diffusers_backend",
    "negt2i.generate.external",
)


class GenerateError(RuntimeError):
    """Generation cannot start or continue (missing weights, a folder made differently, ...)."""


class Generator(Protocol):
    """What the runner needs from a model."""

    def info(self) -> dict[str, Any]:
        """Provenance of the loaded model (pipeline class, scheduler, resolved revision, ...)."""
        ...

    def generate(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[PILImage.Image]:
        """One image per (prompt, seed); image i depends only on prompts[i] and seeds[i]."""
        ...


Factory = Callable[..., Generator]
_FACTORIES: dict[str, Factory] = {}
_state = {"loaded": False}


def register_generator(name: str, factory: Factory, *, replace: bool = False) -> None:
    """Register ``factory(spec, **options)`` as generator ``name``."""
    if name in _FACTORIES and not replace:
        raise ValueError(f"generator {name!r} is already registered")
    _FACTORIES[name] = factory


def _load() -> None:
    if _state["loaded"]:
        return
    _state["loaded"] = True
    extra = [m.strip() for m in os.environ.get(MODULES_ENV, "").split(",") if m.strip()]
    for module in (*BUILTIN_MODULES, *extra):
        importlib.import_module(module)


def available() -> list[str]:
    """Registered generator names, sorted."""
    _load()
    return sorted(_FACTORIES)


def preflight(spec: ModelSpec, *, allow_download: bool = False, strict: bool = True) -> dict[str, Any]:
    """Before anything is created: the weights identity of ``spec`` (``weights_identity`` of the diffusers
    generator: a content digest of a local folder, the commit of a cached repository), checked to be there
    with ``strict``. A generator opts in with a ``preflight(spec, *, allow_download, strict)`` attribute on its
    factory; others give ``{}``. An unknown generator name is an error here already."""
    _load()
    if not strict and spec.generator not in _FACTORIES:
        return {}
    factory = _factory(spec.generator)
    check = getattr(factory, "preflight", None)
    if check is None:
        return {}
    identity: dict[str, Any] = check(spec, allow_download=allow_download, strict=strict)
    return identity


def _factory(name: str) -> Factory:
    """The factory registered as ``name``; the error lists the known names."""
    _load()
    try:
        return _FACTORIES[name]
    except KeyError:
        known = ", ".join(sorted(_FACTORIES)) or "none"
        raise GenerateError(
            f"unknown generator {name!r}; registered: {known} (register one in a module named in {MODULES_ENV})"
        ) from None


def create(spec: ModelSpec, **options: Any) -> Generator:
    """Build the generator ``spec.generator`` for ``spec``; the error lists the known names."""
    return _factory(spec.generator)(spec, **options)
