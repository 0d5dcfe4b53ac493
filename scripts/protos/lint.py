"""A proto lint over compiled descriptors (the checks of ``buf lint`` this project relies on).

``python scripts/protos/lint.py [PROTO_ROOT]`` compiles every ``.proto`` under the root
with source info and reports:

- a package that is not versioned (``name.v1``) or does not match the file's folder;
- a file without the packaging options other languages need (``REQUIRED_OPTIONS``: ``go_package``,
  ``java_package``, ``java_multiple_files``, ``csharp_namespace``);
- a message, field, oneof, enum, enum value, service or RPC without a leading comment;
- an enum whose zero value is not ``<ENUM_NAME>_UNSPECIFIED``, or a value without the enum's prefix;
- names off the style guide: messages / enums / services / RPCs in PascalCase, fields in lower_snake_case,
  enum values in UPPER_SNAKE_CASE.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Final

from google.protobuf import descriptor_pb2

PACKAGE_RE: Final = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*\.v[0-9]+$")
PASCAL_RE: Final = re.compile(r"^[A-Z][A-Za-z0-9]*$")
SNAKE_RE: Final = re.compile(r"^[a-z][a-z0-9_]*$")
UPPER_RE: Final = re.compile(r"^[A-Z][A-Z0-9_]*$")
REQUIRED_OPTIONS: Final = ("go_package", "java_package", "java_multiple_files", "csharp_namespace")
"""File options every ``.proto`` must set (FileOptions field names)."""
VENDORED: Final = ("google/", "grpc/")
"""Folders of the protos shipped as published upstream (google.rpc status / error details, grpc.health.v1):
compiled with ours, never linted (their names and comments are upstream's)."""

# FileDescriptorProto / DescriptorProto / EnumDescriptorProto / ServiceDescriptorProto field numbers
_MESSAGE, _ENUM, _SERVICE = 4, 5, 6
_FIELD, _NESTED, _NESTED_ENUM, _ONEOF = 2, 3, 4, 8
_VALUE, _METHOD = 2, 2


def _upper_snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def compile_protos(root: Path) -> descriptor_pb2.FileDescriptorSet:
    """Compile every ``.proto`` under ``root`` (with comments) using grpcio-tools' protoc."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        code = protoc.main(
            ["protoc", f"--proto_path={root}", f"--proto_path={include}", "--include_source_info",
             f"--descriptor_set_out={out}", *files]
        )  # fmt: skip
        if code != 0:
            raise RuntimeError(f"protoc failed on {root} (exit {code})")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def lint_file(fd: descriptor_pb2.FileDescriptorProto) -> list[str]:
    """Problems of one compiled file, each ``path: element: problem``."""
    comments = {
        tuple(loc.path): (loc.leading_comments or loc.trailing_comments).strip() for loc in fd.source_code_info.location
    }
    problems: list[str] = []

    def need_comment(path: tuple[int, ...], what: str) -> None:
        if not comments.get(path):
            problems.append(f"{fd.name}: {what}: missing comment")

    def check_name(name: str, pattern: re.Pattern[str], what: str, style: str) -> None:
        if not pattern.match(name):
            problems.append(f"{fd.name}: {what}: name is not {style}")

    if not PACKAGE_RE.match(fd.package):
        problems.append(f"{fd.name}: package {fd.package!r} is not versioned (e.g. negt2i.v1)")
    elif str(Path(fd.name).parent).replace("/", ".") != fd.package:
        problems.append(f"{fd.name}: package {fd.package!r} does not match the file's folder")
    for option in REQUIRED_OPTIONS:
        if not fd.options.HasField(option):
            problems.append(f"{fd.name}: missing option {option}")

    def enum(e: descriptor_pb2.EnumDescriptorProto, path: tuple[int, ...], scope: str) -> None:
        what = f"enum {scope}{e.name}"
        need_comment(path, what)
        check_name(e.name, PASCAL_RE, what, "PascalCase")
        prefix = _upper_snake(e.name) + "_"
        if not e.value or e.value[0].number != 0 or e.value[0].name != f"{prefix}UNSPECIFIED":
            problems.append(f"{fd.name}: {what}: the zero value must be {prefix}UNSPECIFIED")
        for j, v in enumerate(e.value):
            vwhat = f"{what}.{v.name}"
            need_comment((*path, _VALUE, j), vwhat)
            check_name(v.name, UPPER_RE, vwhat, "UPPER_SNAKE_CASE")
            if not v.name.startswith(prefix):
                problems.append(f"{fd.name}: {vwhat}: value must start with {prefix}")

    def message(m: descriptor_pb2.DescriptorProto, path: tuple[int, ...], scope: str) -> None:
        what = f"message {scope}{m.name}"
        need_comment(path, what)
        check_name(m.name, PASCAL_RE, what, "PascalCase")
        for j, f in enumerate(m.field):
            fwhat = f"field {scope}{m.name}.{f.name}"
            need_comment((*path, _FIELD, j), fwhat)
            check_name(f.name, SNAKE_RE, fwhat, "lower_snake_case")
        synthetic = {f.oneof_index for f in m.field if f.proto3_optional and f.HasField("oneof_index")}
        for j, o in enumerate(m.oneof_decl):
            if j not in synthetic:
                need_comment((*path, _ONEOF, j), f"oneof {scope}{m.name}.{o.name}")
        for j, nested in enumerate(m.nested_type):
            if not nested.options.map_entry:
                message(nested, (*path, _NESTED, j), f"{scope}{m.name}.")
        for j, e in enumerate(m.enum_type):
            enum(e, (*path, _NESTED_ENUM, j), f"{scope}{m.name}.")

    for i, m in enumerate(fd.message_type):
        message(m, (_MESSAGE, i), "")
    for i, e in enumerate(fd.enum_type):
        enum(e, (_ENUM, i), "")
    for i, s in enumerate(fd.service):
        what = f"service {s.name}"
        need_comment((_SERVICE, i), what)
        check_name(s.name, PASCAL_RE, what, "PascalCase")
        for j, rpc in enumerate(s.method):
            rwhat = f"rpc {s.name}.{rpc.name}"
            need_comment((_SERVICE, i, _METHOD, j), rwhat)
            check_name(rpc.name, PASCAL_RE, rwhat, "PascalCase")
    return problems


def lint(root: str | Path) -> list[str]:
    """Problems of every ``.proto`` under ``root`` (empty when clean)."""
    out: list[str] = []
    for fd in compile_protos(Path(root)).file:
        if not fd.name.startswith(VENDORED):
            out += lint_file(fd)
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the problems; exit 1 if there are any."""
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else Path(__file__).resolve().parents[2] / "protos"
    problems = lint(root)
    for p in problems:
        print(p)
    print(f"{len(problems)} problems in {root}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
