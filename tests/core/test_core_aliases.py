"""The core's old import paths alias the moved modules, and the repository itself uses only the new ones.

The pure core moved from ``negt2i/<module>.py`` to ``negt2i/core/<module>.py`` (issue 27). Outside
code that imports an old path gets the very same module object (``negt2i/_aliases.py``), in a fresh
interpreter, with warnings as errors. Inside the repository nothing names an old path: neither an
import (ruff's banned-api list in pyproject.toml rejects those too) nor a string such as a
``monkeypatch.setattr("negt2i.spec.x", ...)`` target, a ``python -m`` line or a doc reference.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import negt2i.core
from negt2i import _aliases

REPO = Path(__file__).resolve().parents[2]

_PROBE = """
import importlib, sys
import negt2i
for name in sys.argv[1:]:
    old, new = "negt2i." + name, "negt2i.core." + name
    aliased = importlib.import_module(old)  # the old path first: the core module is made through it
    core = importlib.import_module(new)
    assert aliased is core, (old, new)
    assert sys.modules[old] is core and getattr(negt2i, name) is core, old
    assert core.__name__ == new and core.__spec__.name == new, (core.__name__, core.__spec__.name)
ours = [m for m in set(sys.modules.values()) if m.__name__.startswith("negt2i.")]
files = [m.__file__ for m in ours if getattr(m, "__file__", None)]
assert len(files) == len(set(files)), "a core module was executed twice"
print("ok")
"""


def test_each_old_path_is_the_same_module_object() -> None:
    """In a fresh interpreter, with warnings as errors: no second copy, no deprecation noise."""
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _PROBE, *_aliases.MOVED],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_alias_list_is_the_core_folder() -> None:
    """Every module in negt2i/core/ came from the package top, so each has its alias (and no more)."""
    folder = Path(negt2i.core.__file__).parent
    assert set(_aliases.MOVED) == {path.stem for path in folder.glob("*.py")} - {"__init__"}
    assert not any((REPO / "negt2i" / f"{name}.py").exists() for name in _aliases.MOVED)


def test_old_paths_support_from_imports_private_names_and_monkeypatching(monkeypatch: pytest.MonkeyPatch) -> None:
    from negt2i.verdict import judge  # noqa: TID251 (the old path, on purpose)

    import negt2i.core.verdict
    from negt2i import spec as old_spec  # noqa: TID251 (the old path, on purpose)
    from negt2i.core import spec as new_spec

    assert old_spec is new_spec
    assert judge is negt2i.core.verdict.judge
    private = [name for name in vars(new_spec) if name.startswith("_") and not name.startswith("__")]
    assert private, "negt2i.core.spec has private names to reach"
    assert getattr(old_spec, private[0]) is getattr(new_spec, private[0])
    monkeypatch.setattr("negt2i.spec.parse_prompt", "patched")
    assert new_spec.parse_prompt == "patched"


def test_an_unknown_name_under_negt2i_is_still_missing() -> None:
    with pytest.raises(ModuleNotFoundError):
        __import__("negt2i.no_such_module")


_NAMES = "|".join(_aliases.MOVED)
_OLD_PATH = re.compile(rf"\bnegt2i\.(?:{_NAMES})\b|\bnegt2i/(?:{_NAMES})\.py\b")
_SCANNED = ("negt2i", "services", "orchestrator", "tests", "benchmarks", "scripts", "examples", "docs", "docker")
_SCANNED_FILES = ("README.md", "Makefile", "pyproject.toml")
_SUFFIXES = {".py", ".pyi", ".md", ".toml", ".cfg", ".sh", ".yaml", ".yml", ".txt", ".proto", ".json", ""}
#: The files that name the old paths on purpose: the alias mechanism, ruff's ban list and this test.
_EXEMPT = {
    "pyproject.toml",
    "negt2i/_aliases.py",
    "negt2i/__init__.py",
    "negt2i/core/__init__.py",
    "tests/core/test_core_aliases.py",
}


def _scanned_files() -> list[Path]:
    files = [REPO / name for name in _SCANNED_FILES]
    for top in _SCANNED:
        for path in (REPO / top).rglob("*"):
            parts = path.relative_to(REPO).parts
            if any(part.startswith(".") or part in {"node_modules", "__pycache__"} for part in parts):
                continue
            if path.is_file() and (path.suffix in _SUFFIXES or path.name.startswith("Dockerfile")):
                files.append(path)
    files.extend((REPO / "protos").rglob("*.proto"))
    return files


def test_nothing_in_the_repository_names_an_old_path() -> None:
    stale = []
    for path in _scanned_files():
        rel = path.relative_to(REPO).as_posix()
        if rel in _EXEMPT:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if _OLD_PATH.search(line):
                stale.append(f"{rel}:{number}: {line.strip()}")
    assert not stale, "old core paths (use negt2i.core.<module>):\n" + "\n".join(stale)


def test_the_scan_sees_an_old_path() -> None:
    """The check above can fail: each spelling of an old path is caught, the new ones are not."""
    assert _OLD_PATH.search("from negt2i.spec import read_prompts")
    assert _OLD_PATH.search('monkeypatch.setattr("negt2i.flow.begin", fake)')
    assert _OLD_PATH.search("see negt2i/verdict.py")
    assert not _OLD_PATH.search("from negt2i.core.spec import read_prompts")
    assert not _OLD_PATH.search("from negt2i.perception_filex import y")
    assert not _OLD_PATH.search("mounted at /etc/negt2i/rules.json")


def test_ruff_bans_the_old_paths_for_imports() -> None:
    """ruff's banned-api list names every old path, so an import of one fails `ruff check`."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    lint = config["tool"]["ruff"]["lint"]
    banned = lint["flake8-tidy-imports"]["banned-api"]
    assert {f"negt2i.{name}" for name in _aliases.MOVED} <= set(banned)
    assert "TID251" in lint["select"] or "TID" in lint["select"]
