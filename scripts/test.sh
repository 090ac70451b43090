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
echo "== demo catalog"
target/debug/manifold catalog stats --config fixtures/demo/manifold.toml | tail -n 1
