"""The pure core imports no serving, transport or model library, and nothing of the stage backends.

Each module of the core (``docs/architecture.md``, "Core"; the README's layout map) is imported alone
in a fresh interpreter, and the modules it pulled in are checked: no torch, grpc, bentoml or httpx,
and no ``negt2i.stages`` (the backends) or ``negt2i.wire`` (the protobuf adapter). The core's stage
vocabulary (``STAGES``, ``Image``, ``ModelInfo``) lives in ``negt2i.stage_types``; ``negt2i.stages``
re-exports it for plug-ins (the last test).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

CORE_MODULES = (
    "negt2i.vocab",
    "negt2i.spec",
    "negt2i.perception",
    "negt2i.rle",
    "negt2i.config",
    "negt2i.geometry",
    "negt2i.rules",
    "negt2i.plan",
    "negt2i.failures",
    "negt2i.stage_types",
    "negt2i.stage_identity",
    "negt2i.stage_identity",
    "negt2i.verdict",
    "negt2i.flow",
    "negt2i.results",
    "negt2i.jsonl",
    "negt2i.files",
    "negt2i.images",
    "negt2i.labels",
    "negt2i.perception_file",
    "negt2i.rejudge",
    "negt2i.metrics.records",
    "negt2i.metrics.totals",
    "negt2i.metrics.report",
    "negt2i.run.jobs",
    "negt2i.run.output",
)

FORBIDDEN_ROOTS = ("torch", "grpc", "bentoml", "httpx")
FORBIDDEN_PACKAGES = ("negt2i.stages", "negt2i.wire")

_PROBE = """
import importlib, sys
importlib.import_module(sys.argv[1])
roots, packages = sys.argv[2].split(","), sys.argv[3].split(",")
bad = sorted(
    m for m in sys.modules
    if m.split(".")[0] in roots or any(m == p or m.startswith(p + ".") for p in packages)
)
print(" ".join(bad))
"""


@pytest.mark.parametrize("module", CORE_MODULES)
def test_a_core_module_imports_alone_without_heavy_or_backend_modules(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, module, ",".join(FORBIDDEN_ROOTS), ",".join(FORBIDDEN_PACKAGES)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"importing {module} pulled in: {done.stdout.strip()}"


def test_the_probe_sees_a_forbidden_import() -> None:
    """The check above can fail: a module that imports the backends is reported."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, "negt2i.pipeline", ",".join(FORBIDDEN_ROOTS), ",".join(FORBIDDEN_PACKAGES)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "negt2i.stages.base" in done.stdout.split()


def test_the_stage_packages_re_export_the_core_types() -> None:
    """Plug-ins written against ``negt2i.stages.base`` / ``negt2i.stages.registry`` keep working."""
    from negt2i import stage_types
    from negt2i.stages import base, registry

    assert base.Image is stage_types.Image
    assert base.ModelInfo is stage_types.ModelInfo
    assert base.OperatingPoint is stage_types.OperatingPoint
    assert base.applied is stage_types.applied
    assert registry.STAGES is stage_types.STAGES
