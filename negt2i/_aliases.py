"""The core's old import paths: ``negt2i.<module>`` is the very module object ``negt2i.core.<module>``.

The pure core moved from the package top into ``negt2i/core/`` (issue 27). Outside code written
against the old paths (``from negt2i.spec import read_prompts``, ``from negt2i.verdict import judge``)
keeps working, with no warning: an import of an old path imports the core module and binds the same
object under the old name, so ``negt2i.spec is negt2i.core.spec``, private names resolve, and
monkeypatching either name patches both. There are no files at the old paths (so git follows the
moves); this finder is the whole mechanism. New code, and everything in this repository
(``tests/core/test_core_aliases.py`` checks), imports ``negt2i.core.<module>``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

#: The modules that moved into ``negt2i.core`` (old name under ``negt2i`` -> the same name under it).
MOVED = (
    "config",
    "failures",
    "files",
    "flow",
    "geometry",
    "images",
    "jsonl",
    "labels",
    "perception",
    "perception_file",
    "plan",
    "rejudge",
    "results",
    "rle",
    "rules",
    "spec",
    "stage_identity",
    "stage_types",
    "verdict",
    "vocab",
)

ALIASES = {f"negt2i.{name}": f"negt2i.core.{name}" for name in MOVED}


class _AliasLoader(importlib.abc.Loader):
    """Hands the import system the already imported core module instead of making a new one."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self._target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the alias's spec on the module (``module_from_spec`` always sets
        # ``__spec__``); the core module keeps its own, so reloads and pickling see the real name.
        module.__spec__ = self._spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds ``negt2i.<old>`` for each moved core module, and nothing else."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        alias_of = ALIASES.get(fullname)
        if alias_of is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(alias_of))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (idempotent)."""
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
