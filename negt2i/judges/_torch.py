"""Device, dtype, parameter count and peak memory for the torch judges (imported inside factories only)."""

from __future__ import annotations

import resource
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from negt2i.judges.base import JudgeInfo, Kind


def resolve(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """``--device`` (auto, cpu, cuda, cuda:N) and ``--dtype`` (auto: bf16 on CUDA, fp32 on the CPU; fp32,
    bf16, fp16) as torch objects; the errors name the accepted values."""
    import torch

    from negt2i.stages.torch_support import DTYPES, check_dtype, resolve_device

    dev = resolve_device(device)
    if dtype == "auto":
        return dev, torch.bfloat16 if dev.type == "cuda" else torch.float32
    return dev, getattr(torch, DTYPES[check_dtype(dtype)])


def loaded_info(
    label: str,
    *,
    kind: Kind,
    model_name: str,
    random_init: bool,
    revision: str,
    sha256: str,
    dist: str,
    device: torch.device,
    dtype: torch.dtype,
    model: Any,
) -> JudgeInfo:
    """The run header's record of a loaded judge: a tiny random model's name ends in ``-random``, its
    parameters are counted from ``model`` and its library is the installed ``dist``'s version."""
    from negt2i.judges.base import JudgeInfo
    from negt2i.stages.torch_support import library

    return JudgeInfo(
        judge=label + ("-random" if random_init else ""),
        kind=kind,
        model=model_name,
        revision=revision,
        sha256=sha256,
        library=library(dist),
        device=str(device),
        dtype=dtype_name(dtype),
        params=count_params(model),
    )


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def count_params(model: Any) -> int:
    return int(sum(p.numel() for p in model.parameters()))


def peak_gpu_gib(device: torch.device) -> float | None:
    """``torch.cuda.max_memory_allocated`` in GiB since the process started (weights included), the basis
    Appendix B.4 uses for every method; None off CUDA."""
    import torch

    if device.type != "cuda":
        return None
    return float(torch.cuda.max_memory_allocated(device)) / 2**30


def peak_rss_gib() -> float:
    """Peak resident set size of this process in GiB (Appendix B.4's CPU memory)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(peak) / (2**30 if sys.platform == "darwin" else 2**20)


def synchronize(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
