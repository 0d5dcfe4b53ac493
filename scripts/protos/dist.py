"""Build the versioned protos artefact: ``dist/negt2i-protos-<version>.tar.gz`` (``make protos-dist``).

The archive holds one folder, ``negt2i-protos-<version>/``, which is the include root: every file under
``protos/`` (the ``.proto`` files and the JSON Schemas of ``negt2i/v1/schemas/``) at the same relative
path, plus a ``README.md`` naming the version, the include root and the files. ``<version>`` is the
package version of ``pyproject.toml``. The build is reproducible: entries sorted, every timestamp 0,
owner 0:0, modes 0644 / 0755, gzip without a name or time, so the same tree gives the same bytes.
``tests/protos/test_dist.py`` builds it, checks its contents and compiles it with protoc.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import sys
import tarfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "protos"
API_VERSION = "negt2i.v1"


def version() -> str:
    """The package version (``pyproject.toml``)."""
    with (REPO / "pyproject.toml").open("rb") as fh:
        return str(tomllib.load(fh)["project"]["version"])


def files(root: Path = PROTO_ROOT) -> list[Path]:
    """Every file of the include root, sorted by relative path (caches and hidden files left out)."""
    out = [
        p
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(root).parts)
    ]
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def readme(name: str, entries: list[tuple[str, bytes]]) -> str:
    """The archive's README: version, include root, compile commands, the files with their SHA-256."""
    lines = [
        f"# {name}: the protos of the NegT2IBench evaluator's gRPC API ({API_VERSION})",
        "",
        f"This folder ({name}/) is the include root: imports are relative to it",
        '(import "negt2i/v1/common.proto";), so compile with -I (--proto_path) pointing here:',
        "",
        f"    cd {name} && protoc -I . --go_out=OUT --go-grpc_out=OUT negt2i/v1/*.proto",
        "",
        "The generators' guide (requests, vocabulary, verdicts, stream contract, errors, health,",
        "versioning) is docs/api.md of the evaluator's repository. Schemas of the JSON carried in",
        "string fields (measurements_json, config_json, rules_json) are in negt2i/v1/schemas/.",
        "",
        "Files (SHA-256):",
        "",
    ]
    lines += [f"    {hashlib.sha256(data).hexdigest()}  {rel}" for rel, data in entries]
    return "\n".join(lines) + "\n"


def _info(name: str, size: int = 0, *, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if directory else 0o644
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.size = size
    return info


def build(out_dir: Path, root: Path = PROTO_ROOT, ver: str | None = None) -> Path:
    """Write ``negt2i-protos-<version>.tar.gz`` into ``out_dir``; returns its path."""
    name = f"negt2i-protos-{ver or version()}"
    entries = [(p.relative_to(root).as_posix(), p.read_bytes()) for p in files(root)]
    entries.append(("README.md", readme(name, entries).encode()))
    dirs = sorted({f"{name}/{parent}" for rel, _ in entries for parent in _parents(rel)} | {name})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in dirs:
            tar.addfile(_info(d, directory=True))
        for rel, data in sorted(entries):
            tar.addfile(_info(f"{name}/{rel}", len(data)), io.BytesIO(data))
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}.tar.gz"
    with target.open("wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0) as gz:
        gz.write(buf.getvalue())
    return target


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def main(argv: list[str] | None = None) -> int:
    """Build the artefact into ``--out`` (default ``dist/``) and print its path."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=REPO / "dist", help="output directory (default: %(default)s)")
    args = parser.parse_args(argv)
    print(build(args.out))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
