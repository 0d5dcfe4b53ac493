#!/usr/bin/env bash
# Create (or bring up to date) the project's virtual environment at .venv/.
# Idempotent: re-installs only when pyproject.toml or this script changed.
#
# torch / torchvision are installed first, pinned, so that nothing else pulls a
# newer (multi-GB) build; sam2 is built without build isolation for the same
# reason (its build imports torch) and without its optional CUDA extension.
set -euo pipefail
cd "$(dirname "$0")/.."
export UV_PYTHON_DOWNLOADS=never  # uv uses the interpreters given to it, never one it downloads
# Python 3.11, 3.12 or 3.13 (pyproject's requires-python): PYTHON, else the first of python3.11, python3.12,
# python3.13 on PATH. torch==2.14.1 comes from wherever pip finds a wheel for that Python (a local wheel store
# through pip's find-links / extra index, else PyPI: cp311, cp312 and cp313 wheels exist there).
if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
else
    PY=""
    for candidate in python3.11 python3.12 python3.13; do
        if "$candidate" -c pass >/dev/null 2>&1; then  # runs (a pyenv shim of an inactive version does not)
            PY=$candidate
            break
        fi
    done
    if [ -z "$PY" ]; then
        echo "setup: no python3.11, python3.12 or python3.13 on PATH; install one or set PYTHON=/path/to/python3.X" >&2
        exit 1
    fi
fi
if ! "$PY" -c pass >/dev/null 2>&1; then
    echo "setup: $PY not found (or does not run); install Python 3.11, 3.12 or 3.13 or set PYTHON=/path/to/python3.X" >&2
    exit 1
fi
if ! "$PY" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] <= (3, 13) else 1)'; then
    echo "setup: $PY is Python $("$PY" -c 'import platform; print(platform.python_version())'); this project" \
        "supports 3.11, 3.12 and 3.13 (set PYTHON=/path/to/python3.X)" >&2
    exit 1
fi

# The exact versions come from requirements.lock (`make lock`); a lock made from another pyproject.toml is
# refused before anything is installed.
LOCK=requirements.lock
"$PY" docker/requirements.py --check-lock "$LOCK" || exit 1

# The Node.js client (clients/node) that tests/clients runs against a real orchestrator: `npm ci` from its
# committed package-lock.json (exact versions, no install scripts), again only when the lock file changed.
# In CI (CI=true, as .ci/run sets) Node.js >= 18 and npm are required; elsewhere their absence is reported
# and tests/clients is skipped.
setup_node() {
    local dir=clients/node why=""
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        why="node and npm not found"
    elif ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)'; then
        why="node $(node --version) is older than 18"
    fi
    if [ -n "$why" ]; then
        case "${CI:-}" in
            1 | true | TRUE | True | yes)
                echo "setup: $why; CI needs Node.js >= 18 and npm for the Node.js client tests (tests/clients)" >&2
                exit 1
                ;;
        esac
        echo "setup: $why: skipping $dir (tests/clients will be skipped; install Node.js >= 18 to run them)" >&2
        return 0
    fi
    local key
    key=$(cat "$dir/package.json" "$dir/package-lock.json" | sha256sum | cut -c1-16)
    [ -f "$dir/node_modules/.setup-$key" ] && return 0
    echo "setup: npm ci in $dir"
    (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
    touch "$dir/node_modules/.setup-$key"
}
setup_node

# Debian's chromium for the labelling page's browser test (tests/annotation/test_labelling_page.py, driven over
# the DevTools protocol). In CI it is installed with apt-get when missing (root and apt-get needed) and its
# absence is an error; elsewhere its absence is reported and that one test is skipped.
setup_chromium() {
    command -v chromium >/dev/null 2>&1 && return 0
    case "${CI:-}" in
        1 | true | TRUE | True | yes)
            if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
                echo "setup: apt-get install chromium (browser test)"
                apt-get update -qq
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
                command -v chromium >/dev/null 2>&1 && return 0
            fi
            echo "setup: chromium not found and not installable here; CI needs Debian's chromium for" \
                "tests/annotation/test_labelling_page.py (apt-get install chromium)" >&2
            exit 1
            ;;
    esac
    echo "setup: chromium not found: the labelling page's browser test will be skipped (apt-get install chromium)" >&2
}
setup_chromium

# Debian's Go toolchain for the Go client test (tests/clients/test_go_client.py: stubs generated from the
# shipped protos and a small client built offline against Debian's Go packages, docs/api.md "Go"). In CI it
# is installed with apt-get when missing (root and apt-get needed) and its absence is an error; elsewhere its
# absence is reported and that test is skipped. golang-github-golang-protobuf-1-5-dev replaces the 1.3
# package grpc-go 1.33 pulls in (with 1.3 every call panics: docs/api.md).
GO_PACKAGES=(golang-go protobuf-compiler protoc-gen-go protoc-gen-go-grpc golang-google-grpc-dev
    golang-google-protobuf-dev golang-google-genproto-dev golang-github-golang-protobuf-1-5-dev)
setup_go() {
    local have=1
    for tool in go protoc protoc-gen-go protoc-gen-go-grpc; do
        command -v "$tool" >/dev/null 2>&1 || have=0
    done
    local src=/usr/share/gocode/src
    [ -d $src/google.golang.org/grpc ] && [ -d $src/google.golang.org/genproto/googleapis/rpc ] || have=0
    grep -q protoimpl $src/github.com/golang/protobuf/proto/proto.go 2>/dev/null || have=0  # 1.4 or later
    [ "$have" = 1 ] && return 0
    case "${CI:-}" in
        1 | true | TRUE | True | yes)
            if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
                echo "setup: apt-get install Debian's Go toolchain (Go client test)"
                apt-get update -qq
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${GO_PACKAGES[@]}" >/dev/null
                return 0
            fi
            echo "setup: Debian's Go toolchain not found and not installable here; CI needs it for" \
                "tests/clients/test_go_client.py (apt-get install ${GO_PACKAGES[*]})" >&2
            exit 1
            ;;
    esac
    echo "setup: Debian's Go toolchain not found: the Go client test will be skipped" \
        "(apt-get install ${GO_PACKAGES[*]})" >&2
}
setup_go

if [ -x .venv/bin/python ] && [ -n "${PYTHON:-}" ]; then
    want=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    have=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$want" != "$have" ]; then
        echo "setup: .venv is Python $have, PYTHON=$PY is $want; remove .venv (make clean) to switch" >&2
        exit 1
    fi
fi
# requirements.lock is the one lock that the images, `make test-pythons` and the README's "tested versions"
# install share: every distribution at its locked version, hash-checked, nothing else (uv pip sync removes
# what the lock does not name).
stamp_key=$(cat pyproject.toml "$LOCK" scripts/setup.sh scripts/uv.sh docker/requirements.py | sha256sum | cut -c1-16)
stamp=.venv/.setup-$stamp_key
if [ -f "$stamp" ]; then
    exit 0
fi
start=$SECONDS
[ -x .venv/bin/python ] || "$PY" -m venv .venv
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "setup: installing the locked versions ($(grep -c '^[A-Za-z0-9]' "$LOCK") distributions of $LOCK) into .venv;" \
    "a first run downloads about 3 GB (torch and its CUDA libraries): 1 to 10 minutes, mostly the network"
# uv at its locked version (scripts/uv.sh: hash-checked from the lock); it installs the rest.
UV=$(PYTHON="$PY" scripts/uv.sh)
in_venv=(--python .venv/bin/python)
# sam2's build imports torch (its build runs in .venv, without build isolation and without its optional CUDA
# extension), so everything else goes in first.
"$PY" docker/requirements.py --lock-entries '!sam2' "$LOCK" > "$tmp/without-sam2.txt"
"$UV" pip install "${in_venv[@]}" --require-hashes --no-deps -r "$tmp/without-sam2.txt"
SAM2_BUILD_CUDA=0 SAM2_BUILD_ALLOW_ERRORS=1 "$UV" pip sync "${in_venv[@]}" --require-hashes --no-build-isolation "$LOCK"
# The project itself, editable, built with the locked setuptools (no build isolation: nothing unlocked).
"$UV" pip install "${in_venv[@]}" --no-deps --no-build-isolation -e .
rm -f .venv/.setup-*
touch "$stamp"
echo "setup: .venv ready in $((SECONDS - start)) s"
