#!/usr/bin/env bash
# Regenerate the Python protobuf / gRPC stubs of protos/negt2i/v1 into negt2i/wire/v1 and lint the protos.
# tests/protos fails when the committed stubs differ from what this produces.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" scripts/protos/codegen.py
"$PY" scripts/protos/lint.py
