#!/usr/bin/env bash
# `make test-latest`: the README's test command (lint, types, the whole suite) in a throwaway environment with
# the NEWEST versions pyproject.toml allows, not the lock's: what a user who runs `pip install '.[...]'`
# without the lock gets today. Not part of CI's gate (other people's releases would fail it); run it before
# each lock update (`make lock UPGRADE=1`) and record its result in docs/dependencies.md.
#
# The environment is .venv-latest/ (removed first; KEEP=1 keeps it for a rerun). uv comes from .venv
# (`make setup`); ARGS passes pytest arguments (default: the whole suite as `make unit` runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
export UV_PYTHON_DOWNLOADS=never  # uv uses the interpreters given to it, never one it downloads
VENV=.venv-latest
UV=.venv/bin/uv
PY=${PYTHON:-.venv/bin/python}
if [ "${KEEP:-0}" != 1 ] || [ ! -x "$VENV/bin/python" ]; then
    rm -rf "$VENV"
    "$UV" venv --quiet --seed --python "$PY" "$VENV"  # with pip, as a user's venv has it
    in_venv=(--python "$VENV/bin/python")
    extras=$("$PY" -c 'import tomllib; print(",".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]))')
    # torch first (pinned by pyproject.toml) with setuptools: sam2's build imports torch (no build isolation).
    "$UV" pip install "${in_venv[@]}" --upgrade "$("$PY" docker/requirements.py --only torch models)" \
        "$("$PY" docker/requirements.py --only torchvision models)" setuptools wheel
    SAM2_BUILD_CUDA=0 SAM2_BUILD_ALLOW_ERRORS=1 "$UV" pip install "${in_venv[@]}" --upgrade \
        --no-build-isolation-package sam2 -e ".[$extras]"
fi
echo "test-latest: $("$VENV/bin/python" -m pip --version 2>/dev/null | cut -d' ' -f1-2 || true) newest allowed versions:"
"$UV" pip list --python "$VENV/bin/python" --format freeze > "$VENV/versions.txt"
{ diff <("$PY" docker/requirements.py --lock-entries '!' requirements.lock | grep -E '^[A-Za-z0-9]' | sed 's/ .*//') \
    <(grep -v '^negt2ibench' "$VENV/versions.txt") || true; } | sed -n 's/^< /  lock:   /p; s/^> /  latest: /p'
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"
# shellcheck disable=SC2086
"$VENV/bin/python" -m pytest -n 2 --dist loadgroup -q -p no:cacheprovider ${ARGS:-}
echo "test-latest: passed on $(date -u +%Y-%m-%d) (record it in docs/dependencies.md)"
