#!/usr/bin/env bash
# Integration tests with real upstream MCP servers (npm and PyPI) and the real
# Python MCP client, against the manifold in scripts/paths.sh's MANIFOLD_BIN_DIR
# (target/debug by default). Build it first:
#   cargo build --workspace --bins
# MANIFOLD_BIN=path runs it against another build. Extra arguments go to pytest.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source "$root/scripts/paths.sh"

"$root/scripts/install-test-deps.sh"

manifold="${MANIFOLD_BIN:-$MANIFOLD_BIN_DIR/manifold}"
export MANIFOLD_BIN="$manifold"
if [[ ! -x "$manifold" ]]; then
    echo "test-python: $manifold is missing; run cargo build --workspace --bins" >&2
    exit 1
fi

status=0
"$root/.venv/bin/pytest" -q "$root/tests/python" "$@" || status=$?
if [[ $status -eq 5 ]]; then
    echo "test-python: pytest collected no tests" >&2
    exit 1
fi
exit $status
