"""The protos shipped beside ours under ``protos/`` (one include root for clients in any language): the
health service (``grpc/health/v1/health.proto``) and the rich error model (``google/rpc/status.proto``,
``google/rpc/error_details.proto``) are the published ones, and ``protos/`` alone (plus protoc's
well-known types) compiles every file."""

from __future__ import annotations

import tempfile
from pathlib import Path

import google.rpc
import grpc_tools
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2
from grpc_tools import protoc

from tests.protos.tooling import codegen

ROOT = codegen.PROTO_ROOT


def compile_set(*files: str) -> descriptor_pb2.FileDescriptorSet:
    """``files`` and their imports compiled from ``protos/`` (and protoc's own google/protobuf only)."""
    wkt = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        code = protoc.main(["protoc", f"--proto_path={ROOT}", f"--proto_path={wkt}", "--include_imports",
                            f"--descriptor_set_out={out}", *files])  # fmt: skip
        assert code == 0, f"protoc failed on {files}"
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def test_the_rich_error_protos_are_googleapis_own() -> None:
    installed = Path(google.rpc.__file__).parent if google.rpc.__file__ else Path(next(iter(google.rpc.__path__)))
    for name in ("status.proto", "error_details.proto"):
        shipped = ROOT / "google" / "rpc" / name
        assert shipped.read_bytes() == (installed / name).read_bytes(), f"{shipped} differs from googleapis'"


def test_health_proto_matches_grpcio_health_checking() -> None:
    (fd,) = [f for f in compile_set("grpc/health/v1/health.proto").file if f.name == "grpc/health/v1/health.proto"]
    want = descriptor_pb2.FileDescriptorProto()
    health_pb2.DESCRIPTOR.CopyToProto(want)
    fd.ClearField("name")
    want.ClearField("name")  # grpcio-health-checking names its copy grpc_health/v1/health.proto
    for message in [*fd.message_type, *(n for m in fd.message_type for n in m.nested_type)]:
        for field in message.field:
            field.ClearField("json_name")  # protoc's descriptor sets fill it in, the runtime's copy does not
    assert fd == want


def test_every_proto_compiles_from_the_one_include_root() -> None:
    ours = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.proto"))
    names = {f.name for f in compile_set(*ours).file}
    assert set(ours) <= names
    imported = names - set(ours)
    assert imported and all(n.startswith("google/protobuf/") for n in imported), imported  # protoc's own only
    evaluator = next(f for f in compile_set("negt2i/v1/evaluator.proto").file if f.name == "negt2i/v1/evaluator.proto")
    assert "google/rpc/status.proto" in evaluator.dependency
