#!/usr/bin/env bash
# Print the path of a uv at requirements.lock's version (the one installer of make setup, make lock and make
# test-pythons): .venv/bin/uv when it is that version, else build/uv/bin/uv, installed there on first use
# with pip from the lock's entry (hash-checked). PYTHON picks the interpreter for that bootstrap.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
want=$("$PY" docker/requirements.py --lock-entries uv requirements.lock | sed -n 's/^uv==\([^ ;\\]*\).*/\1/p')
for uv in .venv/bin/uv build/uv/bin/uv; do
    if [ -x "$uv" ] && [ "$("$uv" --version | cut -d' ' -f2)" = "$want" ]; then
        echo "$uv"
        exit 0
    fi
done
rm -rf build/uv
mkdir -p build
"$PY" -m venv build/uv
"$PY" docker/requirements.py --lock-entries uv requirements.lock > build/uv/uv.txt
build/uv/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps \
    -r build/uv/uv.txt >&2
echo build/uv/bin/uv
