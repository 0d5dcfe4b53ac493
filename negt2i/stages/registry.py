"""A registry of stage backends by name (``rfdetr-seg-xl``, ``sam2.1-hiera-small``, ...).

Backends register a factory for a stage; ``create(stage, name, **options)`` builds
one. Built-in backends register themselves when their module is imported; the
modules listed in ``BUILTIN_MODULES`` are imported lazily on first use, so
importing the registry never imports torch.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from typing import Any, Final

STAGES: Final[tuple[str, ...]] = ("detector", "segmenter", "attributes", "depth")

BUILTIN_MODULES: list[str] = [
    "negt2i.stages.synthetic",
    "negt2i.stages.rfdetr_backend",
    "negt2i.stages.sam2_backend",
    "negt2i.stages.siglip_backend",
    "negt2i.stages.depth_anything_backend",
    "negt2i.stages.maskrcnn_backend",
]
"""Modules that register built-in backends when imported (filled in by the backend packages).

Each must import its heavy libraries (torch, ...) only inside the backend's constructor."""

DEFAULT_BACKENDS: Final[dict[str, str]] = {
    "detector": "rfdetr-seg-xl",
    "segmenter": "sam2.1-hiera-small",
    "attributes": "siglip2-so400m-378",
    "depth": "depth-anything-v2-small",
}
"""The paper's models (Table 15), used when no backend is named.

Factories take keyword options; the built-in ones all accept ``device`` (``auto``,
``cpu``, ``cuda``, ``cuda:N``), ``weights_dir`` and ``config`` (a ``RuleConfig``)
and ignore options that do not concern them."""

_FACTORIES: dict[str, dict[str, Callable[..., Any]]] = {stage: {} for stage in STAGES}
_state = {"loaded": False}


def _check_stage(stage: str) -> None:
    if stage not in _FACTORIES:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")


def register(stage: str, name: str, factory: Callable[..., Any], *, replace: bool = False) -> None:
    """Register ``factory(**options)`` as backend ``name`` of ``stage``."""
    _check_stage(stage)
    if name in _FACTORIES[stage] and not replace:
        raise ValueError(f"{stage} backend {name!r} is already registered")
    _FACTORIES[stage][name] = factory


def _load_builtins() -> None:
    if not _state["loaded"]:
        _state["loaded"] = True
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
        import_backend_modules()


BACKEND_MODULES_ENV: Final = "NEGT2I_BACKEND_MODULES"
"""Comma-separated modules imported before a backend is built, to register more backends
(``docs/stage-contract.md``, "Plug-in backends"); read by the stage services and ``negt2i evaluate``."""


def import_backend_modules(env: Mapping[str, str] | None = None) -> list[str]:
    """Import the modules named in ``NEGT2I_BACKEND_MODULES``; returns their names."""
    value = (os.environ if env is None else env).get(BACKEND_MODULES_ENV, "")
    names = [m.strip() for m in value.split(",") if m.strip()]
    for module in names:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"{BACKEND_MODULES_ENV}: cannot import {module!r} ({exc})") from None
    return names


def available(stage: str) -> list[str]:
    """Names of the registered backends of ``stage``, sorted."""
    _check_stage(stage)
    _load_builtins()
    return sorted(_FACTORIES[stage])


def create(stage: str, name: str, **options: Any) -> Any:
    """Build backend ``name`` of ``stage``; the error lists the known names."""
    _check_stage(stage)
    _load_builtins()
    try:
        factory = _FACTORIES[stage][name]
    except KeyError:
        known = ", ".join(sorted(_FACTORIES[stage])) or "none"
        raise ValueError(f"unknown {stage} backend {name!r}; registered: {known}") from None
    return factory(**options)
