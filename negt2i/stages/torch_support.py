"""Helpers the torch-based backends share: device resolution, dtypes, library versions, ``ModelInfo``.

Used by the real backends' constructors, the judges, the reward and the ``--dtype`` / ``--device``
parsing of the CLI and the stage services; torch itself is imported only inside the functions that need
it. Public to the package's users (it was the private ``negt2i.stages._torch`` before).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from importlib import metadata
from typing import TYPE_CHECKING, Final

from negt2i.stages.base import ModelInfo

if TYPE_CHECKING:
    import torch

    from negt2i.weights import VerifiedWeights

DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+|mps)$")
"""Device names every backend accepts (``negt2i.cli.common.parse_device`` checks flags against it)."""

DTYPES: Final[dict[str, str]] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""Precision names accepted by ``--dtype`` / ``NEGT2I_DTYPE`` -> the torch dtype recorded in ``ModelInfo.dtype``."""


def check_dtype(name: str) -> str:
    """The ``--dtype`` name (``fp32``, ``bf16``, ``fp16``; torch spellings accepted) in short form."""
    for short, long in DTYPES.items():
        if name in (short, long):
            return short
    raise ValueError(f"unknown dtype {name!r}; use fp32, bf16 or fp16")


def parse_dtypes(spec: str, stages: tuple[str, ...]) -> dict[str, str]:
    """Stage -> dtype from ``--dtype`` / ``NEGT2I_DTYPE``: one name for every stage (``bf16``) or
    ``stage=name`` pairs separated by commas (``detector=fp32,segmenter=bf16``; others ``fp32``)."""
    spec = spec.strip()
    if "=" not in spec:
        return dict.fromkeys(stages, check_dtype(spec or "fp32"))
    out = dict.fromkeys(stages, "fp32")
    for part in filter(None, (p.strip() for p in spec.split(","))):
        stage, _, name = part.partition("=")
        stage = stage.strip()
        if stage not in stages:
            raise ValueError(f"--dtype: unknown stage {stage!r}; stages: {', '.join(stages)}")
        out[stage] = check_dtype(name.strip())
    return out


@contextlib.contextmanager
def precision(device: torch.device, dtype: str) -> Iterator[None]:
    """Inference mode, plus ``torch.autocast`` to ``dtype`` unless it is ``fp32``.

    Autocast (not a cast of the weights) so that every backend reduces precision the same way:
    matrix products and convolutions run in bf16 / fp16, reductions and normalisations stay in
    fp32, and every backend returns float32 outputs either way.
    """
    import torch

    short = check_dtype(dtype)
    with torch.inference_mode():
        if short == "fp32":
            yield
        else:
            with torch.autocast(device_type=device.type, dtype=getattr(torch, DTYPES[short])):
                yield


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` -> ``cuda`` when available, else ``cpu``; ``cpu``, ``cuda``, ``cuda:N`` as given."""
    import torch

    if not DEVICE_RE.match(device):
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
    dtype: str = "fp32",
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
        dtype=DTYPES[check_dtype(dtype)],
    )
