"""Import modules as an image would: only the distributions its requirements pull in are importable.

Run as a subprocess by test_dockerfiles.py, from the repository root:

    python tests/k8s/import_closure.py REQUIREMENTS_JSON MODULES_JSON [BENTOML_TARGETS_JSON]

REQUIREMENTS_JSON is what docker/requirements.py prints for the image (a JSON list);
their transitive closure is computed from the installed distributions' metadata.
BENTOML_TARGETS_JSON lists `bentoml serve` targets, resolved as BentoML does (a module-only
target must define exactly one service).
Every other third-party top-level module is blocked, so an import the image could not
satisfy fails here as ModuleNotFoundError. Prints the blocked top-level names (JSON).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata as md
import importlib.util
import json
import re
import sys
from collections.abc import Sequence
from types import ModuleType

from packaging.requirements import Requirement

PROJECT_MODULES = {"negt2i", "orchestrator", "services"}
"""Our own code, copied into every image."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(requirements: Sequence[str]) -> set[str]:
    """Normalised names of the distributions ``requirements`` install (with extras and markers)."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        key = (_norm(req.name), tuple(sorted(req.extras)))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue
        for line in dist.requires or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
                todo.append(sub)
    return {name for name, _ in seen}


class _Blocker(importlib.abc.MetaPathFinder):
    def __init__(self, blocked: set[str]) -> None:
        self.blocked = blocked

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        top = fullname.partition(".")[0]
        if top in self.blocked:
            raise ModuleNotFoundError(f"No module named {top!r} (not installed in this image)", name=top)
        return None


def main(argv: Sequence[str]) -> int:
    requirements, modules = json.loads(argv[0]), json.loads(argv[1])
    missing = []
    for line in requirements:
        try:
            md.distribution(Requirement(line).name)
        except md.PackageNotFoundError:
            missing.append(line)
    if missing:
        print(
            f"not installed in this environment: {', '.join(missing)}; the image check needs the same "
            "extras as the image: `make setup` installs dev, models, serving and reports",
            file=sys.stderr,
        )
        return 3
    installed = closure(requirements)
    blocked = {
        top
        for top, dists in md.packages_distributions().items()
        if top not in PROJECT_MODULES and not any(_norm(d) in installed for d in dists)
    }
    sys.path.insert(0, ".")
    sys.meta_path.insert(0, _Blocker(blocked))
    # Availability probes (``importlib.util.find_spec(name) is not None``, as diffusers and transformers do for
    # their optional packages) see a blocked package as absent, as they would in the image, instead of failing.
    probe = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> importlib.machinery.ModuleSpec | None:
        return None if name.partition(".")[0] in blocked else probe(name, package)

    importlib.util.find_spec = find_spec
    for module in modules:
        importlib.import_module(module)
    targets = json.loads(argv[2]) if len(argv) > 2 else []
    if targets:
        from bentoml._internal.service.loader import import_service

        for target in targets:
            import_service(target)
    print(json.dumps(sorted(blocked)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
