"""requirements.lock as the tests read it: through docker/requirements.py, its one reader (make setup, make lock
and the image builds use the same functions)."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements.lock"


@cache
def requirements_module() -> ModuleType:
    """docker/requirements.py, imported (it is a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("negt2i_docker_requirements", REPO / "docker" / "requirements.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lock_entries(path: Path = LOCK) -> dict[str, tuple[str, str]]:
    """``{normalised name: (version, entry text)}`` of the lock."""
    entries: dict[str, tuple[str, str]] = requirements_module().lock_entries(path)
    return entries


def lock_version(name: str) -> str:
    """The locked version of one distribution (a KeyError when the lock lacks it)."""
    return lock_entries()[requirements_module()._name(name)][0]
