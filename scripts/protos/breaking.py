"""The versioning rule of ``negt2i.v1``, checked: changes to the protos are additive only.

``snapshot(root)`` lists every element a client can depend on (messages and their fields with
number, type, label and oneof; enums and their values; services and their RPCs with request,
response and streaming), compiled from the ``.proto`` files. ``breaking(old, new)`` names every
element of ``old`` that ``new`` removed, renumbered, renamed or retyped (buf's FILE-level
breaking checks, over descriptors); additions are allowed. ``tests/protos/test_breaking.py``
compares the protos with the committed baseline ``tests/protos/negt2i-v1.baseline.json``;
``python scripts/protos/breaking.py --update`` rewrites the baseline after an additive change, so
that the new elements are protected too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2

REPO = Path(__file__).resolve().parents[2]
BASELINE = REPO / "tests" / "protos" / "negt2i-v1.baseline.json"
PACKAGE = "negt2i.v1"

_TYPES = {v: k.removeprefix("TYPE_").lower() for k, v in descriptor_pb2.FieldDescriptorProto.Type.items()}
_LABELS = {v: k.removeprefix("LABEL_").lower() for k, v in descriptor_pb2.FieldDescriptorProto.Label.items()}


def _compile(root: Path) -> descriptor_pb2.FileDescriptorSet:
    sys.path.insert(0, str(Path(__file__).parent))
    from lint import compile_protos

    return compile_protos(root)


def snapshot(root: Path) -> dict[str, Any]:
    """Every element of the ``negt2i.v1`` package, keyed by full name."""
    out: dict[str, Any] = {"messages": {}, "enums": {}, "services": {}}

    def enum(e: descriptor_pb2.EnumDescriptorProto, scope: str) -> None:
        out["enums"][f"{scope}.{e.name}"] = {v.name: v.number for v in e.value}

    def message(m: descriptor_pb2.DescriptorProto, scope: str) -> None:
        name = f"{scope}.{m.name}"
        fields = {}
        for f in m.field:
            oneof = ""
            if f.HasField("oneof_index") and not f.proto3_optional:
                oneof = m.oneof_decl[f.oneof_index].name
            fields[f.name] = {
                "number": f.number,
                "type": f.type_name.lstrip(".") or _TYPES[f.type],
                "label": _LABELS[f.label],
                "optional": f.proto3_optional,
                "oneof": oneof,
            }
        out["messages"][name] = fields
        for nested in m.nested_type:
            message(nested, name)
        for e in m.enum_type:
            enum(e, name)

    for fd in _compile(root).file:
        if fd.package != PACKAGE:
            continue
        for m in fd.message_type:
            message(m, fd.package)
        for e in fd.enum_type:
            enum(e, fd.package)
        for s in fd.service:
            out["services"][f"{fd.package}.{s.name}"] = {
                r.name: {
                    "input": r.input_type.lstrip("."),
                    "output": r.output_type.lstrip("."),
                    "client_streaming": r.client_streaming,
                    "server_streaming": r.server_streaming,
                }
                for r in s.method
            }
    return out


def breaking(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Every change from ``old`` to ``new`` that is not additive, in words."""
    problems: list[str] = []
    for kind in ("messages", "enums", "services"):
        for name, members in old[kind].items():
            if name not in new[kind]:
                problems.append(f"{kind[:-1]} {name} was removed or renamed")
                continue
            now = new[kind][name]
            for member, spec in members.items():
                if member not in now:
                    problems.append(f"{name}.{member} was removed or renamed")
                elif now[member] != spec:
                    problems.append(f"{name}.{member} changed: {spec} -> {now[member]}")
            if kind == "messages":  # a number reused under another name
                numbers = {spec["number"]: member for member, spec in members.items()}
                for member, spec in now.items():
                    was = numbers.get(spec["number"])
                    if was is not None and was != member:
                        problems.append(f"{name}.{member} reuses field number {spec['number']} of {was}")
            if kind == "enums":
                numbers = {num: member for member, num in members.items()}
                for member, num in now.items():
                    if numbers.get(num, member) != member:
                        problems.append(f"{name}.{member} reuses value {num} of {numbers[num]}")
    return problems


def render(snap: dict[str, Any]) -> str:
    """The baseline file: JSON, one line per field / enum value / RPC, so that diffs read well."""
    lines = ["{"]
    for k, kind in enumerate(sorted(snap)):
        lines.append(f" {json.dumps(kind)}: {{")
        names = sorted(snap[kind])
        for i, name in enumerate(names):
            members = snap[kind][name]
            lines.append(f"  {json.dumps(name)}: {{")
            keys = list(members)
            for j, member in enumerate(keys):
                spec = json.dumps(members[member], sort_keys=True)
                lines.append(f"   {json.dumps(member)}: {spec}{',' if j < len(keys) - 1 else ''}")
            lines.append(f"  }}{',' if i < len(names) - 1 else ''}")
        lines.append(f" }}{',' if k < len(snap) - 1 else ''}")
    return "\n".join([*lines, "}"]) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Check the protos against the baseline, or ``--update`` it (after an additive change)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--root", type=Path, default=REPO / "protos")
    parser.add_argument("--update", action="store_true", help="rewrite the baseline (refused if not additive)")
    args = parser.parse_args(argv)
    new = snapshot(args.root)
    old = json.loads(BASELINE.read_text(encoding="utf-8")) if BASELINE.exists() else None
    problems = breaking(old, new) if old is not None else []
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} breaking changes: negt2i.v1 is additive only (docs/api.md)", file=sys.stderr)
        return 1
    if args.update:
        BASELINE.write_text(render(new), encoding="utf-8")
        print(BASELINE)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
