"""The wire contract: stubs reproducible from ``protos/``, and the proto lint (buf's checks, over descriptors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.protos.tooling import codegen, lint

BAD_PROTO = """
syntax = "proto3";
package negt2i;

message thing {
  string Name = 1;
}

// Colours.
enum Colour {
  RED = 0;
  // Blue.
  COLOUR_BLUE = 1;
}

// A service.
service Things {
  rpc get(thing) returns (thing);
}
"""


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path):
    fresh = codegen.generate(tmp_path / "v1")
    committed = sorted(p for p in codegen.STUB_DIR.iterdir() if p.suffix in {".py", ".pyi"})
    assert [p.name for p in fresh] == [p.name for p in committed], "stub files differ; run scripts/gen_protos.sh"
    for new in fresh:
        old = codegen.STUB_DIR / new.name
        assert new.read_text() == old.read_text(), f"{old} drifted from protos/; run scripts/gen_protos.sh"


def test_our_protos_pass_the_lint():
    assert lint(codegen.PROTO_ROOT) == []


def test_the_lint_catches_what_buf_would(tmp_path: Path):
    (tmp_path / "negt2i").mkdir()
    (tmp_path / "negt2i" / "bad.proto").write_text(BAD_PROTO)
    problems = "\n".join(lint(tmp_path))
    for needle in [
        "package 'negt2i' is not versioned",
        "message thing: missing comment",
        "message thing: name is not PascalCase",
        "field thing.Name: missing comment",
        "field thing.Name: name is not lower_snake_case",
        "enum Colour: the zero value must be COLOUR_UNSPECIFIED",
        "enum Colour.RED: missing comment",
        "enum Colour.RED: value must start with COLOUR_",
        "rpc Things.get: missing comment",
        "rpc Things.get: name is not PascalCase",
        "negt2i/bad.proto: missing option go_package",
        "negt2i/bad.proto: missing option java_package",
        "negt2i/bad.proto: missing option csharp_namespace",
    ]:
        assert needle in problems


@pytest.mark.parametrize("name", ["common", "stages", "evaluator"])
def test_every_proto_file_is_in_the_versioned_package(name: str):
    text = (codegen.PROTO_DIR / f"{name}.proto").read_text()
    assert "package negt2i.v1;" in text and 'syntax = "proto3";' in text


def test_the_core_and_the_cli_import_no_serving_or_model_library():
    import subprocess
    import sys

    code = (
        "import sys, negt2i, negt2i.cli, negt2i.client, negt2i.conformance, negt2i.cli.submit_cmd, "
        "negt2i.cli.conformance_cmd; negt2i.cli.build_parser(); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'grpc', 'bentoml', 'torch', 'google'}); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
