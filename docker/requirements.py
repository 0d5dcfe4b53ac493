"""Print the project's requirements (core + chosen extras) from pyproject.toml, one per line; read the lock.

Used inside the image builds so that the dependency layers are installed from
pyproject.toml alone, before any source code is copied (code edits then never
invalidate the multi-GB dependency layers), and by ``make setup`` / ``make lock``
(scripts/setup.sh, scripts/lock.sh). Standard library only (Python 3.11).

    python requirements.py models serving                # core + two extras
    python requirements.py --only torch,torchvision models
    python requirements.py serving reports --without bentoml
    python requirements.py --check-pinned requirements.lock [--ignore pip,setuptools,wheel]
    python requirements.py --digest                      # the lock's key: pyproject.toml's dependency tables
    python requirements.py --check-lock requirements.lock
    python requirements.py --lock-entries uv requirements.lock        # those entries, hashes included
    python requirements.py --lock-entries '!sam2' requirements.lock   # every entry but those

The lock, ``requirements.lock`` (``make lock``), is ``uv pip compile`` output: one ``name==version``
entry per distribution, an optional ``; marker``, ``--hash`` continuation lines and ``# via`` comments;
its line ``# pyproject-digest: sha256:HEX`` is the ``--digest`` of the pyproject.toml it was made from.

``--check-pinned`` fails (exit 1, naming them) when a distribution installed in the running Python is
not pinned in the lock (or any ``name==version`` file) at its installed version: every Python dependency
of every image is pinned (the project itself, ``negt2ibench``, is installed from the source after it).
``--check-lock`` fails when pyproject.toml's dependency tables changed since the lock was made.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tomllib
from pathlib import Path

DIGEST_PREFIX = "# pyproject-digest: "


def _name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise SystemExit(f"requirements.py: cannot parse requirement {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def lock_entries(lock: Path) -> dict[str, tuple[str, str]]:
    """``{normalised name: (version, entry text)}`` of a pinned requirements file (``--hash`` lines included).

    An entry is a line ``name==version [; marker] [\\]`` and its indented continuation lines; comments
    (``#`` lines, ``# via`` annotations) are dropped.
    """
    entries: dict[str, tuple[str, str]] = {}
    current: list[str] = []
    name = version = ""
    for raw in [*lock.read_text().splitlines(), ""]:
        if raw.startswith((" ", "\t")) and current:
            if not raw.strip().startswith("#"):
                current.append(raw)
            continue
        if current:
            entries[name] = (version, "\n".join(current).rstrip(" \\"))
            current = []
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;\\]+)", line)
        if match is None:
            raise SystemExit(f"requirements.py: {lock}: not a pinned requirement: {raw!r}")
        name, version = _name(match.group(1)), match.group(3)
        current = [raw]
    return entries


def digest(pyproject: Path) -> str:
    """SHA-256 of pyproject.toml's dependency tables (``requires-python``, ``dependencies``,
    ``optional-dependencies``) as canonical JSON (sorted keys, no spaces): the key the lock is made for."""
    project = tomllib.loads(pyproject.read_text())["project"]
    tables = {key: project.get(key) for key in ("requires-python", "dependencies", "optional-dependencies")}
    text = json.dumps(tables, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def check_lock(lock: Path, pyproject: Path) -> int:
    """0 when ``lock`` was made from ``pyproject``'s current dependency tables; else 1 with the fix."""
    recorded = next((line[len(DIGEST_PREFIX) :].strip() for line in lock.read_text().splitlines()
                     if line.startswith(DIGEST_PREFIX)), None)  # fmt: skip
    if recorded != digest(pyproject):
        message = (f"requirements.py: {lock} was not made from this {pyproject} (its dependencies changed since: "
                   f"lock {recorded}, pyproject {digest(pyproject)}); run `make lock` and commit both")  # fmt: skip
        print(message, file=sys.stderr)
        return 1
    return 0


def check_pinned(constraints: Path, ignore: set[str]) -> int:
    """0 when every installed distribution is pinned (``name==version``) in ``constraints``; else 1."""
    from importlib import metadata

    pins = {name: version for name, (version, _) in lock_entries(constraints).items()}
    bad = []
    for dist in metadata.distributions():
        name = _name(dist.metadata["Name"])
        if name in ignore or name == "negt2ibench":
            continue
        if pins.get(name) != dist.version:
            bad.append(f"{name}=={dist.version} (constraints: {pins.get(name, 'not pinned')})")
    if bad:
        listed = ", ".join(sorted(bad))
        print(f"requirements.py: installed but not pinned in {constraints}: {listed}; add them to pyproject.toml "
              "and run `make lock` so that every build installs the same versions", file=sys.stderr)  # fmt: skip
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
    parser.add_argument("--digest", action="store_true", help="print the digest of pyproject's dependency tables")
    parser.add_argument("--check-lock", type=Path, metavar="LOCK", help="check that LOCK was made from pyproject")
    parser.add_argument("--lock-entries", nargs=2, metavar=("NAMES", "LOCK"),
                        help="print LOCK's entries for comma-separated NAMES (!NAMES: all others)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.check_pinned is not None:
        return check_pinned(args.check_pinned, {_name(n) for n in args.ignore.split(",") if n})
    if args.digest:
        print(digest(args.pyproject))
        return 0
    if args.check_lock is not None:
        return check_lock(args.check_lock, args.pyproject)
    if args.lock_entries is not None:
        names, lock = args.lock_entries
        exclude = names.startswith("!")
        wanted = {_name(n) for n in names.lstrip("!").split(",") if n}
        entries = lock_entries(Path(lock))
        unknown = wanted - set(entries)
        if unknown:
            raise SystemExit(f"requirements.py: not in {lock}: {sorted(unknown)}")
        for name, (_, text) in entries.items():
            if (name in wanted) != exclude:
                print(text)
        return 0

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
