"""Print the project's requirements (core + chosen extras) from pyproject.toml, one per line.

Used inside the image builds so that the dependency layers are installed from
pyproject.toml alone, before any source code is copied (code edits then never
invalidate the multi-GB dependency layers). Standard library only (Python 3.11).

    python requirements.py models serving                # core + two extras
    python requirements.py --only torch,torchvision models
    python requirements.py serving reports --without bentoml
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extras", nargs="*", help="optional-dependency groups to include")
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    parser.add_argument("--only", default="", help="comma-separated names: print only these")
    parser.add_argument("--without", default="", help="comma-separated names: leave these out")
    args = parser.parse_args(argv)

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
