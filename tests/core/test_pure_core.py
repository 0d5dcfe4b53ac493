"""The pure core imports no serving, transport or model library, and nothing of the stage backends.

The folder says what the core is: every module under ``negt2i/core/`` (found by walking the folder,
so a module added there is checked without editing this file), plus the few core modules that live
inside mixed packages next to their shells (``EXTRA_CORE_MODULES``). Each is imported alone in a fresh
interpreter, and the modules it pulled in are checked: no torch, grpc, bentoml or httpx, and no
``negt2i.stages`` (the backends) or ``negt2i.wire`` (the protobuf adapter). The core's stage
vocabulary (``STAGES``, ``Image``, ``ModelInfo``) lives in ``negt2i.core.stage_types``;
``negt2i.stages`` re-exports it for plug-ins (the last test).
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import negt2i.core

#: Every module of the ``negt2i.core`` package, read from the folder.
FOLDER_MODULES = tuple(
    sorted(f"negt2i.core.{info.name}" for info in pkgutil.iter_modules(negt2i.core.__path__) if not info.ispkg)
)

#: Core modules that stay in their mixed packages, next to their shells: ``metrics.records`` (results
#: lines as metric rows), ``metrics.totals`` (the one accuracy line) and ``metrics.report``
#: (``build_report``), beside plot writers that need matplotlib; ``run.jobs`` (jobs, discovery, resume)
#: and ``run.output`` (the one results line maker and tally), beside the gRPC stream submitter. Moving
#: them would split each package's one concern over two folders; the README's layout map and
#: docs/architecture.md ("Core") name them as core.
EXTRA_CORE_MODULES = (
    "negt2i.metrics.records",
    "negt2i.metrics.totals",
    "negt2i.metrics.report",
    "negt2i.run.jobs",
    "negt2i.run.output",
)

CORE_MODULES = ("negt2i.core", *FOLDER_MODULES, *EXTRA_CORE_MODULES)

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


def test_the_core_folder_holds_the_core_modules() -> None:
    """The folder listing is real: the core's modules are found there (and nothing is a package)."""
    folder = Path(negt2i.core.__file__).parent
    on_disk = {path.stem for path in folder.glob("*.py")} - {"__init__"}
    assert {name.rsplit(".", 1)[1] for name in FOLDER_MODULES} == on_disk
    for name in ("spec", "rules", "verdict", "flow", "results", "stage_types", "images"):
        assert f"negt2i.core.{name}" in FOLDER_MODULES
    assert not [info.name for info in pkgutil.iter_modules(negt2i.core.__path__) if info.ispkg]


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
    from negt2i.core import stage_types
    from negt2i.stages import base, registry

    assert base.Image is stage_types.Image
    assert base.ModelInfo is stage_types.ModelInfo
    assert base.OperatingPoint is stage_types.OperatingPoint
    assert base.applied is stage_types.applied
    assert registry.STAGES is stage_types.STAGES
