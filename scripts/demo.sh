#!/usr/bin/env bash
# Build and run the gateway on the demo config: 40 fixture servers, 689 tools,
# no outside services, searching with the default `hybrid` strategy. Extra
# arguments go to `manifold serve` (e.g. --listen).
#
# Search embeds with the tool-retrieval model shipped in models/; nothing is
# downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
MANIFOLD_PROFILE=release source scripts/paths.sh
cargo build --release --workspace --bins
exec "$MANIFOLD_BIN_DIR/manifold" serve --config fixtures/demo/manifold.toml "$@"
