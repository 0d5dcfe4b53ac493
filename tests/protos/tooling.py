"""The proto tooling of ``scripts/protos/`` (not a package: loaded from its files)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "protos"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"negt2i_scripts_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


codegen = _load("codegen")
_lint = _load("lint")
lint = _lint.lint
compile_protos = _lint.compile_protos
schemas = _load("schemas")
dist = _load("dist")
breaking = _load("breaking")
