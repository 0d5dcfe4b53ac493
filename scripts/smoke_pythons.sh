#!/usr/bin/env bash
# `make test-pythons`: the pure core on the other supported Pythons (3.12, 3.13; the whole suite runs on 3.11).
#
# For each version V in PYTHONS (default "3.12 3.13"): a virtual environment .venv-V/ with the core profile
# (`pip install .` at requirements.lock's versions: numpy, scipy, pydantic, ... no torch) plus pytest and
# hypothesis (uv from scripts/uv.sh, constrained by the lock), then the smoke subset
# below: the rules, verdicts, prompt records, measurements, the CLI and the corpus validator. The interpreter
# is python3.V on PATH, else ~/.pyenv/versions/V.*/bin/python3.V. In CI (CI=true) a missing interpreter is an
# error; elsewhere that version is skipped with a message. Re-runs reuse .venv-V until pyproject.toml or this
# script changes.
set -euo pipefail
cd "$(dirname "$0")/.."
export UV_PYTHON_DOWNLOADS=never  # uv uses the interpreters given to it, never one it downloads
PYTHONS=${PYTHONS:-"3.12 3.13"}

# Test files that need only the core profile (no torch, OpenCV, protobuf, matplotlib); the two deselected
# tests run OpenCV's mask post-processing.
SMOKE=(
    tests/core/test_rules.py
    tests/core/test_properties.py
    tests/core/test_verdict.py
    tests/core/test_spec.py
    tests/core/test_measurements.py
    tests/core/test_plan_results.py
    tests/core/test_cli.py
    tests/corpus/test_validate.py
    tests/corpus/test_templates.py
)
DESELECT=(
    --deselect tests/core/test_rules.py::test_postprocess_closes_small_holes_and_drops_small_components
    --deselect tests/core/test_rules.py::test_postprocess_does_not_erode_at_the_image_border
)

find_python() {
    local v=$1 candidate
    for candidate in "python$v" "$HOME"/.pyenv/versions/"$v".*/bin/"python$v"; do
        if "$candidate" -c 'import sys; sys.exit(0 if "%d.%d" % sys.version_info[:2] == "'"$v"'" else 1)' \
            >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

# Find the interpreters, then make the environments in parallel (pip waits mostly on the index), then test.
declare -A found=()
for v in $PYTHONS; do
    if ! py=$(find_python "$v"); then
        case "${CI:-}" in
            1 | true | TRUE | True | yes)
                echo "test-pythons: Python $v not found (python$v or ~/.pyenv/versions/$v.*); CI tests it" >&2
                exit 1
                ;;
        esac
        echo "test-pythons: Python $v not found (python$v or ~/.pyenv/versions/$v.*): skipped" >&2
        continue
    fi
    found[$v]=$py
done

key=$(cat pyproject.toml requirements.lock scripts/smoke_pythons.sh | sha256sum | cut -c1-16)
UV=$(scripts/uv.sh)
make_venv() {  # the core profile from the wheel built below at the lock's versions (requirements.lock)
    local v=$1 venv=.venv-$1
    "$UV" pip install --quiet --python "$venv/bin/python" -c requirements.lock "$wheel" pytest hypothesis
    "$venv/bin/python" -c 'import negt2i, pytest, hypothesis'
    touch "$venv/.smoke-$key"
}

start=$SECONDS
todo=()
for v in "${!found[@]}"; do
    if [ ! -f ".venv-$v/.smoke-$key" ]; then
        rm -rf ".venv-$v"
        "${found[$v]}" -m venv ".venv-$v"
        todo+=("$v")
    fi
done
if [ ${#todo[@]} -gt 0 ]; then
    dist=$(mktemp -d)
    trap 'rm -rf "$dist"' EXIT
    "$UV" build --quiet --wheel --build-constraint requirements.lock --python ".venv-${todo[0]}/bin/python" \
        -o "$dist" .
    wheel=$(echo "$dist"/negt2ibench-*.whl)
    pids=()
    for v in "${todo[@]}"; do
        make_venv "$v" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do
        wait "$pid" || { echo "test-pythons: making a core environment failed (above)" >&2; exit 1; }
    done
fi
echo "test-pythons: core environments (${!found[*]}) ready in $((SECONDS - start)) s"

status=0
for v in $PYTHONS; do
    [ -n "${found[$v]:-}" ] || continue
    echo "test-pythons: Python $(".venv-$v/bin/python" -c 'import platform; print(platform.python_version())')" \
        "(${found[$v]}), core profile"
    if ! ".venv-$v/bin/python" -m pytest -q -p no:cacheprovider "${SMOKE[@]}" "${DESELECT[@]}"; then
        status=1
    fi
done
exit $status
