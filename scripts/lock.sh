#!/usr/bin/env bash
# `make lock`: regenerate requirements.lock, the one list of exact versions (with hashes) that `make setup`,
# `make test-pythons`, the images and the README's "tested versions" flag install from.
#
# uv pip compile resolves pyproject.toml with every extra for every supported Python (--universal, 3.11 to
# 3.13) and keeps the versions already in the lock where pyproject.toml still allows them; UPGRADE=1 takes
# the newest versions pyproject.toml allows (run `make test-latest` first: docs/dependencies.md). The lock
# records the digest of pyproject.toml's dependency tables; tests/test_lock.py and `make setup` refuse a lock
# made from another pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
export UV_PYTHON_DOWNLOADS=never  # uv uses the interpreters given to it, never one it downloads
LOCK=requirements.lock
UV=${UV:-$(scripts/uv.sh)}
args=(pip compile pyproject.toml --all-extras --universal --python-version 3.11 --generate-hashes
    --custom-compile-command "make lock" --no-progress --quiet -o "$LOCK")
case "${UPGRADE:-0}" in
    1 | true | yes) args+=(--upgrade) ;;
esac
"$UV" "${args[@]}"
# The digest line goes right after uv's two header lines.
digest=$(python3 docker/requirements.py --digest)
python3 - "$LOCK" "$digest" <<'PY'
import sys
path, digest = sys.argv[1], sys.argv[2]
lines = [line for line in open(path).read().splitlines() if not line.startswith("# pyproject-digest: ")]
lines.insert(2, f"# pyproject-digest: {digest}")
open(path, "w").write("\n".join(lines) + "\n")
PY
echo "lock: $LOCK ($(grep -c '^[A-Za-z0-9]' "$LOCK") distributions, $digest)"
