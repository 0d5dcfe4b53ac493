"""Helpers the torch-based backends share: device resolution, library versions, ``ModelInfo``.

Imported only by the real backends' constructors, never by the registry.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import TYPE_CHECKING

from negt2i.stages.base import ModelInfo

if TYPE_CHECKING:
    import torch

    from negt2i.weights import VerifiedWeights

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+|mps)$")


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` -> ``cuda`` when available, else ``cpu``; ``cpu``, ``cuda``, ``cuda:N`` as given."""
    import torch

    if not _DEVICE_RE.match(device):
        raise ValueError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested, but CUDA is not available (use --device cpu)")
    return torch.device(device)


def library(dist: str) -> str:
    """``"<dist> <version>"`` of an installed distribution (``"<dist>"`` when unknown)."""
    try:
        return f"{dist} {metadata.version(dist)}"
    except metadata.PackageNotFoundError:
        return dist


def model_info(
    stage: str,
    backend: str,
    model: str,
    *,
    dist: str,
    device: torch.device,
    weights: VerifiedWeights | None = None,
    revision: str = "",
) -> ModelInfo:
    """``ModelInfo`` for a torch backend; without ``weights`` the model has random (test) weights."""
    return ModelInfo(
        stage=stage,
        backend=backend,
        model=model,
        revision=weights.revision if weights else (revision or "random-init"),
        sha256=weights.sha256 if weights else "",
        library=library(dist),
        device=str(device),
        dtype="float32",
    )
