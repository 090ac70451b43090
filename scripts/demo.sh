#!/usr/bin/env bash
# Build and run the gateway on the demo config: 40 fixture servers, 689 tools,
# no outside services. Extra arguments go to `manifold serve` (e.g. --listen).
set -euo pipefail
cd "$(dirname "$0")/.."
MANIFOLD_PROFILE=release source scripts/paths.sh
cargo build --release --workspace --bins
exec "$MANIFOLD_BIN_DIR/manifold" serve --config fixtures/demo/manifold.toml "$@"
