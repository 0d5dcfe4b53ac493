"""Generate the Python stubs of ``protos/negt2i/v1`` into ``negt2i/wire/v1`` (reproducibly).

``python scripts/protos/codegen.py`` (or ``scripts/gen_protos.sh``) runs grpcio-tools'
bundled ``protoc`` with the python, mypy (``mypy-protobuf``) and grpc plugins,
then rewrites the generated imports from the proto package path
(``negt2i.v1``) to where the stubs live (``negt2i.wire.v1``). The serialized
descriptors are never touched. ``tests/protos`` regenerates into a temporary
directory and fails when the committed stubs differ.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "protos"
PROTO_DIR = PROTO_ROOT / "negt2i" / "v1"
STUB_DIR = REPO / "negt2i" / "wire" / "v1"
STUB_PACKAGE = "negt2i.wire.v1"
_MODULE_RE = re.compile(r"\bnegt2i\.v1\.(\w+_pb2(?:_grpc)?)\b")
_FROM_RE = re.compile(r"^from negt2i\.v1 import ", re.MULTILINE)
_STUB_RE = re.compile(r"^class \w+Stub\b", re.MULTILINE)
_INIT = '"""Generated protobuf / gRPC stubs of ``protos/negt2i/v1`` (made by ``scripts/protos/codegen.py``)."""\n'


def proto_files() -> list[Path]:
    """The ``.proto`` files of the package, sorted."""
    return sorted(PROTO_DIR.glob("*.proto"))


def _plugin(name: str) -> str:
    exe = Path(sys.executable).parent / name
    found = str(exe) if exe.exists() else shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found; install the dev extra (mypy-protobuf)")
    return found


def _rewrite(text: str) -> str:
    text = _FROM_RE.sub(f"from {STUB_PACKAGE} import ", text)
    return _MODULE_RE.sub(lambda m: f"{STUB_PACKAGE}.{m.group(1)}", text)


def generate(out_dir: Path) -> list[Path]:
    """Write the stubs (and an ``__init__.py``) into ``out_dir``; returns the written files, sorted."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"--proto_path={PROTO_ROOT}",
            f"--proto_path={include}",
            f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
            f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            *(str(p.relative_to(PROTO_ROOT)) for p in proto_files()),
        ]
        code = protoc.main(args)
        if code != 0:
            raise RuntimeError(f"protoc failed with exit code {code}")
        written: list[Path] = []
        for src in sorted((Path(tmp) / "negt2i" / "v1").iterdir()):
            text = src.read_text(encoding="utf-8")
            if "_pb2_grpc" in src.name and not _STUB_RE.search(text):
                continue  # protoc writes an empty grpc module for protos without services
            dst = out_dir / src.name
            dst.write_text(_rewrite(text), encoding="utf-8")
            written.append(dst)
    init = out_dir / "__init__.py"
    init.write_text(_INIT, encoding="utf-8")
    return sorted([*written, init])


def main(argv: list[str] | None = None) -> int:
    """Regenerate the committed stubs (or ``--out DIR``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=STUB_DIR, help="output directory (default: %(default)s)")
    args = parser.parse_args(argv)
    for stale in args.out.glob("*_pb2*"):
        stale.unlink()
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
