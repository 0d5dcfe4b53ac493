#!/usr/bin/env bash
# Create (or bring up to date) the project's virtual environment at .venv/.
# Idempotent: re-installs only when pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "setup: $PY not found; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
    exit 1
fi
stamp_key=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
stamp=.venv/.setup-$stamp_key
if [ -f "$stamp" ]; then
    exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[dev]"
rm -f .venv/.setup-*
touch "$stamp"
echo "setup: .venv ready"
