"""Print the project's requirements (core + chosen extras) from pyproject.toml, one per line.

Used inside the image builds so that the dependency layers are installed from
pyproject.toml alone, before any source code is copied (code edits then never
invalidate the multi-GB dependency layers). Standard library only (Python 3.11).

    python requirements.py models serving                # core + two extras
    python requirements.py --only torch,torchvision models
    python requirements.py serving reports --without bentoml
    python requirements.py --check-pinned constraints.txt [--ignore pip,setuptools,wheel]

``--check-pinned`` fails (exit 1, naming them) when a distribution installed in the running Python is
not pinned in the constraints file at its installed version: every Python dependency of every image is
pinned (the project itself, ``negt2ibench``, is installed from the source after it).
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path


def _name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise SystemExit(f"requirements.py: cannot parse requirement {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def check_pinned(constraints: Path, ignore: set[str]) -> int:
    """0 when every installed distribution is pinned (``name==version``) in ``constraints``; else 1."""
    from importlib import metadata

    pins: dict[str, str] = {}
    for raw in constraints.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[_name(name)] = version.strip()
    bad = []
    for dist in metadata.distributions():
        name = _name(dist.metadata["Name"])
        if name in ignore or name == "negt2ibench":
            continue
        if pins.get(name) != dist.version:
            bad.append(f"{name}=={dist.version} (constraints: {pins.get(name, 'not pinned')})")
    if bad:
        listed = ", ".join(sorted(bad))
        print(f"requirements.py: installed but not pinned in {constraints}: {listed}; add them (make constraints) "
              "so that every build installs the same versions", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extras", nargs="*", help="optional-dependency groups to include")
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    parser.add_argument("--only", default="", help="comma-separated names: print only these")
    parser.add_argument("--without", default="", help="comma-separated names: leave these out")
    parser.add_argument("--check-pinned", type=Path, metavar="CONSTRAINTS",
                        help="check that every installed distribution is pinned in CONSTRAINTS")  # fmt: skip
    parser.add_argument("--ignore", default="", help="with --check-pinned: comma-separated names not checked")
    args = parser.parse_args(argv)
    if args.check_pinned is not None:
        return check_pinned(args.check_pinned, {_name(n) for n in args.ignore.split(",") if n})

    project = tomllib.loads(args.pyproject.read_text())["project"]
    groups = project.get("optional-dependencies", {})
    unknown = [extra for extra in args.extras if extra not in groups]
    if unknown:
        raise SystemExit(f"requirements.py: unknown extras {unknown}; known: {sorted(groups)}")
    requirements = list(project.get("dependencies", []))
    for extra in args.extras:
        requirements += groups[extra]

    only = {_name(n) for n in args.only.split(",") if n}
    without = {_name(n) for n in args.without.split(",") if n}
    missing = only - {_name(r) for r in requirements}
    if missing:
        raise SystemExit(f"requirements.py: --only names not in the requirements: {sorted(missing)}")
    for requirement in requirements:
        name = _name(requirement)
        if (only and name not in only) or name in without:
            continue
        print(requirement)
    return 0


if __name__ == "__main__":
    sys.exit(main())
