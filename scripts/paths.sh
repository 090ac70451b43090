# Sourced by the scripts: where cargo puts the binaries they run.
#   MANIFOLD_TARGET_DIR  CARGO_TARGET_DIR (made absolute), else <repo>/target
#   MANIFOLD_PROFILE     the cargo profile the tests run against (default debug)
#   MANIFOLD_BIN_DIR     $MANIFOLD_TARGET_DIR/<profile folder>
# CI keeps its target folder outside the clone (.ci/run), so no script may
# assume target/debug.
manifold_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MANIFOLD_TARGET_DIR="${CARGO_TARGET_DIR:-$manifold_root/target}"
[[ "$MANIFOLD_TARGET_DIR" = /* ]] || MANIFOLD_TARGET_DIR="$manifold_root/$MANIFOLD_TARGET_DIR"
MANIFOLD_PROFILE="${MANIFOLD_PROFILE:-debug}"
case "$MANIFOLD_PROFILE" in
    dev | debug) MANIFOLD_BIN_DIR="$MANIFOLD_TARGET_DIR/debug" ;;
    *) MANIFOLD_BIN_DIR="$MANIFOLD_TARGET_DIR/$MANIFOLD_PROFILE" ;;
esac
export MANIFOLD_TARGET_DIR MANIFOLD_PROFILE MANIFOLD_BIN_DIR
