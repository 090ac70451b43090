#!/usr/bin/env bash
# Everything the gateway and its tests need: release and debug builds, plus the
# test peers (npm and PyPI reference servers, Node 22, the conformance suite).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --bins
cargo build --workspace --bins
scripts/install-test-deps.sh
