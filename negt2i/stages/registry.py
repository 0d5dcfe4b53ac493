"""The one table of stage backends by name (``rfdetr-seg-xl``, ``sam2.1-hiera-small``, ...).

Each ``Backend`` row holds the stage, the name, the factory, the model id and the weights
entry (``negt2i.weights.WEIGHTS``, None when the backend needs no weights). Backends
register themselves when their module is imported; the modules in ``BUILTIN_MODULES``
are imported lazily on first use (so importing the registry never imports torch), then
the plug-in modules named in ``NEGT2I_BACKEND_MODULES``. ``negt2i backends`` lists the table.

``create(stage, name, device=, weights_dir=, config=)`` builds one: the options are
explicit keywords (a misspelled one is a ``TypeError``), every factory is called with
exactly these three, and the result is checked against the stage's protocol
(``negt2i.stages.base``), which is also its static type.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, overload

from negt2i.core.stage_types import STAGES

__all__ = [  # STAGES is the core's (negt2i.core.stage_types), re-exported: plug-ins import it from here
    "BACKEND_MODULES_ENV",
    "BUILTIN_MODULES",
    "DEFAULT_BACKENDS",
    "STAGES",
    "Backend",
    "available",
    "backend",
    "backends",
    "check_device",
    "create",
    "import_backend_modules",
    "register",
]

if TYPE_CHECKING:
    from negt2i.core.config import RuleConfig
    from negt2i.stages.base import AttributeScorer, DepthEstimator, Detector, Segmenter

BUILTIN_MODULES: list[str] = [
    "negt2i.stages.synthetic",
    "negt2i.stages.rfdetr_backend",
    "negt2i.stages.sam2_backend",
    "negt2i.stages.siglip_backend",
    "negt2i.stages.depth_anything_backend",
    "negt2i.stages.maskrcnn_backend",
]
"""Modules that register built-in backends when imported.

Each must import its heavy libraries (torch, ...) only inside the backend's factory."""

DEFAULT_BACKENDS: Final[dict[str, str]] = {
    "detector": "rfdetr-seg-xl",
    "segmenter": "sam2.1-hiera-small",
    "attributes": "siglip2-so400m-378",
    "depth": "depth-anything-v2-small",
}
"""The paper's models (Table 15), used when no backend is named."""

BACKEND_MODULES_ENV: Final = "NEGT2I_BACKEND_MODULES"
"""Comma-separated modules imported before a backend is built, to register more backends
(``docs/stage-contract.md``, "Plug-in backends"); read by the stage services, ``negt2i evaluate``
and ``negt2i backends``."""


@dataclass(frozen=True)
class Backend:
    """One row of the backend table."""

    stage: str
    name: str
    factory: Callable[..., Any]
    """Called as ``factory(device=..., weights_dir=..., config=...)``."""
    model: str = ""
    """The model id, e.g. ``RFDETRSegXLarge``."""
    weights: str | None = None
    """The ``negt2i.weights.WEIGHTS`` entry it loads (None: no weights to fetch)."""


_TABLE: dict[str, dict[str, Backend]] = {stage: {} for stage in STAGES}
_state = {"loaded": False}


def _check_stage(stage: str) -> None:
    if stage not in _TABLE:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")


def register(
    stage: str,
    name: str,
    factory: Callable[..., Any],
    *,
    model: str = "",
    weights: str | None = None,
    replace: bool = False,
) -> None:
    """Add backend ``name`` of ``stage`` to the table."""
    _check_stage(stage)
    if name in _TABLE[stage] and not replace:
        raise ValueError(f"{stage} backend {name!r} is already registered")
    _TABLE[stage][name] = Backend(stage, name, factory, model, weights)


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


def _load_builtins() -> None:
    if not _state["loaded"]:
        _state["loaded"] = True
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
        import_backend_modules()


def available(stage: str) -> list[str]:
    """Names of the registered backends of ``stage``, sorted."""
    _check_stage(stage)
    _load_builtins()
    return sorted(_TABLE[stage])


def backends() -> list[Backend]:
    """Every row of the table, by stage (in ``STAGES`` order) then name."""
    _load_builtins()
    return [_TABLE[stage][name] for stage in STAGES for name in sorted(_TABLE[stage])]


def backend(stage: str, name: str) -> Backend:
    """The table row of backend ``name`` of ``stage``; the error lists the known names."""
    _check_stage(stage)
    _load_builtins()
    try:
        return _TABLE[stage][name]
    except KeyError:
        known = ", ".join(sorted(_TABLE[stage])) or "none"
        raise ValueError(f"unknown {stage} backend {name!r}; registered: {known}") from None


@overload
def create(
    stage: Literal["detector"],
    name: str,
    *,
    device: str = ...,
    weights_dir: str | Path | None = ...,
    config: RuleConfig | None = ...,
    dtype: str | None = ...,
) -> Detector: ...
@overload
def create(
    stage: Literal["segmenter"],
    name: str,
    *,
    device: str = ...,
    weights_dir: str | Path | None = ...,
    config: RuleConfig | None = ...,
    dtype: str | None = ...,
) -> Segmenter: ...
@overload
def create(
    stage: Literal["attributes"],
    name: str,
    *,
    device: str = ...,
    weights_dir: str | Path | None = ...,
    config: RuleConfig | None = ...,
    dtype: str | None = ...,
) -> AttributeScorer: ...
@overload
def create(
    stage: Literal["depth"],
    name: str,
    *,
    device: str = ...,
    weights_dir: str | Path | None = ...,
    config: RuleConfig | None = ...,
    dtype: str | None = ...,
) -> DepthEstimator: ...
@overload
def create(
    stage: str,
    name: str,
    *,
    device: str = ...,
    weights_dir: str | Path | None = ...,
    config: RuleConfig | None = ...,
    dtype: str | None = ...,
) -> Detector | Segmenter | AttributeScorer | DepthEstimator: ...
def create(
    stage: str,
    name: str,
    *,
    device: str = "auto",
    weights_dir: str | Path | None = None,
    config: RuleConfig | None = None,
    dtype: str | None = None,
    shape: tuple[int, int] | None = None,
) -> Detector | Segmenter | AttributeScorer | DepthEstimator:  # fmt: skip
    """Build backend ``name`` of ``stage`` (see the module docstring)."""
    from negt2i.core.config import CURRENT
    from negt2i.stages.base import AttributeScorer, DepthEstimator, Detector, Segmenter

    row = backend(stage, name)
    extra: dict[str, Any] = {} if dtype is None else {"dtype": dtype}  # compute dtype, for backends that take one
    if shape is not None:  # an inference resolution override (tests)
        extra["shape"] = shape
    built = row.factory(device=device, weights_dir=weights_dir, config=config or CURRENT, **extra)
    protocol: type[Any] = {"detector": Detector, "segmenter": Segmenter, "attributes": AttributeScorer,
                           "depth": DepthEstimator}[stage]  # fmt: skip
    if not isinstance(built, protocol):
        raise TypeError(f"{stage} backend {name!r} built a {type(built).__name__}, which is not a {protocol.__name__}")
    out: Detector | Segmenter | AttributeScorer | DepthEstimator = built
    check_device(stage, name, device, str(getattr(out.info, "device", "") or ""))
    return out


_warned: set[tuple[str, str, str]] = set()


def check_device(stage: str, name: str, requested: str, ran: str) -> None:
    """Say so (one warning line on stderr per backend and device) when a backend asked for a device runs
    on another, e.g. ``--device cuda`` with the synthetic backends, which only run on the CPU. Backends that
    cannot honour a device they could use raise instead (the torch backends: CUDA asked for, not available)."""
    if requested in ("", "auto") or not ran or ran.split(":", maxsplit=1)[0] == requested.split(":", maxsplit=1)[0]:
        return
    key = (name, requested, ran)
    if key in _warned:
        return
    _warned.add(key)
    print(
        f"warning: backend {name!r} ({stage}, and any other stage of it) runs on {ran} only; "
        f"the requested device {requested!r} is not used",
        file=sys.stderr,
    )
