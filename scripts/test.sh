#!/usr/bin/env bash
# The whole test suite. Installs what the tests need first (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== install test dependencies"
scripts/install-test-deps.sh
echo "== build"
cargo build --workspace --bins
echo "== lint"
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace
echo "== python integration tests (real upstreams, real Python clients)"
scripts/test-python.sh
echo "== MCP conformance suite through Manifold"
scripts/conformance.sh
echo "== fuzzing (30 s a target) beside the 10-minute soak"
mkdir -p target
scripts/soak.sh 600 > target/soak.log 2>&1 &
soak=$!
scripts/fuzz.sh 30
if ! wait "$soak"; then
    cat target/soak.log
    exit 1
fi
tail -n 12 target/soak.log
echo "== demo catalog"
target/debug/manifold catalog stats --config fixtures/demo/manifold.toml | tail -n 1
