"""``make protos-dist``: the versioned protos artefact, its contents, and protoc on its include root."""

from __future__ import annotations

import tarfile
from pathlib import Path

from tests.protos.tooling import codegen, compile_protos, dist, lint


def test_the_artefact_holds_the_include_root_and_is_reproducible(tmp_path: Path):
    first = dist.build(tmp_path / "a")
    again = dist.build(tmp_path / "b")
    version = dist.version()
    assert first.name == f"negt2i-protos-{version}.tar.gz" and version.count(".") == 2
    assert first.read_bytes() == again.read_bytes()  # reproducible, byte for byte
    root = f"negt2i-protos-{version}"
    with tarfile.open(first) as tar:
        members = {m.name: m for m in tar.getmembers()}
        want = {f"{root}/{p.relative_to(codegen.PROTO_ROOT).as_posix()}" for p in dist.files()}
        for name in (
            "negt2i/v1/evaluator.proto",
            "negt2i/v1/common.proto",
            "negt2i/v1/stages.proto",
            "negt2i/v1/schemas/statement-measurements.schema.json",
        ):
            assert f"{root}/{name}" in want
        files = {n for n, m in members.items() if m.isfile()}
        assert files == want | {f"{root}/README.md"}
        assert all(n == root or n.startswith(root + "/") for n in members)  # one folder: no tarbomb
        assert all(m.mtime == 0 and m.uid == 0 and m.mode in (0o644, 0o755) for m in members.values())
        for name in want:
            rel = name.removeprefix(root + "/")
            extracted = tar.extractfile(name)
            assert extracted is not None and extracted.read() == (codegen.PROTO_ROOT / rel).read_bytes()
        readme = tar.extractfile(f"{root}/README.md")
        assert readme is not None
        text = readme.read().decode()
    assert "is the include root" in text and "negt2i.v1" in text and "evaluator.proto" in text


def test_protoc_compiles_the_unpacked_artefact_from_its_include_root(tmp_path: Path):
    archive = dist.build(tmp_path)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    root = tmp_path / "x" / f"negt2i-protos-{dist.version()}"
    fds = compile_protos(root)  # grpcio-tools' protoc, -I <the unpacked folder> only (+ protoc's own includes)
    names = {f.name for f in fds.file}
    assert {"negt2i/v1/evaluator.proto", "negt2i/v1/common.proto", "negt2i/v1/stages.proto"} <= names
    evaluator = next(f for f in fds.file if f.name == "negt2i/v1/evaluator.proto")
    assert evaluator.options.go_package.endswith(";negt2iv1") and evaluator.options.java_multiple_files
    assert lint(root) == []
