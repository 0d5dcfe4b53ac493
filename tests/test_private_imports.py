"""No module of ``negt2i/``, ``orchestrator/`` or ``services/`` imports another module's private name.

A name with a leading underscore is its module's own business: a second module that imports it
(``from negt2i.audit import _safe``) ties itself to something the owner may change without notice. What
is shared is made public where it lives (or moved to the module that uses it). A package's private
*submodule* (``negt2i/judges/_torch.py``) may be imported by the modules of that package, which own it.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("negt2i", "orchestrator", "services")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_submodule(dotted: str) -> bool:
    base = REPO.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _package_of(path: Path) -> str:
    """The package that holds the module at ``path`` (for a package's ``__init__``, the package itself)."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1])


def _within(package: str, owner: str) -> bool:
    """``package`` is ``owner`` or one of its subpackages."""
    return package == owner or package.startswith(owner + ".")


def private_imports(source: str, path: Path) -> list[str]:
    """``LINE: from X import _y`` (or ``LINE: X._y``) for each private name of another module that ``source``,
    the module at ``path``, imports."""
    tree = ast.parse(source)
    package = _package_of(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            if module.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                dotted = f"{module}.{alias.name}"
                own_submodule = _is_submodule(dotted) and module == package
                if _private(alias.name) and not own_submodule:
                    found.append(f"{node.lineno}: from {module} import {alias.name}")
            names = [module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:  # a private module, imported from outside the package that holds it
            parts = name.split(".")
            for i, part in enumerate(parts):
                if _private(part) and parts[0] in PACKAGES and not _within(package, ".".join(parts[:i])):
                    found.append(f"{node.lineno}: {name}")
    return found


def test_no_module_imports_another_module_s_private_name() -> None:
    offending = {
        str(path.relative_to(REPO)): hits
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        if not path.name.endswith(("_pb2.py", "_pb2_grpc.py"))
        and (hits := private_imports(path.read_text(encoding="utf-8"), path))
    }
    assert not offending, offending


def test_the_check_sees_a_private_import() -> None:
    """The scan itself: a private name of another module is reported, a package's own private submodule and a
    public name are not."""
    source = (
        "from negt2i.audit import AuditError, _font\n"
        "import negt2i.judges._torch\n"
        "from negt2i.judges import _torch\n"
        "from .audit import _safe\n"
    )
    assert private_imports(source, REPO / "negt2i" / "probe.py") == [
        "1: from negt2i.audit import _font",
        "2: negt2i.judges._torch",
        "3: from negt2i.judges import _torch",
        "4: from negt2i.audit import _safe",
    ]
    own = "from negt2i.judges._torch import resolve\nfrom negt2i.judges import _torch\nfrom . import _torch\n"
    assert private_imports(own, REPO / "negt2i" / "judges" / "probe.py") == []
