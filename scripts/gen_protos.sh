#!/usr/bin/env bash
# Regenerate the Python protobuf / gRPC stubs of protos/negt2i/v1 into negt2i/wire/v1 and the JSON Schemas
# into protos/negt2i/v1/schemas, and lint the protos.
# tests/protos fails when the committed stubs or schemas differ from what this produces.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" scripts/protos/codegen.py
"$PY" scripts/protos/schemas.py
"$PY" scripts/protos/lint.py
